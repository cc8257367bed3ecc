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

Speed: a trace can be hundreds of megabytes, so lines are handled in batches,
by the cheapest of three paths that takes them (see :func:`_fold`). The memory
samples of a read chunk, in their written form, are checked and read as text
(:func:`_sample_text`: no Python object per line but their values); phase records
and samples written otherwise go in batches of :data:`FAST_BATCH` lines, each
valid record with rising ``seq`` checked and folded with C-level
``map``/``set``/``min``/``max`` passes (:func:`_fast_batch`); any batch that is not
clean is re-read line by line, where each problem is found and, only then,
explained with the JSON Schema (``allocator-record``). The paths give the same
result (the tests compare them, on every digit moved anywhere in a line). Chunks are
cut into lines here (:func:`_texts`) rather than by :func:`auditor._io.iter_lines`,
whose one object per line costs more than the whole fast path; the semantics
(numbering, clipping at ``max_line``, an unterminated final line) are the same.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Iterator
from itertools import compress, repeat
from operator import gt, itemgetter, lt, not_
from typing import Any, BinaryIO

import orjson

from auditor import catalogue
from auditor._io import CHUNK_SIZE, HashingReader, Line, clip, iter_blocks
from auditor.collect.jsondoc import has_duplicate_keys
from auditor.model import AllocatorTrace, Citation, Finding, PhaseRecord
from auditor.schema import json_type, validate_record

MAX_LINE = CHUNK_SIZE
"""Longest line parsed (bytes); a record is a few hundred bytes."""

FINDINGS_CAP = 100
"""Line findings kept per file; further ones are counted in one ``AUD013``."""

MAX_DISTINCT = 1000
"""Distinct pids (and ranks) recorded per file."""

PHASES_CAP = 50_000
"""Phase records kept per trace (first half and last half); a real run has a few per step."""

FAST_BATCH = 256
"""Lines checked together by the fast path: few enough that the batch's parsed
records stay in the CPU cache across its passes, enough to amortise them."""

_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError
_INT_ONLY = {int}
_seq_of = itemgetter("seq")
_pid_of = itemgetter("pid")
_sample_ns_of = itemgetter("sample_ns")
_allocated_of = itemgetter("allocated_bytes")
_reserved_of = itemgetter("reserved_bytes")
_has_key = dict.__contains__


