"""`tritonmp check`: every problem of every model in some repositories, without serving them."""

from __future__ import annotations

import os

from . import config as cfg


def check_repositories(repositories: list[str], auto_complete: bool = True) -> tuple[list[str], int]:
    """(problems as lines, number of models looked at)."""
    problems: list[str] = []
    seen: dict[str, str] = {}
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
            result = cfg.check_all(path, auto_complete)
            if isinstance(result, list):
                problems += [str(p) for p in result]
    return problems, models
