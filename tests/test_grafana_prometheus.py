"""The Grafana dashboard and the alert rules, proved on a real Prometheus (Debian's): it scrapes a
live tritonmp under load, every PromQL expression of deploy/grafana/tritonmp.json runs through its
HTTP API and returns series, and the rules of deploy/prometheus/alerts.yml load, evaluate, and fire
when a model's worker restarts."""

import json
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request

import orjson
import pytest
import yaml

from conftest import ROOT, free_ports, serving, wait_for

PROMETHEUS, PROMTOOL = shutil.which("prometheus"), shutil.which("promtool")
pytestmark = [pytest.mark.skipif(PROMETHEUS is None or PROMTOOL is None,
                                 reason="Debian's prometheus is not installed (.ci/run installs it)"),
              pytest.mark.slow]
DASHBOARD = ROOT / "deploy" / "grafana" / "tritonmp.json"
SCRAPE_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
ADD = orjson.dumps({"inputs": [{"name": "A", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]},
                               {"name": "B", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]})
FAIL = orjson.dumps({"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [0]}]})
BATCH = orjson.dumps({"inputs": [{"name": "X", "shape": [2, 4], "datatype": "FP32", "data": [1.0] * 8}]})


def _get(port: int, path: str, **params) -> dict:
    url = f"http://127.0.0.1:{port}{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def _query(port: int, expr: str) -> list:
    answer = _get(port, "/api/v1/query", query=expr)
    assert answer["status"] == "success", (expr, answer)
    return answer["data"]["result"]


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def prometheus(example_repo, test_repo, tmp_path_factory):
    """A tritonmp under steady load, and a Prometheus scraping it twice a second with the shipped
    scrape settings and rules (one of each for the module: the alert test's crash comes last)."""
    with serving([example_repo, test_repo], ["--exit-on-error=false"], tmp_path_factory) as server:
        yield from _prometheus(server, tmp_path_factory.mktemp("prometheus"))


def _prometheus(server, tmp_path):
    stop = threading.Event()

    def load():
        deadline = time.monotonic() + 120
        for i in range(20000):
            if stop.is_set() or time.monotonic() > deadline:
                return
            server.post("/v2/models/add_py/infer", ADD)
            if i % 10 == 0:
                server.post("/v2/models/fail/infer", FAIL)
                server.post("/v2/models/batch_report/infer", BATCH)

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    config = yaml.safe_load(SCRAPE_CONFIG.read_text())
    config["global"].update(scrape_interval="500ms", evaluation_interval="500ms")
    config["rule_files"] = [str(ALERTS)]
    (job,) = config["scrape_configs"]
    # the labels Kubernetes pod discovery gives, which the autoscaling manifests' queries select on
    job["static_configs"] = [{"targets": [f"127.0.0.1:{server.metrics_port}"],
                              "labels": {"namespace": "default", "pod": "tritonmp-0"}}]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    (port,) = free_ports(1)
    log = open(tmp_path / "prometheus.log", "wb")
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: _ready(port) or proc.poll() is not None, 60, "prometheus to start")
        assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]
        # enough scrapes for rates over 15 s windows
        wait_for(lambda: _query(port, 'count_over_time(up{job="tritonmp"}[1m]) >= 4 and up{job="tritonmp"} == 1'),
                 60, "four scrapes of tritonmp")
        yield server, port
    finally:
        stop.set()
        loader.join(30)
        proc.terminate()
        proc.wait(30)
        log.close()


def _expressions() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel["targets"]]


def _concrete(expr: str) -> str:
    """A dashboard expression with Grafana's variables as a Prometheus query takes them."""
    return (expr.replace("$__rate_interval", "15s").replace("$__range", "1m")
            .replace("$job", "tritonmp").replace("$model", ".*"))


