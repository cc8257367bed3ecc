"""Collector for ``training-<job>.log``: one streaming pass that finds what the log shows.

The console log of a training driver is the only place the *terminal event* of
a run appears: verl's console logger prints ``step:N - ... - training/global_step:N
- ...`` once per training step, and the run dispatched with
``TOTAL_TRAINING_STEPS=N`` is complete only if that line for N is there. Around
it the log may show why a run did not complete: Python tracebacks, GPU or host
out-of-memory errors, vLLM KV-cache initialisation failures, NCCL watchdog
timeouts and errors, ``slurmstepd`` cancellation lines, or a coordinated shutdown.

What real logs look like, and how this module copes:

- Logs can be gigabytes. The file is read once, in chunks of
  :data:`auditor._io.CHUNK_SIZE` bytes (bounded memory: one chunk plus one clipped
  line), and never split into lines in Python: each block of complete lines is
  searched for a few trigger words with Aho-Corasick searches (``ahocorasick_rs``,
  compiled, at several GB/s when the words are rare; a Python regular expression
  alternation of them runs at under 100 MB/s), and only the lines holding one are
  decoded (UTF-8 with replacement) and examined with regular expressions. Line
  numbers are counted with numpy (``bytes.count`` for short ranges); UTF-8 is
  validated per 16 kB piece (``isascii`` first); lines longer than ``max_line`` are
  found by looking for a newline in every ``max_line`` bytes. While a traceback waits
  for its exception line, lines are examined one by one.
- Ray prefixes every worker line with ``(TaskRunner pid=1) ``, ``(WorkerDict pid=2,
  ip=10.0.0.7) ``, ``(wiQkzJWorkerDict_0:0 WorkerDict pid=3) ``, ``(raylet) ``...,
  often wrapped in ANSI colour codes; torch adds ``[rank0]:``, vLLM its logger
  prefix, docker compose ``name  | ``. ANSI sequences (CSI and OSC) are removed
  and these prefixes are stripped before matching. Event texts keep the Ray
  prefix (it says which process spoke) but never ANSI codes or raw control bytes.
- tqdm progress bars rewrite one physical line with ``\\r``; each ``\\r``-separated
  segment is matched on its own, and events report the physical line number.
- Lines longer than ``max_line`` are examined on their first ``max_line`` bytes
  only (finding AUD007); invalid UTF-8 (AUD005) and NUL bytes (AUD006) are reported
  once per file, at their first line, and never stop the scan.

Terminal matching follows the evidence contract: a line holding ``step:N``
followed later on the same line by ``training/global_step:N``. The value may be
printed ``1``, ``1.000``, ``np.int64(1)`` or ``np.float64(1.0)``; ``step:10`` never
matches N=1, ``global_step:``/``timing_s/step:`` are not the ``step:`` key, and a
validation-only ``step:N+1 - val/...`` line (no global step) never counts. verl
logs older than the ``training/global_step`` key (v0.1/v0.2) therefore have no
terminal event under the built-in matcher; a protocol ``terminal_event.pattern``
(a regex with a named group ``step``) replaces the matcher for them.

This module reads (chunks, the prefilter, file-level findings); what an examined line
shows is :mod:`auditor.collect.log_events`'s.
"""

from __future__ import annotations

import codecs
import re
from bisect import bisect_left
from functools import cache
from typing import BinaryIO

import ahocorasick_rs

from auditor import rules
from auditor._io import DEFAULT_MAX_LINE, HashingReader, Line, iter_blocks
from auditor.collect.log_events import PATTERN_TIMEOUT, _compile_pattern, _quote, _Scanner
from auditor.collect.terminal import SpecError, matcher
from auditor.model import Citation, Finding, TrainingLogScan
from auditor.model.lines import ROLE_EXIT_WORDS
from auditor.model.presets import VERL, TerminalSpec

__all__ = ["scan_training_log"]

