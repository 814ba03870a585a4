# tritonmp on a CPU: docker build -t tritonmp .
#   docker run --rm --shm-size=1g -p 8000-8002:8000-8002 -v /path/to/models:/models:ro tritonmp
# Workers exchange tensors with the frontend through /dev/shm: give the container more than
# Docker's default 64 MiB (--shm-size, or shm_size in compose).
# BASE: any image with Python 3.10+ and pip on PATH and useradd (scripts/container-check.sh builds
# one from Debian's packages where no registry of images can be reached)
ARG BASE=python:3.11-slim
FROM ${BASE}

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

# the sources are installed, then removed: a `tritonmp` folder in the working directory would
# shadow the installed package for the workers (python -m puts the working directory first)
COPY pyproject.toml constraints.txt README.md /tmp/src/
COPY tritonmp /tmp/src/tritonmp
# EXTRAS: optional frameworks, e.g. --build-arg EXTRAS=cloud,openvino,torch (cloud: model repositories in
# S3, GCS and Azure Storage, as Triton's image reads them)
ARG EXTRAS="cloud"
RUN pip install -c /tmp/src/constraints.txt "/tmp/src${EXTRAS:+[$EXTRAS]}" && rm -rf /tmp/src \
    && useradd --system --uid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin tritonmp \
    && mkdir /models && chown tritonmp /models \
    && printf '#!/bin/sh\nexec python -m tritonmp.sagemaker_serve "$@"\n' > /usr/local/bin/serve \
    && chmod 755 /usr/local/bin/serve

USER 10001
# 8080: SageMaker's endpoint, where SageMaker runs the image as `serve`
EXPOSE 8000 8001 8002 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/v2/health/ready', timeout=2)"]
CMD ["tritonmp", "--model-repository", "/models", "--workers", "auto"]
