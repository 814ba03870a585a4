"""The model repositories as directories of this file system: which directories hold which model,
their files' fingerprints (to notice changes when polling), the files a load request sends written
to a private directory, and a load failure worded without this server's paths."""

from __future__ import annotations

import os
import shutil
import tempfile

from ..errors import ServerError, internal
from ..logs import get_logger

log = get_logger("models")


def valid_model_name(name: str) -> bool:
    """A name that can only ever mean a directory directly inside a repository."""
    return bool(name) and name not in (".", "..") and not any(c in name for c in "/\\\0") \
        and not name.startswith(".")


class Repositories:
    """The model repositories, in the order they were given."""

    def __init__(self, paths: list[str]):
        self.paths = paths

    def discover(self) -> dict[str, list[str]]:
        """Model name -> the directories that hold a model of that name, repository order."""
        found: dict[str, list[str]] = {}
        for repo in self.paths:
            try:
                names = sorted(os.listdir(repo))
            except OSError as e:
                log.error("cannot read model repository '%s': %s", repo, e)
                continue
            for name in names:
                path = os.path.join(repo, name)
                if valid_model_name(name) and os.path.isdir(path):
                    found.setdefault(name, []).append(path)
        return found

    def model_dir(self, name: str) -> str:
        if not valid_model_name(name):
            raise internal(f"failed to load '{name}', failed to poll from model repository: not a valid "
                           "model name")
        dirs = self.discover().get(name)
        if not dirs:
            raise internal(f"failed to load '{name}', failed to poll from model repository: no model directory "
                           f"'{name}' in the model repositories")
        if len(dirs) > 1:
            raise internal(f"failed to load '{name}', failed to poll from model repository: model '{name}' "
                           f"appears in {len(dirs)} model repositories; keep one")
        return dirs[0]

    def public(self, name: str, message: str, files_dir: str = "") -> str:
        """A load failure as clients see it: Triton's `failed to load '<name>', ` first (clients
        match on it), and no path of this server's file system (paths inside a repository are
        given from the repository, an uploaded model's from its own directory)."""
        for root in sorted([*self.paths, files_dir], key=len, reverse=True):
            if root:
                message = message.replace(os.path.abspath(root).rstrip(os.sep) + os.sep, "")
        prefix = f"failed to load '{name}'"
        return message if message.startswith(prefix) else f"{prefix}, {message}"

    def in_repository(self, name: str) -> bool:
        return valid_model_name(name) and any(os.path.isdir(os.path.join(r, name)) for r in self.paths)

    def fingerprints(self) -> dict[str, tuple]:
        """Per model directory: every file's path, size and mtime, to notice changes."""
        out = {}
        for name, dirs in self.discover().items():
            items = []
            for root, _, files in os.walk(dirs[0]):
                for f in files:
                    try:
                        st = os.stat(os.path.join(root, f))
                    except OSError:
                        continue
                    items.append((os.path.relpath(os.path.join(root, f), dirs[0]), st.st_size, st.st_mtime_ns))
            out[name] = (dirs[0], tuple(sorted(items)))
        return out


def poll_failed(name: str, reason: str) -> ServerError:
    """A load's files that cannot make a model directory: Triton's status and words (its repository
    agent's error is a failed poll), the reason after them."""
    return internal(f"failed to load '{name}', failed to poll from model repository: {reason}")


def write_files(name: str, files: dict[str, bytes]) -> tuple[str, str]:
    """Write a load request's files into a fresh private directory; (that directory, the model dir).
    A file that cannot be written there fails the load as a failed poll."""
    root = tempfile.mkdtemp(prefix="tritonmp-model-")
    model_dir = os.path.join(root, name)
    os.makedirs(model_dir)
    try:
        for rel, content in files.items():
            # "file:/1/model.py" names the same file as "file:1/model.py", as Triton takes it
            parts = rel.replace("\\", "/").lstrip("/").split("/")
            if not rel.strip("/") or any(p in ("", ".", "..") or "\0" in p for p in parts):
                raise poll_failed(name, f"file path '{rel}' must stay inside the model directory")
            path = os.path.join(model_dir, *parts)
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(content)
            except OSError as e:  # a name too long, a file where a directory must go: said without our paths
                raise poll_failed(name, f"cannot write file '{rel}': {e.strerror}") from None
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return root, model_dir