# A few short literals looked for in the raw bytes: a line none of these occur in
# is never decoded nor examined (it cannot produce any event, nor a finding but
# AUD005/AUD007). Each word covers several texts: "rror" Error/error, "emory" every
# out-of-memory and KV-cache message, "NCCL" the watchdog (WorkNCCL,
# ProcessGroupNCCL), "hut"/"HUT" shutdown, shutting, COSMOS_SHUTDOWN_*. Each
# detector below re-checks its own exact text. They are found by Aho-Corasick
# searches (see :func:`_hit_lines`), many times faster than a regex alternation.
_TRIGGER_WORDS = (
    b"step:", b"rror", b"xception", b"emory", b"oom", b"NCCL", b"CANCELLED",
    b"hut", b"HUT", b"Traceback", b'File "', b"\x00",
    # what ended a run (failure_texts._ends): a crash, a signal, a dead actor or child, a node
    b"egmentation", b"SIGSEGV", b"xitcode", b"return code", b"death signal", b"Signals.",
    b"got signal", b"Killed", b"Aborted", b"Bus error", b"ActorDied", b"RayActorError",
    b"actor died", b"actor is dead", b"worker died", b"Root Cause", b"ode failure",
    # a launcher's line naming a process's exit (model.lines.role_exit)
    *(word.encode() for word in ROLE_EXIT_WORDS),
    b":::MLLOG",  # an MLPerf record (its run_stop aborted: the trainer's own abort)
    # contract v1.2's more causes (failure_texts._MORE_CAUSES), where a line that says it
    # need not hold "rror" or "xception" (a logger's ERROR, a warning); kept few: with 65
    # words the search lost its SIMD prefilter and ran 6x slower than with 29 (41: as fast;
    # a 52nd, "died unexpectedly", made the large study's logs 10% slower to scan: vLLM's
    # "Worker proc ... died unexpectedly" is read where its next line, "EngineCore ...", is)
    b"EngineCore", b"output_handler", b"sigquit", b"Xid", b"fallen off", b"GPU is lost",
    b"NaN", b"space left", b"client socket", b"TCP client", b"GCS", b"marked dead",
    b"is nan", b"was nan", b"is inf",  # (Python's own spelling: "Loss is nan, stopping")
    # a hedge (failure_texts._HEDGES), seen so that the list on the lines after it is its
    b"root causes", b"causes include", b"ossible causes",
)  # fmt: skip
_TRIGGER = re.compile(b"|".join(re.escape(word) for word in _TRIGGER_WORDS))
"""The trigger words as one regex (matches the same lines)."""

HIT_BLOCK = 1 << 18
"""Bytes of complete lines searched at once (the line starts found take memory)."""


# A line whose only trigger word is "NCCL" (NCCL_DEBUG=INFO prints thousands, and
# "NCCL version ...") can produce an event only through a text holding one of these:
# every other event needs a text holding another trigger word, but the NCCL timeout
# texts, a KV-cache message naming neither "Error" nor "memory" (it needs one of its
# other trouble words, see _KV_CACHE_TROUBLE), and a shutdown gated on "olicy". Such
# a line is skipped (it changes nothing when examined) unless it holds one of these
# or ESC: removing an ANSI code may join a word (``em\x1b[0mory``).
_NCCL_ONLY_WORDS = (
    b"atchdog", b"eartbeat", b"NCCL work", b"NCCL operations", b"ProcessGroupNCCL",
    b"olicy", b"OLICY", b"nsufficient", b"ot enough", b"larger than the available",
    b"Try increasing",
)  # fmt: skip


def _search(words: tuple[bytes, ...]) -> ahocorasick_rs.BytesAhoCorasick:
    """A search for ``words``, leftmost-first: its SIMD prefilter (Teddy) passes over
    text holding none of them at several GB/s, where the standard (overlapping) match
    kind runs the automaton over every byte, at about 400 MB/s. Non-overlapping matches
    still find every line holding a word (no word spans a newline)."""
    return ahocorasick_rs.BytesAhoCorasick(
        list(words), matchkind=ahocorasick_rs.MatchKind.LeftmostFirst)


_TRIGGER_SEARCH = _search(tuple(w for w in _TRIGGER_WORDS if w not in (b"NCCL", b"\x00")))
"""Every trigger word but "NCCL" (see :data:`_NCCL_ONLY_WORDS`) and NUL (``memchr``)."""
_MATTERS_SEARCH = _search(_NCCL_ONLY_WORDS)
_NCCL_SEARCH = _search((b"NCCL",))

UTF8_PIECE = 1 << 14
"""Bytes validated as UTF-8 at once (pieces of ASCII lines are skipped with ``isascii``)."""


