"""Triton's error classes, raised by the in-process API in the situations Triton raises them."""

from __future__ import annotations

from ...errors import ServerError, Status


class TritonError(Exception):
    """Base of the in-process API's errors."""


class UnknownError(TritonError):
    pass


class InternalError(TritonError):
    pass


class NotFoundError(TritonError):
    pass


class InvalidArgumentError(TritonError):
    pass


class UnavailableError(TritonError):
    pass


class UnsupportedError(TritonError):
    pass


class AlreadyExistsError(TritonError):
    pass


class CancelledError(TritonError):
    pass


_BY_STATUS = {
    Status.UNKNOWN: UnknownError,
    Status.INTERNAL: InternalError,
    Status.NOT_FOUND: NotFoundError,
    Status.INVALID_ARG: InvalidArgumentError,
    Status.UNAVAILABLE: UnavailableError,
    Status.UNSUPPORTED: UnsupportedError,
    Status.ALREADY_EXISTS: AlreadyExistsError,
    Status.CANCELLED: CancelledError,
    Status.TOO_LARGE: InvalidArgumentError,
}


def from_server_error(error: ServerError) -> TritonError:
    """The API's error for an error of the server's core, with its message."""
    return _BY_STATUS.get(error.status, InternalError)(error.message)
