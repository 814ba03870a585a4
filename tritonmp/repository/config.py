"""Model configuration: parse config.pbtxt into Triton's ModelConfig, complete it, check it.

Every problem is a ConfigProblem naming the file, the field and what to do about it, so that
`tritonmp check` can list them all and the model manager can refuse a model with the reason.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import FieldDescriptor
from tritonclient.grpc import model_config_pb2 as mc

from .. import backends, datatypes
from . import model_io, onnx_graph, python_backends, python_envs, ragged, reshape, warmup
from .problems import ConfigProblem

ModelConfig = mc.ModelConfig

@dataclass
class Completed:
    """A model's configuration after parsing, completion and checking."""

    config: mc.ModelConfig
    backend: str
    model_dir: str
    versions: list[int]  # the version directories present, ascending
    code_file: str = ""  # a python-based backend's model.py ("": the version directory's model file)
    python_env: python_envs.PythonEnv | None = None  # its own environment (EXECUTION_ENV_PATH; None: the server's)


def parse_text(text: str, path: str) -> mc.ModelConfig:
    config = mc.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as e:
        raise ConfigProblem(path, "", f"not a valid ModelConfig in protobuf text format: {e}") from None
    return config


def version_dirs(model_dir: str) -> list[int]:
    out = []
    for entry in os.listdir(model_dir):
        if entry.isdigit() and os.path.isdir(os.path.join(model_dir, entry)):
            out.append(int(entry))
    return sorted(out)


def resolve_backend(config: mc.ModelConfig, model_dir: str, versions: list[int], path: str) -> tuple[str, str]:
    """(backend, platform) from `backend`, `platform`, or the model file that is present."""
    if config.backend:
        backend = config.backend
        if config.platform and backends.PLATFORMS.get(config.platform, backend) != backend:
            raise ConfigProblem(path, "platform", f"platform '{config.platform}' does not go with "
                                f"backend '{backend}'; give one of them, or a matching pair")
        platform = config.platform
        described = backends.get(backend)
        if not platform and described is not None and len(described.formats) > 1:
            platform = _format_present(described, config, model_dir, versions)
    elif config.platform:
        if config.platform not in backends.PLATFORMS:
            raise ConfigProblem(path, "platform", f"unknown platform '{config.platform}'; known: "
                                + ", ".join(sorted(backends.PLATFORMS)))
        backend, platform = backends.PLATFORMS[config.platform], config.platform
    else:
        found = None
        for v in reversed(versions):
            for fname, pair in backends.MODEL_FILES.items():
                if os.path.exists(os.path.join(model_dir, str(v), config.default_model_filename or fname)):
                    found = pair
                    break
            if found:
                break
        if found is None:
            raise ConfigProblem(path, "backend", "no backend or platform given and no model file "
                                "(" + ", ".join(backends.MODEL_FILES) + ") found in a version directory; set "
                                "backend or platform")
        backend, platform = found
    described = backends.get(backend)
    if described is None:
        known = ", ".join(sorted(backends.BACKENDS))
        raise ConfigProblem(path, "backend", f"backend '{backend}' is not available in this server "
                            f"(available: {known}; a python-based backend is found in --backend-directory)")
    if len(described.formats) == 1:
        platform = described.platform
    return backend, platform


def _format_present(backend: backends.Backend, config: mc.ModelConfig, model_dir: str, versions: list[int]) -> str:
    """The platform of a backend with several model formats, from the model file named or present in
    the newest version that has one (its other formats looked for before its default); the default
    where none is."""
    formats = [*backend.formats[1:], backend.formats[0]]
    for v in reversed(versions):
        for f in formats:
            if config.default_model_filename.endswith(os.path.splitext(f.file)[1]) or \
                    os.path.exists(os.path.join(model_dir, str(v), f.file)):
                return f.platform
    return backend.platform


