"""One object-store repository: its models and their objects (one listing of the repository's keys),
one object downloaded to a file, and whether a repository can be served from. Every call here blocks
on the network: callers run them off the event loop. A file streams to disk in pieces, so a model
file never sits in memory whole."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

from .credentials import CredentialError, for_location
from .locations import Location, LocationError, is_remote, parse
from .stores import StoreError, obstore_module, open_store, reworded, store_errors

PIECE = 8 << 20  # bytes written to disk at a time


@dataclass(frozen=True)
class StoredFile:
    """An object of a model directory: its path inside the model, size and version tag."""

    path: str
    size: int
    tag: str  # the ETag, else the modification time

    def copy_to(self, repo: RemoteRepository, model: str, model_dir: str) -> None:
        """This object of `model`, into the local model directory. An empty one may be a folder marker
        (the key of a folder and a '/', which tools write for an empty folder, such as an ensemble's
        version folder; listings give it without its '/'): where no object has the key as listed, the
        copy has the folder."""
        parts = self.path.split("/")
        key = repo.location.key(model, self.path)
        if any(p in ("", ".", "..") or "\0" in p for p in parts):  # a key that would leave the model's folder
            raise StoreError(f"object '{key}' has a path that is not inside its model's folder")
        local = os.path.join(model_dir, *parts)
        if self.size == 0 and not repo.exists(key):
            os.makedirs(local, exist_ok=True)
        else:
            repo.download(key, local)


Listing = dict[str, tuple[StoredFile, ...]]  # model name -> its files, sorted


class RemoteRepository:
    """A repository in S3, GCS or Azure Storage."""

    def __init__(self, uri: str):
        self.location: Location = parse(uri)
        self._store: Any = None
        self._lock = threading.Lock()

    @property
    def uri(self) -> str:
        return self.location.uri

    def store(self) -> Any:
        with self._lock:
            if self._store is None:
                self._store = open_store(self.location, for_location(self.location))
            return self._store

    def models(self) -> Listing:
        """Every model directory of the repository, with its files: one listing of the prefix. A key
        directly under the prefix is no model (a file beside the model directories)."""
        found: dict[str, list[StoredFile]] = {}
        for meta in self._list(self.location.prefix):
            rel = meta["path"][len(self.location.prefix):].lstrip("/") if self.location.prefix else meta["path"]
            name, sep, inside = rel.partition("/")
            if not sep:
                continue
            files = found.setdefault(name, [])
            if inside:
                files.append(_stored(inside, meta))
        return {name: tuple(sorted(files, key=lambda f: f.path)) for name, files in found.items()}

    def model(self, name: str) -> tuple[StoredFile, ...] | None:
        """The files of one model directory; None when there is none."""
        prefix = self.location.key(name)
        metas = self._list(prefix)
        if not metas:
            return None
        files = [_stored(m["path"][len(prefix) + 1:], m) for m in metas if m["path"] != prefix]
        return tuple(sorted(files, key=lambda f: f.path))

    def _list(self, prefix: str) -> list[dict]:
        try:
            return [meta for chunk in obstore_module().list(self.store(), prefix=prefix or None, chunk_size=1000)
                    for meta in chunk]
        except store_errors() as e:
            raise reworded(e, self.location, f"cannot list '{prefix or '/'}'") from None

    def download(self, key: str, path: str) -> None:
        """One object to one file, in pieces (the client takes up a body that breaks off where it
        stopped, and retries, as RETRIES in stores.py says)."""
        errors = store_errors()
        try:
            pieces = iter(obstore_module().get(self.store(), key).stream(min_chunk_size=PIECE))
        except errors as e:
            raise reworded(e, self.location, f"cannot get '{key}'") from None
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            out = open(path, "wb")
        except OSError as e:
            raise StoreError(f"cannot write '{key}' to the local copy: {e.strerror}") from None
        with out:
            while True:
                try:
                    piece = next(pieces)
                except StopIteration:
                    return
                except errors as e:
                    raise reworded(e, self.location, f"cannot get '{key}'") from None
                try:
                    out.write(piece)
                except OSError as e:
                    raise StoreError(f"cannot write '{key}' to the local copy: {e.strerror}") from None

    def exists(self, key: str) -> bool:
        try:
            obstore_module().head(self.store(), key)
            return True
        except FileNotFoundError:
            return False
        except store_errors() as e:
            raise reworded(e, self.location, f"cannot look up '{key}'") from None

    def check(self) -> None:
        """Raise the store's reason when the repository cannot be listed (no bucket, wrong keys)."""
        try:
            next(iter(obstore_module().list(self.store(), prefix=self.location.prefix or None, chunk_size=1)), None)
        except store_errors() as e:
            raise reworded(e, self.location, "cannot list the repository") from None


def _stored(path: str, meta: dict) -> StoredFile:
    return StoredFile(path, int(meta["size"]), str(meta.get("e_tag") or meta["last_modified"].isoformat()))


def repository_problem(path: str) -> str:
    """Why a model repository (a local directory or an object store) cannot be served from, as one
    line; "" when it can. An object store is asked for one key of the repository."""
    if not is_remote(path):
        return "" if os.path.isdir(path) else f"model repository '{path}' is not a directory"
    try:
        RemoteRepository(path).check()
    except (StoreError, LocationError, CredentialError) as e:
        return f"model repository '{path}': {e}"
    return ""
