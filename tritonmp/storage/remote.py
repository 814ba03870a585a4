"""One object-store repository: its models and their objects (one listing of the repository's keys),
one object downloaded to a file, and whether a repository can be served from. Every call here blocks
on the network: callers run them off the event loop. A file streams to disk in pieces, so a model
file never sits in memory whole; a download that fails part way is started again, with backoff, a few
times."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .credentials import CredentialError, for_location
from .locations import Location, LocationError, is_remote, parse
from .stores import StoreError, obstore_module, open_store, reworded

PIECE = 8 << 20  # bytes written to disk at a time
ATTEMPTS = 4  # per file, for failures in the middle of a body (the client retries whole requests itself)
BACKOFF = 0.2  # seconds before the second attempt, doubling


@dataclass(frozen=True)
class StoredFile:
    """An object of a model directory: its path inside the model, size and version tag."""

    path: str
    size: int
    tag: str  # the ETag, else the modification time


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
            if inside and not inside.endswith("/"):  # "dir/" keys are folder markers some tools write
                files.append(_stored(inside, meta))
        return {name: tuple(sorted(files, key=lambda f: f.path)) for name, files in found.items()}

    def model(self, name: str) -> tuple[StoredFile, ...] | None:
        """The files of one model directory; None when there is none."""
        prefix = self.location.key(name)
        metas = self._list(prefix)
        if not metas:
            return None
        files = [_stored(m["path"][len(prefix) + 1:], m) for m in metas if not m["path"].endswith("/")]
        return tuple(sorted(files, key=lambda f: f.path))

    def _list(self, prefix: str) -> list[dict]:
        obstore = obstore_module()
        try:
            return [meta for chunk in obstore.list(self.store(), prefix=prefix or None, chunk_size=1000)
                    for meta in chunk]
        except obstore.exceptions.BaseError as e:
            raise reworded(e, self.location, f"cannot list '{prefix or '/'}'") from None

    def download(self, key: str, path: str, sleep: Callable[[float], None] = time.sleep) -> None:
        """One object to one file, in pieces; a transient failure starts it again after a pause."""
        obstore = obstore_module()
        os.makedirs(os.path.dirname(path), exist_ok=True)
        for attempt in range(ATTEMPTS):
            try:
                result = obstore.get(self.store(), key)
                with open(path, "wb") as out:
                    for piece in result.stream(min_chunk_size=PIECE):
                        out.write(piece)
                return
            except obstore.exceptions.BaseError as e:
                error = reworded(e, self.location, f"cannot get '{key}'")
            except OSError as e:
                raise StoreError(f"cannot write '{key}' to the local copy: {e.strerror}") from None
            if not error.transient or attempt == ATTEMPTS - 1:
                raise error
            sleep(BACKOFF * 2 ** attempt)

    def check(self) -> None:
        """Raise the store's reason when the repository cannot be listed (no bucket, wrong keys)."""
        obstore = obstore_module()
        try:
            next(iter(obstore.list(self.store(), prefix=self.location.prefix or None, chunk_size=1)), None)
        except obstore.exceptions.BaseError as e:
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