def load(model_dir: str, auto_complete: bool = True, override: str | None = None,
         max_batch_sizes: dict[str, int] | None = None, config_name: str = "", model_name: str = "",
         backend_directory: str = "", environments: python_envs.Environments | None = None) -> Completed:
    """Parse, complete and check the configuration of the model in `model_dir`; `override` is a
    ModelConfig in JSON that replaces config.pbtxt (the repository API's `config` parameter).

    Raises ConfigProblem on the first problem; `check_all` collects them instead.
    """
    problems = check_all(model_dir, auto_complete, override, max_batch_sizes=max_batch_sizes, config_name=config_name,
                         model_name=model_name, backend_directory=backend_directory, environments=environments)
    if isinstance(problems, Completed):
        return problems
    raise problems[0]


def check_all(model_dir: str, auto_complete: bool = True, override: str | None = None, inspect: bool = False,
              max_batch_sizes: dict[str, int] | None = None, config_name: str = "",
              model_name: str = "", backend_directory: str = "",
              environments: python_envs.Environments | None = None) -> Completed | list[ConfigProblem]:
    """Every problem of the model in `model_dir`, or its completed configuration: its config read,
    its model files found, the config completed, then checked, in Triton's order. With `inspect`,
    a framework model's files are read (in a short-lived process) to check the config against them
    even where nothing needs completing, as `tritonmp check` does; otherwise its worker checks that
    when it loads. `max_batch_sizes` (backend, or "" for all -> size) is the max_batch_size that
    auto-complete gives a batchable model (Triton's --backend-config default-max-batch-size);
    `config_name` picks configs/NAME.pbtxt over config.pbtxt where it exists (--model-config-name).
    `model_name`: the model's name where it is not its folder's (a repository registered with names
    for its folders), which its config then takes whatever it says. `backend_directory`: where
    python-based backends are (--backend-directory; "": none). `environments`: where a python model's
    own environment (EXECUTION_ENV_PATH) is unpacked and probed (None: the default cache)."""
    model_dir = os.path.abspath(model_dir)
    read = read_config(model_dir, auto_complete, override, config_name)
    if isinstance(read, ConfigProblem):
        return [read]
    config, path = read
    problems = []
    name = model_name or os.path.basename(model_dir)
    if not config.name or name != os.path.basename(model_dir):  # a folder served under another name: its name
        config.name = name
    elif config.name != name:
        problems.append(ConfigProblem(path, "name", f"'{config.name}' differs from the model's directory "
                                      f"name '{name}'; they must be the same"))
    found = find_model(config, model_dir, path, backend_directory)
    if isinstance(found, ConfigProblem):
        return problems + [found]
    if found.backend.name == "python":
        try:
            found.python_env = (environments or python_envs.Environments()).prepare(
                config, model_dir, path, os.path.dirname(found.newest_file(config)))
        except ConfigProblem as e:
            return problems + [e]
    done, more = complete(config, found, path, auto_complete, inspect, max_batch_sizes or {})
    problems += more
    if not done:
        return problems
    problems += check(config, found, path)
    if problems:
        return problems
    normalize(config)
    return Completed(config=config, backend=found.backend.name, model_dir=model_dir, versions=found.present,
                     code_file=found.code_file, python_env=found.python_env)


def read_config(model_dir: str, auto_complete: bool, override: str | None,
                config_name: str) -> tuple[mc.ModelConfig, str] | ConfigProblem:
    """The model's config as written (config.pbtxt, configs/NAME.pbtxt, or a load request's JSON; an
    empty one to auto-complete where there is none), and where it came from."""
    path = os.path.join(model_dir, "config.pbtxt")
    if config_name and os.path.isfile(os.path.join(model_dir, "configs", config_name + ".pbtxt")):
        path = os.path.join(model_dir, "configs", config_name + ".pbtxt")
    if override is not None:
        path = "the load request's 'config' parameter"
        config = mc.ModelConfig()
        try:
            json_format.Parse(override, config)
        except json_format.ParseError as e:
            return ConfigProblem(path, "", f"not a valid ModelConfig in JSON: {e}")
        return config, path
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            try:
                return parse_text(f.read(), path), path
            except ConfigProblem as e:
                return e
    if auto_complete:
        return mc.ModelConfig(), path
    return ConfigProblem(path, "", "missing, and auto-complete is disabled (--disable-auto-complete-config); write "
                         "a config.pbtxt")


