"""Read an allocator trace, ``allocator-traces/allocator-<pid>.jsonl``, in one streaming pass.

Each line is a phase record (a call that returned or raised: it has ``phase``)
or a memory sample (no ``phase``). Phase records are kept whole; samples are
folded into a count and peaks, so memory stays bounded on a trace of any
size. Also gathered: the earliest and latest timestamps, and each distinct
``pid`` (any record) and ``rank`` (phase records) with the first line it is on.

Findings, each naming the file and line; the records before and after a bad
line still count:

- ``AUD003`` a line that is not a JSON object (not JSON, blank, an array...);
- ``AUD002`` a record that misses a field or has one of the wrong type
  (``where`` is ``:<line>``, the message names the field's pointer). A phase
  record with a string ``phase`` and ``error_type`` is still kept, its invalid
  fields read as None; any other invalid record is not counted;
- ``AUD115`` ``started_ns`` after ``finished_ns``, or ``seq`` not rising
  (compared with the previous line's ``seq``);
- ``AUD007`` a line longer than ``max_line`` bytes (hashed, not parsed);
- ``AUD004`` a final line without a newline: kept (warning) when it parses,
  not counted when it does not (a writer killed mid-record);
- ``AUD010`` an empty file.

Line findings are capped at :data:`FINDINGS_CAP` per file, the rest counted in
one ``AUD013``; ``AUD004`` and ``AUD010`` are never capped. At most
:data:`MAX_DISTINCT` distinct pids and ranks are recorded (a trace with more is
already an identity failure many times over).

Speed: a trace can be hundreds of megabytes, so lines are handled in batches. The
fast path is one seam, :func:`auditor.collect.allocator_fold.fold`: given a text of
complete lines it returns what they add to the trace, or None, and only then is the
text read here record by record (:func:`_slow_batch`), where each problem is found and,
only then, explained with the JSON Schema (``allocator-record``, also the one declaration
of the record's shape, see :mod:`auditor.collect.allocator_record`). :func:`_fold`
decides what to offer it: a whole read chunk (memory samples), else the chunk cut at its
phase records, else pieces of :data:`FAST_BATCH` lines, so one odd line costs only its
piece the cheap path. The paths give the same result (the tests compare them, on every
digit moved anywhere in a line). Lines come from the shared splitter,
:func:`auditor._io.iter_blocks`, a read chunk's complete lines at a time.
"""

from __future__ import annotations

import re
import sys
from collections import deque
from collections.abc import Iterator
from operator import itemgetter
from typing import Any, BinaryIO

import orjson

from auditor import rules
from auditor._io import CHUNK_SIZE, HashingReader, Line, iter_blocks
from auditor._text import clip
from auditor.collect.allocator_fold import FAST_BATCH, Folded, fold
from auditor.collect.allocator_record import count, phase_ok, repeats_a_key, sample_ok
from auditor.model import INT64_MAX, INT64_MIN, AllocatorTrace, Citation, Finding, PhaseRecord
from auditor.schema import json_type, validate_record

MAX_LINE = CHUNK_SIZE
"""Longest line parsed (bytes); a record is a few hundred bytes."""

FINDINGS_CAP = 100
"""Line findings kept per file; further ones are counted in one ``AUD013``."""

MAX_DISTINCT = 1000
_DIGEST = re.compile(r"[0-9a-f]{64}")
"""Distinct pids (and ranks) recorded per file."""

SMALL_TEXT = 64 << 10
"""A text longer than this is no small file's: the lines of one are not counted (two scans
of every 1 MiB chunk of a large trace holding phase records cost 1.8 s of CPU on the 4 GB
study, for a choice that changes no result)."""
FEW_SAMPLES = 2
"""A text of phase records and at most this many other lines (a small trace's) is read
record by record: a valid phase record costs the same either way, and :func:`fold`'s
passes over the batch cost more than so few samples do one by one (the many study's
trace of 7 phase records and 2 samples: 56 us through :func:`fold`, 52 us so; of one of
each: 20 and 15 us)."""

PHASES_CAP = 50_000
"""Phase records kept per trace (first half and last half); a real run has a few per step."""

