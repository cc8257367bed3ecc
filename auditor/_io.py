"""Streaming byte I/O shared by the collectors: hash while parsing, lines in bounded memory.

Threat model for the hashing: evidence files are attacker-controllable in the
sense that a crashing job or a careless copy can leave anything on disk. The
auditor therefore reads every listed file exactly once, through
:class:`HashingReader`, so the SHA-256 it reports is the hash of exactly the
bytes it parsed (no time-of-check/time-of-use gap between hashing and parsing),
and it never holds more than one chunk plus one clipped line in memory.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from typing import Any, BinaryIO, NamedTuple

from auditor.model import FileDigest

CHUNK_SIZE = 1 << 20
"""Bytes read per call; large enough to amortise syscalls, small enough to bound memory."""

DEFAULT_MAX_LINE = 1 << 16
"""Longest line (bytes) kept for parsing; longer lines are clipped, still hashed in full."""


class HashingReader:
    """Wraps a binary file: every byte read through it feeds one SHA-256 and a size count.

    Call :meth:`drain` after parsing so bytes a parser did not consume (it
    stopped early) are still hashed, then :meth:`digest`.
    """

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._hash = hashlib.sha256()
        self._size = 0
        self._ended = False

    def read(self, size: int = CHUNK_SIZE) -> bytes:
        """Read up to ``size`` bytes (``-1`` reads the rest in chunks)."""
        if size is None or size < 0:
            parts = []
            while chunk := self.read(CHUNK_SIZE):
                parts.append(chunk)
            return b"".join(parts)
        data = self._raw.read(size)
        if data:
            self._hash.update(data)
            self._size += len(data)
        elif size:
            self._ended = True
        return data

    def drain(self) -> None:
        """Hash whatever has not been read yet (nothing to do once a read hit the end)."""
        while not self._ended and self.read(CHUNK_SIZE):
            pass

    def digest(self) -> FileDigest:
        """The SHA-256 and size of every byte read so far."""
        return FileDigest(self._hash.hexdigest(), self._size)


class Line(NamedTuple):
    """One physical line as the scanner saw it (a tuple: cheap to make per line)."""

    number: int
    """1-based."""
    data: bytes
    """The line without its ``\\n`` (and without a trailing ``\\r``), clipped to the limit."""
    length: int
    """The full length in bytes (without the newline), even when clipped."""
    terminated: bool
    """False only for a final line without a trailing newline."""

    @property
    def clipped(self) -> bool:
        """True when ``data`` is shorter than the real line."""
        return self.length > len(self.data)


def iter_lines(
    stream: BinaryIO | HashingReader, max_line: int = DEFAULT_MAX_LINE
) -> Iterator[Line]:
    """Yield the lines of ``stream`` in bounded memory.

    A line longer than ``max_line`` bytes is yielded clipped to its first
    ``max_line`` bytes with its true ``length``; the rest is read (and so
    hashed) but not kept. An empty stream yields nothing; a final line
    without a newline is yielded with ``terminated=False``.
    """
    number = 0
    pending = bytearray()  # the current line's kept bytes
    pending_length = 0  # the current line's full length so far
    while True:
        chunk = stream.read(CHUNK_SIZE)
        if not chunk:
            break
        start = 0
        while True:
            newline = chunk.find(b"\n", start)
            if newline < 0:
                piece = chunk[start:]
                room = max_line - len(pending)
                if room > 0:
                    pending += piece[:room]
                pending_length += len(piece)
                break
            piece = chunk[start:newline]
            number += 1
            if not pending and len(piece) <= max_line:
                data = bytes(piece)
                length = len(piece)
            else:
                room = max_line - len(pending)
                if room > 0:
                    pending += piece[:room]
                data = bytes(pending)
                length = pending_length + len(piece)
                pending.clear()
                pending_length = 0
            if data.endswith(b"\r") and length == len(data):
                data = data[:-1]
                length -= 1
            yield Line(number, data, length, True)
            start = newline + 1
    if pending_length:
        number += 1
        yield Line(number, bytes(pending), pending_length, False)


def read_limited(stream: BinaryIO | HashingReader, limit: int) -> bytes | None:
    """Read a whole small document, or None (after reading, and hashing, all of it) when it
    is larger than ``limit`` bytes."""
    parts: list[bytes] = []
    total = 0
    while chunk := stream.read(CHUNK_SIZE):
        total += len(chunk)
        if total <= limit:
            parts.append(chunk)
        else:
            parts.clear()
    return b"".join(parts) if total <= limit else None


def sha256_file(path: str) -> FileDigest:
    """Hash a file that is not parsed (source and protocol inputs, outputs)."""
    with open(path, "rb") as handle:
        reader = HashingReader(handle)
        reader.drain()
        return reader.digest()


def printable(text: str) -> str:
    """``text`` as valid UTF-8: a file name's undecodable byte (kept by the file system
    decoding as a lone surrogate, so the file can still be opened) becomes ``\\xNN``, any
    other lone surrogate ``\\uNNNN``. Outputs (Parquet, JSON, markdown, the terminal)
    cannot hold lone surrogates."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "".join(
            f"\\x{ord(ch) - 0xDC00:02x}" if "\udc80" <= ch <= "\udcff"
            else f"\\u{ord(ch):04x}" if "\ud800" <= ch <= "\udfff" else ch
            for ch in text)
    return text


def unprintable(text: str) -> str:
    """The file name :func:`printable` made ``text`` from (its ``\\xNN`` of 80-FF back to
    the bytes the file system decoding keeps as lone surrogates)."""
    if "\\x" not in text:
        return text
    return re.sub(r"\\x([89a-f][0-9a-f])", lambda m: chr(0xDC00 + int(m.group(1), 16)), text)


def printable_json(value: Any) -> Any:
    """``value`` (JSON-like) with every string :func:`printable`."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable_json(k): printable_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [printable_json(v) for v in value]
    if isinstance(value, tuple):
        return tuple(printable_json(v) for v in value)
    return value


def counted(n: int, thing: str) -> str:
    """``n`` things, in the right number: ``1 trace``, ``1,400 findings``."""
    return f"{n:,} {thing}{'' if n == 1 else 's'}"


def clip(text: str, limit: int = 200) -> str:
    """Clip ``text`` to ``limit`` characters, marking the cut with an ellipsis."""
    return text if len(text) <= limit else text[: limit - 1] + "…"
