"""The deployment files: the Dockerfiles, the compose file, the Kubernetes manifests (with their
GPU overlay) and the KServe runtime. Manifests are parsed with the `kubernetes` client's models
(every field must survive a round trip through them, so a misspelt field fails), the commands they
run are parsed by tritonmp's own argument parser and then served for real, and the probes and
health checks they declare answer on that server."""

import json
import re
import shlex
import subprocess
import sys

import pytest

from tritonmp.cli import serve_parser

from conftest import ROOT, http_request

yaml = pytest.importorskip("yaml", reason="PyYAML is not installed (the test extra has it)")
ApiClient = pytest.importorskip("kubernetes.client", reason="the kubernetes client is not installed (the test extra "
                                "has it)").ApiClient

DEPLOY = ROOT / "deploy"
PORT_FLAGS = ("--http-port", "--grpc-port", "--metrics-port")


def _dockerfile(name: str) -> list[tuple[str, str]]:
    """A Dockerfile's instructions, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", (ROOT / name).read_text())
    instructions = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            instructions.append((keyword.upper(), rest.strip()))
    return instructions


def _command(args: list[str]) -> list[str]:
    """A container's command as tritonmp's flags, checked by its own parser."""
    assert args[0] == "tritonmp", args
    flags = args[1:]
    serve_parser().parse_args(flags)  # exits (SystemExit) on a flag it does not know
    return flags


def _served_flags(flags: list[str], repo) -> list[str]:
    """The same flags for a test server: its own repository and free ports (start_server's)."""
    out, skip = [], False
    for flag in flags:
        if skip:
            skip = False
            continue
        name = flag.split("=", 1)[0]
        if name in (*PORT_FLAGS, "--model-repository"):
            skip = "=" not in flag
            continue
        out.append(flag)
    return out


def _round_trip(document: dict, model: str) -> None:
    """The document, read into the kubernetes client's model and written back, is unchanged: every
    field is one Kubernetes knows, with a value of the right type."""
    client = ApiClient()
    obj = client._ApiClient__deserialize(document, model)
    assert client.sanitize_for_serialization(obj) == json.loads(json.dumps(document)), model


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.gpu"])
def test_dockerfiles(name):
    instructions = _dockerfile(name)
    kinds = [k for k, _ in instructions]
    assert set(kinds[:kinds.index("FROM")]) <= {"ARG"} and kinds.count("CMD") == 1 and "ENTRYPOINT" not in kinds
    users = [v for k, v in instructions if k == "USER"]
    assert users and users[-1] not in ("root", "0")
    assert set(" ".join(v for k, v in instructions if k == "EXPOSE").split()) == {"8000", "8001", "8002", "8080"}
    (healthcheck,) = [v for k, v in instructions if k == "HEALTHCHECK"]
    assert "127.0.0.1:8000/v2/health/ready" in healthcheck
    (cmd,) = [json.loads(v) for k, v in instructions if k == "CMD"]
    assert "/models" in _command(cmd)
    for k, v in instructions:
        if k == "COPY":
            for source in v.split()[:-1]:
                assert (ROOT / source).exists(), source
    assert "WORKDIR" not in kinds  # the working directory must not hold a `tritonmp` folder
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert not {"tritonmp", "workers", "pyproject.toml", "constraints.txt", "README.md"} & set(ignored)
    installs = " ".join(v for k, v in instructions if k in ("RUN", "ARG"))
    assert "pip install" in installs
    # SageMaker runs an image as `docker run IMAGE serve`
    assert "/usr/local/bin/serve" in installs and "python -m tritonmp.sagemaker_serve" in installs
    if name == "Dockerfile.gpu":
        assert 'EXTRAS="gpu,cloud"' in installs and "onnxruntime-gpu" in installs


def test_the_containers_health_check_passes_on_a_ready_server_only(start_server, example_repo):
    (healthcheck,) = [v for k, v in _dockerfile("Dockerfile") if k == "HEALTHCHECK"]
    probe = json.loads(healthcheck.split("CMD", 1)[1])
    assert probe[0] == "python"
    server = start_server([example_repo])
    script = probe[2].replace("127.0.0.1:8000", f"127.0.0.1:{server.http_port}")
    assert subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=30).returncode == 0
    server.stop()
    assert subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=30).returncode != 0


