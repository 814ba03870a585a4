"""Triton's --http-header-forward-pattern and --grpc-header-forward-pattern: the request headers
(gRPC: metadata) whose name the regular expression matches anywhere in it reach the model as string
request parameters, under the header's name. Infer requests only, added after the request's own
parameters, as Triton adds them."""

from __future__ import annotations

import re


def compile_pattern(pattern: str, what: str) -> re.Pattern | None:
    """The pattern compiled (None when empty); ValueError naming `what` when it is not one."""
    if not pattern:
        return None
    try:
        return re.compile(pattern)
    except re.error as e:
        raise ValueError(f"{what} '{pattern}' is not a regular expression: {e}") from None


def forwarded(pattern: re.Pattern, headers) -> dict[str, str]:
    """The headers, (name, value) pairs of bytes or str, that `pattern` forwards, as parameters.
    HTTP/2's pseudo-headers (`:path`, ...) are not metadata, and are never forwarded."""
    out = {}
    for name, value in headers:
        if isinstance(name, bytes):
            name = name.decode("latin-1")
        if name.startswith(":") or not pattern.search(name):
            continue
        out[name] = value.decode("latin-1") if isinstance(value, bytes) else str(value)
    return out