@dataclass
class FoundModel:
    """A model's backend and platform, and the versions whose directory holds its model file."""

    backend: backends.Backend
    platform: str
    model_dir: str
    present: list[int]
    code_file: str = ""  # a python-based backend's model.py, which every version runs
    python_env: python_envs.PythonEnv | None = None  # a python model's own environment

    def newest_file(self, config: mc.ModelConfig) -> str:
        return self.code_file or os.path.join(self.model_dir, str(self.present[-1]), config.default_model_filename)


def find_model(config: mc.ModelConfig, model_dir: str, path: str,
               backend_directory: str = "") -> FoundModel | ConfigProblem:
    """The model's backend, platform and model files; the config gets the backend, the platform and
    the default model file name it leaves out. A backend that is not built in is a python-based one
    of `backend_directory`, whose models run its model.py on the python backend."""
    versions = version_dirs(model_dir)
    if not versions:
        return ConfigProblem(model_dir, "", "no version directory (a directory named by a number, such as 1/, "
                             "holding the model file)")
    if config.backend and backends.get(config.backend) is None and backend_directory:
        try:
            based = python_backends.find(config, backend_directory, path)
        except ConfigProblem as e:
            return e
        return FoundModel(backends.BACKENDS["python"], "", model_dir, versions, based.code_file)
    try:
        backend, platform = resolve_backend(config, model_dir, versions, path)
    except ConfigProblem as e:
        return e
    described = backends.BACKENDS[backend]
    config.backend = "" if backend == "ensemble" else backend
    config.platform = platform
    if not config.default_model_filename:
        config.default_model_filename = next((f.file for f in described.formats if f.platform == platform),
                                             described.default_file)
    present = [v for v in versions if backend == "ensemble"
               or os.path.exists(os.path.join(model_dir, str(v), config.default_model_filename))]
    if not present:
        missing = os.path.join(model_dir, str(versions[-1]), config.default_model_filename)
        return ConfigProblem(model_dir, "default_model_filename", (
            # Triton's words (its qa greps the log for them; clients see the path from the repository)
            f"Failed to preinitialize Python stub: Python model file not found in '{missing}'"
            if described.stub else f"no version directory holds '{config.default_model_filename}'"))
    return FoundModel(described, platform, model_dir, present)


def complete(config: mc.ModelConfig, found: FoundModel, path: str, auto_complete: bool, inspect: bool,
             max_batch_sizes: dict[str, int]) -> tuple[bool, list[ConfigProblem]]:
    """Complete the config's inputs, outputs and max_batch_size from the model as its backend reads it
    (the model's own auto_complete_config, its framework in a short-lived process, or the ONNX graph),
    checking the config against what was read; whether checking may go on, and the problems found."""
    backend = found.backend
    problems: list[ConfigProblem] = []
    if backend.tensors_from == "model" and auto_complete:
        try:
            python_complete(config, found.newest_file(config), found.python_env)
        except ConfigProblem as e:
            return False, [e]
    default_batch = max_batch_sizes.get(backend.name, max_batch_sizes.get("", model_io.DEFAULT_MAX_BATCH_SIZE))
    missing = backends.framework_missing(backend.name)
    if missing:
        return False, [ConfigProblem(path, "backend", missing)]
    if backend.tensors_from == "framework":
        incomplete = not config.input or not config.output
        if inspect or (auto_complete and incomplete):
            try:
                graph, max_batch = framework_io(backend.name, found.newest_file(config), config, default_batch)
            except ConfigProblem as e:
                return False, [e]
            if auto_complete:
                model_io.complete(config, graph, max_batch)
            problems += model_io.check(config, graph, path, backends.model_kind(backend.name, found.platform),
                                       all_inputs=True)
        elif incomplete:
            problems.append(ConfigProblem(path, "input" if not config.input else "output",
                                          "missing, and auto-complete is disabled (--disable-auto-complete-config); "
                                          "list every input and output"))
    if backend.tensors_needed and (not config.input or not config.output):
        problems.append(ConfigProblem(path, "input" if not config.input else "output", backend.tensors_needed))
    if backend.tensors_from == "onnx":
        graph_file = found.newest_file(config)
        try:
            graph = onnx_graph.read_io(graph_file)
        except ValueError as e:
            return False, problems + [ConfigProblem(graph_file, "", str(e))]
        if auto_complete:
            model_io.complete(config, graph, default_batch)
        problems += model_io.check(config, graph, path)
    return True, problems