def test_compose_file_services_ports_and_mounts():
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"tritonmp", "prometheus", "grafana"}
    tritonmp = services["tritonmp"]
    assert {p.split(":")[-1] for p in tritonmp["ports"]} == {"8000", "8001", "8002"}
    flags = _command(tritonmp["command"])
    exit_timeout = float(flags[flags.index("--exit-timeout-secs") + 1])
    assert float(tritonmp["stop_grace_period"].rstrip("s")) > exit_timeout
    assert tritonmp["shm_size"] and tritonmp["build"]["context"] == ".."
    assert (DEPLOY / tritonmp["build"]["context"] / tritonmp["build"]["dockerfile"]).exists()
    assert any(v.endswith(":/models:ro") for v in tritonmp["volumes"])
    for name in ("prometheus", "grafana"):
        for volume in services[name]["volumes"]:
            assert (DEPLOY / volume.split(":")[0]).exists(), volume
    scrape = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    (job,) = scrape["scrape_configs"]
    assert job["static_configs"][0]["targets"] == ["tritonmp:8002"]
    datasource = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text())
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"
    provider = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/tritonmp.yml").read_text())
    mounted = {v.split(":")[1] for v in services["grafana"]["volumes"]}
    assert provider["providers"][0]["options"]["path"] + "/tritonmp.json" in mounted


def _manifests(path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _apply_json_patch(document: dict, operations: list[dict]) -> dict:
    """RFC 6902 add/replace, as kustomize applies the overlays' patches."""
    for op in operations:
        assert op["op"] in ("add", "replace")
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].lstrip("/").split("/")]
        node = document
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        key: int | str = int(last) if isinstance(node, list) else last
        if op["op"] == "replace":
            assert key in node if isinstance(node, dict) else 0 <= int(key) < len(node), op["path"]
        node[key] = op["value"]
    return document


