"""The one error type of the server: a message with a Triton status, mapped once per frontend.

Imports nothing from the rest of tritonmp, so workers may use it too.
"""

from __future__ import annotations

import enum


class Status(enum.Enum):
    """Triton's error codes (TRITONSERVER_Error_Code), each with the HTTP status Triton answers it
    with. Each member is its own: two codes that share an HTTP status stay distinct (an enum of
    bare HTTP numbers would make them aliases, and UNKNOWN would leave as INVALID_ARG)."""

    UNKNOWN = ("UNKNOWN", 400)
    INTERNAL = ("INTERNAL", 500)
    NOT_FOUND = ("NOT_FOUND", 404)
    INVALID_ARG = ("INVALID_ARG", 400)
    UNAVAILABLE = ("UNAVAILABLE", 503)
    UNSUPPORTED = ("UNSUPPORTED", 501)
    ALREADY_EXISTS = ("ALREADY_EXISTS", 400)
    CANCELLED = ("CANCELLED", 400)
    TOO_LARGE = ("TOO_LARGE", 413)  # a request over a size limit: HTTP 413, gRPC RESOURCE_EXHAUSTED

    @property
    def http_status(self) -> int:
        return self.value[1]


class ServerError(Exception):
    """An error that reaches a client: its message and the Triton status it carries."""

    def __init__(self, message: str, status: Status = Status.INVALID_ARG, from_model: bool = False):
        super().__init__(message)
        self.message = message
        self.status = status
        self.from_model = from_model  # the model (or its worker) said it, not a check before it ran
        self.final = False  # in a stream of responses: the last one (a decoupled model's error sent as final)

    def __reduce__(self):  # pickled whole (a helper process's decoding errors), not just its message
        return (ServerError, (self.message, self.status, self.from_model))

    def __str__(self) -> str:
        return self.message


def invalid(message: str) -> ServerError:
    return ServerError(message, Status.INVALID_ARG)


def not_found(message: str) -> ServerError:
    return ServerError(message, Status.NOT_FOUND)


def unavailable(message: str) -> ServerError:
    return ServerError(message, Status.UNAVAILABLE)


def internal(message: str) -> ServerError:
    return ServerError(message, Status.INTERNAL)


def unsupported(message: str) -> ServerError:
    return ServerError(message, Status.UNSUPPORTED)


def too_large(message: str) -> ServerError:
    return ServerError(message, Status.TOO_LARGE)
