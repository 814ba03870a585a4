"""`tritonmp check`: every problem of every model in some repositories (local, or object stores copied to
a temporary folder first), without serving them."""

from __future__ import annotations

import os
import tempfile
from concurrent.futures import ThreadPoolExecutor

from ..storage.credentials import CredentialError
from ..storage.locations import LocationError, is_remote
from ..storage.remote import RemoteRepository
from ..storage.stores import StoreError
from . import config as cfg
from .python_envs import Environments


def check_repositories(repositories: list[str], auto_complete: bool = True, backend_directory: str = "",
                       env_cache: str = "", from_requirements: bool = False) -> tuple[list[str], int]:
    """(problems as lines, number of models looked at); `backend_directory`: where python-based backends
    are; `env_cache`: where python models' environment archives are unpacked ("": the default)."""
    environments = Environments(env_cache, from_requirements)
    problems: list[str] = []
    seen: dict[str, str] = {}
    completed: dict[str, cfg.Completed] = {}
    models = 0
    copied: dict[str, str] = {}  # a copy's folder -> the object store's URI
    with tempfile.TemporaryDirectory(prefix="tritonmp-check-") as copies:
        for i, repo in enumerate(repositories):
            local, where = repo, repo
            if is_remote(repo):
                local = os.path.join(copies, str(i))
                copied[local] = repo
                try:
                    copy_repository(repo, local)
                except (StoreError, LocationError, CredentialError) as e:
                    problems.append(f"{repo}: {e}")
                    continue
            elif not os.path.isdir(repo):
                problems.append(f"{repo}: not a directory")
                continue
            for name in sorted(os.listdir(local)):
                path = os.path.join(local, name)
                if not os.path.isdir(path) or name.startswith("."):
                    continue
                models += 1
                if name in seen:
                    problems.append(f"{os.path.join(where, name)}: model '{name}' also appears in {seen[name]}")
                seen[name] = repo
                result = cfg.check_all(path, auto_complete, inspect=True, backend_directory=backend_directory,
                                       environments=environments)
                if isinstance(result, list):
                    problems += [str(p).replace(local, where, 1) for p in result]
                else:
                    completed[name] = result
        for problem in _ensemble_links(completed, set(seen)):
            for local, where in copied.items():
                problem = problem.replace(local, where, 1)
            problems.append(problem)
    return problems, models


def copy_repository(uri: str, dest: str) -> None:
    """Every model of an object-store repository, copied into `dest`, several files at once."""
    repo = RemoteRepository(uri)
    listing = repo.models()
    for name in listing:
        os.makedirs(os.path.join(dest, name), exist_ok=True)
    with ThreadPoolExecutor(8, thread_name_prefix="tritonmp-fetch") as pool:
        for future in [pool.submit(f.copy_to, repo, name, os.path.join(dest, name))
                       for name, files in listing.items() for f in files]:
            future.result()


def _ensemble_links(completed: dict[str, cfg.Completed], names: set[str]) -> list[str]:
    """Each ensemble step must name a model of the repositories, with the tensors the step maps."""
    problems = []
    for c in completed.values():
        if c.backend != "ensemble":
            continue
        path = os.path.join(c.model_dir, "config.pbtxt")
        for i, step in enumerate(c.config.ensemble_scheduling.step):
            field = f"{path}: ensemble_scheduling.step[{i}]"
            if step.model_name not in names:
                problems.append(f"{field}.model_name: no model '{step.model_name}' in the repositories")
                continue
            target = completed.get(step.model_name)
            if target is None:
                continue  # its own problems are listed already
            inputs = {t.name for t in target.config.input}
            outputs = {t.name for t in target.config.output}
            for key in step.input_map:
                if key not in inputs:
                    problems.append(f"{field}.input_map: '{key}' is not an input of '{step.model_name}' "
                                    f"(it has {', '.join(sorted(inputs))})")
            for key in step.output_map:
                if key not in outputs:
                    problems.append(f"{field}.output_map: '{key}' is not an output of '{step.model_name}' "
                                    f"(it has {', '.join(sorted(outputs))})")
    return problems