def _check_deployment(deployment: dict, service: dict) -> dict:
    _round_trip(deployment, "V1Deployment")
    pod = deployment["spec"]["template"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    flags = _command(container["args"])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002}
    assert {p["targetPort"] for p in service["spec"]["ports"]} == set(ports)
    probes = {kind: container[kind]["httpGet"] for kind in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert probes["livenessProbe"]["path"] == "/v2/health/live"
    assert probes["readinessProbe"]["path"] == probes["startupProbe"]["path"] == "/v2/health/ready"
    assert all(p["port"] == "http" for p in probes.values())
    exit_timeout = float(flags[flags.index("--exit-timeout-secs") + 1])
    assert pod["spec"]["terminationGracePeriodSeconds"] >= exit_timeout + 10  # drain, then stop the workers
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "8002"
    return container


def test_kubernetes_manifests_and_the_gpu_overlay():
    documents = {d["kind"]: d for d in _manifests(DEPLOY / "kubernetes" / "tritonmp.yaml")}
    assert set(documents) == {"PersistentVolumeClaim", "Deployment", "Service"}
    _round_trip(documents["PersistentVolumeClaim"], "V1PersistentVolumeClaim")
    _round_trip(documents["Service"], "V1Service")
    container = _check_deployment(documents["Deployment"], documents["Service"])
    claim = documents["PersistentVolumeClaim"]["metadata"]["name"]
    assert any(v.get("persistentVolumeClaim", {}).get("claimName") == claim
               for v in documents["Deployment"]["spec"]["template"]["spec"]["volumes"])
    assert "nvidia.com/gpu" not in container["resources"]["limits"]
    base = yaml.safe_load((DEPLOY / "kubernetes" / "kustomization.yaml").read_text())
    assert base["resources"] == ["tritonmp.yaml"]
    overlay = yaml.safe_load((DEPLOY / "kubernetes" / "gpu" / "kustomization.yaml").read_text())
    assert overlay["resources"] == ["../"] and overlay["images"] == [{"name": "tritonmp", "newTag": "gpu"}]
    (patch,) = overlay["patches"]
    assert patch["target"] == {"kind": "Deployment", "name": "tritonmp"}
    gpu = _apply_json_patch(documents["Deployment"], yaml.safe_load(patch["patch"]))
    container = _check_deployment(gpu, documents["Service"])
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert gpu["spec"]["template"]["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"


def test_kserve_runtime_and_inference_service():
    (runtime,) = _manifests(DEPLOY / "kubernetes" / "kserve-runtime.yaml")
    assert runtime["apiVersion"] == "serving.kserve.io/v1alpha1" and runtime["kind"] == "ClusterServingRuntime"
    spec = runtime["spec"]
    formats = {f["name"] for f in spec["supportedModelFormats"]}
    assert {"triton", "onnx", "pytorch", "tensorflow", "openvino_ir", "tensorrt"} <= formats
    assert set(spec["protocolVersions"]) == {"v2", "grpc-v2"}
    (container,) = spec["containers"]
    _round_trip(container, "V1Container")
    for volume in spec["volumes"]:
        _round_trip(volume, "V1Volume")
    assert container["name"] == "kserve-container"
    args = serve_parser().parse_args(_command(container["args"]))
    assert args.model_repository == ["/mnt/models"] and args.allow_http and args.allow_grpc
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": args.http_port}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": args.http_port}
    assert [p["containerPort"] for p in container["ports"]] == [args.grpc_port]
    assert spec["annotations"]["prometheus.kserve.io/port"] == str(args.metrics_port)
    (service,) = _manifests(DEPLOY / "kubernetes" / "kserve-inferenceservice.yaml")
    model = service["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] in formats and model["protocolVersion"] == "v2"


def test_the_object_storage_overlay_serves_a_bucket_and_the_kserve_service_reads_one(tmp_path):
    """deploy/kubernetes/object-storage: the Deployment's repository is a bucket's URI, its keys come
    from the secret, its copies go to a writable emptyDir; the volume claim is deleted. The KServe
    InferenceService takes an s3:// storage URI on the same runtime."""
    documents = {d["kind"]: d for d in _manifests(DEPLOY / "kubernetes" / "tritonmp.yaml")}
    overlay = yaml.safe_load((DEPLOY / "kubernetes" / "object-storage" / "kustomization.yaml").read_text())
    assert overlay["resources"] == ["../"]
    deployment_patch, claim_patch = overlay["patches"]
    assert deployment_patch["target"] == {"kind": "Deployment", "name": "tritonmp"}
    patched = _apply_json_patch(documents["Deployment"], yaml.safe_load(deployment_patch["patch"]))
    container = _check_deployment(patched, documents["Service"])
    args = serve_parser().parse_args(_command(container["args"]))
    assert args.model_repository == ["s3://my-bucket/model_repository"]
    assert container["envFrom"] == [{"secretRef": {"name": "tritonmp-object-storage"}}]
    mount = {e["name"]: e["value"] for e in container["env"]}["TRITON_AWS_MOUNT_DIRECTORY"]
    (models,) = [m for m in container["volumeMounts"] if m["mountPath"] == mount]
    assert models["readOnly"] is False
    (volume,) = [v for v in patched["spec"]["template"]["spec"]["volumes"] if v["name"] == models["name"]]
    assert volume == {"name": "models", "emptyDir": {}}
    _round_trip(volume, "V1Volume")
    deleted = yaml.safe_load(claim_patch["patch"])
    assert deleted["$patch"] == "delete" and deleted["metadata"]["name"] == \
        documents["PersistentVolumeClaim"]["metadata"]["name"] == claim_patch["target"]["name"]
    (service,) = _manifests(DEPLOY / "kubernetes" / "kserve-inferenceservice-s3.yaml")
    (runtime,) = _manifests(DEPLOY / "kubernetes" / "kserve-runtime.yaml")
    model = service["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"] and model["storageUri"].startswith("s3://")


@pytest.mark.parametrize("where", ["dockerfile", "compose", "kubernetes", "kserve"])
def test_each_deployments_command_serves_and_answers_its_probes(where, start_server, example_repo):
    if where == "dockerfile":
        args = [json.loads(v) for k, v in _dockerfile("Dockerfile") if k == "CMD"][0]
    elif where == "compose":
        args = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]["tritonmp"]["command"]
    elif where == "kubernetes":
        documents = {d["kind"]: d for d in _manifests(DEPLOY / "kubernetes" / "tritonmp.yaml")}
        args = documents["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"]
    else:
        args = _manifests(DEPLOY / "kubernetes" / "kserve-runtime.yaml")[0]["spec"]["containers"][0]["args"]
    server = start_server([example_repo], *_served_flags(_command(args), example_repo))
    for path in ("/v2/health/live", "/v2/health/ready"):
        assert http_request(server.http_port, "GET", path)[0] == 200, shlex.join(args)
    assert http_request(server.metrics_port, "GET", "/metrics")[0] == 200


def test_autoscaling_manifests():
    """deploy/kubernetes/autoscaling: the HPA scales the Deployment on the metric the adapter's rule
    publishes, and KEDA's ScaledObject scales the same Deployment from a Prometheus query (the
    queries run on a real Prometheus in test_grafana_prometheus.py)."""
    autoscaling = DEPLOY / "kubernetes" / "autoscaling"
    deployment = {d["kind"]: d for d in _manifests(DEPLOY / "kubernetes" / "tritonmp.yaml")}["Deployment"]
    (adapter,) = _manifests(autoscaling / "prometheus-adapter-rules.yaml")
    _round_trip(adapter, "V1ConfigMap")
    (rule,) = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
    assert "<<.LabelMatchers>>" in rule["metricsQuery"] and "<<.GroupBy>>" in rule["metricsQuery"]
    (hpa,) = _manifests(autoscaling / "hpa.yaml")
    _round_trip(hpa, "V2HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": deployment["metadata"]["name"]}
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] == rule["name"]["as"]
    (scaled,) = _manifests(autoscaling / "keda-scaledobject.yaml")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1" and scaled["kind"] == "ScaledObject"
    assert scaled["spec"]["scaleTargetRef"] == {"name": deployment["metadata"]["name"]}
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and float(trigger["metadata"]["threshold"]) > 0
    assert set(trigger["metadata"]) == {"serverAddress", "query", "threshold"}
