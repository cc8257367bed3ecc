"""Records kept out of memory as an audit makes them, given back in order.

A study of a million files has a million evidence rows; holding each as a Python object
until the report is written costs about 400 bytes a row. :class:`SortedSpill` writes rows
(tuples of plain values) to an unnamed temporary file in sorted runs and gives them back
merged: the order ``sorted()`` would give the whole list (stable: of equal keys, the one
added first), with only a piece of each run in memory at a time. :class:`EvidenceSpill`
keeps a study's evidence rows so, and counts what the report says of them as they pass.
:class:`PackedList` keeps a sequence of records (a large study's judged periods and
verdicts) pickled and compressed in memory, a block at a time, and gives them back made
anew as they are read; :class:`Packed` keeps one value so.
"""

from __future__ import annotations

import contextlib
import heapq
import pickle
import tempfile
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import fields
from operator import attrgetter, itemgetter
from typing import IO, Any, Generic, TypeVar, overload

from auditor.errors import OutputError
from auditor.model import HASHED_STATUSES, EvidenceFile

RUN_ROWS = 16_384
"""Rows sorted together before they go to disk (a run)."""
PIECE_ROWS = 1024
"""Rows of a run read back at a time while the runs are merged."""
PACK_BLOCK = 64
"""Records a :class:`PackedList` pickles and compresses together (a judged period's
verdict and records took 8.7 KB as objects, 2.1 KB pickled in blocks of 64 and 0.4 KB
compressed; a block is remade in about 3 ms)."""

T = TypeVar("T")
U = TypeVar("U")


@contextlib.contextmanager
def spilling() -> Iterator[None]:
    """Around making and writing a temporary file of rows: a temporary directory that is
    full or cannot be written is the user's one line (exit 2), not a bug."""
    try:
        yield
    except OSError as error:
        raise OutputError(
            f"cannot keep the audit's rows in the temporary directory "
            f"{tempfile.gettempdir()} ({error.strerror or error}); point TMPDIR at a "
            "directory with room") from None


class SortedSpill:
    """Rows (tuples) kept on disk in sorted runs, given back sorted by their element
    ``key`` (a stable sort of every row, in the order added). The file has no name on
    disk and goes when this object does."""

    def __init__(self, key: int, run_rows: int | None = None, piece_rows: int | None = None
                 ) -> None:
        self._key = itemgetter(key)
        self._run_rows = run_rows or RUN_ROWS
        self._piece_rows = piece_rows or PIECE_ROWS
        self._pending: list[tuple[Any, ...]] = []
        self._runs: list[list[tuple[int, int]]] = []
        """Each run's pieces: (offset, length) in the file."""
        self._file: IO[bytes] | None = None
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def extend(self, rows: Iterable[tuple[Any, ...]]) -> None:
        """Add ``rows``; each full run is sorted and written out."""
        before = len(self._pending)
        self._pending.extend(rows)
        self._size += len(self._pending) - before
        if len(self._pending) >= self._run_rows:
            self._spill()

    def _spill(self) -> None:
        run = sorted(self._pending, key=self._key)  # (stable: equal keys in order added)
        self._pending = []
        with spilling():
            if self._file is None:
                self._file = tempfile.TemporaryFile()
            self._file.seek(0, 2)
            pieces = []
            for start in range(0, len(run), self._piece_rows):
                data = pickle.dumps(run[start:start + self._piece_rows], protocol=5)
                pieces.append((self._file.tell(), len(data)))
                self._file.write(data)
            self._file.flush()
        self._runs.append(pieces)

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        """Every row, sorted; the rows still in memory are the last run."""
        last = sorted(self._pending, key=self._key)
        if not self._runs:
            return iter(last)
        runs = [self._run(pieces) for pieces in self._runs]
        return heapq.merge(*runs, iter(last), key=self._key)  # (stable: earlier runs first)

    def _run(self, pieces: list[tuple[int, int]]) -> Iterator[tuple[Any, ...]]:
        assert self._file is not None
        for offset, length in pieces:
            self._file.seek(offset)
            yield from pickle.loads(self._file.read(length))


_ROW_FIELDS = attrgetter(*(f.name for f in fields(EvidenceFile)))


class EvidenceSpill:
    """A study's evidence rows kept out of memory as they come (each period's, then those
    of the files no period lists), given back sorted by path as ``sorted()`` would sort
    them, with what the report counts of them: how many have each status
    (:attr:`statuses`), how many were hashed (:attr:`hashed`) and the rows that are not
    verified (:attr:`unusual`, by path), which are few."""

    def __init__(self) -> None:
        self._rows = SortedSpill(key=0)
        self.statuses: Counter[str] = Counter()
        self.hashed = 0
        self._unusual: list[EvidenceFile] = []

    def __len__(self) -> int:
        return len(self._rows)

    def extend(self, rows: Iterable[EvidenceFile]) -> None:
        """Add ``rows``."""
        values = []
        for row in rows:
            self.statuses[row.status] += 1
            self.hashed += row.actual_sha256 is not None and row.status in HASHED_STATUSES
            if row.status != "verified":
                self._unusual.append(row)
            values.append(_ROW_FIELDS(row))
        self._rows.extend(values)

    def __iter__(self) -> Iterator[EvidenceFile]:
        return (EvidenceFile(*values) for values in self._rows)

    @property
    def unusual(self) -> list[EvidenceFile]:
        """The rows not verified, by path (stable)."""
        return sorted(self._unusual, key=attrgetter("path"))


