"""Streaming byte I/O shared by the collectors: hash while parsing, lines in bounded memory.

Threat model for the hashing: evidence files are attacker-controllable in the
sense that a crashing job or a careless copy can leave anything on disk. The
auditor therefore reads every listed file exactly once, through
:class:`HashingReader`, so the SHA-256 it reports is the hash of exactly the
bytes it parsed (no time-of-check/time-of-use gap between hashing and parsing),
and it never holds more than one chunk plus one clipped line in memory.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, NamedTuple, Protocol

from auditor.model import FileDigest

CHUNK_SIZE = 1 << 20
"""Bytes read per call; large enough to amortise syscalls, small enough to bound memory."""

DEFAULT_MAX_LINE = 1 << 16
"""Longest line (bytes) kept for parsing; longer lines are clipped, still hashed in full."""


class Readable(Protocol):
    """What :class:`HashingReader` reads from: a binary file, or anything with its ``read``."""

    def read(self, size: int = ..., /) -> bytes: ...


class HashingReader:
    """Wraps a binary file: every byte read through it feeds one SHA-256 and a size count.

    Call :meth:`drain` after parsing so bytes a parser did not consume (it
    stopped early) are still hashed, then :meth:`digest`.
    """

    def __init__(self, raw: BinaryIO | Readable) -> None:
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


class Block(NamedTuple):
    """The complete lines of one read chunk: ``chunk[start:end]``, each ending in ``\\n``
    (``end`` is just after the chunk's last newline; a ``\\r`` before it is kept)."""

    chunk: bytes
    start: int
    end: int


def iter_blocks(
    stream: BinaryIO | HashingReader, max_line: int = DEFAULT_MAX_LINE
) -> Iterator[Block | Line]:
    """The one line splitter: ``stream`` cut into lines, a read chunk at a time.

    Yields a :class:`Block` for the complete lines inside each chunk (never split into
    lines here: a fast reader searches a block whole; a line in it may be longer than
    ``max_line``, the reader checks), and a :class:`Line` for a line that spans chunks
    (``terminated``) or ends the stream without a newline (not ``terminated``). Such a
    line's ``number`` is 0 (only the reader counts lines), its ``data`` is the raw bytes
    (a trailing ``\\r`` kept) clipped to ``max_line``, its ``length`` the full length
    without the newline. Blocks and lines come in stream order; an empty stream yields
    nothing. Memory: one chunk, plus at most ``max_line`` bytes of a line that spans
    chunks (the rest is read, and so hashed, but not kept).
    """
    carry = b""  # the kept start (at most max_line bytes) of an unfinished line
    carry_length = 0  # that line's full length so far
    while chunk := stream.read(CHUNK_SIZE):
        first = chunk.find(b"\n")
        if first < 0:  # the whole chunk continues one line
            if len(carry) < max_line:
                carry += chunk[: max_line - len(carry)]
            carry_length += len(chunk)
            continue
        start = 0
        if carry_length:
            if len(carry) < max_line:
                carry += chunk[: min(first, max_line - len(carry))]
            yield Line(0, carry, carry_length + first, True)
            carry, carry_length, start = b"", 0, first + 1
        last = chunk.rfind(b"\n")
        if start <= last:
            yield Block(chunk, start, last + 1)
        if last + 1 < len(chunk):
            carry = chunk[last + 1 : last + 1 + max_line]
            carry_length = len(chunk) - last - 1
    if carry_length:
        yield Line(0, carry, carry_length, False)


def iter_lines(
    stream: BinaryIO | HashingReader, max_line: int = DEFAULT_MAX_LINE
) -> Iterator[Line]:
    """Yield the lines of ``stream`` one by one, numbered, in bounded memory (the lines
    of :func:`iter_blocks`).

    A line longer than ``max_line`` bytes is yielded clipped to its first
    ``max_line`` bytes with its true ``length``; the rest is read (and so
    hashed) but not kept. A trailing ``\\r`` is removed from a line that is
    neither clipped nor the final one without a newline. An empty stream yields
    nothing; a final line without a newline is yielded with ``terminated=False``.
    """
    number = 0
    for item in iter_blocks(stream, max_line):
        if isinstance(item, Line):
            number += 1
            data, length = item.data, item.length
            if item.terminated and length == len(data) and data.endswith(b"\r"):
                data, length = data[:-1], length - 1
            yield Line(number, data, length, item.terminated)
            continue
        chunk, start, end = item
        find = chunk.find
        while start < end:
            newline = find(b"\n", start, end)
            number += 1
            length = newline - start
            if length > max_line:
                yield Line(number, chunk[start : start + max_line], length, True)
            elif length and chunk[newline - 1] == 13:  # b"\r"
                yield Line(number, chunk[start : newline - 1], length - 1, True)
            else:
                yield Line(number, chunk[start:newline], length, True)
            start = newline + 1


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
    """Hash a regular file that is not parsed (source and protocol inputs, outputs); anything
    else is an ``OSError`` saying so: a FIFO opened without waiting for a writer (the audit
    would block for ever), a device (it would never end), a pipe (a shell's process
    substitution: what it gave could never be read again, so ``auditor verify`` and the
    catalogue would refuse the audit for ever)."""
    descriptor = _regular_descriptor(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC,
                                     fifo="a pipe, which no later 'auditor verify' can read "
                                     "again; save it to a file")
    with os.fdopen(descriptor, "rb") as handle:
        reader = HashingReader(handle)
        reader.drain()
        return reader.digest()


def regular_bytes(path: Path | str, read: bool = True, limit: int = -1,
                  follow: bool = True) -> bytes:
    """The bytes of the regular file ``path`` (none unless ``read``; at most ``limit``, -1
    for all); anything else is an ``OSError`` saying what it is: a FIFO put in its place
    would block the read for ever, a device never end it. ``follow``: a link in the file's
    place is followed; else refused (an audit's own outputs, which are never links: one
    would be read where it leads)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        descriptor = _regular_descriptor(path, flags)
    except OSError as error:
        if error.errno == errno.ELOOP and not follow:
            raise OSError(errno.ELOOP, "a link in its place; not read", str(path)) from None
        raise
    with os.fdopen(descriptor, "rb") as handle:
        return handle.read(limit) if read else b""


def _regular_descriptor(path: Path | str, flags: int, fifo: str = "not a regular file"
                        ) -> int:
    """``path`` opened with ``flags`` (``O_NONBLOCK`` among them: a FIFO is opened, never
    waited on), its descriptor; anything but a regular file is an ``OSError`` saying what
    it is (``fifo``: what a FIFO or pipe is said to be)."""
    descriptor = os.open(path, flags)
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, fifo if stat.S_ISFIFO(mode) else "not a regular file",
                          str(path))
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DIR_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Beneath:
    """Opens files below one directory (the evidence root) through descriptors: each part
    of a root-relative path opened relative to its directory's descriptor, none through a
    link (``O_NOFOLLOW``), a FIFO never waited on (``O_NONBLOCK``). The path checks decide,
    before reading, what may be read and where (links inside the root resolved); a file
    swapped for a link, or a directory for one, between that check and this open is then
    refused, never followed out of the root. A context manager: the directories it opened
    (kept for the files beside each other: an attempt's) are closed at its end."""

    __slots__ = ("_dirs", "root")

    def __init__(self, root: str) -> None:
        self.root = root.rstrip("/") or "/"
        self._dirs: dict[str, int] = {}

    def open(self, rel: str, listed: int | None = None) -> Bounded:
        """The regular file at ``rel`` (no ``..``, no link on the way), to be read no
        further than ``listed`` bytes (its manifest size; its size now when None) plus one
        block. ``OSError`` otherwise: ``ELOOP`` for a link, ``EINVAL`` for a file that is
        not a regular one."""
        directory, _, name = rel.rpartition("/")
        descriptor = os.open(name, _FILE_FLAGS, dir_fd=self._dir(directory))
        try:
            return Bounded(descriptor, listed)
        except BaseException:
            os.close(descriptor)
            raise

    def relative(self, path: str) -> str | None:
        """``path`` (absolute: a checked path's resolved one) relative to the root; None
        when it is not below it."""
        prefix = self.root if self.root.endswith("/") else self.root + "/"
        return path[len(prefix):] if path.startswith(prefix) else None

    def _dir(self, rel: str) -> int:
        found = self._dirs.get(rel)
        if found is not None:
            return found
        if not rel:
            descriptor = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        else:
            up, _, name = rel.rpartition("/")
            if name in ("", ".", ".."):
                raise OSError(errno.EINVAL, "not a plain path below the root", rel)
            descriptor = os.open(name, _DIR_FLAGS, dir_fd=self._dir(up))
        self._dirs[rel] = descriptor
        return descriptor

    def close(self) -> None:
        """Close every directory opened."""
        for descriptor in self._dirs.values():
            os.close(descriptor)
        self._dirs.clear()

    def __enter__(self) -> Beneath:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class Bounded:
    """A regular file read through its descriptor (``os.read``: no file object, whose making
    and closing took 2 of the 10 us that opening, hashing and closing a small file costs),
    no further than its listed size plus one block; :meth:`problem` says, after the
    reading, whether it was larger than listed or changed while it was read."""

    __slots__ = ("fd", "_left", "_over", "_read", "_reads", "_stamp")

    def __init__(self, descriptor: int, listed: int | None) -> None:
        info = os.fstat(descriptor)
        if stat.S_ISDIR(info.st_mode):
            raise OSError(errno.EISDIR, os.strerror(errno.EISDIR))
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        self.fd = descriptor
        self._stamp = (info.st_size, info.st_mtime_ns, info.st_ino)
        self._left = (info.st_size if listed is None else max(listed, 0)) + CHUNK_SIZE
        self._over = False
        self._read = 0
        self._reads = 0

    def read(self, size: int = CHUNK_SIZE) -> bytes:
        if self._left <= 0:  # (a file that keeps growing is never read for ever)
            self._over = self._over or bool(os.read(self.fd, 1))
            return b""
        data = os.read(self.fd, min(size, self._left))
        self._left -= len(data)
        self._read += len(data)
        self._reads += 1
        return data

    @property
    def cut(self) -> bool:
        """Whether the reading stopped at the listed size with more of the file left."""
        return self._over

    def problem(self) -> str:
        """Why the bytes read are not the file's (after reading to the end): "" when they
        are."""
        if self._over:
            return (f"larger than its listed size: read no further than {self._read:,} bytes "
                    "(it grew, or its listing is wrong)")
        if self._read != self._stamp[0]:
            return "changed while the audit read it"
        if self._reads > 2:  # (a file read in one call, then its end, has had no time to)
            info = os.fstat(self.fd)
            if (info.st_size, info.st_mtime_ns, info.st_ino) != self._stamp:
                return "changed while the audit read it"
        return ""

    def __enter__(self) -> Bounded:
        return self

    def __exit__(self, *_: object) -> None:
        os.close(self.fd)


def open_reason(error: OSError) -> str:
    """A short reason an evidence file could not be opened or read (without the path)."""
    if error.errno == errno.ELOOP:
        return "a link where the audit's check found none (not followed)"
    if error.errno == errno.ENOTDIR:
        return "a directory on its path was replaced (not followed)"
    return error.strerror or type(error).__name__
