"""Tests for the one line splitter, :func:`auditor._io.iter_blocks`, and :func:`iter_lines`
on top of it: at every read size they cut a stream exactly as splitting it in memory does.

The allocator trace reader and the training log scanner read through ``iter_blocks``; their
own tests compare them with a line-by-line reading (:func:`plain_lines` is that reading).
"""

from __future__ import annotations

import io
import random
from collections.abc import Iterator

import pytest

from auditor import _io
from auditor._io import Block, HashingReader, Line, iter_blocks, iter_lines


def plain_lines(data: bytes, max_line: int) -> Iterator[Line]:
    """The lines of ``data`` split in memory: what the streaming splitter must give."""
    pieces = data.split(b"\n")
    last = pieces.pop()
    for number, piece in enumerate(pieces, 1):
        length = len(piece)
        if length > max_line:
            yield Line(number, piece[:max_line], length, True)
        elif piece.endswith(b"\r"):
            yield Line(number, piece[:-1], length - 1, True)
        else:
            yield Line(number, piece, length, True)
    if last:
        yield Line(len(pieces) + 1, last[:max_line], len(last), False)


def blocks_as_lines(data: bytes, max_line: int) -> list[tuple[bytes, int, bool]]:
    """``iter_blocks`` of ``data``, its blocks cut into (raw line, length, terminated)."""
    out: list[tuple[bytes, int, bool]] = []
    for item in iter_blocks(io.BytesIO(data), max_line):
        if isinstance(item, Line):
            assert item.number == 0 and len(item.data) <= max_line
            out.append((item.data, item.length, item.terminated))
        else:
            assert isinstance(item, Block)
            chunk, start, end = item
            assert start < end and chunk[end - 1 : end] == b"\n"
            out.extend((piece[:max_line], len(piece), True)
                       for piece in chunk[start : end - 1].split(b"\n"))
    return out


def random_data(rng: random.Random) -> bytes:
    words = [b"", b"a", b"bb", b"\r", b"x" * 30, b"\xff", b"{}", b"y" * 100]
    lines = [b"".join(rng.choice(words) for _ in range(rng.choice([0, 1, 2, 5])))
             for _ in range(rng.choice([0, 1, 2, 10, 60]))]
    data = b"\n".join(lines)
    return data + b"\n" if rng.random() < 0.5 else data


@pytest.mark.parametrize("seed", range(8))
def test_every_read_size_cuts_like_splitting_in_memory(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    for _ in range(60):
        data = random_data(rng)
        max_line = rng.choice([1, 3, 16, 64, 65536])
        monkeypatch.setattr(_io, "CHUNK_SIZE", rng.choice([1, 2, 3, 7, 50, 1 << 20]))
        expected = list(plain_lines(data, max_line))
        assert list(iter_lines(io.BytesIO(data), max_line)) == expected, (data, max_line)
        raw = [(line.data, line.length, line.terminated) for line in expected]
        # iter_blocks keeps each \r (only iter_lines removes it): compare without it
        unstripped = [
            (data if clipped or not terminated or not data.endswith(b"\r") else data[:-1],
             length - (not clipped and terminated and data.endswith(b"\r")), terminated)
            for data, length, terminated in blocks_as_lines(data, max_line)
            for clipped in [length > len(data)]
        ]
        assert unstripped == raw, (data, max_line)


def test_a_line_spanning_reads_comes_alone_and_clipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_io, "CHUNK_SIZE", 4)
    items = list(iter_blocks(io.BytesIO(b"ab\ncdefghij\r\nk"), 5))
    assert items == [
        Block(b"ab\nc", 0, 3),
        Line(0, b"cdefg", 9, True),  # the raw line, \r kept, clipped to 5
        Line(0, b"k", 1, False),
    ]


def test_an_empty_stream_yields_nothing_and_every_byte_is_hashed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert list(iter_blocks(io.BytesIO(b""), 10)) == []
    monkeypatch.setattr(_io, "CHUNK_SIZE", 3)
    data = b"z" * 50 + b"\n" + b"w" * 7
    reader = HashingReader(io.BytesIO(data))
    assert [line.length for line in iter_lines(reader, 4)] == [50, 7]
    assert reader.digest().size == len(data)
