"""What a worker template (workers/template.py) and the frontend (templates.py) say to each other
over their SOCK_SEQPACKET socket: one message per packet, a kind byte then a msgpack body, with
file descriptors beside it as SCM_RIGHTS."""

from __future__ import annotations

import array
import socket
from collections.abc import Sequence

import msgspec

TEMPLATE_ENV = "TRITONMP_TEMPLATE"  # the template's: "<backend> <frontend pid> <its socket's fd>"


class ForkRequest(msgspec.Struct, array_like=True):
    env: dict[str, str]  # where the worker's environment differs from the template's (CUDA_VISIBLE_DEVICES)


class Forked(msgspec.Struct, array_like=True):
    pid: int = 0
    error: str = ""


class Exited(msgspec.Struct, array_like=True):
    pid: int
    status: int  # as waitpid gives it


class Ready(msgspec.Struct, array_like=True):
    preloaded: list[str]  # the modules imported
    failed: list[str]  # those that could not be: their workers import them after the fork


# frontend -> template: FORK (with the worker's socket); template -> frontend: READY once, then
# FORKED (with a pidfd of the worker) for each FORK in order, and EXITED for each worker reaped
FORK, FORKED, EXITED, READY = b"K", b"D", b"X", b"R"
MAX_MESSAGE = 1 << 16  # a ForkRequest carries a few variables (the spec goes on the worker's own socket)

_encoder = msgspec.msgpack.Encoder()


def encode(kind: bytes, message) -> bytes:
    return kind + _encoder.encode(message)


def send_packet(sock: socket.socket, packet: bytes, fds: Sequence[int] = ()) -> None:
    """One encoded message; BlockingIOError where a non-blocking socket has no room for it now."""
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    sock.sendmsg([packet], ancillary)


def send(sock: socket.socket, kind: bytes, message, fds: Sequence[int] = ()) -> None:
    send_packet(sock, encode(kind, message), fds)


def receive(sock: socket.socket) -> tuple[bytes, bytes, list[int]]:
    """(kind, body, descriptors) of one message; kind b"" when the socket has closed."""
    data, ancdata, _flags, _addr = sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(4 * 4))
    fds: list[int] = []
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += array.array("i", payload[:len(payload) - len(payload) % 4]).tolist()
    return data[:1], data[1:], fds