class _Scan:
    """What one pass has gathered so far (mutable; frozen into an AllocatorTrace at the end)."""

    __slots__ = (
        "path", "lines", "phases", "samples", "peak_allocated", "peak_reserved", "pids",
        "ranks", "first_ns", "last_ns", "last_seq", "kept", "dropped", "phase_tail",
        "phases_dropped",
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
        _see(self.pids, pid, line)

    def see_rank(self, rank: int, line: int) -> None:
        _see(self.ranks, rank, line)

    def see_ns(self, first: int | None, last: int | None) -> None:
        if first is not None and (self.first_ns is None or first < self.first_ns):
            self.first_ns = first
        if last is not None and (self.last_ns is None or last > self.last_ns):
            self.last_ns = last

    def fold_samples(
        self, allocated: int, reserved: int, first: int, last: int, count: int
    ) -> None:
        self.samples += count
        if self.peak_allocated is None or allocated > self.peak_allocated:
            self.peak_allocated = allocated
        if self.peak_reserved is None or reserved > self.peak_reserved:
            self.peak_reserved = reserved
        self.see_ns(first, last)


def _see(seen: dict[int, int], value: int, line: int) -> None:
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
            scan.lines += _fold(scan, scan.lines + 1, text, _hints(text), max_line)
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
            catalogue.finding(
                "AUD013", path, [Citation(path)], dropped=scan.dropped, cap=FINDINGS_CAP
            )
        )
    if scan.phases_dropped:
        findings.append(catalogue.finding("AUD016", path, [Citation(path)],
                                          dropped=scan.phases_dropped, cap=PHASES_CAP))
    if scan.lines == 0:
        findings.append(catalogue.finding("AUD010", path, [Citation(path)]))
    return AllocatorTrace(
        path=path,
        lines=scan.lines,
        phases=(*scan.phases, *scan.phase_tail),
        samples=scan.samples,
        sample_peak_allocated_bytes=scan.peak_allocated,
        sample_peak_reserved_bytes=scan.peak_reserved,
        pids=tuple(sorted(scan.pids.items(), key=itemgetter(1))),
        ranks=tuple(sorted(scan.ranks.items(), key=itemgetter(1))),
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


# ----------------------------------------------------------------- fast path

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


def _fold(scan: _Scan, start: int, text: bytes, hints: int, max_line: int) -> int:
    """Fold ``text`` (complete lines from line ``start`` on) by the cheapest paths that
    can take them; returns its number of lines.

    Splitting lines into batches never changes the result (each path handles lines in
    order and commits all or nothing). A chunk of memory samples is one batch for
    :func:`_sample_text`, and is not split into lines (unless ``max_line`` is below the
    read size, for its check); a chunk with a few phase records among them (the usual
    shape) is cut at those records, each of which goes to :func:`_fast_batch`, while
    the samples between them still go whole to :func:`_sample_text`; anything else goes
    in pieces of :data:`FAST_BATCH` lines (see :func:`_fold_pieces`)."""
    if max_line < CHUNK_SIZE:
        lines = _split(text)
        if max(map(len, lines)) > max_line:
            _fold_pieces(scan, start, lines, hints, max_line)
            return len(lines)
    if hints & _MAYBE_PHASE:  # (looking for samples only would read the text in vain)
        marked = _marked_lines(text, len(text) // 800)
    else:
        count = _sample_text(scan, start, text)
        if count:
            return count
        marked = None
    if not marked:
        lines = _split(text)
        _fold_pieces(scan, start, lines, hints, max_line)
        return len(lines)
    number = start
    offset = 0  # where the first line after the last marked one starts
    for line_start, line_end in (*marked, (len(text), len(text))):
        if line_start > offset:
            piece = text[offset:line_start]
            count = _sample_text(scan, number, piece)
            if not count:
                lines = _split(piece)
                _fold_pieces(scan, number, lines, hints, max_line)
                count = len(lines)
            number += count
        if line_start < len(text):
            _fold_records(scan, number, [text[line_start:line_end]], hints, max_line)
            number += 1
        offset = line_end + 1
    return number - start


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


def _fold_pieces(scan: _Scan, start: int, lines: list[bytes], hints: int,
                 max_line: int) -> None:
    """Lines the sample path did not take as a whole: in pieces of :data:`FAST_BATCH`
    lines, so one odd line costs only its piece the cheap path."""
    for offset in range(0, len(lines), FAST_BATCH):
        part = lines[offset : offset + FAST_BATCH]
        if len(part) == len(lines) or not _sample_batch(scan, start + offset, part, max_line):
            _fold_records(scan, start + offset, part, hints, max_line)


def _fold_records(scan: _Scan, start: int, lines: list[bytes], hints: int, max_line: int) -> None:
    if not _fast_batch(scan, start, lines, hints, max_line):
        _slow_batch(scan, start, lines, max_line)


_SAMPLE_FORMS = tuple(
    form.encode() + b"\n" for form in (
        '{"pid":,"seq":,"sample_ns":,"allocated_bytes":,"reserved_bytes":}',
        '{"pid": , "seq": , "sample_ns": , "allocated_bytes": , "reserved_bytes": }',
    )
)
"""The written forms of a memory sample with its digits taken out: compact (orjson's)
and ``json.dumps``'s default, keys in the contract's order."""
_DIGITS = b"0123456789"
_KEPT = _DIGITS + b", :\n}"
_TO_NEGATIVES = bytes.maketrans(b":\n}", b"-, ")
_DROPPED = bytes(byte for byte in range(256) if byte not in _KEPT)
"""With these, a batch of samples in a compact form becomes the JSON array of their
values, each negated: every colon becomes a minus sign, the number's only possible
start, so a digit anywhere but right after a colon makes the array invalid JSON."""
_INT64_MIN = -(2**63)
"""orjson reads a negative number below this as a float (see :func:`_commit_negated`)."""


def _sample_batch(scan: _Scan, start: int, lines: list[bytes], max_line: int) -> bool:
    """:func:`_sample_text` of a list of lines (False when one is longer than ``max_line``)."""
    if max_line < CHUNK_SIZE and max(map(len, lines)) > max_line:
        return False
    return _sample_text(scan, start, b"\n".join(lines) + b"\n") > 0


def _sample_text(scan: _Scan, start: int, text: bytes) -> int:
    """Fold ``text``, lines each ending in a newline, when they are memory samples
    written in one of :data:`_SAMPLE_FORMS`; returns their number (0: not taken).

    The commonest batch of a trace costs here about a third of the record-by-record
    fast path. The batch with its digits removed must be exactly one form repeated:
    every line then holds the five keys in order and nothing else but digits. The
    spaced form loses the space after each colon. Each colon then becomes a minus sign,
    each newline a comma, a closing brace a space, and every other character goes (see
    :data:`_DROPPED`), giving the JSON array of the values negated; one ``orjson``
    parse reads it. A digit anywhere but right after its colon (inside a key, before
    the brace, after it), an empty value, or a zero-led one makes that parse fail; a
    number too big for 64 bits comes back a float, which :func:`_commit_negated`
    refuses. Any other batch returns 0, having changed nothing (the other paths take it).
    """
    skeleton = text.translate(None, _DIGITS)
    for form in _SAMPLE_FORMS:
        count, rest = divmod(len(skeleton), len(form))
        if not rest and form * count == skeleton:
            break
    else:
        return 0
    if form is _SAMPLE_FORMS[1]:
        text = text.replace(b": ", b":")
    array = bytearray(b"[")
    array += text.translate(_TO_NEGATIVES, _DROPPED)
    array[-1] = 93  # "]" for the last newline's comma
    try:
        values = _loads(array)
    except _JSONDecodeError:
        return 0
    return count if _commit_negated(scan, start, values) else 0


def _fast_batch(scan: _Scan, start: int, lines: list[bytes], hints: int, max_line: int) -> bool:
    """Fold a batch in which every line is a valid record and ``seq`` rises.

    Returns False, having changed nothing, for any other batch: the slow path
    then finds and explains its problems. No Python code runs per sample line:
    each check is one C-level pass (``map``/``set``/``min``/``max``) over the
    batch; ``hints`` (see :func:`_hints`) lets it skip passes that cannot fail.
    """
    if max_line < CHUNK_SIZE and max(map(len, lines)) > max_line:
        return False
    try:
        records: list[Any] = list(map(_loads, lines))
    except _JSONDecodeError:
        return False
    try:
        seqs = list(map(_seq_of, records))  # TypeError: a line is not an object
    except (KeyError, TypeError):
        return False
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
                if not _phase_ok(record) or record["started_ns"] > record["finished_ns"] \
                        or _repeats_a_key(lines[index], record):
                    return False
    try:
        pids = list(map(_pid_of, samples))
        sample_ns = list(map(_sample_ns_of, samples))
        allocated = list(map(_allocated_of, samples))
        reserved = list(map(_reserved_of, samples))
    except KeyError:
        return False
    types = set(map(type, seqs)).union(
        map(type, pids), map(type, sample_ns), map(type, allocated), map(type, reserved)
    )
    if types != _INT_ONLY:
        return False
    return _commit(scan, start, seqs, pids, sample_ns, allocated, reserved,
                   bool(hints & _MAYBE_NEGATIVE), [(i, records[i]) for i in phase_at], sample_at)


def _commit(
    scan: _Scan, start: int, seqs: list[int], pids: list[int], sample_ns: list[int],
    allocated: list[int], reserved: list[int], signed: bool,
    phases: list[tuple[int, dict[str, Any]]], sample_at: list[int] | None,
) -> bool:
    """Check what a batch's records have in common, then fold them into ``scan``.

    ``seqs`` are every record's, the other columns the samples' (``sample_at`` their
    offsets in the batch; None when every record is one), ``phases`` the valid phase
    records with their offsets; all values are ints (the caller checked), and
    ``signed`` says whether any may be negative. Returns False, having changed
    nothing, when ``seq`` does not rise, a sample's value is out of range, or the batch
    brings many pids: the slow path then finds and explains it."""
    # Rising from at least -1, every seq is >= 0 (an invalid line may have left a
    # negative one: the next must still not be).
    previous = -1 if scan.last_seq is None else max(scan.last_seq, -1)
    if seqs[0] <= previous or not all(map(lt, seqs, seqs[1:])):
        return False
    booked: list[int] | None = []
    if sample_ns:
        first_ns, last_ns = min(sample_ns), max(sample_ns)
        if signed and (first_ns < 0 or min(allocated) < 0 or min(reserved) < 0):
            return False
        booked = _new_pids(scan, pids, 1)
    if booked is None:
        return False
    # Every check passed: commit, booking identities in line order (as line by line:
    # it decides which are kept once MAX_DISTINCT is reached).
    steps: list[tuple[int, dict[str, Any] | int]] = [*phases]
    steps.extend((position if sample_at is None else sample_at[position], pids[position])
                 for position in booked)
    steps.sort(key=itemgetter(0))  # (a line is a phase record or a sample: no ties)
    for offset, step in steps:
        if isinstance(step, dict):
            scan.keep_phase(_phase_record(scan, step, start + offset))
        else:
            scan.see_pid(step, start + offset)
    if sample_ns:
        scan.fold_samples(max(allocated), max(reserved), first_ns, last_ns, len(sample_ns))
    scan.last_seq = seqs[-1]
    return True


def _commit_negated(scan: _Scan, start: int, values: list[int]) -> bool:
    """:func:`_commit` for a batch of samples only, given as the flat list of their five
    values each, negated (as :func:`_sample_text` reads them; negating them back one by
    one would cost more than the rest of the fold).

    orjson reads a negative number below ``-2**63`` as a float, whose value is then at
    most ``-2**63``: a batch whose least value is above that holds only ints."""
    seqs = values[1::5]
    previous = -1 if scan.last_seq is None else scan.last_seq
    if -seqs[0] <= previous or not all(map(gt, seqs, seqs[1:])):
        return False
    pids = values[0::5]
    sample_ns = values[2::5]
    allocated, reserved = min(values[3::5]), min(values[4::5])
    first, last = max(sample_ns), min(sample_ns)
    if min(seqs[-1], allocated, reserved, last, min(pids)) <= _INT64_MIN:
        return False  # a float may hide here (or -2**63 itself: the other paths take it)
    booked = _new_pids(scan, pids, -1)
    if booked is None:
        return False
    for position in booked:
        scan.see_pid(-pids[position], start + position)
    scan.fold_samples(-allocated, -reserved, -first, -last, len(seqs))
    scan.last_seq = -seqs[-1]
    return True


def _new_pids(scan: _Scan, pids: list[int], sign: int) -> list[int] | None:
    """Offsets of the first sample of each pid ``scan`` has not seen, in line order
    (``sign`` -1: ``pids`` are negated); None when a pid is below 1 or the batch brings
    many new ones (the slow path then books them)."""
    if pids.count(pids[0]) == len(pids):  # the usual case: one pid throughout
        pid = sign * pids[0]
        if pid < 1:
            return None
        return [] if pid in scan.pids else [0]
    distinct = {sign * pid for pid in set(pids)}
    if min(distinct) < 1:
        return None
    new = distinct.difference(scan.pids)
    if len(new) > 8:
        return None
    return sorted(pids.index(sign * pid) for pid in new)


def _phase_ok(record: dict[str, Any]) -> bool:
    """True when a phase record matches the ``phase`` form of the schema."""
    get = record.get
    pid, rank, seq, step = get("pid"), get("rank"), get("seq"), get("step")
    started, finished = get("started_ns"), get("finished_ns")
    message = get("error_message")
    return (
        type(pid) is int and pid >= 1
        and type(rank) is int and rank >= 0
        and type(get("role")) is str
        and type(seq) is int and seq >= 0
        and type(get("phase")) is str
        and type(step) is int and step >= 0
        and type(started) is int and started >= 0
        and type(finished) is int and finished >= 0
        and type(get("error_type")) is str
        and (message is None or type(message) is str)
        and _optional_count(get("peak_allocated_bytes"))
        and _optional_count(get("peak_reserved_bytes"))
    )


def _optional_count(value: object) -> bool:
    return value is None or (type(value) is int and value >= 0)


def _sample_ok(record: dict[str, Any]) -> bool:
    """True when a record without ``phase`` matches the ``sample`` form of the schema."""
    get = record.get
    pid = get("pid")
    return (
        type(pid) is int and pid >= 1
        and _count(get("seq")) is not None
        and _count(get("sample_ns")) is not None
        and _count(get("allocated_bytes")) is not None
        and _count(get("reserved_bytes")) is not None
    )


def _count(value: object) -> int | None:
    """A non-negative integer, else None."""
    return value if type(value) is int and value >= 0 else None


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
    started, finished = _count(get("started_ns")), _count(get("finished_ns"))
    scan.see_ns(started, finished)
    role, message = get("role"), get("error_message")
    peak_allocated, peak_reserved = get("peak_allocated_bytes"), get("peak_reserved_bytes")
    return PhaseRecord(
        path=scan.path,
        line=line,
        pid=pid if type(pid) is int and pid >= 1 else None,
        rank=_count(rank),
        role=_shared(role) if type(role) is str else None,
        seq=_count(get("seq")),
        phase=_shared(record["phase"]),
        step=_count(get("step")),
        started_ns=started,
        finished_ns=finished,
        error_type=_shared(record["error_type"]),
        error_message=message if type(message) is str else "",
        peak_allocated_bytes=_count(peak_allocated),
        peak_reserved_bytes=_count(peak_reserved),
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
                _disorder(path, line, raw, f"seq {seq} does not rise above {scan.last_seq}")
            )
        scan.last_seq = seq
    if "phase" in record:
        if _repeats_a_key(raw, record):  # (orjson keeps the last value: of an
            # error_type, say, written twice; which one the writer meant is unknown)
            scan.add(_not_object(path, line, raw, "a key appears twice in the phase record"))
            return False
        if not _phase_ok(record):
            _explain(scan, record, line, "phase")
        started, finished = record.get("started_ns"), record.get("finished_ns")
        if type(started) is int and type(finished) is int and started > finished:
            scan.add(
                _disorder(
                    path, line, raw, f"started_ns {started} is after finished_ns {finished}"
                )
            )
        if type(record.get("phase")) is str and type(record.get("error_type")) is str:
            scan.keep_phase(_phase_record(scan, record, line))
            return True
        if type(rank := record.get("rank")) is int:
            scan.see_rank(rank, line)
        return False
    if _sample_ok(record):
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
            catalogue.finding(
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
        detail = "; the line is too long to parse and is not counted"
        return [_truncated(path, line, detail)]
    try:
        record = _loads(line.data)
    except _JSONDecodeError:
        detail = "; it is not valid JSON (writer cut off?) and is not counted"
        return [_truncated(path, line, detail)]
    if _take(scan, record, line.number, line.data):
        return [_truncated(path, line, "; it parses and is kept")]
    return [_truncated(path, line, "; it parses but is not a usable record")]


# ------------------------------------------------------------------ findings


def _quote(raw: bytes) -> str:
    return clip(raw[:400].rstrip(b"\r").decode("utf-8", "replace"), 120)


def _decode_error(raw: bytes, error: orjson.JSONDecodeError) -> str:
    if not raw.strip():
        return "empty line"
    return clip(str(error), 160)


def _repeats_a_key(raw: bytes, record: dict[str, Any]) -> bool:
    """Whether the line ``raw`` (parsed into ``record``) spells a key twice. Outside its
    strings JSON holds one colon per key, so a line with as many colons as the record
    has keys repeats none (nor holds a nested object, or a colon in a string): only the
    other lines need the full check, which writes the record back."""
    return raw.count(b":") != len(record) and has_duplicate_keys(raw, record)


def _not_object(path: str, line: int, raw: bytes, error: str) -> Finding:
    return catalogue.finding(
        "AUD003", path, [Citation(path, line=line, quote=_quote(raw))], error=error
    )


def _disorder(path: str, line: int, raw: bytes, detail: str) -> Finding:
    return catalogue.finding(
        "AUD115", path, [Citation(path, line=line, quote=_quote(raw))], detail=detail
    )


def _clipped(path: str, line: int, data: bytes, length: int, limit: int) -> Finding:
    return catalogue.finding(
        "AUD007",
        path,
        [Citation(path, line=line, quote=_quote(data))],
        length=length,
        limit=limit,
    )


def _truncated(path: str, line: Line, detail: str) -> Finding:
    return catalogue.finding(
        "AUD004", path, [Citation(path, line=line.number, quote=_quote(line.data))], detail=detail
    )