def check(config: mc.ModelConfig, found: FoundModel, path: str) -> list[ConfigProblem]:
    """The completed config's own problems: each field as Triton checks it, its warmup samples, and an
    ensemble's steps."""
    problems = check_fields(config, path, found.backend.name)
    problems += warmup.check(config, found.model_dir, path)
    if found.backend.name == "ensemble":
        problems += check_ensemble(config, path)
    elif config.HasField("ensemble_scheduling"):
        problems.append(ConfigProblem(path, "ensemble_scheduling", "only an ensemble (platform: \"ensemble\") "
                                      "has ensemble_scheduling"))
    return problems


_PLAIN_MODEL_CLASS = re.compile(r"^class\s+TritonPythonModel\s*(\(\s*(object)?\s*\))?\s*:", re.MULTILINE)


def python_complete(config: mc.ModelConfig, model_py: str, env: python_envs.PythonEnv | None = None) -> None:
    """Let the model's own `auto_complete_config` fill the config, as Triton's python backend does.
    Runs in a short-lived process (the frontend never imports model code), in the model's own
    environment where it has one, unless the model file
    itself defines TritonPythonModel with no base class and never names the method (a model that
    imports its class from elsewhere, or derives it, may have one)."""
    import subprocess
    import sys

    with open(model_py, encoding="utf-8", errors="replace") as f:
        source = f.read()
    if "auto_complete_config" not in source and _PLAIN_MODEL_CLASS.search(source):
        return
    argv = [sys.executable, "-m", "tritonmp.workers.autocomplete", model_py]
    environ = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    if env is not None:
        argv, environ = env.argv("tritonmp.workers.autocomplete", model_py), env.environ(environ)
    result = subprocess.run(argv, input=json.dumps(to_json(config)), capture_output=True, text=True, timeout=120,
                            env=environ)
    if result.returncode != 0:
        raise ConfigProblem(model_py, "auto_complete_config", result.stderr.strip() or "failed")
    completed = mc.ModelConfig()
    try:
        json_format.ParseDict(json.loads(result.stdout), completed)
    except (ValueError, json_format.ParseError) as e:
        raise ConfigProblem(model_py, "auto_complete_config", f"returned a configuration that is not a valid "
                            f"ModelConfig: {e}") from None
    config.CopyFrom(completed)


def framework_io(backend: str, model_file: str, config: mc.ModelConfig,
                 default_batch: int = model_io.DEFAULT_MAX_BATCH_SIZE) -> tuple[tuple[list, list], int]:
    """The model's inputs and outputs as its framework reads them, in a short-lived process (the
    frontend never imports a framework), and the max_batch_size auto-complete gives it."""
    import subprocess
    import sys

    env = dict(os.environ)
    if not backends.BACKENDS[backend].introspect_on_gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        result = subprocess.run([sys.executable, "-m", "tritonmp.workers.introspect", backend, model_file],
                                input=json.dumps(to_json(config)), capture_output=True, text=True, timeout=600,
                                env=env)
    except subprocess.TimeoutExpired:
        raise ConfigProblem(model_file, "", "reading the model's inputs and outputs took over 600 s") from None
    if result.returncode != 0:
        lines = [ln for ln in result.stderr.strip().splitlines() if ln.strip()]
        raise ConfigProblem(model_file, "", lines[-1] if lines else f"cannot be read by the {backend} backend")
    doc = json.loads(result.stdout)
    graph = model_io.from_specs(doc["inputs"]), model_io.from_specs(doc["outputs"])
    return graph, int(doc.get("max_batch_size", default_batch))