_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError

__all__ = ["FAST_BATCH", "FINDINGS_CAP", "MAX_DISTINCT", "MAX_LINE", "PHASES_CAP",
           "read_allocator_trace"]


class _Scan:
    """What one pass has gathered so far (mutable; frozen into an AllocatorTrace at the end)."""

    __slots__ = (
        "path", "lines", "phases", "samples", "peak_allocated", "peak_reserved", "pids",
        "ranks", "first_ns", "last_ns", "last_seq", "kept", "dropped", "phase_tail",
        "phases_dropped", "hosts", "terminals", "params",
    )

    def __init__(self, path: str) -> None:
        self.path = path
        self.lines = 0
        self.phases: list[PhaseRecord] = []
        self.samples = 0
        self.peak_allocated: int | None = None
        self.peak_reserved: int | None = None
        self.pids: dict[int, int] = {}
        self.ranks: dict[int, int] = {}
        self.params: list[tuple[int, str, str, int]] = []
        """(step, when, digest, line) of each parameter digest, up to :data:`MAX_DISTINCT`."""
        self.terminals: list[tuple[int, int]] = []
        """(step, line) of each terminal record, up to :data:`MAX_DISTINCT`."""
        self.hosts: dict[str, int] = {}
        """Hosts the phase records name (contract v1.2), each with its first line."""
        self.first_ns: int | None = None
        self.last_ns: int | None = None
        self.last_seq: int | None = None
        self.kept: list[Finding] = []
        self.dropped = 0
        self.phase_tail: deque[PhaseRecord] = deque(maxlen=PHASES_CAP // 2)
        self.phases_dropped = 0

    def keep_phase(self, record: PhaseRecord) -> None:
        """Keep the first and the last ``PHASES_CAP // 2`` phase records (bounded memory on
        a hostile trace; the final steps, which completion needs, are always kept)."""
        if len(self.phases) < PHASES_CAP // 2:
            self.phases.append(record)
            return
        if len(self.phase_tail) == self.phase_tail.maxlen:
            self.phases_dropped += 1
        self.phase_tail.append(record)

    def add(self, finding: Finding) -> None:
        """Keep a line finding, up to the cap."""
        if len(self.kept) < FINDINGS_CAP:
            self.kept.append(finding)
        else:
            self.dropped += 1

    def see_pid(self, pid: int, line: int) -> None:
        if INT64_MIN <= pid <= INT64_MAX:  # (past 64 bits: the schema's finding names it,
            _see(self.pids, pid, line)  # and no table or part could hold it)

    def see_rank(self, rank: int, line: int) -> None:
        if INT64_MIN <= rank <= INT64_MAX:
            _see(self.ranks, rank, line)

    def see_ns(self, first: int | None, last: int | None) -> None:
        if first is not None and (self.first_ns is None or first < self.first_ns):
            self.first_ns = first
        if last is not None and (self.last_ns is None or last > self.last_ns):
            self.last_ns = last

    def fold_samples(
        self, allocated: int | None, reserved: int | None, first: int, last: int, count: int
    ) -> None:
        """Count ``count`` samples and their peaks (None: not measured, which leaves the
        peak as it was: unknown stays unknown, never 0)."""
        self.samples += count
        if allocated is not None and (self.peak_allocated is None
                                      or allocated > self.peak_allocated):
            self.peak_allocated = allocated
        if reserved is not None and (self.peak_reserved is None
                                     or reserved > self.peak_reserved):
            self.peak_reserved = reserved
        self.see_ns(first, last)

    def after(self) -> int:
        """The ``seq`` the next line's must rise above (at least -1: an invalid line may
        have left a negative one, and the next must still not be negative)."""
        return -1 if self.last_seq is None else max(self.last_seq, -1)

    def take(self, start: int, folded: Folded) -> None:
        """Book what :func:`~auditor.collect.allocator_fold.fold` made of the lines from
        line ``start`` on, identities in line order (as line by line: it decides which
        are kept once MAX_DISTINCT is reached)."""
        for offset, step in folded.steps:
            if isinstance(step, dict):
                self.keep_phase(_valid_phase_record(self, step, start + offset))
            else:
                self.see_pid(step, start + offset)
        if folded.samples:
            assert folded.peak_allocated is not None and folded.peak_reserved is not None
            assert folded.first_ns is not None and folded.last_ns is not None
            self.fold_samples(folded.peak_allocated, folded.peak_reserved, folded.first_ns,
                              folded.last_ns, folded.samples)
        self.last_seq = folded.last_seq


def _see(seen: dict[Any, int], value: object, line: int) -> None:
    known = seen.get(value)
    if known is None:
        if len(seen) < MAX_DISTINCT:
            seen[value] = line
    elif line < known:
        seen[value] = line


def read_allocator_trace(
    stream: BinaryIO | HashingReader,
    path: str,
    *,
    max_line: int = MAX_LINE,
    fast: bool = True,
) -> AllocatorTrace:
    """Read one allocator trace from ``stream``; ``path`` is its root-relative POSIX path.

    ``fast=False`` forces the line-by-line path (for tests and comparison).
    Any bytes give a result, never an exception; an ``OSError`` from the
    stream propagates (the caller reports the file as unreadable).
    """
    scan = _Scan(path)
    file_findings: list[Finding] = []
    for text in _texts(stream, max_line):
        if isinstance(text, Line):
            scan.lines += 1
            file_findings.extend(_odd_line(scan, text._replace(number=scan.lines), max_line))
        elif fast:
            scan.lines += _fold(scan, scan.lines + 1, text, max_line)
        else:
            lines = _split(text)
            for offset in range(0, len(lines), FAST_BATCH):
                _slow_batch(scan, scan.lines + 1 + offset, lines[offset : offset + FAST_BATCH],
                            max_line)
            scan.lines += len(lines)
    findings = list(scan.kept)
    findings.extend(file_findings)
    if scan.dropped:
        findings.append(
            rules.finding(
                "AUD013", path, [Citation(path)], dropped=scan.dropped, cap=FINDINGS_CAP
            )
        )
    if scan.phases_dropped:
        findings.append(rules.finding("AUD016", path, [Citation(path)],
                                          dropped=scan.phases_dropped, cap=PHASES_CAP))
    if scan.lines == 0:
        findings.append(rules.finding("AUD010", path, [Citation(path)]))
    return AllocatorTrace(
        path=path,
        lines=scan.lines,
        phases=(*scan.phases, *scan.phase_tail),
        samples=scan.samples,
        sample_peak_allocated_bytes=scan.peak_allocated,
        sample_peak_reserved_bytes=scan.peak_reserved,
        pids=tuple(sorted(scan.pids.items(), key=itemgetter(1))),
        ranks=tuple(sorted(scan.ranks.items(), key=itemgetter(1))),
        hosts=tuple(sorted(scan.hosts.items(), key=itemgetter(1))),
        terminals=tuple(scan.terminals),
        params=tuple(scan.params),
        first_ns=scan.first_ns,
        last_ns=scan.last_ns,
        findings=tuple(findings),
    )


# ------------------------------------------------------------------- reading


def _texts(stream: BinaryIO | HashingReader, max_line: int) -> Iterator[bytes | Line]:
    """The lines of :func:`auditor._io.iter_blocks` as the fast path takes them: the
    complete lines of a chunk as one ``bytes`` text (each line ending in ``\\n``, a
    trailing ``\\r`` kept: JSON reads it as whitespace), a line that spans chunks and
    fits as a text of its own, and a :class:`Line` (``number`` 0) for one too long to
    parse or a final line without a newline."""
    for item in iter_blocks(stream, max_line):
        if isinstance(item, Line):
            if item.terminated and item.length <= max_line:
                yield item.data + b"\n"
            else:
                yield item
        else:
            chunk, start, end = item
            yield chunk if start == 0 and end == len(chunk) else chunk[start:end]


def _split(text: bytes) -> list[bytes]:
    """The lines of a text of complete lines, without their newlines."""
    lines = text.split(b"\n")
    lines.pop()
    return lines


# ----------------------------------------------------------------- batching


def _fold(scan: _Scan, start: int, text: bytes, max_line: int) -> int:
    """Fold ``text`` (complete lines from line ``start`` on) through :func:`fold`, in the
    largest pieces it takes; returns its number of lines.

    Splitting lines into batches never changes the result (each path handles lines in
    order, and :func:`fold` commits nothing). A chunk of memory samples is one piece,
    not split into lines (unless it may hold a line longer than ``max_line``); a chunk
    with a few phase records among them (the usual shape) is cut at those records, each
    offered alone, while the samples between them still go whole; a text of at most
    :data:`FAST_BATCH` lines (a small file's) is one piece; anything else goes in
    pieces of :data:`FAST_BATCH` lines (see :func:`_fold_pieces`)."""
    if len(text) > max_line:
        lines = _split(text)
        if max(map(len, lines)) > max_line:
            _fold_pieces(scan, start, lines, max_line)
            return len(lines)
    if b"h" in text:  # (phase records hold one, samples none: look for samples in vain?)
        newlines = text.count(b"\n") if len(text) <= SMALL_TEXT else FAST_BATCH + 1
        if newlines <= FAST_BATCH and newlines - text.count(b'"phase"') <= FEW_SAMPLES:
            _slow_batch(scan, start, _split(text), max_line)  # (a small trace's text)
            return newlines
        if newlines <= FAST_BATCH:
            return _fold_text(scan, start, text, max_line)
        marked = _marked_lines(text, len(text) // 800)
    else:
        folded = fold(text, scan.after())
        if folded is not None:
            scan.take(start, folded)
            return folded.lines
        marked = None
    if not marked:
        lines = _split(text)
        _fold_pieces(scan, start, lines, max_line)
        return len(lines)
    number = start
    offset = 0  # where the first line after the last marked one starts
    for line_start, line_end in (*marked, (len(text), len(text))):
        if line_start > offset:
            number += _fold_text(scan, number, text[offset:line_start], max_line)
        if line_start < len(text):
            number += _fold_text(scan, number, text[line_start : line_end + 1], max_line)
        offset = line_end + 1
    return number - start


def _fold_text(scan: _Scan, start: int, text: bytes, max_line: int) -> int:
    """A piece of a chunk (no line longer than ``max_line``): folded whole, else in
    batches (one batch: read record by record, as :func:`_fold_pieces` would after the
    same fold); returns its number of lines."""
    folded = fold(text, scan.after())
    if folded is not None:
        scan.take(start, folded)
        return folded.lines
    lines = _split(text)
    if len(lines) <= FAST_BATCH:
        _slow_batch(scan, start, lines, max_line)
    else:
        _fold_pieces(scan, start, lines, max_line)
    return len(lines)


def _marked_lines(text: bytes, most: int) -> list[tuple[int, int]] | None:
    """``(start, end)`` of each line of ``text`` holding an ``h`` (a phase record has
    one, in ``phase`` or ``finished_ns``; a sample has none; ``end`` is its newline's
    offset), found with ``memchr``-speed searches; None when there are more than
    ``most`` (about one line in eight: the text is then read in pieces)."""
    marked: list[tuple[int, int]] = []
    position = 0
    while (found := text.find(b"h", position)) >= 0:
        if len(marked) == most:
            return None
        position = text.find(b"\n", found)
        marked.append((text.rfind(b"\n", 0, found) + 1, position))
        position += 1
    return marked


def _fold_pieces(scan: _Scan, start: int, lines: list[bytes], max_line: int) -> None:
    """Lines not folded as a whole: in pieces of :data:`FAST_BATCH` lines, each folded
    when it can be, else read record by record."""
    for offset in range(0, len(lines), FAST_BATCH):
        part = lines[offset : offset + FAST_BATCH]
        folded = None
        if max(map(len, part)) <= max_line:
            folded = fold(b"\n".join(part) + b"\n", scan.after())
        if folded is not None:
            scan.take(start + offset, folded)
        else:
            _slow_batch(scan, start + offset, part, max_line)


def _shared(text: str) -> str:
    """One copy of a short repeated name (role, phase, error type) for every record that
    holds it: a long run keeps thousands of phase records per trace."""
    return sys.intern(text) if len(text) <= 64 else text


def _phase_record(scan: _Scan, record: dict[str, Any], line: int) -> PhaseRecord:
    """Book a phase record (its values valid or None) and return it."""
    get = record.get
    pid, rank = get("pid"), get("rank")
    if type(pid) is int:
        scan.see_pid(pid, line)
    if type(rank) is int:
        scan.see_rank(rank, line)
    if type(host := get("host")) is str:
        _see(scan.hosts, host, line)
    started, finished = count(get("started_ns")), count(get("finished_ns"))
    scan.see_ns(started, finished)
    role, message = get("role"), get("error_message")
    peak_allocated, peak_reserved = get("peak_allocated_bytes"), get("peak_reserved_bytes")
    return PhaseRecord(
        path=scan.path,
        line=line,
        pid=pid if type(pid) is int and pid >= 1 else None,
        rank=count(rank),
        role=_shared(role) if type(role) is str else None,
        seq=count(get("seq")),
        phase=_shared(record["phase"]),
        step=count(get("step")),
        started_ns=started,
        finished_ns=finished,
        error_type=_shared(record["error_type"]),
        error_message=message if type(message) is str else "",
        peak_allocated_bytes=count(peak_allocated),
        peak_reserved_bytes=count(peak_reserved),
    )


def _valid_phase_record(scan: _Scan, record: dict[str, Any], line: int) -> PhaseRecord:
    """:func:`_phase_record` of a record :func:`~.allocator_record.phase_ok` passed (what
    :func:`fold` gives): every field is there with its type and within its bounds, or an
    optional one absent or null, so none is checked again (4 us a record, 1.6 so; the
    agreement test compares the two)."""
    pid, rank = record["pid"], record["rank"]
    started, finished = record["started_ns"], record["finished_ns"]
    _see(scan.pids, pid, line)
    _see(scan.ranks, rank, line)
    if type(host := record.get("host")) is str:
        _see(scan.hosts, host, line)
    scan.see_ns(started, finished)
    get = record.get
    message = get("error_message")
    return PhaseRecord(
        scan.path, line, pid, rank, _shared(record["role"]), record["seq"],
        _shared(record["phase"]), record["step"], started, finished,
        _shared(record["error_type"]), "" if message is None else message,
        get("peak_allocated_bytes"), get("peak_reserved_bytes"),
    )


# ----------------------------------------------------------------- slow path


def _slow_batch(scan: _Scan, start: int, lines: list[bytes], max_line: int) -> None:
    """Handle a batch line by line, finding (and explaining) every problem."""
    for offset, raw in enumerate(lines):
        number = start + offset
        if len(raw) > max_line:
            scan.add(_clipped(scan.path, number, raw[:max_line], len(raw), max_line))
            continue
        try:
            record = _loads(raw)
        except _JSONDecodeError as error:
            scan.add(_not_object(scan.path, number, raw, _decode_error(raw, error)))
            continue
        _take(scan, record, number, raw)


def _take(scan: _Scan, record: object, line: int, raw: bytes) -> bool:
    """Check and book one parsed line; True when it counted (as a phase or a sample)."""
    path = scan.path
    if type(record) is not dict:
        scan.add(_not_object(scan.path, line, raw, f"found {json_type(record)}"))
        return False
    pid, seq = record.get("pid"), record.get("seq")
    if type(pid) is int:
        scan.see_pid(pid, line)
    if type(seq) is int:
        if scan.last_seq is not None and seq <= scan.last_seq:
            scan.add(
                _disorder(path, line, raw, seq=seq, last_seq=scan.last_seq)
            )
        scan.last_seq = seq
    if record.get("kind") == "params":  # (contract v1.2: a digest before/after an update)
        step, when, digest = record.get("step"), record.get("when"), record.get("digest")
        if count(pid) and type(step) is int and 0 <= step <= INT64_MAX \
                and when in ("before", "after") and type(digest) is str \
                and _DIGEST.fullmatch(digest) and type(seq) is int and seq >= 0:
            if len(scan.params) < MAX_DISTINCT:
                scan.params.append((step, when, digest, line))
            return True
        _explain(scan, record, line, "params")
        return False
    if record.get("kind") == "terminal":  # (contract v1.2: the rank's own last-step record)
        step = record.get("step")
        if count(pid) and type(step) is int and 0 <= step <= INT64_MAX \
                and type(seq) is int and seq >= 0:
            if len(scan.terminals) < MAX_DISTINCT:
                scan.terminals.append((step, line))
            return True
        _explain(scan, record, line, "terminal")
        return False
    if "phase" in record:
        if repeats_a_key(raw, record):  # (orjson keeps the last value: of an
            # error_type, say, written twice; which one the writer meant is unknown)
            scan.add(_not_object(path, line, raw, "a key appears twice in the phase record"))
            return False
        valid = phase_ok(record)
        if not valid:
            _explain(scan, record, line, "phase")
        started, finished = record.get("started_ns"), record.get("finished_ns")
        if type(started) is int and type(finished) is int and started > finished:
            scan.add(
                _disorder(path, line, raw, form="reversed", started=started, finished=finished)
            )
        if valid:
            scan.keep_phase(_valid_phase_record(scan, record, line))
            return True
        if type(record.get("phase")) is str and type(record.get("error_type")) is str:
            scan.keep_phase(_phase_record(scan, record, line))
            return True
        if type(rank := record.get("rank")) is int:
            scan.see_rank(rank, line)
        return False
    if sample_ok(record):
        sample_ns = record["sample_ns"]
        scan.fold_samples(
            record["allocated_bytes"], record["reserved_bytes"], sample_ns, sample_ns, 1
        )
        return True
    _explain(scan, record, line, "sample")
    return False


def _explain(scan: _Scan, record: dict[str, Any], line: int, form: str) -> None:
    """``AUD002`` findings for a record the fast check rejected, from the JSON Schema."""
    explained = validate_record("allocator-record", record, scan.path, line)
    if not explained:  # the fast check is stricter than the schema: still say so
        explained = [
            rules.finding(
                "AUD002",
                scan.path,
                [Citation(scan.path, line=line)],
                where=f":{line}",
                error=f"record does not match the {form} form",
            )
        ]
    for finding in explained:
        scan.add(finding)


def _odd_line(scan: _Scan, line: Line, max_line: int) -> list[Finding]:
    """A clipped or unterminated line; returns its file-level (uncapped) findings."""
    path = scan.path
    if line.clipped or line.length > max_line:
        scan.add(_clipped(path, line.number, line.data, line.length, max_line))
        if line.terminated:
            return []
        return [_truncated(path, line, "too_long")]
    try:
        record = _loads(line.data)
    except _JSONDecodeError:
        return [_truncated(path, line, "not_json")]
    if _take(scan, record, line.number, line.data):
        return [_truncated(path, line, "kept")]
    return [_truncated(path, line, "unusable")]


# ------------------------------------------------------------------ findings


def _quote(raw: bytes) -> str:
    return clip(raw[:400].rstrip(b"\r").decode("utf-8", "replace"), 120)


def _decode_error(raw: bytes, error: orjson.JSONDecodeError) -> str:
    if not raw.strip():
        return "empty line"
    return clip(str(error), 160)


def _not_object(path: str, line: int, raw: bytes, error: str) -> Finding:
    return rules.finding(
        "AUD003", path, [Citation(path, line=line, quote=_quote(raw))], error=error
    )


def _disorder(path: str, line: int, raw: bytes, **values: object) -> Finding:
    return rules.finding(
        "AUD115", path, [Citation(path, line=line, quote=_quote(raw))], **values
    )


def _clipped(path: str, line: int, data: bytes, length: int, limit: int) -> Finding:
    return rules.finding(
        "AUD007",
        path,
        [Citation(path, line=line, quote=_quote(data))],
        length=length,
        limit=limit,
    )


def _truncated(path: str, line: Line, form: str) -> Finding:
    return rules.finding(
        "AUD004", path, [Citation(path, line=line.number, quote=_quote(line.data))], form=form
    )
