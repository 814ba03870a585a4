"""A python model's own Python environment (its config's EXECUTION_ENV_PATH), as Triton's python
backend reads it: `$$TRITON_MODEL_DIRECTORY` stands for the model's directory; a `.tar.gz` archive
(conda-pack's, venv-pack's, or any packed environment) is unpacked once into a cache keyed by its
content, so that instances, restarts, reloads and later servers share one copy and concurrent loads
of one archive unpack it once; a directory (an unpacked environment, or any virtual environment) is
used in place. Beyond Triton, with --python-env-from-requirements a python model that names no
environment but has a `requirements.txt` beside its model.py gets one built for it: a virtual
environment of the server's Python with those requirements (uv where it is installed, else venv and
pip), built once per requirements' content into the same cache; a build that fails fails the load
with its log.

The model's workers, and its auto-complete run, are started by exec with that environment's
interpreter, its packages first, its bin/ on PATH and its lib/ on LD_LIBRARY_PATH, and the user's
site-packages off (PYTHONNOUSERSITE, as Triton sets for its stubs). What the worker runtime needs
reaches that interpreter without being installed there: a small runtime directory (in the cache)
links tritonmp's package, put before the environment's packages, and the runtime's compiled
dependencies (msgspec, posix_ipc, ml_dtypes, typing_extensions), put after them, so an environment
that has its own keeps its own. numpy is the model's: it comes from the environment. An environment
whose Python or numpy the worker cannot run with fails the load, naming what is missing (a probe run
once per environment; a passed probe is remembered in the cache for as long as the environment's
packages do not change)."""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import zlib
from dataclasses import dataclass, field

from tritonclient.grpc import model_config_pb2 as mc

from ..logs import get_logger
from .problems import ConfigProblem

log = get_logger("models")
PARAMETER = "EXECUTION_ENV_PATH"
MODEL_DIRECTORY = "$$TRITON_MODEL_DIRECTORY"
REQUIREMENTS = "requirements.txt"
RUNTIME_DEPENDENCIES = ("msgspec", "posix_ipc", "ml_dtypes", "typing_extensions")
MIN_NUMPY = (1, 23)
# how a worker starts in the environment's interpreter: tritonmp first, the environment's packages,
# then the runtime's dependencies; then the module runs as `python -m` would run it
_BOOT = ("import runpy, sys; first, after, module = sys.argv[1:4]; sys.path.insert(0, first); "
         "sys.path.append(after); sys.argv = [module, *sys.argv[4:]]; "
         "runpy.run_module(module, run_name='__main__', alter_sys=True)")