def _check_tensors(kind: str, tensors, config: mc.ModelConfig, path: str) -> list[ConfigProblem]:
    problems = []
    seen = set()
    for i, t in enumerate(tensors):
        field = f"{kind}[{i}]"
        if not t.name:
            problems.append(ConfigProblem(path, field + ".name", "empty; every tensor needs a name"))
        elif t.name in seen:
            problems.append(ConfigProblem(path, field + ".name", f"'{t.name}' appears twice"))
        seen.add(t.name)
        if t.data_type == mc.TYPE_INVALID:
            problems.append(ConfigProblem(path, field + ".data_type", "missing; set one such as TYPE_FP32"))
        if any(d < -1 or d == 0 for d in t.dims):
            problems.append(ConfigProblem(path, field + ".dims", f"{list(t.dims)}: each dimension must "
                                          "be a positive size or -1 for a variable one"))
        if not t.dims:
            problems.append(ConfigProblem(path, field + ".dims", "missing; give the tensor's shape "
                                          "(without the batch dimension when max_batch_size > 0)"))
        else:
            problems += [ConfigProblem(path, field + ".reshape", message)
                         for message in reshape.problems(t, kind, config.max_batch_size)]
        label_file = getattr(t, "label_filename", "")
        if label_file and not os.path.isfile(os.path.join(os.path.dirname(path), label_file)):
            problems.append(ConfigProblem(path, field + ".label_filename", f"'{label_file}' is not a file in "
                                          "the model directory"))
    return problems


def _check_states(config: mc.ModelConfig, path: str) -> list[ConfigProblem]:
    """sequence_batching.state: implicit state, which the server gives the model as an input with every
    request of a sequence and takes back from its output."""
    problems = []
    inputs = {t.name for t in config.input}
    model_dir = os.path.dirname(path)
    for i, state in enumerate(config.sequence_batching.state):
        field = f"sequence_batching.state[{i}]"
        if not state.input_name or not state.output_name:
            problems.append(ConfigProblem(path, field, "needs input_name and output_name"))
        if state.input_name in inputs:
            problems.append(ConfigProblem(path, field + ".input_name", f"'{state.input_name}' is also listed as a "
                                          "model input; a state's input is given by the server, not by clients"))
        if state.data_type == mc.TYPE_INVALID or not state.dims:
            problems.append(ConfigProblem(path, field, "needs data_type and dims"))
        if config.model_transaction_policy.decoupled:
            problems.append(ConfigProblem(path, field, "implicit state with a decoupled model is not supported by "
                                          "this server yet"))
        for init in state.initial_state:
            where = field + ".initial_state"
            if any(d < 1 for d in init.dims):
                problems.append(ConfigProblem(path, where + ".dims", "an initial state has fixed dimensions"))
            if init.WhichOneof("state_data") is None:
                problems.append(ConfigProblem(path, where, "needs zero_data or data_file"))
            elif init.WhichOneof("state_data") == "data_file" and \
                    not os.path.isfile(os.path.join(model_dir, "initial_state", init.data_file)):
                problems.append(ConfigProblem(path, where + ".data_file", f"'{init.data_file}' is not a file in "
                                              "the model's initial_state directory"))
    return problems


