"""`tritonmp check`: every problem of every model in some repositories, without serving them."""

from __future__ import annotations

import os

from . import config as cfg


def check_repositories(repositories: list[str], auto_complete: bool = True) -> tuple[list[str], int]:
    """(problems as lines, number of models looked at)."""
    problems: list[str] = []
    seen: dict[str, str] = {}
    completed: dict[str, cfg.Completed] = {}
    models = 0
    for repo in repositories:
        if not os.path.isdir(repo):
            problems.append(f"{repo}: not a directory")
            continue
        for name in sorted(os.listdir(repo)):
            path = os.path.join(repo, name)
            if not os.path.isdir(path) or name.startswith("."):
                continue
            models += 1
            if name in seen:
                problems.append(f"{path}: model '{name}' also appears in {seen[name]}")
            seen[name] = repo
            result = cfg.check_all(path, auto_complete, inspect=True)
            if isinstance(result, list):
                problems += [str(p) for p in result]
            else:
                completed[name] = result
    problems += _ensemble_links(completed, set(seen))
    return problems, models


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
