"""The architecture that docs/architecture.md draws, held by the code: the package's modules import
each other without cycles and only downwards through its layers, and no module grows past the size
a reader can take in without a stated reason."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "tritonmp"

# Lowest first: a module imports from its own layer and those below it, never from one above.
# Each entry is a module or a package (every module in it), as named under tritonmp.
LAYERS: list[tuple[str, list[str]]] = [
    ("foundation", ["errors", "logs", "testing", "settings", "datatypes", "inference", "gpus", "backends",
                    "host_policy", "metrics_config"]),
    ("observability", ["observability"]),
    ("model storage", ["storage"]),
    ("model configuration", ["repository"]),
    ("the wire", ["ipc"]),
    ("worker processes and instances", ["workers", "instances"]),
    ("served versions and request checks", ["served", "validation", "classification"]),
    ("scheduling", ["scheduling"]),
    ("model lifecycle", ["lifecycle"]),
    ("reports", ["reports"]),
    ("server api", ["server_api"]),
    ("frontends", ["frontends"]),
    ("assembly", ["runtime", "command", "triton_flags", "cli", "__main__", "tritonserver", "tritonfrontend",
                  "ray_serve", "sagemaker_serve", "as_triton"]),
]

# Modules over MAX_LINES, each with the reason it is one module.
MAX_LINES = 500
LARGE = {
    "frontends/http2.py": "one HTTP/2 connection's state machine (RFC 9113): frames, streams and flow control "
                          "read together",
    "workers/pb_utils.py": "triton_python_backend_utils: the public names of Triton's python backend API, "
                           "in one module as models import it",
    "frontends/http_protocol.py": "uvicorn's HTTP/1.1 protocol with its guards and the fast infer path, which "
                                  "share the connection's state",
    "repository/config.py": "reading, auto-completing and checking config.pbtxt, in Triton's order",
    "frontends/grpc_protocol.py": "one gRPC call's life on an HTTP/2 stream: its messages cut from the stream, "
                                  "its deadline, and its answer, which share the call's state",
}


# Functions over MAX_FUNCTION_LINES, each with the reason it is one function.
MAX_FUNCTION_LINES = 60
LONG_FUNCTIONS = {
    "repository/config.py:check_fields": "one check per field of ModelConfig that Triton validates, in its order",
    "repository/model_io.py:check": "config against model, tensor by tensor, every mismatch reported at once",
    "cli.py:serve_parser": "the argparse declarations of Triton's flags, one statement each",
    "triton_flags.py:add_to": "the argparse declarations of the rest of Triton's flags, one statement each",
    "cli.py:serve": "flags to settings, one statement each, in the order Triton applies them",
    "validation.py:_check_in_order": "the rules of a request, in Triton's order and words, for whatever the "
                                     "one pass does not take",
    "frontends/http_codec.py:_general_request": "the KServe JSON request in full, every field in the order Triton "
                                                "reads it",
    "frontends/http_codec.py:_typed_request": "the typed one-pass decode of the common request, written out: it "
                                              "runs for every request",
    "frontends/grpc_server.py:ModelStreamInfer": "one bidirectional stream: its reader, its per-request tasks and "
                                                 "its writer share the stream's state",
    "instances/instance.py:_on_result": "a batch's answers: decoded, counted, traced and settled in one pass, per "
                                  "request; it runs for every batch",
    "workers/main.py:run_batch": "a batch in the worker: inputs, execute, outputs in one pass, timed; it runs "
                                 "for every batch",
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path], typing_too: bool = False) -> set[str]:
    """The package's modules that `name` imports when it runs, and with `typing_too` those it imports
    only for the type checker as well."""
    tree = ast.parse(path.read_text())
    typing_only = set() if typing_too else {
        id(n) for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)] if node.level > 1 else package
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                if not (node.module or "").startswith("tritonmp"):
                    continue
                target = node.module.removeprefix("tritonmp").lstrip(".")
            submodules = [f"{target}.{a.name}".lstrip(".") for a in node.names]
            # `from package import module` depends on the module (the package is its parent anyway)
            candidates = [c for c in submodules if c in modules] or [target]
        elif isinstance(node, ast.Import):
            candidates = [a.name.removeprefix("tritonmp").lstrip(".") for a in node.names
                          if a.name.startswith("tritonmp")]
        else:
            continue
        out.update(c for c in candidates if c in modules and c and c != name)
    return out


def _layer(name: str) -> int:
    for rank, (_, members) in enumerate(LAYERS):
        for member in members:
            if name == member or name.startswith(member + "."):
                return rank
    raise AssertionError(f"tritonmp.{name} belongs to no layer: add it to LAYERS and to docs/architecture.md")


def test_every_module_belongs_to_a_layer_and_imports_only_downwards():
    modules = _modules()
    upward = []
    for name, path in modules.items():
        if not name:
            continue
        for target in _imports(name, path, modules):
            if _layer(target) > _layer(name):
                upward.append(f"{name} ({LAYERS[_layer(name)][0]}) imports {target} ({LAYERS[_layer(target)][0]})")
    assert not upward, "\n".join(sorted(upward))


def test_no_import_cycles_not_even_for_the_type_checker():
    modules = _modules()
    graph = {name: _imports(name, path, modules, typing_too=True) for name, path in modules.items()}
    state: dict[str, int] = defaultdict(int)  # 0 unseen, 1 on the current path, 2 done
    cycles = []

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in sorted(graph[name]):
            if state[target] == 1:
                cycles.append(" -> ".join([*path[path.index(target):], target]))
            elif state[target] == 0:
                visit(target, [*path, target])
        state[name] = 2

    for name in sorted(graph):
        if state[name] == 0:
            visit(name, [name])
    assert not cycles, "\n".join(cycles)


def test_functions_stay_short_or_say_why():
    long = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(PACKAGE)}:{node.name}"] = lines
    unexplained = {name: n for name, n in long.items() if name not in LONG_FUNCTIONS}
    assert not unexplained, f"functions over {MAX_FUNCTION_LINES} lines without a stated reason: {unexplained}"
    stale = [name for name in LONG_FUNCTIONS if name not in long]
    assert not stale, f"listed as long but no longer are (take them off LONG_FUNCTIONS): {stale}"


def test_modules_stay_small_or_say_why():
    sizes = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    over = {name: n for name, n in sizes.items() if n > MAX_LINES and name not in LARGE}
    assert not over, f"modules over {MAX_LINES} lines without a stated reason (LARGE): {over}"
    stale = [name for name in LARGE if sizes.get(name, 0) <= MAX_LINES]
    assert not stale, f"listed as large but no longer are (take them off LARGE): {stale}"


def test_every_package_of_the_source_tree_is_installed():
    """pyproject.toml lists packages by name: a new subpackage missing there works from a checkout
    (editable install) and is absent from the wheel users install."""
    from pathlib import Path

    import tomllib

    root = Path(__file__).resolve().parent.parent
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"tritonmp." + ".".join(p.parent.relative_to(root / "tritonmp").parts)
             for p in (root / "tritonmp").rglob("__init__.py") if p.parent != root / "tritonmp"}
    assert found | {"tritonmp", "tritonmp.workers"} <= listed


def test_no_module_reaches_into_a_private_name_of_another_layers_module():
    """`module._name` where `module` is a package module of another layer: what another layer may use
    of a module is its public names."""
    modules = _modules()
    reaches = []
    for name, path in modules.items():
        if not name:
            continue
        tree = ast.parse(path.read_text())
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        local: dict[str, str] = {}  # a name bound to a package module -> that module
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[:len(package) - (node.level - 1)] if node.level > 1 else package
                    target = ".".join([*base, *([node.module] if node.module else [])])
                elif (node.module or "").startswith("tritonmp"):
                    target = node.module.removeprefix("tritonmp").lstrip(".")
                else:
                    continue
                for alias in node.names:
                    full = f"{target}.{alias.name}".lstrip(".")
                    if full in modules:
                        local[alias.asname or alias.name] = full
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.attr.startswith("_")
                    and not node.attr.startswith("__") and node.value.id in local):
                target = local[node.value.id]
                if _layer(target) != _layer(name):
                    reaches.append(f"{name}:{node.lineno} reads {target}.{node.attr}")
    assert not reaches, "\n".join(reaches)