def default_cache() -> str:
    """Where environments are unpacked unless --python-env-cache says otherwise."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tritonmp", "python-envs")


@dataclass(frozen=True)
class PythonEnv:
    """A prepared environment: where it came from, its directory and its interpreter."""

    source: str  # EXECUTION_ENV_PATH, resolved
    root: str  # the environment's directory (an archive's: its unpacked copy)
    python: str  # its interpreter
    runtime: tuple[str, str] = ("", "")  # the runtime's directories: before, and after the environment's packages
    facts: dict = field(default_factory=dict, compare=False)  # what the probe found: python, numpy

    def argv(self, module: str, *args: str) -> list[str]:
        """The command that runs `python -m module args` in this environment with the worker runtime."""
        return [self.python, "-c", _BOOT, *self.runtime, module, *args]

    def environ(self, base: dict[str, str]) -> dict[str, str]:
        """`base` as the environment's activation makes it, the server's own Python settings left out."""
        env = {k: v for k, v in base.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "CONDA_PREFIX",
                                                          "PYTHONSTARTUP", "PYTHONEXECUTABLE")}
        bin_dir, lib_dir = os.path.join(self.root, "bin"), os.path.join(self.root, "lib")
        env["PATH"] = bin_dir + (os.pathsep + base["PATH"] if base.get("PATH") else "")
        env["LD_LIBRARY_PATH"] = lib_dir + (os.pathsep + base["LD_LIBRARY_PATH"] if base.get("LD_LIBRARY_PATH") else "")
        env["VIRTUAL_ENV" if os.path.exists(os.path.join(self.root, "pyvenv.cfg")) else "CONDA_PREFIX"] = self.root
        env["PYTHONNOUSERSITE"] = "1"
        return env


def named_path(config: mc.ModelConfig, model_dir: str) -> str:
    """The config's EXECUTION_ENV_PATH with $$TRITON_MODEL_DIRECTORY resolved, as an absolute path;
    "" where it names none."""
    if PARAMETER not in config.parameters:
        return ""
    path = config.parameters[PARAMETER].string_value.strip()
    if not path:
        return ""
    if path.startswith(MODEL_DIRECTORY):
        path = model_dir + path[len(MODEL_DIRECTORY):]
    elif "://" in path:
        raise ConfigProblem("", f"parameters.{PARAMETER}", f"'{path}' is in object storage: an environment "
                            "there is served from the model's own folder ($$TRITON_MODEL_DIRECTORY/...), which is "
                            "copied with the model")
    return os.path.normpath(os.path.join(model_dir, path))


class Environments:
    """The environments of one server's models: archives unpacked into `cache`, each environment
    probed once."""

    def __init__(self, cache: str = "", from_requirements: bool = False):
        self.cache = os.path.abspath(cache or default_cache())
        self.from_requirements = from_requirements  # --python-env-from-requirements
        self._lock = threading.Lock()
        self._unpacking: dict[str, threading.Lock] = {}
        self._digests: dict[tuple[str, int, int], str] = {}
        self._probed: dict[str, PythonEnv] = {}
        self._runtime: tuple[str, str] | None = None

    def prepare(self, config: mc.ModelConfig, model_dir: str, where: str, code_dir: str = "") -> PythonEnv | None:
        """The model's environment ready to run its workers, or None where its config names none (and,
        with from_requirements, `code_dir`, its model.py's directory, has no requirements.txt);
        ConfigProblem (about `where`) where it cannot be used, with the reason."""
        try:
            source = named_path(config, model_dir)
        except ConfigProblem as e:
            raise ConfigProblem(where, e.field, e.message) from None
        requirements = os.path.join(code_dir, REQUIREMENTS) if code_dir else ""
        if not source and self.from_requirements and requirements and os.path.isfile(requirements):
            try:
                return self._probe(requirements, self._built(requirements))
            except ConfigProblem as e:
                raise ConfigProblem(where, e.field or REQUIREMENTS, e.message) from None
        if not source:
            return None
        try:
            if os.path.isdir(source):
                root = source
            elif os.path.isfile(source):
                root = self._unpacked(source)
            else:
                raise ConfigProblem(where, f"parameters.{PARAMETER}", f"'{source}' does not exist")
            return self._probe(source, root)
        except ConfigProblem as e:
            raise ConfigProblem(where, e.field, e.message) from None

    # -- archives --------------------------------------------------------------------------------
    def _digest(self, archive: str) -> str:
        st = os.stat(archive)
        key = (os.path.realpath(archive), st.st_size, st.st_mtime_ns)
        with self._lock:
            known = self._digests.get(key)
        if known:
            return known
        h = hashlib.sha256()
        with open(archive, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        digest = h.hexdigest()[:32]
        with self._lock:
            self._digests[key] = digest
        return digest

    def _unpacked(self, archive: str) -> str:
        """The directory holding `archive` unpacked: the cache's copy of its content."""
        return self._once(os.path.join(self.cache, "archives", self._digest(archive)),
                          lambda dest: self._unpack(archive, dest))

    def _once(self, dest: str, make) -> str:
        """`dest`, made by `make(dest)` where it is not there yet: by one load (in this process and any
        other sharing the cache) while the others wait for it."""
        if os.path.isdir(dest):
            return dest
        with self._lock:
            lock = self._unpacking.setdefault(dest, threading.Lock())
        with lock:
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with open(dest + ".lock", "w") as held:
                fcntl.flock(held, fcntl.LOCK_EX)  # another server making the same
                if not os.path.isdir(dest):
                    make(dest)
        return dest

    # -- environments built from requirements ----------------------------------------------------
    def _built(self, requirements: str) -> str:
        """The environment of `requirements` (a requirements.txt) for the server's Python, built once
        for its content."""
        with open(requirements, "rb") as f:
            content = f.read()
        key = hashlib.sha256(sys.version.encode() + b"\0" + content).hexdigest()[:32]
        return self._once(os.path.join(self.cache, "requirements", key), lambda dest: self._build(requirements, dest))

    def _build(self, requirements: str, dest: str) -> None:
        log.info("Building Python execution env from %s into %s", requirements, dest)
        partial = tempfile.mkdtemp(prefix=os.path.basename(dest) + ".partial-", dir=os.path.dirname(dest))
        uv = shutil.which("uv") or shutil.which("uv", path=os.path.dirname(sys.executable))
        python = os.path.join(partial, "bin", "python")
        steps = [[uv, "venv", "-q", "--python", sys.executable, partial],
                 [uv, "pip", "install", "--python", python, "-r", requirements]] if uv else \
            [[sys.executable, "-m", "venv", partial],
             [python, "-m", "pip", "install", "--disable-pip-version-check", "-r", requirements]]
        output = []
        for step in steps:
            try:
                done = subprocess.run(step, capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL)
            except (OSError, subprocess.TimeoutExpired) as e:
                done = subprocess.CompletedProcess(step, 1, "", str(e))
            output.append(f"$ {' '.join(step)}\n{done.stdout}{done.stderr}")
            if done.returncode != 0:
                shutil.rmtree(partial, ignore_errors=True)
                lines = "".join(output).strip().splitlines()
                raise ConfigProblem("", REQUIREMENTS, f"building an environment from '{requirements}' failed; its "
                                    "log:\n" + "\n".join(lines[-40:]))
        os.rename(partial, dest)

    def _unpack(self, archive: str, dest: str) -> None:
        log.info("Extracting Python execution env %s into %s", archive, dest)
        partial = tempfile.mkdtemp(prefix=os.path.basename(dest) + ".partial-", dir=os.path.dirname(dest))
        try:
            with tarfile.open(archive, "r:*") as tar:
                # the 'tar' filter refuses members outside the destination (absolute, '..', or through
                # a link), as Triton's extraction does, and keeps an environment's own links
                tar.extractall(partial, filter="tar")
        except (tarfile.TarError, EOFError, OSError, zlib.error, ValueError) as e:
            shutil.rmtree(partial, ignore_errors=True)
            raise ConfigProblem("", f"parameters.{PARAMETER}", f"'{archive}' cannot be unpacked: "
                                f"{type(e).__name__}: {e}") from None
        os.rename(partial, dest)

    # -- the interpreter -------------------------------------------------------------------------
    def _probe(self, source: str, root: str) -> PythonEnv:
        with self._lock:
            known = self._probed.get(root)
        if known is not None:
            return PythonEnv(source, known.root, known.python, known.runtime, known.facts)
        python = next((p for p in (os.path.join(root, "bin", n) for n in ("python3", "python"))
                       if os.path.isfile(p) and os.access(p, os.X_OK)), "")
        if not python:
            raise ConfigProblem("", f"parameters.{PARAMETER}", f"'{source}' is not a Python environment: it has no "
                                "bin/python3 or bin/python")
        env = PythonEnv(source, root, python, self._runtime_dirs())
        passed = self._passed_probe(root, python, env.runtime)
        if os.path.isfile(passed):  # this environment, unchanged, passed with this runtime before
            with open(passed, encoding="utf-8") as f:
                facts = _first_json(f.read())
            if facts:
                env = PythonEnv(source, root, python, env.runtime, facts)
                with self._lock:
                    self._probed[root] = env
                return env
        try:
            result = subprocess.run(env.argv("tritonmp.workers.env_probe"), capture_output=True,
                                    text=True, timeout=120, env=env.environ({**os.environ, "CUDA_VISIBLE_DEVICES": ""}),
                                    stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ConfigProblem("", f"parameters.{PARAMETER}", f"the interpreter of '{source}' cannot be run: "
                                f"{e}") from None
        facts = _first_json(result.stdout)
        if result.returncode != 0 or not facts:
            raise ConfigProblem("", f"parameters.{PARAMETER}", _why_not(source, facts, result.stderr))
        if tuple(facts.get("numpy_version", ())) < MIN_NUMPY:
            needed = ".".join(map(str, MIN_NUMPY))
            raise ConfigProblem("", f"parameters.{PARAMETER}", f"the environment '{source}' has numpy "
                                f"{facts.get('numpy')}; the worker needs numpy {needed} or newer")
        env = PythonEnv(source, root, python, env.runtime, facts)
        with self._lock:
            self._probed[root] = env
        try:
            os.makedirs(os.path.dirname(passed), exist_ok=True)
            with open(passed + f".{os.getpid()}", "w", encoding="utf-8") as f:
                f.write(json.dumps(facts) + "\n")
            os.replace(passed + f".{os.getpid()}", passed)
        except OSError:  # a cache that cannot be written costs the next server its probe
            pass
        return env

    def _passed_probe(self, root: str, python: str, runtime: tuple[str, str]) -> str:
        """Where a passed probe of the environment at `root` is remembered: keyed by the environment's
        interpreter and the state of its packages (the modification times of its site-packages
        folders, which installing or removing a package changes) and by the worker runtime, so that
        only an unchanged environment skips its probe."""
        import glob

        state: list[object] = [os.path.realpath(python), list(runtime)]
        for path in [python, *sorted(glob.glob(os.path.join(root, "lib", "python3*", "site-packages")))]:
            try:
                state.append(os.stat(path).st_mtime_ns)
            except OSError:
                state.append(0)
        key = hashlib.sha256(json.dumps([root, state]).encode()).hexdigest()[:32]
        return os.path.join(self.cache, "probed", key)

    def _runtime_dirs(self) -> tuple[str, str]:
        """The worker runtime's two directories: tritonmp's package, and its dependencies (links to the
        server's own copies, in the cache, one pair per server installation)."""
        if self._runtime is not None:
            return self._runtime
        package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        places = {"tritonmp": package}
        for name in RUNTIME_DEPENDENCIES:
            spec = importlib.util.find_spec(name)
            if spec is None:
                continue
            locations = list(spec.submodule_search_locations or ())
            places[name] = locations[0] if locations else (spec.origin or "")
        key = hashlib.sha256(json.dumps([sys.version, places], sort_keys=True).encode()).hexdigest()[:16]
        base = os.path.join(self.cache, "runtime", key)
        first, after = os.path.join(base, "first"), os.path.join(base, "after")
        if not os.path.isdir(after):
            partial = tempfile.mkdtemp(prefix=key + ".partial-", dir=_made(os.path.dirname(base)))
            os.makedirs(os.path.join(partial, "first"))
            os.makedirs(os.path.join(partial, "after"))
            for name, place in places.items():
                os.symlink(place, os.path.join(partial, "first" if name == "tritonmp" else "after",
                                               os.path.basename(place)))
            try:
                os.rename(partial, base)
            except OSError:  # another load made it meanwhile
                shutil.rmtree(partial, ignore_errors=True)
        self._runtime = (first, after)
        return self._runtime


def _made(path: str) -> str:
    os.makedirs(path, exist_ok=True)
    return path


def _first_json(text: str) -> dict:
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return {}
    return {}


def _why_not(source: str, facts: dict, stderr: str) -> str:
    """Why the environment cannot run the worker, from its probe's error."""
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    last = lines[-1] if lines else "its interpreter failed"
    running = f"Python {facts['python']}" if facts.get("python") else "its Python"
    if "No module named 'numpy'" in stderr:
        return f"the environment '{source}' has no numpy, which the worker needs: install numpy in it"
    mine = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if facts.get("python") and not facts["python"].startswith(mine + "."):
        return (f"the environment '{source}' ({running}) cannot run the worker: {last}. The server lends it "
                f"its own compiled packages ({', '.join(RUNTIME_DEPENDENCIES)}), built for Python {mine}: use "
                f"Python {mine} in the environment, or install those packages in it")
    return f"the environment '{source}' ({running}) cannot run the worker: {last}"
