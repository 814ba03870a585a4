"""The models the server knows, by key (repositories.model_key: a model's name, or with
--model-namespacing its repository and name), and the one place names become keys: `find` resolves
the name a call gives, in the caller's own namespace first (an ensemble's step, a python model's BLS
call), else to the one model of that name; several are an ambiguity, refused with Triton's words.
Also what is read of them all: the repository index, readiness, failures, and a request's version
string as Triton reads it."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field

from ..errors import invalid
from ..served import ServedVersion
from .repositories import Repositories, model_key

_VERSION = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")  # what C's strtol reads: space, a sign, digits
_LONG = 1 << 63
_VERSIONS: dict[str, int] = {}  # version string -> its number: clients send the same few
_KEPT = 1024


def parse_version(text: str) -> int:
    """A request's model version string as Triton reads it (std::stol: leading space, a sign and
    digits; anything after them is ignored), -1 for the empty string. INVALID_ARG, with Triton's
    words, for a string with no number, one out of a 64-bit range, or a negative one."""
    number = _VERSIONS.get(text)
    if number is not None:
        return number
    if not text:
        return -1
    match = _VERSION.match(text)
    number = int(match.group(1)) if match else _LONG
    if not -_LONG <= number < _LONG:
        raise invalid(f"failed to get model version from specified version string '{text}' (details: stol), "
                      "version should be an integral value > 0")
    if number < 0:
        raise invalid(f"invalid model version specified '{text}' , version should be an integral value > 0")
    if len(_VERSIONS) >= _KEPT:
        _VERSIONS.clear()
    _VERSIONS[text] = number
    return number


@dataclass
class ModelEntry:
    name: str
    path: str
    namespace: str = ""  # the repository it is from, with --model-namespacing
    versions: dict[int, ServedVersion] = field(default_factory=dict)  # the versions being served
    problem: str = ""  # why the model could not be loaded at all
    platform: str = ""
    down: dict[int, str] = field(default_factory=dict)  # versions known but not served -> why (unloaded, failed)
    files_dir: str = ""  # a private directory holding files sent with a load request
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def key(self) -> str:
        return model_key(self.namespace, self.name)


class ModelTable:
    """The models known (`models`: key -> entry) and their names; the model manager loads them."""

    def __init__(self, repositories: Repositories, namespacing: bool):
        self.repositories = repositories
        self.namespacing = namespacing
        self.models: dict[str, ModelEntry] = {}
        self._named: dict[str, list[ModelEntry]] = {}  # name -> the entries of that name

    def _entry_for(self, key: str, path: str) -> ModelEntry:
        """The entry of a model key, made where there is none yet."""
        entry = self.models.get(key)
        if entry is None:
            namespace, name = self.repositories.identity(key)
            entry = self.models[key] = ModelEntry(name, path, namespace)
            self._named.setdefault(name, []).append(entry)
        return entry

    def _forget(self, key: str) -> None:
        entry = self.models.pop(key)
        named = self._named[entry.name]
        named.remove(entry)
        if not named:
            del self._named[entry.name]

    # -- names to keys ---------------------------------------------------------------------
    def find(self, name: str, near: str = "", repositories: bool = False) -> str:
        """The key of the model a call names: without namespacing, the name. With it, among the
        models of that name served (or, for a load, those of the repositories too; for a name that
        none serves, those known), the one of namespace `near` (the caller's own), else the only
        one; more than one is an ambiguity, refused with Triton's words. A name no model has is its
        own key, for the caller's "not found"."""
        if not self.namespacing:
            return name
        known = self._named.get(name, ())
        keys = [e.key for e in known if e.versions]
        if repositories:
            keys += [k for k in self.repositories.keys_named(name) if k not in keys]
        elif not keys:
            keys = [e.key for e in known] or self.repositories.keys_named(name)
        if near and model_key(near, name) in keys:
            return model_key(near, name)
        if len(keys) > 1:
            raise invalid(f"There are {len(keys)} identifiers of model '{name}' in global map, model namespace "
                          "must be provided to resolve ambiguity.")
        return keys[0] if keys else name

    def keys_named(self, name: str) -> list[str]:
        """Every model key a load or unload of `name` acts on: each model of that name, known or in the
        repositories (the name itself where there is none)."""
        if not self.namespacing:
            return [name]
        keys = [e.key for e in self._named.get(name, ())]
        keys += [k for k in self.repositories.keys_named(name) if k not in keys]
        return keys or [name]


    def forget_unlisted(self) -> None:
        """Drop what is known of models that no longer serve and that no repository holds (after a
        registered repository went), so that the index no longer lists them."""
        listed = self.repositories.discover()
        for key in [k for k, e in self.models.items() if not e.versions and k not in listed and not e.lock.locked()]:
            self._forget(key)

    def index(self, ready_only: bool = False, namespaces: bool = False) -> list[dict]:
        """The repository index: each model (each version known), by namespace and name. `namespaces`:
        each row of a model of a namespace says it (Triton's index does not)."""
        rows: list[dict] = []
        keys = set(self.repositories.discover()) | set(self.models)
        for key in sorted(keys, key=self.repositories.identity):
            entry = self.models.get(key)
            name = self.repositories.identity(key)[1] if entry is None else entry.name
            first = len(rows)
            if entry is None or (not entry.versions and not entry.down and not entry.problem):
                if not ready_only:
                    rows.append({"name": name})
            else:
                self._index_rows(rows, entry, ready_only)
            namespace = self.repositories.identity(key)[0]
            if namespaces and namespace:
                for row in rows[first:]:
                    row["namespace"] = namespace
        return rows

    @staticmethod
    def _index_rows(rows: list[dict], entry: ModelEntry, ready_only: bool) -> None:
        """The index's rows of one model that has versions, or had, or failed to load."""
        name = entry.name
        for v, mv in sorted(entry.versions.items()):
            if ready_only and mv.state != "READY":
                continue
            row = {"name": name, "version": str(v), "state": mv.state}
            if mv.reason:
                row["reason"] = mv.reason
            rows.append(row)
        if ready_only:
            return
        down = sorted(v for v in entry.down if v not in entry.versions)
        for v in down:
            rows.append({"name": name, "version": str(v), "state": "UNAVAILABLE", "reason": entry.down[v]})
        if entry.problem and not entry.versions and all(entry.down[v].startswith("unloaded") for v in down):
            # the load failed before any version started (else its versions' rows say why)
            rows.append({"name": name, "state": "UNAVAILABLE", "reason": entry.problem})

    def all_ready(self) -> bool:
        return all(not e.problem and all(v.state == "READY" for v in e.versions.values())
                   for e in self.models.values() if e.versions or e.problem)

    def ready_versions(self) -> list[ServedVersion]:
        """Every model version in the READY state."""
        return [v for e in self.models.values() for v in e.versions.values() if v.state == "READY"]

    def failures(self) -> list[str]:
        out = []
        for e in self.models.values():
            if e.problem:
                out.append(f"{e.name}: {e.problem}")
            for v in e.versions.values():
                if v.state != "READY":
                    out.append(f"{e.name} version {v.version}: {v.reason}")
        return out
