"""An early look at a protobuf message as it is inflated: its top-level fields' tags and lengths are
followed chunk by chunk, so that output which cannot be a message (a decompression bomb of zeros: a
field number 0) or that declares a field running past the size limit is refused after its first
bytes, instead of once the limit's worth has been inflated. Only the framing is read, never the
fields' contents; protobuf's own parse of the whole message stays the judge of what is accepted."""

from __future__ import annotations

FIELDS_FOLLOWED = 4096  # top-level fields followed; past them the rest is left to the parse


class NotAMessage(ValueError):
    """The bytes so far cannot begin a protobuf message."""


class TooLong(ValueError):
    """A field declares more bytes than the size limit leaves (args: the message's size it implies)."""


class ProtobufFraming:
    """Follows the top-level framing of a message whose bytes come in chunks: `feed(chunk)` raises
    NotAMessage or TooLong as soon as the bytes show it."""

    __slots__ = ("limit", "offset", "skip", "pending", "fields")

    def __init__(self, limit: int):
        self.limit = limit
        self.offset = 0  # bytes of the message fed so far
        self.skip = 0  # bytes still to pass over: the rest of the field being read
        self.pending = b""  # the start of a field's tag and length, cut by a chunk's end
        self.fields = 0

    def feed(self, chunk: bytes) -> None:
        if self.fields >= FIELDS_FOLLOWED:
            return
        n = len(chunk)
        at = self.offset  # the message's offset of chunk[0]
        self.offset += n
        if self.pending:  # the cut tag and length, completed from the chunk's start
            kept = len(self.pending)
            joined = self.pending + chunk[:21]
            self.pending = b""
            cut, i = self._fields(joined, 0, len(joined), at - kept, one=True)
            if cut:
                self._keep(joined[i:])
                return
            self.skip = i - kept
        pos = min(self.skip, n)
        self.skip -= pos
        if pos == n:
            return
        cut, i = self._fields(chunk, pos, n, at)
        if cut:
            self._keep(chunk[i:])
        elif i > n:
            self.skip = i - n

    def _fields(self, data: bytes, i: int, end: int, base: int, one: bool = False) -> tuple[bool, int]:
        """Read field headers from data[i:end] (`base`: the message's offset of data[0]), each field's
        contents passed over: (True, where the cut field starts) when one is cut by `end`, else
        (False, the offset after the last field, which may lie past `end`)."""
        while i < end:
            field_at = i
            tag, i = _varint(data, i, end)
            if tag is None:
                return True, field_at
            number, wire = tag >> 3, tag & 7
            if number == 0 or wire > 5:
                raise NotAMessage(f"a field with number {number} and wire type {wire}")
            length = 0  # a varint's, or a group's start or end
            if wire == 0:
                value, i = _varint(data, i, end)
                if value is None:
                    return True, field_at
            elif wire == 1:
                length = 8
            elif wire == 2:
                declared, i = _varint(data, i, end)
                if declared is None:
                    return True, field_at
                length = declared
            elif wire == 5:
                length = 4
            if base + i + length > self.limit:
                raise TooLong(base + i + length)
            i += length
            self.fields += 1
            if one or self.fields >= FIELDS_FOLLOWED:
                break
        return False, i

    def _keep(self, kept: bytes) -> None:
        if len(kept) > 20:  # no tag and length are this long
            raise NotAMessage("a varint of more than 10 bytes")
        self.pending = bytes(kept)


def _varint(data: bytes, i: int, end: int) -> tuple[int | None, int]:
    """The varint at data[i:], and the offset after it; None when it is cut by `end`."""
    value = 0
    shift = 0
    while i < end:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7
        if shift >= 70:
            raise NotAMessage("a varint of more than 10 bytes")
    return None, i
