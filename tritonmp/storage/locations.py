"""Where an object-store repository is: a URI as Triton reads it, split into store, bucket (or
container) and prefix. `s3://bucket/path`, `s3://host:port/bucket/path` and
`s3://https://host:port/bucket/path` (an S3-compatible server), `gs://bucket/path`,
`as://account/container/path`. Any other string is a local path."""

from __future__ import annotations

import re
from dataclasses import dataclass

SCHEMES = ("s3", "gs", "as")

# Triton's form of an S3 URI that names its server: an optional scheme, host:port, the bucket, the path
_S3_WITH_HOST = re.compile(r"(http://|https://|)([0-9a-zA-Z\-.]+):([0-9]+)/([0-9a-z.\-]+)((?:/[0-9a-zA-Z.\-_]+)*)")
_AZURE = re.compile(r"([^/]+)/([^/?]+)(?:/([^?]*))?(\?.*)?")


class LocationError(ValueError):
    """A URI of an object store that names no bucket or container."""


@dataclass(frozen=True)
class Location:
    """An object-store repository: its store, bucket (container for Azure) and the prefix of the
    repository's keys (no leading or trailing '/')."""

    uri: str  # as given, without trailing '/'
    scheme: str  # "s3", "gs" or "as"
    bucket: str
    prefix: str
    endpoint: str = ""  # an S3-compatible server the URI names ("http://host:port")
    account: str = ""  # the Azure storage account the URI names

    def key(self, *parts: str) -> str:
        """The object key of a path inside the repository."""
        return "/".join(p for p in (self.prefix, *parts) if p)

    def child(self, name: str) -> str:
        """The URI of a model directory of the repository."""
        return f"{self.uri}/{name}"


def is_remote(path: str) -> bool:
    return any(path.startswith(s + "://") for s in SCHEMES)


def parse(uri: str) -> Location:
    """The location a URI of an object store names; LocationError when it names no bucket."""
    scheme, _, rest = uri.partition("://")
    clean = uri.rstrip("/")
    if scheme == "s3":
        return _s3(clean, rest)
    parts = [p for p in rest.split("/") if p]
    if scheme == "gs":
        if not parts:
            raise LocationError(f"No bucket name found in path: {uri}")
        return Location(clean, "gs", parts[0], "/".join(parts[1:]))
    if scheme == "as":
        m = _AZURE.fullmatch(rest.rstrip("/"))
        if m is None:
            raise LocationError(f"Invalid azure storage path: {uri}")
        host, container, path = m.group(1), m.group(2), m.group(3) or ""
        account = host[:-len(".blob.core.windows.net")] if host.endswith(".blob.core.windows.net") else host
        return Location(clean, "as", container, "/".join(p for p in path.split("/") if p), account=account)
    raise LocationError(f"not an object-store URI: {uri}")


def _s3(clean: str, rest: str) -> Location:
    """Triton's reading: a leading http:// or https:// is kept, slashes around and doubled inside are
    dropped; host:port before the bucket names the server."""
    protocol = ""
    for p in ("https://", "http://"):
        if p in rest:
            protocol, rest = p, rest[rest.index(p) + len(p):]
            break
    segments = [s for s in rest.split("/") if s]
    if not segments:
        raise LocationError(f"Invalid bucket name: '{rest}'")
    path = protocol + "/".join(segments)
    m = _S3_WITH_HOST.fullmatch(path)
    if m is not None:
        scheme = "https" if m.group(1) == "https://" else "http"
        return Location(clean, "s3", m.group(4), m.group(5).strip("/"), endpoint=f"{scheme}://{m.group(2)}:{m.group(3)}")
    if protocol:
        raise LocationError(f"No bucket name found in path: {clean} (a server is named as host:port)")
    return Location(clean, "s3", segments[0], "/".join(segments[1:]))
