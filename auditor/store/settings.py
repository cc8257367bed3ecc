"""Where the store keeps what it takes out of memory, and from what size it does.

Two settings, each with a sane default a user never has to touch:

- :func:`spill_from`: how many records a :class:`~auditor.store.Kept` holds as objects
  before it packs them (``AUDITOR_SPILL_FROM`` in the environment; 0 packs from the first
  record, the setting the test suite runs the whole spilling path with on small studies).
- :func:`spill_directory`: the directory its temporary files go to (unnamed files, gone when
  the process is: they leave nothing behind). The command line points it beside ``--out``
  (:func:`spilling_into`); else it is ``TMPDIR``'s. The pipeline refuses one under the
  evidence root (:func:`check_outside`): the auditor never writes there.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from auditor._signals import signals_deferred
from auditor.errors import OutputError, UsageError

SPILL_FROM = 20_000
"""Records a :class:`~auditor.store.Kept` holds as objects before it packs them. A judged
period's verdict took about 6 KB as objects; packed, a record costs about 45 us each time
it is read, and the report reads the periods through some fifty times: at 16,000 periods
(144,003 files) packing from 4,096 made the audit 1.7x slower (41.7 s against 23.3 s), so
below this many the objects are cheaper."""

SPILL_FROM_VARIABLE = "AUDITOR_SPILL_FROM"
"""The environment variable that overrides :data:`SPILL_FROM` (a whole number; 0: from the
first record). Read each time a sequence is made, so it reaches the pool's workers too."""

_DIRECTORY: list[Path] = []
"""The directory :func:`spilling_into` set, innermost last."""


def spill_from() -> int:
    """Records a :class:`~auditor.store.Kept` holds as objects before it packs them."""
    given = os.environ.get(SPILL_FROM_VARIABLE, "").strip()
    if not given:
        return SPILL_FROM
    if not given.isdigit():
        raise UsageError(f"{SPILL_FROM_VARIABLE}={given!r}: give a whole number of records "
                         "(0 keeps every one out of memory)")
    return int(given)


def spill_directory() -> Path:
    """Where temporary files go: the directory :func:`spilling_into` set, else ``TMPDIR``'s
    (:func:`tempfile.gettempdir`)."""
    return _DIRECTORY[-1] if _DIRECTORY else Path(tempfile.gettempdir())


@contextlib.contextmanager
def spilling_into(directory: Path) -> Iterator[Path]:
    """Within the block, temporary files go to ``directory`` (made, if missing, and removed
    at the end when made here and left empty: the files themselves have no names)."""
    made = not directory.exists()
    with spilling():
        directory.mkdir(parents=True, exist_ok=True)
    _DIRECTORY.append(directory)
    try:
        yield directory
    finally:
        with signals_deferred():  # (a second Ctrl-C here left the directory)
            _DIRECTORY.pop()
            if made:
                with contextlib.suppress(OSError):
                    directory.rmdir()


def check_outside(root: Path) -> None:
    """Refuse (one line) a spill directory inside the evidence root ``root``: told from the
    environment before :func:`tempfile.gettempdir` is asked, which tries each candidate by
    writing a file in it (under the root, that write was the audit's)."""
    where = _DIRECTORY[-1] if _DIRECTORY else Path(tempfile.tempdir) if tempfile.tempdir \
        else next((Path(value) for name in ("TMPDIR", "TEMP", "TMP")
                   if (value := os.environ.get(name))), None)
    if where is None:
        where = spill_directory()
    where = where.resolve()
    if where == root or root in where.parents:
        raise UsageError(f"the temporary directory {where} is inside the evidence root "
                         f"{root}, which the audit never writes to; point TMPDIR elsewhere")


@contextlib.contextmanager
def spilling() -> Iterator[None]:
    """Around making and writing a temporary file: a temporary directory that is full or
    cannot be written is the user's one line (exit 2), not a bug."""
    try:
        yield
    except OSError as error:
        raise OutputError(
            f"cannot keep the audit's records in the temporary directory "
            f"{spill_directory()} ({error.strerror or error}); point TMPDIR at a "
            "directory with room") from None


def temporary_file() -> IO[bytes]:
    """An unnamed temporary file in :func:`spill_directory` (it goes with its object)."""
    with spilling():
        return tempfile.TemporaryFile(dir=spill_directory())


def write_at(file: IO[bytes], data: bytes, offset: int) -> None:
    """Write ``data`` at ``offset`` of ``file`` (unbuffered, by position).

    By position, never through the file's offset: a process forked from this one (the
    report's helper, :mod:`auditor.report.beside`) shares that offset, and a read of its own
    would move it under this process's feet."""
    view = memoryview(data)
    while view:
        written = os.pwrite(file.fileno(), view, offset)
        view, offset = view[written:], offset + written


class ReadFromStart(io.RawIOBase):
    """``file`` read from its start by position (see :func:`write_at`), through an offset of
    this reader's own: what a library that reads a stream (pyarrow's IPC reader) is given."""

    def __init__(self, file: IO[bytes]) -> None:
        super().__init__()
        self._descriptor = file.fileno()
        self._at = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = os.pread(self._descriptor, len(buffer), self._at)
        buffer[:len(data)] = data
        self._at += len(data)
        return len(data)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_END:
            base = os.fstat(self._descriptor).st_size
        else:  # (SEEK_SET or SEEK_CUR; a stream's reader asks for no other)
            base = self._at if whence == os.SEEK_CUR else 0
        self._at = max(base + offset, 0)
        return self._at

    def tell(self) -> int:
        return self._at


def read_at(file: IO[bytes], length: int, offset: int) -> bytes:
    """``length`` bytes of ``file`` from ``offset``, by position (see :func:`write_at`)."""
    parts = []
    while length > 0:
        part = os.pread(file.fileno(), length, offset)
        if not part:
            raise OSError(f"a temporary file ended {length} bytes early")
        parts.append(part)
        length, offset = length - len(part), offset + len(part)
    return b"".join(parts)