class PackedList(Sequence[T]):
    """A list of records (picklable, immutable) kept pickled and zlib-compressed in memory
    in blocks of :data:`PACK_BLOCK`, appended in order, given back as a sequence: each one
    read is made anew from its block (the last block read is kept made, so reading in
    order, or near it, remakes each block once a pass). For what a study holds a record
    per period of until its report is written: at a hundred thousand periods, about a
    twentieth of the memory the objects took, at about 45 us a record each pass. Records
    that were one object are one object again only within a block (values are equal, not
    identical): nothing is to compare them by identity."""

    def __init__(self, items: Iterable[T] = (), block: int | None = None) -> None:
        self._block = block or PACK_BLOCK
        self._blocks: list[bytes] = []
        self._tail: list[T] = []
        self._made: tuple[int, list[T]] = (-1, [])
        for item in items:
            self.append(item)

    def append(self, item: T) -> None:
        """Add ``item`` at the end (a full block is packed)."""
        self._tail.append(item)
        if len(self._tail) >= self._block:
            self._keep(zlib.compress(pickle.dumps(self._tail, protocol=5), 1))
            self._tail = []

    def _keep(self, data: bytes) -> None:
        """Keep a packed block (after the others)."""
        self._blocks.append(data)

    def _load(self, number: int) -> list[T]:
        """Packed block ``number``'s records, made anew."""
        loaded: list[T] = pickle.loads(zlib.decompress(self._blocks[number]))
        return loaded

    def _packed(self) -> int:
        """How many blocks are packed."""
        return len(self._blocks)

    def extend(self, items: Iterable[T]) -> None:
        """Add ``items`` at the end, in order."""
        for item in items:
            self.append(item)

    def __len__(self) -> int:
        return self._packed() * self._block + len(self._tail)

    def _made_block(self, number: int) -> list[T]:
        if number == self._packed():
            return self._tail
        if self._made[0] != number:
            self._made = (number, self._load(number))
        return self._made[1]

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> list[T]: ...

    def __getitem__(self, index: int | slice) -> T | list[T]:
        if isinstance(index, slice):
            return [self[at] for at in range(*index.indices(len(self)))]
        size = len(self)
        if index < 0:
            index += size
        if not 0 <= index < size:
            raise IndexError("PackedList index out of range")
        number, at = divmod(index, self._block)
        return self._made_block(number)[at]

    def __iter__(self) -> Iterator[T]:
        for number in range(self._packed()):
            # (made apart from the one-block cache: passes that interleave stay cheap)
            yield from self._load(number)
        yield from self._tail

    def drain(self) -> Iterator[T]:
        """Every record, in order, each block let go once read: the list is empty from
        the first call on."""
        blocks, tail = self._blocks, self._tail
        self._blocks, self._tail, self._made = [], [], (-1, [])
        blocks.reverse()
        while blocks:
            yield from pickle.loads(zlib.decompress(blocks.pop()))
        yield from tail

    def __reduce__(self) -> tuple[Any, ...]:
        return (PackedList, (list(self), self._block))


class SpilledList(PackedList[T]):
    """A :class:`PackedList` whose packed blocks are kept in an unnamed temporary file,
    not in memory: for a sequence made once and read over in order several times (a
    report's diagnosis group, whose members are read in several passes)."""

    def __init__(self, items: Iterable[T] = (), block: int | None = None) -> None:
        self._file: IO[bytes] | None = None
        self._places: list[tuple[int, int]] = []
        """Each packed block's (offset, length) in the file."""
        super().__init__(items, block)

    def _keep(self, data: bytes) -> None:
        with spilling():
            if self._file is None:
                self._file = tempfile.TemporaryFile()
            self._file.seek(0, 2)
            self._places.append((self._file.tell(), len(data)))
            self._file.write(data)

    def _load(self, number: int) -> list[T]:
        assert self._file is not None
        offset, length = self._places[number]
        with spilling():
            self._file.seek(offset)
            data = self._file.read(length)
        loaded: list[T] = pickle.loads(zlib.decompress(data))
        return loaded

    def _packed(self) -> int:
        return len(self._places)

    def drain(self) -> Iterator[T]:
        """Every record, in order (the file is let go once read)."""
        yield from self
        self._places, self._tail, self._made, self._file = [], [], (-1, []), None

    def __reduce__(self) -> tuple[Any, ...]:
        return (SpilledList, (list(self), self._block))


class Packed(Generic[T]):
    """One value kept pickled and zlib-compressed until it is wanted (:meth:`load` makes
    it anew each time), and sent on as it is kept: what a worker is given with a batch, or
    what waits unread while the audit reads (a scheduler dump's rows: 55,556 jobs took
    55 MB as objects, 9.4 MB pickled, 2.2 MB compressed)."""

    __slots__ = ("data",)

    def __init__(self, value: T) -> None:
        self.data = zlib.compress(pickle.dumps(value, protocol=5), 1)

    def load(self) -> T:
        """The value, made anew."""
        value: T = pickle.loads(zlib.decompress(self.data))
        return value


class MappedSequence(Sequence[U]):
    """``function`` of each item of ``base``, made as each is read (a part of each of a
    :class:`PackedList`'s records, say, with no second copy of them held)."""

    def __init__(self, base: Sequence[T], function: Callable[[T], U]) -> None:
        self._base = base
        self._function = function

    def __len__(self) -> int:
        return len(self._base)

    @overload
    def __getitem__(self, index: int) -> U: ...

    @overload
    def __getitem__(self, index: slice) -> list[U]: ...

    def __getitem__(self, index: int | slice) -> U | list[U]:
        if isinstance(index, slice):
            return [self[at] for at in range(*index.indices(len(self)))]
        return self._function(self._base[index])

    def __iter__(self) -> Iterator[U]:
        return map(self._function, self._base)