def check_fields(config: mc.ModelConfig, path: str, runner: str) -> list[ConfigProblem]:
    """The fields' own problems; `runner`: the backend that runs the model (python for a python-based
    backend's models)."""
    problems = []
    if config.max_batch_size < 0:
        problems.append(ConfigProblem(path, "max_batch_size", "must be 0 (no batching) or positive"))
    # no inputs, or no outputs, is a model Triton serves too (a generator, a health check, a sink)
    problems += _check_tensors("input", config.input, config, path)
    problems += _check_tensors("output", config.output, config, path)
    if config.HasField("dynamic_batching"):
        db = config.dynamic_batching
        if config.max_batch_size == 0:
            problems.append(ConfigProblem(path, "dynamic_batching", "needs max_batch_size > 0; set "
                                          "max_batch_size or remove dynamic_batching"))
        if db.priority_levels and not 1 <= db.default_priority_level <= db.priority_levels:
            problems.append(ConfigProblem(path, "dynamic_batching.default_priority_level",
                                          f"{db.default_priority_level} must lie between 1 and priority_levels "
                                          f"({db.priority_levels})"))
        for level in db.priority_queue_policy:
            if not 1 <= level <= db.priority_levels:
                problems.append(ConfigProblem(path, "dynamic_batching.priority_queue_policy",
                                              f"level {level} is not one of the priority levels 1 to "
                                              f"{db.priority_levels}"))
        for size in db.preferred_batch_size:
            if size < 1 or (config.max_batch_size and size > config.max_batch_size):
                problems.append(ConfigProblem(path, "dynamic_batching.preferred_batch_size",
                                              f"{size} must lie between 1 and max_batch_size "
                                              f"({config.max_batch_size})"))
    problems += [ConfigProblem(path, field, message) for field, message in ragged.problems(config, runner)]
    if config.HasField("sequence_batching"):
        sb = config.sequence_batching
        if config.HasField("dynamic_batching"):
            problems.append(ConfigProblem(path, "sequence_batching", "a model has either dynamic_batching or "
                                          "sequence_batching, not both"))
        problems += _check_states(config, path)
        if sb.iterative_sequence and not backends.one_by_one(runner):
            problems.append(ConfigProblem(
                path, "sequence_batching.iterative_sequence", f"not served for the {runner}'s "
                "backend: an iterative sequence runs for as long as its model reschedules its request, and only a "
                "python model can (request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)); "
                "the framework backends run each request once"))
        for i, c in enumerate(sb.control_input):
            for control in c.control:
                if control.kind == mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID:
                    continue
                pair = control.int32_false_true or control.fp32_false_true or control.bool_false_true
                if len(pair) != 2:
                    problems.append(ConfigProblem(path, f"sequence_batching.control_input[{i}]",
                                                  f"control '{c.name}' needs a false and a true value "
                                                  "(int32_false_true, fp32_false_true or bool_false_true)"))
    if config.model_transaction_policy.decoupled and runner != "ensemble" and not backends.one_by_one(runner):
        problems.append(ConfigProblem(path, "model_transaction_policy.decoupled",
                                      f"only python models can be decoupled here, not {runner} ones"))
    for i, group in enumerate(config.instance_group):
        if group.count < 0:
            problems.append(ConfigProblem(path, f"instance_group[{i}].count", "must be positive"))
        if group.kind not in (mc.ModelInstanceGroup.KIND_AUTO, mc.ModelInstanceGroup.KIND_CPU,
                              mc.ModelInstanceGroup.KIND_GPU, mc.ModelInstanceGroup.KIND_MODEL):
            problems.append(ConfigProblem(path, f"instance_group[{i}].kind",
                                          f"{mc.ModelInstanceGroup.Kind.Name(group.kind)} is not "
                                          "supported; use KIND_CPU, KIND_GPU, KIND_AUTO or KIND_MODEL"))
    vp = config.version_policy
    if vp.WhichOneof("policy_choice") == "specific" and not vp.specific.versions:
        problems.append(ConfigProblem(path, "version_policy.specific.versions", "empty; list versions"))
    if vp.WhichOneof("policy_choice") == "latest" and vp.latest.num_versions < 1:
        problems.append(ConfigProblem(path, "version_policy.latest.num_versions", "must be at least 1"))
    return problems


