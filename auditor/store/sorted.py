"""Rows kept out of memory as an audit makes them, given back sorted: :class:`SortedRows`.

A study of a million files has a million evidence rows; holding each as a Python object
until the report is written costs about 400 bytes a row. :class:`SortedRows` writes rows
(tuples of plain values) to an unnamed temporary file in sorted runs and gives them back
merged: the order ``sorted()`` would give the whole list (stable: of equal keys, the one
added first), with only a piece of each run in memory at a time; a run is written only
once it is full, so a small study's rows never leave memory. :class:`EvidenceStore` keeps
a study's evidence rows so, and counts what the report says of them as they pass;
:func:`kept_sorted` sorts records into a :class:`~auditor.store.Kept`.
"""

from __future__ import annotations

import heapq
import pickle
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import fields
from operator import attrgetter, itemgetter
from typing import IO, Any, TypeVar

from auditor.model import HASHED_STATUSES, EvidenceFile
from auditor.store.kept import Kept
from auditor.store.settings import read_at, spill_from, spilling, temporary_file, write_at

RUN_ROWS = 16_384
"""Rows sorted together before they go to disk (a run), or
:func:`~auditor.store.settings.spill_from` if fewer (but :data:`MIN_RUN_ROWS`)."""
MIN_RUN_ROWS = 8
"""The fewest rows of a run (spilling from the first record sorts runs of this many)."""
PIECE_ROWS = 1024
"""Rows of a run read back at a time while the runs are merged."""


class SortedRows:
    """Rows (tuples) kept on disk in sorted runs, given back sorted by their element
    ``key`` (a stable sort of every row, in the order added). The file has no name on
    disk and goes when this object does."""

    def __init__(self, key: int, run_rows: int | None = None, piece_rows: int | None = None
                 ) -> None:
        self._key = itemgetter(key)
        self._run_rows = run_rows or min(RUN_ROWS, max(spill_from(), MIN_RUN_ROWS))
        self._piece_rows = piece_rows or min(PIECE_ROWS, self._run_rows)
        self._pending: list[tuple[Any, ...]] = []
        self._runs: list[list[tuple[int, int]]] = []
        """Each run's pieces: (offset, length) in the file."""
        self._file: IO[bytes] | None = None
        self._end = 0
        """Where the file's next piece goes."""
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
                self._file = temporary_file()
                weakref.finalize(self, self._file.close)  # (closed with its owner)
            pieces = []
            for start in range(0, len(run), self._piece_rows):
                data = pickle.dumps(run[start:start + self._piece_rows], protocol=5)
                write_at(self._file, data, self._end)
                pieces.append((self._end, len(data)))
                self._end += len(data)
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
            with spilling():
                data = read_at(self._file, length, offset)
            yield from pickle.loads(data)


_ROW_FIELDS = attrgetter(*(f.name for f in fields(EvidenceFile)))


class EvidenceStore:
    """A study's evidence rows kept out of memory as they come (each period's, then those
    of the files no period lists), given back sorted by path as ``sorted()`` would sort
    them, with what the report counts of them: how many have each status
    (:attr:`statuses`), how many were hashed (:attr:`hashed`) and the rows that are not
    verified (:attr:`unusual`, by path), which are few."""

    def __init__(self) -> None:
        self._rows = SortedRows(key=0)
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


T = TypeVar("T")


def kept_sorted(items: Iterable[T], key: Callable[[T], Any]) -> Kept[T]:
    """``items`` sorted by ``key`` (stable), in a :class:`~auditor.store.Kept`: sorted in
    runs on disk when they are many, each given to the sequence as the runs merge."""
    rows = SortedRows(key=0)
    rows.extend((key(item), item) for item in items)
    return Kept(item for _, item in rows)
