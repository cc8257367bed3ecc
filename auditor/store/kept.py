"""Sequences whose records the store keeps where their number says: :class:`Kept`.

A study of a million files has 111,112 periods, each judged into a verdict, facts and
records the report reads several times; as objects they were most of the audit's memory,
and packed in memory still 120 MB of it. A :class:`Kept` holds its records as objects until
there are more than :func:`~auditor.store.settings.spill_from` of them, then keeps them
pickled and compressed a block at a time in an unnamed temporary file, made anew as they
are read. Either way it is the same sequence: a reader never asks which.
:class:`Held` keeps one value so; :class:`Mapped` is a view of a function of each record.
"""

from __future__ import annotations

import pickle
import weakref
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import IO, Any, Generic, TypeVar, overload

from auditor.store.settings import read_at, spill_from, spilling, temporary_file, write_at

PACK_BLOCK = 64
"""Records pickled and compressed together (a judged period's verdict and records took
8.7 KB as objects, 2.1 KB pickled in blocks of 64 and 0.4 KB compressed; a block is
remade in about 3 ms); fewer when :func:`~auditor.store.settings.spill_from` is fewer (at
0, each record alone: a small study then runs every packed path)."""

T = TypeVar("T")
U = TypeVar("U")


class _Blocks(Generic[T]):
    """Records pickled and zlib-compressed in blocks of :data:`PACK_BLOCK` in an unnamed
    temporary file, appended in order; the last block read is kept made, so reading in
    order, or near it, remakes each block once a pass."""

    def __init__(self, block: int) -> None:
        self._block = block
        self._file: IO[bytes] | None = temporary_file()
        weakref.finalize(self, self._file.close)  # (closed with its owner: no warning)
        self._places: list[tuple[int, int]] = []
        """Each block's (offset, length) in the file."""
        self._end = 0
        self.tail: list[T] = []
        self._made: tuple[int, list[T]] = (-1, [])

    def packed(self) -> int:
        """How many blocks are packed."""
        return len(self._places)

    def __len__(self) -> int:
        return self.packed() * self._block + len(self.tail)

    def append(self, item: T) -> None:
        self.tail.append(item)
        if len(self.tail) >= self._block:
            data = zlib.compress(pickle.dumps(self.tail, protocol=5), 1)
            self.tail = []
            assert self._file is not None
            with spilling():
                write_at(self._file, data, self._end)
            self._places.append((self._end, len(data)))
            self._end += len(data)

    def load(self, number: int) -> list[T]:
        """Block ``number``'s records, made anew."""
        assert self._file is not None
        offset, length = self._places[number]
        with spilling():
            data = read_at(self._file, length, offset)
        loaded: list[T] = pickle.loads(zlib.decompress(data))
        return loaded

    def at(self, index: int) -> T:
        number, at = divmod(index, self._block)
        if number == self.packed():
            return self.tail[at]
        if self._made[0] != number:
            self._made = (number, self.load(number))
        return self._made[1][at]

    def __iter__(self) -> Iterator[T]:
        for number in range(self.packed()):
            # (made apart from the one-block cache: passes that interleave stay cheap)
            yield from self.load(number)
        yield from self.tail

    def drain(self) -> Iterator[T]:
        """Every record, in order (the file goes once read)."""
        self._made = (-1, [])
        yield from self
        self._file, self._places, self.tail = None, [], []


class Kept(Sequence[T]):
    """A sequence of records (picklable, immutable) appended in order, kept as objects
    while there are at most :func:`~auditor.store.settings.spill_from` of them, then packed
    in an unnamed temporary file. Records read back from a packed block are made anew:
    equal to those given, not the same objects, so nothing may compare them by identity."""

    __slots__ = ("_items", "_blocks", "_from")

    def __init__(self, items: Iterable[T] = ()) -> None:
        self._items: list[T] | None = []
        self._blocks: _Blocks[T] | None = None
        self._from = spill_from()
        self.extend(items)

    def append(self, item: T) -> None:
        """Add ``item`` at the end."""
        if self._items is not None:
            self._items.append(item)
            if len(self._items) > self._from:
                self._pack()
        else:
            assert self._blocks is not None
            self._blocks.append(item)

    def extend(self, items: Iterable[T]) -> None:
        """Add ``items`` at the end, in order."""
        for item in items:
            self.append(item)

    def _pack(self) -> None:
        assert self._items is not None
        items, self._items = self._items, None
        self._blocks = _Blocks(min(PACK_BLOCK, max(self._from, 1)))
        for item in items:
            self._blocks.append(item)

    def __len__(self) -> int:
        return len(self._items) if self._items is not None else len(self._blocks or ())

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> list[T]: ...

    def __getitem__(self, index: int | slice) -> T | list[T]:
        if self._items is not None:
            return self._items[index]
        if isinstance(index, slice):
            return [self[at] for at in range(*index.indices(len(self)))]
        size = len(self)
        if index < 0:
            index += size
        if not 0 <= index < size:
            raise IndexError("Kept index out of range")
        assert self._blocks is not None
        return self._blocks.at(index)

    def __iter__(self) -> Iterator[T]:
        if self._items is not None:
            return iter(self._items)
        assert self._blocks is not None
        return iter(self._blocks)

    def drain(self) -> Iterator[T]:
        """Every record, in order, each let go once read: the sequence is empty from the
        first call on."""
        if self._items is not None:
            items, self._items = self._items, []
            items.reverse()
            while items:
                yield items.pop()
            return
        assert self._blocks is not None
        blocks, self._blocks, self._items = self._blocks, None, []
        yield from blocks.drain()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Kept({len(self)} records)"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Kept, (list(self),))


class Held(Generic[T]):
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


class Mapped(Sequence[U]):
    """``function`` of each item of ``base``, made as each is read (a part of each of a
    :class:`Kept`'s records, say, with no second copy of them held)."""

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
