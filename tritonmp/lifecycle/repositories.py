"""The model repositories, local directories and object stores: which one holds which model (by its
key: its name, or with --model-namespacing its repository and name), a model's local directory for a
load (an object store's copied to a private folder), their fingerprints (to notice changes when
polling), the files a load request sends written to a private directory, and a load failure worded
without this server's paths."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor

from ..errors import ServerError, Status, internal, invalid
from ..logs import get_logger
from ..storage.credentials import CredentialError
from ..storage.locations import LocationError, is_remote
from ..storage.remote import Listing, RemoteRepository, StoredFile
from ..storage.stores import StoreError

log = get_logger("models")

FETCHES_AT_ONCE = 8  # object downloads at once, across every load
MOUNT_DIRECTORIES = {"s3": "TRITON_AWS_MOUNT_DIRECTORY", "gs": "TRITON_GCS_MOUNT_DIRECTORY",
                     "as": "TRITON_AZURE_MOUNT_DIRECTORY"}


def model_key(namespace: str, name: str) -> str:
    """What the server knows a model by: its name, or with --model-namespacing its namespace (the
    repository holding it, as given) and its name, as Triton writes them ("<repository>::<name>")."""
    return f"{namespace}::{name}" if namespace else name


def check_load_name(name: str) -> None:
    """Refuse the name a load gives, as Triton refuses it, where it cannot name a model: blank, or with a
    path in it (INVALID_ARG, in Triton's words); other names that cannot be a model directory's are
    refused where the model is looked for (`Repositories.source`)."""
    trimmed = name.strip()
    if not trimmed:
        raise invalid("Model name cannot be empty. Please enter a valid name to deploy.")
    if trimmed == ".." or "/" in trimmed:
        raise invalid(f"invalid model name '{name}', model name must not contain path traversal characters")


def valid_model_name(name: str) -> bool:
    """A name that can only ever mean a directory directly inside a repository."""
    return bool(name) and name not in (".", "..") and not any(c in name for c in "/\\\0") \
        and not name.startswith(".")


class Repositories:
    """The model repositories, in the order they were given: local directories and object-store
    repositories (s3://, gs://, as://). A model of an object store is copied to a private local folder
    for each load (under TRITON_AWS_MOUNT_DIRECTORY, TRITON_GCS_MOUNT_DIRECTORY or
    TRITON_AZURE_MOUNT_DIRECTORY, else a temporary folder of this server), which goes when the versions
    loaded from it have retired; the stores' listings are what `discover` reads of them."""

    def __init__(self, paths: list[str], namespacing: bool = False):
        self.paths = paths
        self.namespacing = namespacing  # --model-namespacing: each repository is a namespace of its own
        self.identities: dict[str, tuple[str, str]] = {}  # a model key seen -> (its namespace, its name)
        self.remote = {p: RemoteRepository(p) for p in paths if is_remote(p)}
        self._listed: dict[str, Listing] = {}  # an object-store repository's last listing, by URI
        self._refresh: asyncio.Future[None] | None = None  # the listing under way, shared by its callers
        self._fetches: ThreadPoolExecutor | None = None
        self._temporary = ""  # this server's folder for copies, where no mount directory is set
        self.copies: set[str] = set()  # the private folders of copies not yet removed
        # repositories registered while serving (SageMaker's multi-model endpoint): local directory ->
        # the model names of some of its folders (the others are models of their folder's name)
        self.registered: dict[str, dict[str, str]] = {}

    # -- repositories registered while serving ------------------------------------------------
    def register(self, path: str, names: dict[str, str]) -> None:
        """Serve the models of another local repository, the folders in `names` under the names
        given, as Triton's repository registration does."""
        if path in self.registered or path in self.paths:
            raise ServerError(f"model repository '{path}' has already been registered", Status.ALREADY_EXISTS)
        if not os.path.isdir(path):
            raise invalid(f"failed to register '{path}', repository not found")
        found = {} if self.namespacing else self.discover()  # namespaces keep same names apart
        for name in names.values():
            if name in found:
                raise ServerError(f"failed to register '{path}', there is a conflicting model name '{name}'",
                                  Status.ALREADY_EXISTS)
        self.registered[path] = dict(names)

    def unregister(self, path: str) -> None:
        self.registered.pop(path, None)

    # -- what the repositories hold ---------------------------------------------------------
    def discover(self) -> dict[str, list[str]]:
        """Model key (model_key) -> where a model of that key is (its directory, or its URI in an object
        store), repository order; without namespacing several repositories may hold one name. Object
        stores as their last listing saw them."""
        found: dict[str, list[str]] = {}

        def add(namespace: str, name: str, where: str) -> None:
            namespace = namespace if self.namespacing else ""
            key = model_key(namespace, name)
            self.identities[key] = (namespace, name)
            found.setdefault(key, []).append(where)

        for path, renamed in self.registered.items():
            for folder in sorted(os.listdir(path)) if os.path.isdir(path) else ():
                if os.path.isdir(os.path.join(path, folder)) and valid_model_name(renamed.get(folder, folder)):
                    add(path, renamed.get(folder, folder), os.path.join(path, folder))
        for repo in self.paths:
            if repo in self.remote:
                for name in sorted(self._listed.get(repo, {})):
                    if valid_model_name(name):
                        add(repo, name, f"{repo}/{name}")
                continue
            try:
                names = sorted(os.listdir(repo))
            except OSError as e:
                log.error("cannot read model repository '%s': %s", repo, e)
                continue
            for name in names:
                path = os.path.join(repo, name)
                if valid_model_name(name) and os.path.isdir(path):
                    add(repo, name, path)
        return found

    def identity(self, key: str) -> tuple[str, str]:
        """(namespace, name) of a model key: ("", key) for a name without a namespace."""
        return self.identities.get(key, ("", key))

    def keys_named(self, name: str) -> list[str]:
        """The keys of the repositories' models called `name`: one at most without namespacing."""
        return [k for k in self.discover() if self.identity(k)[1] == name]

    def source(self, key: str) -> str:
        """Where the one model `key` of the repositories is; a failed poll when none or several hold it."""
        name = self.identity(key)[1]
        if not valid_model_name(name):
            raise poll_failed(name, "not a valid model name")
        found = self.discover().get(key)
        if not found:
            raise poll_failed(name, f"no model directory '{name}' in the model repositories")
        if len(found) > 1:
            raise poll_failed(name, f"model '{name}' appears in {len(found)} model repositories; keep one, "
                                    "or start the server with --model-namespacing=true to serve each")
        return found[0]

    def in_repository(self, key: str) -> bool:
        return valid_model_name(self.identity(key)[1]) and key in self.discover()

    def public(self, name: str, message: str, files_dir: str = "") -> str:
        """A load failure as clients see it: Triton's `failed to load '<name>', ` first (clients
        match on it), and no path of this server's file system (paths inside a repository are
        given from the repository, an uploaded model's or a copy's from its own directory)."""
        local = [p for p in self.paths if p not in self.remote] + list(self.registered)
        for root in sorted([*local, files_dir], key=len, reverse=True):
            if root:
                message = message.replace(os.path.abspath(root).rstrip(os.sep) + os.sep, "")
        prefix = f"failed to load '{name}'"
        return message if message.startswith(prefix) else f"{prefix}, {message}"

    # -- object stores: listing and copying -------------------------------------------------
    async def refresh(self) -> None:
        """List the object-store repositories again (all at once, off the loop); callers that come
        while a listing is under way share it, so that at most one runs at a time whatever the number
        of callers. A repository that cannot be listed keeps its last listing, so that a store that is
        down for a moment unloads nothing."""
        if not self.remote:
            return
        if self._refresh is None:
            self._refresh = asyncio.ensure_future(self._list_all())
        refresh = self._refresh
        try:
            await asyncio.shield(refresh)
        finally:
            if refresh.done() and self._refresh is refresh:
                self._refresh = None

    async def _list_all(self) -> None:
        uris = list(self.remote)
        listings = await asyncio.gather(*(asyncio.to_thread(self.remote[u].models) for u in uris),
                                        return_exceptions=True)
        for uri, listing in zip(uris, listings):
            if isinstance(listing, BaseException):
                log.error("cannot list model repository '%s': %s", uri, listing)
            else:
                self._listed[uri] = listing

    async def localize(self, key: str) -> tuple[str, str]:
        """The local directory of model `key` for a load: (a private folder to remove once the
        versions loaded from it have retired, or "" for a local repository; the model directory). A
        model of an object store is listed and copied afresh; a failure fails the load with the
        store's reason."""
        where = self.source(key)
        name = self.identity(key)[1]
        repo = next((r for uri, r in self.remote.items() if where == f"{uri}/{name}"), None)
        if repo is None:
            return "", where
        try:
            files = await asyncio.to_thread(repo.model, name)
        except (StoreError, LocationError, CredentialError) as e:
            raise poll_failed(name, str(e)) from None
        if files is None:
            raise poll_failed(name, f"no model directory '{name}' in the model repository '{repo.uri}'")
        self._listed.setdefault(repo.uri, {})[name] = files
        root = tempfile.mkdtemp(prefix="folder", dir=self._mount(repo.location.scheme))
        self.copies.add(root)
        try:
            await self._copy(repo, name, files, os.path.join(root, name))
        except Exception as e:  # the store's reason (StoreError), or what else stopped the copy
            self.remove_copy(root)
            raise poll_failed(name, str(e) if isinstance(e, StoreError) else f"cannot copy the model: {e!r}") \
                from None
        except BaseException:
            self.remove_copy(root)
            raise
        log.info("copied '%s' from %s (%d files, %d bytes)", name, repo.uri, len(files), sum(f.size for f in files))
        return root, os.path.join(root, name)

    async def _copy(self, repo: RemoteRepository, name: str, files: tuple[StoredFile, ...], dest: str) -> None:
        """Download the files on the shared pool (FETCHES_AT_ONCE at once across every load); once one
        fails, those not started yet are not, and the first failure is raised when the rest have ended."""
        if self._fetches is None:
            self._fetches = ThreadPoolExecutor(FETCHES_AT_ONCE, thread_name_prefix="tritonmp-fetch")
        loop = asyncio.get_running_loop()
        failed: list[BaseException] = []

        def one(f: StoredFile) -> None:
            if not failed:
                try:
                    f.copy_to(repo, name, dest)
                except BaseException as e:
                    failed.append(e)

        os.makedirs(dest, exist_ok=True)
        await asyncio.gather(*(loop.run_in_executor(self._fetches, one, f) for f in files))
        if failed:
            raise failed[0]

    def _mount(self, scheme: str) -> str:
        mount = os.environ.get(MOUNT_DIRECTORIES[scheme], "")
        if mount:
            os.makedirs(mount, exist_ok=True)
            return mount
        if not self._temporary:
            self._temporary = tempfile.mkdtemp(prefix="tritonmp-cloud-")
        return self._temporary

    def remove_copy(self, root: str) -> None:
        shutil.rmtree(root, ignore_errors=True)
        self.copies.discard(root)

    def close(self) -> None:
        """Remove every copy left and this server's temporary folder; stop the downloads' threads."""
        for root in list(self.copies):
            self.remove_copy(root)
        if self._temporary:
            shutil.rmtree(self._temporary, ignore_errors=True)
            self._temporary = ""
        if self._fetches is not None:
            self._fetches.shutdown(wait=False, cancel_futures=True)
            self._fetches = None

    # -- polling ------------------------------------------------------------------------------
    async def fingerprints(self) -> dict[str, tuple]:
        """Per model key: where it is and what it holds (a local file's path, size and mtime; an object's
        path, size and ETag), to notice changes. Object stores are listed again first."""
        await self.refresh()
        found = self.discover()
        local = await asyncio.to_thread(_local_fingerprints, {n: w[0] for n, w in found.items()
                                                              if not is_remote(w[0])})
        out: dict[str, tuple] = {}
        for key, where in found.items():
            if key in local:
                out[key] = (where[0], local[key])
            else:
                name = self.identity(key)[1]
                listing = self._listed.get(where[0][:-len(name) - 1], {})
                out[key] = (where[0], tuple((f.path, f.size, f.tag) for f in listing.get(name, ())))
        return out


def _local_fingerprints(dirs: dict[str, str]) -> dict[str, tuple]:
    """Per model directory: every file's path, size and mtime."""
    out = {}
    for name, top in dirs.items():
        items = []
        for root, _, files in os.walk(top):
            for f in files:
                try:
                    st = os.stat(os.path.join(root, f))
                except OSError:
                    continue
                items.append((os.path.relpath(os.path.join(root, f), top), st.st_size, st.st_mtime_ns))
        out[name] = tuple(sorted(items))
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