def test_every_dashboard_expression_returns_series(prometheus):
    server, port = prometheus
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert set(variables) == {"datasource", "job", "model"}
    models = _get(port, "/api/v1/label/model/values", **{"match[]": 'nv_inference_request_success{job=~".*"}'})
    assert {"add_py", "fail", "batch_report"} <= set(models["data"])
    gpus = bool(_query(port, "nv_gpu_utilization"))
    expressions = _expressions()
    assert len(expressions) >= 14
    for title, expr in expressions:
        assert "$model" in expr or "nv_gpu_" in expr or "process_" in expr or "nv_cpu_" in expr, title
        result = _query(port, _concrete(expr))
        if "nv_gpu_" in expr and not gpus:
            continue  # a machine without GPUs exports no GPU series; the expression still ran without error
        assert result, f"'{title}': {_concrete(expr)} returned no series"
    # the figures move with the load
    requests_per_s = _concrete(expressions[0][1]).replace('model=~".*"', 'model="add_py"')
    (rate,) = _query(port, requests_per_s)
    assert float(rate["value"][1]) > 0


def test_the_autoscaling_queries_return_each_replicas_pending_requests(prometheus):
    """deploy/kubernetes/autoscaling: prometheus-adapter's rule (its series query, and its metrics
    query as the adapter fills it in for the pods of a namespace) and KEDA's trigger query, run as
    written on the Prometheus that scrapes the loaded server."""
    _, port = prometheus
    autoscaling = ROOT / "deploy" / "kubernetes" / "autoscaling"
    adapter = yaml.safe_load((autoscaling / "prometheus-adapter-rules.yaml").read_text())
    (rule,) = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    (series,) = _get(port, "/api/v1/series", **{"match[]": rule["seriesQuery"]})["data"][:1]
    assert series["namespace"] == "default" and series["pod"] == "tritonmp-0"
    metrics_query = (rule["metricsQuery"].replace("<<.LabelMatchers>>", 'namespace="default",pod=~"tritonmp-0"')
                     .replace("<<.GroupBy>>", "pod"))
    (per_pod,) = _query(port, metrics_query)
    assert per_pod["metric"] == {"pod": "tritonmp-0"} and float(per_pod["value"][1]) >= 0
    (scaled,) = yaml.safe_load_all((autoscaling / "keda-scaledobject.yaml").read_text())
    (trigger,) = scaled["spec"]["triggers"]
    (total,) = _query(port, trigger["metadata"]["query"])
    assert float(total["value"][1]) >= 0


def test_alert_rules_check_load_evaluate_and_fire(prometheus):
    server, port = prometheus
    checked = subprocess.run([PROMTOOL, "check", "rules", str(ALERTS)], capture_output=True, text=True)
    assert checked.returncode == 0 and "SUCCESS: 4 rules found" in checked.stdout, checked.stdout + checked.stderr
    crash = orjson.dumps({"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [-1]}]})
    assert server.post("/v2/models/crash/infer", crash)[0] == 500  # its worker dies, and is restarted

    def rules():
        groups = _get(port, "/api/v1/rules")["data"]["groups"]
        return {rule["name"]: rule for group in groups for rule in group["rules"]}

    wait_for(lambda: all(r.get("lastEvaluation", "").startswith("2") and r["health"] != "unknown"
                         for r in rules().values()), 30, "every rule to be evaluated")
    for name, rule in rules().items():
        assert rule["health"] == "ok", (name, rule.get("lastError"))
    assert set(rules()) == {"TritonmpModelNotReady", "TritonmpHighFailureRatio", "TritonmpQueueTimeP99High",
                            "TritonmpWorkerRestarts"}

    def firing():
        alerts = _get(port, "/api/v1/alerts")["data"]["alerts"]
        return {(a["labels"]["alertname"], a["labels"].get("model")) for a in alerts if a["state"] == "firing"}

    wait_for(lambda: ("TritonmpWorkerRestarts", "crash") in firing(), 60, "the restart alert to fire")
    assert ("TritonmpWorkerRestarts", "add_py") not in firing()
