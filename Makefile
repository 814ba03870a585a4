# make serve: set up .venv, build the example repository, start the server on it.
# make test:  the same set-up, the CPU frameworks' extras (OpenVINO, TensorFlow, PyTorch), Ray Serve and the
#             object stores' client and servers, the type checker (make typecheck), then the whole test suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
REPO := configs/model_repository
ARGS ?=

.PHONY: install frameworks node-client example-repo serve typecheck test test-compat lint bench clean

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml constraints.txt | $(BIN)/activate
	$(BIN)/python -m pip install -q --upgrade "pip>=24"
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test]'
	touch $@

install: $(VENV)/.installed

# The optional frameworks that run on a CPU, Ray Serve, the object-store client with the servers of
# the three object-store protocols, and the OpenTelemetry exporter, installed into the venv once, so
# that the tests of their backends, of tritonmp.ray_serve, of repositories in object storage and of
# OpenTelemetry traces run (without them those tests skip).
# `make serve` does not need them.
$(VENV)/.frameworks: $(VENV)/.installed pyproject.toml constraints.txt
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test,openvino,tensorflow,torch,ray,cloud,otel,storage-emulators]'
	touch $@

frameworks: $(VENV)/.frameworks

# Node's @grpc/grpc-js, a second gRPC client for the tests, and Azurite, Azure's Blob Storage emulator,
# where node and npm are present (their tests skip with the reason otherwise).
tests/node/node_modules/.package-lock.json: tests/node/package.json tests/node/package-lock.json
	@if command -v npm >/dev/null; then npm ci --prefix tests/node --no-audit --no-fund --loglevel=error; \
	else echo "npm is not installed: the @grpc/grpc-js client and Azure Storage tests will skip"; fi

node-client: tests/node/node_modules/.package-lock.json

$(REPO)/add/1/model.onnx: scripts/make_example_repo.py $(VENV)/.installed
	$(BIN)/python scripts/make_example_repo.py $(REPO)

example-repo: $(REPO)/add/1/model.onnx

serve: example-repo
	$(BIN)/tritonmp --model-repository $(REPO) --workers auto $(ARGS)

# mypy over tritonmp/, as pyproject.toml configures it: the contracts between the parts
# (tritonmp/served.py, tritonmp/workers/backend.py) are checked before any test runs
typecheck: install
	$(BIN)/mypy

# QUICK=1 leaves out the tests marked slow, for a quick loop while working
test: example-repo frameworks node-client typecheck
	$(BIN)/python -m pytest -q -m "not compat and not container$(if $(QUICK), and not slow)" $(ARGS)

# Installs the reference Triton server (../shared/anchors/setup.sh) when it is missing, then compares.
ANCHORS ?= $(HOME)/.cache/tritonmp-anchors
test-compat: example-repo
	@[ -x $(ANCHORS)/bin/tritonserver-ref ] || bash ../shared/anchors/setup.sh $(ANCHORS)
	TRITONMP_ANCHORS=$(ANCHORS) $(BIN)/python -m pytest -q -m compat $(ARGS)

lint: install
	$(BIN)/ruff check tritonmp tests scripts

bench: example-repo
	bash scripts/bench_vs_triton.sh

clean:
	rm -rf $(VENV) $(REPO)/add/1/model.onnx