def scan_training_log(
    stream: BinaryIO | HashingReader,
    path: str,
    expected_steps: int | None,
    pattern: str | None = None,
    max_events: int = 200,
    max_line: int = DEFAULT_MAX_LINE,
    terminal: TerminalSpec | None = None,
) -> TrainingLogScan:
    """Read a training log once and report its terminal event, last step and other events.

    ``path`` is the file's path relative to the evidence root (used in events'
    findings and citations). ``expected_steps`` is the dispatched
    ``TOTAL_TRAINING_STEPS``; when None no terminal event is looked for, but
    ``last_step`` is still recorded. ``pattern`` replaces the built-in terminal
    matcher: a regex with a named group ``step``, searched in every ``\\r``
    segment after ANSI and prefix removal (every line is then decoded, which
    is slower).

    Events are returned in line order. At most ``max_events`` are kept: the
    first three quarters and the last quarter of those seen, with the first
    event of every kind kept in place of a repeat (a time-limit line is never
    lost among a thousand tracebacks); the rest are counted in
    ``events_dropped``. The last :data:`STEP_LINES_KEPT` ``step_line`` events
    come on top (``last_step`` is what matters), and the terminal event is
    kept apart. The stream is read to its end (so a :class:`HashingReader`
    has hashed every byte).

    Raises ``ValueError`` (before reading anything) when ``pattern`` is not a
    valid regular expression or lacks the ``step`` group, or a limit is not positive.
    """
    if max_events < 0:
        raise ValueError(f"max_events must be >= 0, not {max_events}")
    if max_line < 1:
        raise ValueError(f"max_line must be >= 1, not {max_line}")
    if pattern is not None:
        _compile_pattern(pattern)  # (refused with its own words, before a byte is read)
        terminal = TerminalSpec(patterns=(pattern,))
    spec = terminal if terminal is not None and terminal != VERL else None
    try:
        compiled = matcher(spec) if spec is not None else None
    except SpecError as error:
        raise ValueError(str(error)) from None
    scanner = _Scanner(path, expected_steps, compiled, max_events)
    reader = _Reader(scanner, max_line, examine_all=compiled is not None
                     and not compiled.triggers, triggers=compiled.triggers if compiled else ())
    reader.read(stream)

    findings: list[Finding] = []
    if reader.utf8 is not None:
        line, quote = reader.utf8
        findings.append(rules.finding("AUD005", path, [Citation(path, line, quote=quote)]))
    if reader.nul is not None:
        line, quote = reader.nul
        findings.append(rules.finding("AUD006", path, [Citation(path, line, quote=quote)]))
    if reader.clipped is not None:
        line, length = reader.clipped
        findings.append(
            rules.finding("AUD007", path, [Citation(path, line)], length=length, limit=max_line)
        )
    if reader.unterminated is not None:
        findings.append(rules.finding("AUD017", path, [Citation(path, reader.unterminated)],
                                          line=reader.unterminated))
    if scanner.pattern_gave_up is not None:
        findings.append(rules.finding(
            "AUD020", path, [Citation(path, scanner.pattern_gave_up)],
            line=scanner.pattern_gave_up, seconds=PATTERN_TIMEOUT))
    findings.sort(key=lambda found: (found.citations[0].line or 0, found.rule_id))
    return scanner.result(reader.lines, tuple(findings))


