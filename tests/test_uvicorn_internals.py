"""frontends/http_protocol.py extends uvicorn's HttpToolsProtocol: it overrides some of its methods
and reads and sets some of its private state. pyproject.toml bounds uvicorn to the releases this
was written against; this test fails, naming what moved, if an installed uvicorn changes any of it."""

import inspect
import re

from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tritonmp.frontends.http_protocol import GuardedHttpProtocol

# the methods of uvicorn's protocol that GuardedHttpProtocol overrides, with the parameters they take
OVERRIDDEN = {
    "connection_made": ["transport"], "connection_lost": ["exc"], "data_received": ["data"],
    "_unset_keepalive_if_required": [], "on_response_complete": [], "on_message_begin": [],
    "on_url": ["url"], "on_header": ["name", "value"], "on_headers_complete": [], "on_body": ["body"],
    "on_message_complete": [],
}
# the state of uvicorn's protocol that it reads or sets
STATE = ["app_state", "asgi_version", "client", "connections", "cycle", "flow", "headers", "logger", "loop",
         "parser", "pipeline", "root_path", "scheme", "scope", "server", "server_state", "timeout_keep_alive",
         "transport", "url"]


def test_the_methods_it_overrides_are_still_uvicorns_with_the_same_parameters():
    ours = {name for name, value in vars(GuardedHttpProtocol).items()
            if callable(value) and hasattr(HttpToolsProtocol, name)}
    assert ours == set(OVERRIDDEN), "GuardedHttpProtocol overrides a different set of uvicorn's methods now"
    for name, params in OVERRIDDEN.items():
        theirs = list(inspect.signature(getattr(HttpToolsProtocol, name)).parameters)[1:]
        assert theirs == params, f"uvicorn's HttpToolsProtocol.{name} now takes {theirs}"


def test_the_state_it_touches_is_still_uvicorns():
    source = inspect.getsource(HttpToolsProtocol)
    theirs = set(re.findall(r"self\.([a-z_][a-z_0-9]*)\s*(?::[^=\n]*)?=", source))
    missing = [name for name in STATE if name not in theirs]
    assert not missing, f"uvicorn's HttpToolsProtocol no longer sets: {missing}"
    assert hasattr(httptools_impl, "STATUS_LINE")
