"""The one error type of the server: a message with a Triton status, mapped once per frontend.

Imports nothing from the rest of tritonmp, so workers may use it too.
"""

from __future__ import annotations

import enum


class Status(enum.Enum):
    """Triton's error codes (TRITONSERVER_Error_Code), each with its HTTP status."""

    UNKNOWN = 400
    INTERNAL = 500
    NOT_FOUND = 404
    INVALID_ARG = 400
    UNAVAILABLE = 503
    UNSUPPORTED = 501
    ALREADY_EXISTS = 409
    CANCELLED = 499

    @property
    def http_status(self) -> int:
        # Triton answers ALREADY_EXISTS, UNKNOWN and CANCELLED with 400.
        return 400 if self.value in (409, 499) else self.value


class ServerError(Exception):
    """An error that reaches a client: its message and the Triton status it carries."""

    def __init__(self, message: str, status: Status = Status.INVALID_ARG):
        super().__init__(message)
        self.message = message
        self.status = status

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
