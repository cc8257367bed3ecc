"""The allocator trace's fast path, behind one seam: :func:`fold`.

``fold(text, after)`` takes a text of complete lines (each ending in ``\\n``) and returns
what they add to a trace, a :class:`Folded`, when every line is a valid record whose
``seq`` rises from above ``after``; else None, having looked only: the caller then reads
the text record by record (``auditor.collect.allocator_trace``), where each problem is
found and explained. Its contract is the agreement test in
``tests/collect/test_allocator_trace.py``: the trace read through ``fold`` equals the
trace read record by record, on generated traces, on every mutated field, and on every
digit moved anywhere in a line.

Two ways in, cheapest first:

- **Memory samples in a written form** (:data:`~.allocator_record.SAMPLE_FORMS`): the text
  with its digits taken out must be one form repeated; then each colon becomes a minus
  sign, each newline a comma, and one ``orjson`` parse of the resulting array reads every
  value, negated (:func:`_fold_samples`: no Python object per line but its values).
- **Any valid records**, at most :data:`FAST_BATCH` lines: parsed one by one with orjson,
  checked and folded with C-level ``map``/``set``/``min``/``max`` passes over the batch
  (:func:`_fold_records`); a phase record is checked by :func:`~.allocator_record.phase_ok`.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress, repeat
from operator import gt, itemgetter, lt, not_
from typing import Any, NamedTuple

import orjson

from auditor.collect.allocator_record import (
    SAMPLE_FIELDS,
    SAMPLE_FORMS,
    phase_ok,
    repeats_a_key,
)

FAST_BATCH = 256
"""Most lines :func:`fold` parses record by record: few enough that the batch's parsed
records stay in the CPU cache across its passes, enough to amortise them."""

MOST_PIDS = 8
"""Distinct pids a folded text may hold (a trace is one process's; more go the slow way)."""

_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError
_INT_ONLY = {int}
_seq_of = itemgetter("seq")
_pid_of = itemgetter("pid")
_sample_ns_of = itemgetter("sample_ns")
_allocated_of = itemgetter("allocated_bytes")
_reserved_of = itemgetter("reserved_bytes")
_has_key = dict.__contains__


class Folded(NamedTuple):
    """What a text of valid records adds to a trace (offsets count lines from 0)."""

    lines: int
    last_seq: int
    samples: int
    peak_allocated: int | None
    """The samples' peaks and time range; None when the text holds no sample."""
    peak_reserved: int | None
    first_ns: int | None
    last_ns: int | None
    steps: Sequence[tuple[int, dict[str, Any] | int]]
    """In line order: ``(offset, record)`` of each phase record (valid, to be kept) and
    ``(offset, pid)`` of the first sample of each pid."""


def fold(text: bytes, after: int = -1) -> Folded | None:
    """Fold ``text`` (complete lines) when every line is a valid record and ``seq`` rises
    from above ``after`` (at least -1); None sends the text the record-by-record way.

    A text of more than :data:`FAST_BATCH` lines is folded only when it is memory
    samples in a written form (a longer one is cut into batches by the caller).
    """
    hints = _hints(text)
    if not hints & _MAYBE_PHASE:  # (a written sample has no "h": phase records all do)
        folded = _fold_samples(text, after)
        if folded is not None:
            return folded
    if text.count(b"\n") > FAST_BATCH:
        return None
    lines = text.split(b"\n")
    lines.pop()
    return _fold_records(lines, after, hints)


_MAYBE_PHASE = 1
"""Hint bit: some line may have a ``phase`` key."""
_MAYBE_NEGATIVE = 2
"""Hint bit: some line may hold a negative number."""


def _hints(data: bytes) -> int:
    """Cheap facts about ``data`` from single-byte searches (``memchr`` speed).

    A ``phase`` key is written with an ``h``, or escaped with a backslash, and
    a negative number needs a ``-``: bytes lacking them rule those out, so the
    fast path can skip the per-record phase test and the sign checks. (The
    canonical memory sample has no ``h`` and no ``-``.)
    """
    hints = 0
    if b"h" in data or b"\\" in data:
        hints |= _MAYBE_PHASE
    if b"-" in data:
        hints |= _MAYBE_NEGATIVE
    return hints


# --------------------------------------------------------- samples, as text

_DIGITS = b"0123456789"
_KEPT = _DIGITS + b", :\n}"
_TO_NEGATIVES = bytes.maketrans(b":\n}", b"-, ")
_DROPPED = bytes(byte for byte in range(256) if byte not in _KEPT)
"""With these, a batch of samples in a compact form becomes the JSON array of their
values, each negated: every colon becomes a minus sign, the number's only possible
start, so a digit anywhere but right after a colon makes the array invalid JSON."""
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
"""orjson reads a negative number below this as a float (see :func:`_fold_samples`)."""
_WIDTH = len(SAMPLE_FIELDS)
_AT = {key: SAMPLE_FIELDS.index(key)
       for key in ("pid", "seq", "sample_ns", "allocated_bytes", "reserved_bytes")}
"""Where each value stands among a written sample's values."""


def _fold_samples(text: bytes, after: int) -> Folded | None:
    """``text`` when its lines are memory samples written in one of the forms.

    The commonest batch of a trace costs here about a third of the record-by-record
    fast path. The batch with its digits removed must be exactly one form repeated:
    every line then holds the five keys in order and nothing else but digits. The
    spaced form loses the space after each colon. Each colon then becomes a minus sign,
    each newline a comma, a closing brace a space, and every other character goes (see
    :data:`_DROPPED`), giving the JSON array of the values negated; one ``orjson``
    parse reads it. A digit anywhere but right after its colon (inside a key, before
    the brace, after it), an empty value, or a zero-led one makes that parse fail; a
    number too big for 64 bits comes back a float, which is refused (negating the
    values back one by one would cost more than the rest of the fold).
    """
    skeleton = text.translate(None, _DIGITS)
    for form in SAMPLE_FORMS:
        count, rest = divmod(len(skeleton), len(form))
        if not rest and form * count == skeleton:
            break
    else:
        return None
    if form is SAMPLE_FORMS[1]:
        text = text.replace(b": ", b":")
    array = bytearray(b"[")
    array += text.translate(_TO_NEGATIVES, _DROPPED)
    array[-1] = 93  # "]" for the last newline's comma
    try:
        values = _loads(array)
    except _JSONDecodeError:
        return None
    seqs = values[_AT["seq"]::_WIDTH]
    if -seqs[0] <= after or not all(map(gt, seqs, seqs[1:])):
        return None
    pids = values[_AT["pid"]::_WIDTH]
    sample_ns = values[_AT["sample_ns"]::_WIDTH]
    allocated = min(values[_AT["allocated_bytes"]::_WIDTH])
    reserved = min(values[_AT["reserved_bytes"]::_WIDTH])
    first, last = max(sample_ns), min(sample_ns)
    # orjson reads a negative number below -2**63 as a float, whose value is then at
    # most -2**63: a batch whose least value is above that holds only ints.
    if min(seqs[-1], allocated, reserved, last, min(pids)) <= _INT64_MIN:
        return None  # a float may hide here (or -2**63 itself: the other paths take it)
    firsts = _first_pids(pids, -1)
    if firsts is None:
        return None
    return Folded(len(seqs), -seqs[-1], len(seqs), -allocated, -reserved, -first, -last, firsts)


# ------------------------------------------------------- records, in batches


def _fold_records(lines: list[bytes], after: int, hints: int) -> Folded | None:
    """Fold a batch in which every line is a valid record and ``seq`` rises.

    No Python code runs per sample line: each check is one C-level pass
    (``map``/``set``/``min``/``max``) over the batch; ``hints`` (see :func:`_hints`)
    lets it skip passes that cannot fail.
    """
    try:
        records: list[Any] = list(map(_loads, lines))
    except _JSONDecodeError:
        return None
    try:
        seqs = list(map(_seq_of, records))  # TypeError: a line is not an object
    except (KeyError, TypeError):
        return None
    phase_at: list[int] = []
    sample_at: list[int] | None = None  # None: every record is a sample
    samples = records
    if hints & _MAYBE_PHASE:
        flags = list(map(_has_key, records, repeat("phase")))
        if True in flags:
            phase_at = list(compress(range(len(records)), flags))
            sample_at = list(compress(range(len(records)), map(not_, flags)))
            samples = list(compress(records, map(not_, flags)))
            for index in phase_at:
                record = records[index]
                if not phase_ok(record) or record["started_ns"] > record["finished_ns"] \
                        or repeats_a_key(lines[index], record):
                    return None
    try:
        pids = list(map(_pid_of, samples))
        sample_ns = list(map(_sample_ns_of, samples))
        allocated = list(map(_allocated_of, samples))
        reserved = list(map(_reserved_of, samples))
    except KeyError:
        return None
    types = set(map(type, seqs)).union(
        map(type, pids), map(type, sample_ns), map(type, allocated), map(type, reserved)
    )
    if types != _INT_ONLY:
        return None
    # Rising from at least -1, every seq is >= 0 (an invalid line may have left a
    # negative one: the next must still not be).
    if seqs[0] <= after or not all(map(lt, seqs, seqs[1:])) or seqs[-1] > _INT64_MAX:
        return None
    steps: list[tuple[int, dict[str, Any] | int]] = [(i, records[i]) for i in phase_at]
    if not sample_ns:
        return Folded(len(lines), seqs[-1], 0, None, None, None, None, steps)
    if hints & _MAYBE_NEGATIVE and (min(sample_ns) < 0 or min(allocated) < 0
                                    or min(reserved) < 0):
        return None
    top_allocated, top_reserved, last_ns = max(allocated), max(reserved), max(sample_ns)
    if max(top_allocated, top_reserved, last_ns) > _INT64_MAX:
        return None  # (past 64 bits: the slow path names it)
    firsts = _first_pids(pids, 1)
    if firsts is None:
        return None
    steps.extend((offset if sample_at is None else sample_at[offset], pid)
                 for offset, pid in firsts)
    steps.sort(key=itemgetter(0))  # (a line is a phase record or a sample: no ties)
    return Folded(len(lines), seqs[-1], len(sample_ns), top_allocated, top_reserved,
                  min(sample_ns), last_ns, steps)


def _first_pids(pids: list[int], sign: int) -> list[tuple[int, int]] | None:
    """``(offset, pid)`` of the first sample of each pid, in line order (``sign`` -1:
    ``pids`` are negated); None when a pid is below 1 or there are more than
    :data:`MOST_PIDS` (the slow path then books them)."""
    if pids.count(pids[0]) == len(pids):  # the usual case: one pid throughout
        pid = sign * pids[0]
        return None if pid < 1 or pid > _INT64_MAX else [(0, pid)]
    distinct = set(pids)
    if len(distinct) > MOST_PIDS or min(sign * pid for pid in distinct) < 1 \
            or max(sign * pid for pid in distinct) > _INT64_MAX:
        return None
    return sorted((pids.index(pid), sign * pid) for pid in distinct)