class _Reader:
    """Feeds a stream's lines to a :class:`_Scanner`, a chunk at a time, and notes the
    file-level facts (first invalid UTF-8, first NUL, first clipped line).

    A line is what :func:`auditor._io.iter_lines` yields: the bytes before a ``\\n``
    (a trailing ``\\r`` removed unless the line is clipped or is a final line without
    a newline), clipped to ``max_line`` bytes. Lines are examined when the plain
    line-by-line loop would examine them: every line under a custom pattern or while
    a traceback is open, else the lines holding a trigger word (but those holding
    only "NCCL" that cannot matter, see :data:`_NCCL_ONLY_WORDS`).
    """

    def __init__(self, scanner: _Scanner, max_line: int, examine_all: bool,
                 triggers: tuple[bytes, ...] = ()) -> None:
        self.scanner = scanner
        self.max_line = max_line
        self.examine_all = examine_all
        self.words = _TRIGGER_WORDS + triggers
        """The trigger words, a preset's own added (a line holding none is not examined)."""
        self.search = _TRIGGER_SEARCH if not triggers else _search_with(triggers)
        self.lines = 0
        """Lines read so far (the number of the last one)."""
        self.utf8: tuple[int, str] | None = None
        """(line, quote) of the first line that is not UTF-8."""
        self.nul: tuple[int, str] | None = None
        """(line, quote) of the first examined line holding NUL (every such line is)."""
        self.clipped: tuple[int, int] | None = None
        """(line, full length) of the first line longer than ``max_line``."""
        self.unterminated: int | None = None
        """The number of the last line when it has no newline (the log was cut)."""

    def read(self, stream: BinaryIO | HashingReader) -> None:
        """Read ``stream`` to its end."""
        for item in iter_blocks(stream, self.max_line):
            if isinstance(item, Line):
                self._line(item.data, item.length, item.terminated)
                if not item.terminated:
                    self.unterminated = self.lines
            else:
                self._block(*item)

    def _line(self, data: bytes, length: int, terminated: bool) -> None:
        """One line given on its own: spanning chunks, longer than ``max_line``, or last."""
        self.lines += 1
        number = self.lines
        if terminated and length == len(data) and data.endswith(b"\r"):
            data = data[:-1]
            length -= 1
        clipped = length > len(data)
        if self.utf8 is None and not data.isascii():
            bad = _utf8_error_offset(data, clipped)
            if bad is not None:
                self.utf8 = (number, _quote(data, bad))
        if clipped and self.clipped is None:
            self.clipped = (number, length)
        if (
            self.examine_all
            or self.scanner.open_tracebacks
            or any(word in data for word in self.words)
        ):
            self._examine(number, data)

    def _block(self, chunk: bytes, start: int, end: int) -> None:
        """The complete lines in ``chunk[start:end]`` (which ends with a newline)."""
        max_line = self.max_line
        rfind = chunk.rfind
        while start < end:
            # Find the next line longer than max_line: one starting at ``cursor`` is
            # iff no newline lies in the max_line + 1 bytes from it; all lines starting
            # before the last newline in that window are shorter.
            cursor = start
            long_line = -1
            while end - cursor > max_line + 1:
                newline = rfind(b"\n", cursor, cursor + max_line + 1)
                if newline < 0:
                    long_line = cursor
                    break
                cursor = newline + 1
            if long_line < 0:
                self._run(chunk, start, end)
                return
            if start < long_line:
                self._run(chunk, start, long_line)
            newline = chunk.find(b"\n", long_line)
            self._line(
                chunk[long_line : long_line + max_line], newline - long_line, terminated=True
            )
            start = newline + 1

    def _run(self, chunk: bytes, start: int, end: int) -> None:
        """Complete lines in ``chunk[start:end]``, none longer than ``max_line``."""
        if self.utf8 is None and not chunk.isascii():
            self._check_utf8(chunk, start, end)
        number = self.lines + 1  # the number of the line starting at ``position``
        if self.examine_all:
            self.lines = self._each_line(chunk, start, end, number)[1] - 1
            return
        scanner = self.scanner
        examine = scanner.examine
        find = chunk.find
        position = start
        while position < end:
            if scanner.open_tracebacks:
                position, number = self._each_line(chunk, position, end, number)
                continue
            stop = end  # searched at once: bounds the memory the hits take
            if end - position > HIT_BLOCK:
                stop = find(b"\n", position + HIT_BLOCK - 1, end) + 1
            for line_start in _hit_lines(chunk, position, stop, self.search):
                if line_start < position:
                    continue
                number += _newlines(chunk, position, line_start)
                position = find(b"\n", line_start)
                data = chunk[line_start:position]
                if data.endswith(b"\r"):
                    data = data[:-1]
                if self.nul is None and b"\x00" in data:  # NUL is a trigger word
                    self.nul = (number, _quote(data, data.index(b"\x00")))
                examine(number, data)
                position += 1
                number += 1
                if scanner.open_tracebacks:  # may go on past ``stop``
                    position, number = self._each_line(chunk, position, end, number)
            if position < stop:
                number += _newlines(chunk, position, stop)
                position = stop
        self.lines = number - 1

    def _each_line(self, chunk: bytes, position: int, end: int, number: int) -> tuple[int, int]:
        """Examine every line from ``position`` (line ``number``) on: to ``end``, or while
        a traceback is open when no custom pattern is set. Returns the next position
        and line number."""
        scanner = self.scanner
        find = chunk.find
        examine_all = self.examine_all
        while position < end and (examine_all or scanner.open_tracebacks):
            newline = find(b"\n", position)
            self._examine(number, _line_bytes(chunk, position, newline))
            position = newline + 1
            number += 1
        return position, number

    def _examine(self, number: int, data: bytes) -> None:
        if self.nul is None and b"\x00" in data:  # NUL is one of the trigger words
            self.nul = (number, _quote(data, data.index(b"\x00")))
        self.scanner.examine(number, data)

    def _check_utf8(self, chunk: bytes, start: int, end: int) -> None:
        """Note the first line of ``chunk[start:end]`` (complete lines) that is not UTF-8."""
        piece_start = start
        while piece_start < end:
            piece_end = end
            if end - piece_start > UTF8_PIECE:
                piece_end = chunk.find(b"\n", piece_start + UTF8_PIECE - 1, end) + 1
            piece = chunk[piece_start:piece_end]
            if not piece.isascii():
                try:
                    piece.decode("utf-8")
                except UnicodeDecodeError as exc:
                    offset = piece_start + exc.start
                    line_start = chunk.rfind(b"\n", start, offset) + 1 or start
                    data = _line_bytes(chunk, line_start, chunk.find(b"\n", offset))
                    number = self.lines + 1 + chunk.count(b"\n", start, line_start)
                    bad = _utf8_error_offset(data, clipped=False)
                    self.utf8 = (number, _quote(data, offset - line_start if bad is None else bad))
                    return
            piece_start = piece_end


