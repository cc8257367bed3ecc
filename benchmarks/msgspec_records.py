"""Micro-benchmark: the allocator trace reader today against msgspec typed records.

Issue 17 asks whether msgspec (``Struct`` types with constraints, decoded with
``msgspec.json.Decoder(...).decode_lines``) should be the one declared shape of an
allocator record, in place of the hand-written checks and the fast path's written
forms. This script times, on the traces of a study (``python -m fixtures.generate scale
OUT ...`` makes large ones), interleaved, best of ``--repeat``, in CPU seconds of this
process (on a shared machine the others' load then counts less):

- ``today``: :func:`auditor.collect.allocator_trace.read_allocator_trace` (the fast path);
- ``msgspec``: the same reader with msgspec behind its fast-path seam
  (:func:`msgspec_fold` in place of :func:`auditor.collect.allocator_fold.fold`): each
  text's lines decoded by ``decode_lines`` into a constrained ``Sample`` struct and
  folded (seq rising, peaks, time range, pids), a text that does not decode (a phase
  record, a bad line) handed to today's fold; the traces read must be equal. This is
  the least a msgspec reader does, so it bounds one from above;
- ``decode``: ``decode_lines`` alone (no fold), the floor of any msgspec reader.

Usage: ``python benchmarks/msgspec_records.py STUDY [--repeat 5]``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from operator import attrgetter, lt
from pathlib import Path
from typing import Annotated

import msgspec

from auditor._io import HashingReader, Line
from auditor.collect import allocator_trace
from auditor.collect.allocator_fold import Folded, fold
from auditor.collect.allocator_trace import read_allocator_trace
from auditor.model import AllocatorTrace

Count = Annotated[int, msgspec.Meta(ge=0)]


class Sample(msgspec.Struct, gc=False):
    """A memory sample, declared once: every field required, each a count (pid >= 1)."""

    pid: Annotated[int, msgspec.Meta(ge=1)]
    seq: Count
    sample_ns: Count
    allocated_bytes: Count
    reserved_bytes: Count


_DECODER = msgspec.json.Decoder(Sample)
_seq, _pid, _ns = attrgetter("seq"), attrgetter("pid"), attrgetter("sample_ns")
_alloc, _res = attrgetter("allocated_bytes"), attrgetter("reserved_bytes")


def msgspec_fold(text: bytes, after: int = -1) -> Folded | None:
    """:func:`auditor.collect.allocator_fold.fold` with its sample path done by msgspec:
    the lines decoded into :class:`Sample` structs (the constraints checked in C), then
    folded; a text that does not decode (a phase record, a bad line) goes to today's."""
    try:
        records = _DECODER.decode_lines(text)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return fold(text, after)
    seqs = list(map(_seq, records))
    if not seqs or seqs[0] <= after or not all(map(lt, seqs, seqs[1:])):
        return None
    pids = list(map(_pid, records))
    if pids.count(pids[0]) != len(pids):
        return fold(text, after)
    ns = list(map(_ns, records))
    return Folded(len(records), seqs[-1], len(records), max(map(_alloc, records)),
                  max(map(_res, records)), min(ns), max(ns), [(0, pids[0])])


def read_msgspec(path: Path) -> AllocatorTrace:
    """The trace read with :func:`msgspec_fold` behind the reader's seam."""
    original = allocator_trace.fold
    allocator_trace.fold = msgspec_fold
    try:
        return read_today(path)
    finally:
        allocator_trace.fold = original


def decode_only(path: Path) -> int:
    count = 0
    with path.open("rb") as handle:
        for text in allocator_trace._texts(HashingReader(handle), allocator_trace.MAX_LINE):
            if isinstance(text, Line):
                continue
            try:
                count += len(_DECODER.decode_lines(text))
            except (msgspec.ValidationError, msgspec.DecodeError):
                pass
    return count


def read_today(path: Path) -> AllocatorTrace:
    with path.open("rb") as handle:
        return read_allocator_trace(HashingReader(handle), str(path))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", type=Path)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    traces = sorted(args.study.rglob("allocator-*.jsonl"))
    size = sum(path.stat().st_size for path in traces)
    readers: dict[str, Callable[[Path], object]] = {
        "today": read_today, "msgspec": read_msgspec, "decode": decode_only}
    best = dict.fromkeys(readers, float("inf"))
    results: dict[str, list[object]] = {}
    for _ in range(args.repeat):
        for name, reader in readers.items():
            start = time.process_time()
            results[name] = [reader(path) for path in traces]
            best[name] = min(best[name], time.process_time() - start)
    if results["today"] != results["msgspec"]:
        raise SystemExit("the readers disagree")
    print(f"{len(traces)} traces, {size / 1e6:.0f} MB, best of {args.repeat}:")
    for name, seconds in best.items():
        print(f"  {name:8} {seconds:6.2f} s  {size / seconds / 1e6:6.0f} MB/s")


if __name__ == "__main__":
    main()