def check_ensemble(config: mc.ModelConfig, path: str) -> list[ConfigProblem]:
    """The steps of an ensemble: each names a model, and its tensors flow from the ensemble's inputs
    through earlier steps to the ensemble's outputs, without cycles or loose ends."""
    steps = config.ensemble_scheduling.step
    if not steps:
        return [ConfigProblem(path, "ensemble_scheduling.step", "an ensemble needs at least one step")]
    problems = []
    available = {t.name for t in config.input}
    produced_by: dict[str, int] = {}
    for i, step in enumerate(steps):
        if not step.model_name:
            problems.append(ConfigProblem(path, f"ensemble_scheduling.step[{i}].model_name", "missing"))
        if step.model_name == config.name:
            problems.append(ConfigProblem(path, f"ensemble_scheduling.step[{i}].model_name",
                                          "an ensemble cannot call itself"))
        for tensor in step.output_map.values():
            if tensor in produced_by or tensor in available:
                problems.append(ConfigProblem(path, f"ensemble_scheduling.step[{i}].output_map",
                                              f"ensemble tensor '{tensor}' is produced more than once"))
            produced_by[tensor] = i
    # a step may run once all its inputs exist: check that every step can run, in some order
    known, pending = set(available), list(range(len(steps)))
    while pending:
        ready = [i for i in pending if set(steps[i].input_map.values()) <= known]
        if not ready:
            for i in pending:
                missing = sorted(set(steps[i].input_map.values()) - known)
                problems.append(ConfigProblem(path, f"ensemble_scheduling.step[{i}].input_map",
                                              f"ensemble tensor(s) {', '.join(missing)} are neither ensemble inputs "
                                              "nor produced by another step (or they form a cycle)"))
            break
        for i in ready:
            known.update(steps[i].output_map.values())
            pending.remove(i)
    for t in config.output:
        if t.name not in produced_by:
            problems.append(ConfigProblem(path, "output", f"ensemble output '{t.name}' is produced by no step"))
    used = {name for step in steps for name in step.input_map.values()}
    for t in config.input:
        if t.name not in used:
            problems.append(ConfigProblem(path, "input", f"ensemble input '{t.name}' is used by no step"))
    return problems


def normalize(config: mc.ModelConfig) -> None:
    """Fill the defaults Triton fills, so that config and metadata answers match Triton's."""
    if not config.version_policy.WhichOneof("policy_choice"):
        config.version_policy.latest.num_versions = 1
    if config.HasField("dynamic_batching") and not config.dynamic_batching.preferred_batch_size:
        config.dynamic_batching.preferred_batch_size.append(config.max_batch_size)
    opt = config.optimization
    if not opt.HasField("input_pinned_memory"):
        opt.input_pinned_memory.enable = True
    if not opt.HasField("output_pinned_memory"):
        opt.output_pinned_memory.enable = True
    for i, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{i}"
        if group.count == 0:
            group.count = 1


def version_is_wanted(config: mc.ModelConfig, available: list[int]) -> list[int]:
    """The versions the version policy serves, ascending."""
    vp = config.version_policy
    which = vp.WhichOneof("policy_choice")
    if which == "all":
        return list(available)
    if which == "specific":
        return [v for v in available if v in set(vp.specific.versions)]
    n = vp.latest.num_versions or 1
    return list(available[-n:])


def _is_repeated(field: FieldDescriptor) -> bool:
    """Whether a field is a list; protobuf 6 deprecates `label` in favour of `is_repeated`."""
    is_repeated = getattr(field, "is_repeated", None)
    if is_repeated is not None:
        return bool(is_repeated)
    return field.label == FieldDescriptor.LABEL_REPEATED


def to_json(message) -> dict:
    """A protobuf message as Triton prints it: every scalar and list, 64-bit integers as numbers,
    enums by name, message fields only when set."""
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        is_map = field.message_type is not None and field.message_type.GetOptions().map_entry
        repeated = _is_repeated(field)
        value = getattr(message, field.name)
        if is_map:
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = {k: (to_json(v) if value_field.message_type else v) for k, v in value.items()}
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            if repeated:
                out[field.name] = [to_json(v) for v in value]
            elif message.HasField(field.name):
                out[field.name] = to_json(value)
        elif field.type == FieldDescriptor.TYPE_ENUM:
            names = field.enum_type.values_by_number
            out[field.name] = [names[v].name for v in value] if repeated else names[value].name
        elif repeated:
            out[field.name] = list(value)
        else:
            if field.containing_oneof is not None and not message.HasField(field.name):
                continue
            out[field.name] = value
    return out


def metadata_shape(config: mc.ModelConfig, dims) -> list[int]:
    return ([-1] if config.max_batch_size > 0 else []) + list(dims)


def tensor_datatype(tensor) -> str:
    return datatypes.from_config(mc.DataType.Name(tensor.data_type))