NUMPY_COUNT = 1 << 15
"""Bytes from which newlines are counted with numpy (below it, ``bytes.count`` is as fast
as building the array)."""


def _newlines(chunk: bytes, start: int, end: int) -> int:
    """The newlines in ``chunk[start:end]``: with numpy for a long range, about 5x faster
    than ``bytes.count`` (which compares byte by byte); numpy is imported on first use."""
    if end - start < NUMPY_COUNT:
        return chunk.count(b"\n", start, end)
    import numpy

    view = numpy.frombuffer(chunk, numpy.uint8, end - start, start)
    return int(numpy.count_nonzero(view == 10))


def _line_bytes(chunk: bytes, start: int, newline: int) -> bytes:
    """The line ``chunk[start:newline]`` without a trailing ``\\r``."""
    if newline > start and chunk[newline - 1] == 13:  # b"\r"
        return chunk[start : newline - 1]
    return chunk[start:newline]


@cache
def _search_with(triggers: tuple[bytes, ...]) -> ahocorasick_rs.BytesAhoCorasick:
    """:data:`_TRIGGER_SEARCH` with a preset's own words added (made once per preset)."""
    words = tuple(w for w in _TRIGGER_WORDS if w not in (b"NCCL", b"\x00"))
    return _search(tuple(dict.fromkeys(words + triggers)))


def _hit_lines(chunk: bytes, start: int, end: int,
               search: ahocorasick_rs.BytesAhoCorasick = _TRIGGER_SEARCH) -> list[int]:
    """Starts of the lines in ``chunk[start:end]`` (complete lines) that must be examined:
    those holding a trigger word, but a line holding only "NCCL" when it cannot matter
    (when it holds none of :data:`_NCCL_ONLY_WORDS` nor ESC).

    Each search is one pass at ``memchr``-like speed when its words are rare (see
    :func:`_search`); each word found is taken to the start of its line. The "NCCL"
    lines are looked at only when the block holds a word that can make one matter, or
    ESC.
    """
    rfind = chunk.rfind
    find = chunk.find
    floor = start - 1 if start else 0  # so rfind finds the newline before ``start``
    view = memoryview(chunk)[start:end]
    starts: set[int] = set()
    add = starts.add
    line_end = -1  # end of the line last added: its other words need no search
    for _, at, _ in search.find_matches_as_indexes(view):
        position = start + at
        if position > line_end:
            add(rfind(b"\n", floor, position) + 1)
            line_end = find(b"\n", position)
    position = start
    while (found := find(b"\x00", position, end)) >= 0:
        add(rfind(b"\n", floor, found) + 1)
        position = find(b"\n", found, end)
        if position < 0:
            break
    matters = [start + at for _, at, _ in _MATTERS_SEARCH.find_matches_as_indexes(view)]
    escaped = find(b"\x1b", start, end) >= 0
    if not matters and not escaped:
        return sorted(starts)
    line_end = -1
    for _, at, _ in _NCCL_SEARCH.find_matches_as_indexes(view):
        position = start + at
        if position <= line_end:
            continue  # this line was decided
        line = rfind(b"\n", floor, position) + 1
        line_end = find(b"\n", position, end)
        if line_end < 0:
            line_end = end
        if line in starts:
            continue  # another trigger word holds it
        first = bisect_left(matters, line)
        if (first < len(matters) and matters[first] < line_end) \
                or (escaped and find(b"\x1b", line, line_end) >= 0):
            add(line)
    return sorted(starts)


def _utf8_error_offset(data: bytes, clipped: bool) -> int | None:
    """Offset of the first byte that is not UTF-8, or None; a clipped line may end
    inside a character."""
    try:
        if clipped:
            codecs.getincrementaldecoder("utf-8")().decode(data, final=False)
        else:
            data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start
    return None
