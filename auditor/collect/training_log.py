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
"""

from __future__ import annotations

import codecs
import re
from bisect import bisect_left
from collections import deque
from typing import TYPE_CHECKING, BinaryIO

import ahocorasick_rs

from auditor import catalogue
from auditor._io import DEFAULT_MAX_LINE, HashingReader, Line, clip, iter_blocks
from auditor.model import Citation, Finding, LogEvent, TrainingLogScan

if TYPE_CHECKING:
    import regex

__all__ = ["scan_training_log"]

TEXT_LIMIT = 300
"""Characters of a line kept in an event's ``text``."""

QUOTE_LIMIT = 120
"""Characters of a line quoted in a finding's citation."""

PATTERN_TIMEOUT = 1.0
"""Seconds a protocol's terminal pattern may search one line before it is given up for the
rest of the log (``AUD020``): a pattern that backtracks without end would hang the audit,
and a sound one takes microseconds."""
STEP_LINES_KEPT = 3
"""How many of the last ``step_line`` events are kept (``last_step`` is what matters)."""

TRACEBACK_HORIZON = 1000
"""Lines after which an unfinished traceback of one process is forgotten."""

TRACEBACK_KEYS = 64
"""Most processes with an unfinished traceback tracked at once."""

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

_ANSI = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: colours, cursor movement (tqdm)
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC: window titles, hyperlinks
    r"|\x1b[@-Z\\-_]"  # other two-byte escapes
)

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")

# Prefixes in front of the line a process printed. The first two identify the
# process (the key a traceback's frames and exception line share).
_PROCESS_PREFIX = re.compile(
    r"\((?:[^()\n]{1,200} )?pid=\d+(?:, ip=[^()\s]+)?\) ?"  # Ray worker / actor / task
    r"|\((?:raylet|gcs_server|dashboard|dashboard_agent|runtime_env_agent|log_monitor"
    r"|monitor|autoscaler|scheduler)(?:, ip=[^()\s]+)?(?: \+[\w.]+)?\) ?"  # Ray system
    r"|\[(?:rank|default)\d+\]: ?"  # torch.distributed / torchrun
)
_OTHER_PREFIX = re.compile(
    r"(?:INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? "
    r"\[?[\w./-]+:\d+\] ?"  # vLLM logger
    r"|[\w.-]+ +\| "  # docker compose service
)
_PREFIX = re.compile(f"(?P<process>{_PROCESS_PREFIX.pattern})|{_OTHER_PREFIX.pattern}")
"""Either prefix, the process one first (one match per prefix instead of two)."""

# Patterns run on decoded lines start with a literal where they can: the regex
# engine then finds candidates with a fast substring search, where a leading
# lookbehind or alternation makes it try every position (100x slower on the
# 3 kB metric lines verl prints once per step).
#
# A key is ``step:`` (or ``training/global_step:``) not preceded by a character of a
# longer key name (``global_step:``, ``timing_s/step:``, ``val-step:``): the lookbehind
# comes after the literal so the engine still searches for the literal first.
_VALUE = r"(?:np\.[a-z]+\d*\(\s*)?(\d{1,18})(?:\.(\d*))?\)?(?![\w.])"
_STEP_KEY = re.compile(r"step:(?<![\w/.\-]step:)\s*" + _VALUE)
_GLOBAL_STEP_KEY = re.compile(
    r"training/global_step:(?<![\w/.\-]training/global_step:)\s*" + _VALUE
)
_LEGACY_STEP_LINE = re.compile(r"\s*step:\s*" + _VALUE)
_STEP_VALUE = re.compile(r"\s*(?:np\.[a-z]+\d*\(\s*)?([+-]?\d{1,18})(?:\.(\d*))?\s*\)?\s*")

_TRACEBACK = "Traceback (most recent call last)"
_EXCEPTION_IN_TRACEBACK = re.compile(r"([A-Za-z_][\w.]*(?:\([\w.]+\))?)(?::\s|:?$)")
_EXCEPTION_STANDALONE = re.compile(
    r"((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)(?:\([\w.]+\))?):\s"
)

# Failure texts, most specific first: the first one found is the event's detail.
_HOST_OOM = (
    "ray.exceptions.OutOfMemoryError",  # Ray's memory monitor killed the task: host RAM
    "Task was killed due to the node running low on memory",
    "exceeds the memory usage threshold",
    "oom-kill",  # kernel "invoked oom-killer", slurmstepd "oom-kill event(s)"
    "oom_kill",
    "Out of memory: Killed process",
    "Out of memory: Kill process",
    "out-of-memory handler",
    "Memory cgroup out of memory",
)
_GPU_OOM = (
    "torch.cuda.OutOfMemoryError",
    "torch.OutOfMemoryError",
    "RayTaskError(OutOfMemoryError)",  # a remote task raised torch's OutOfMemoryError
    "CUDA out of memory",
    "CUDA error: out of memory",
    "CUDA Error: out of memory",  # vLLM's cumem allocator (sleep mode wake-up)
    "cudaErrorMemoryAllocation",
    "HIP out of memory",
)
_KV_CACHE = "No available memory for the cache blocks"  # vLLM V0
_KV_CACHE_NAMES = ("KV cache", "kv cache", "KV Cache")
_KV_CACHE_TROUBLE = (  # vLLM V1: "... larger than the available KV cache memory ..."
    "Error",
    "nsufficient",
    "not enough",
    "Not enough",
    "larger than the available",
    "Try increasing",
)
_NCCL_TIMEOUT = (
    "Watchdog caught collective operation timeout",
    "Timeout at NCCL work",
    "NCCL operations have failed or timed out",
    "Heartbeat monitor timed out",
    "heartbeat monitor timed out",
    "watchdog got stuck",
)
_NCCL_ERROR = (
    "NCCL error",  # torch: "DistBackendError: NCCL error in: ...ProcessGroupNCCL.cpp..."
    "ncclSystemError",
    "ncclInternalError",
    "ncclRemoteError",
)
"""An NCCL communication failure: the system, NCCL itself or a peer (a network error)."""
_NOT_NCCL_FAULT = ("invalid usage", "nvalidUsage", "cuda error", "udaError", "out of memory")
"""What makes an "NCCL error" the code's (invalid usage) or the GPU's (a CUDA error, out of
memory), not the communication's."""
_TIMEOUT_WORD = re.compile(r"\bTimeout\b(?!\s*\(ms\))")
"""After ``ProcessGroupNCCL``: a timeout named in other words (not the ``Timeout(ms)`` setting)."""
_SLURM_CANCEL = re.compile(
    r"\*\*\* (?:JOB|STEP) (?P<id>[\w.+\[\]-]+)(?: ON \S+)? CANCELLED AT \S+(?P<rest>[^*]*)"
)
_SHUTDOWN = re.compile(  # run on the lower-cased line; bounded repeats keep it linear
    r"coordinated[\s_-]{1,3}(?:[a-z]{1,20}[\s_-]{1,3})?shut(?:ting)?[\s_-]{0,3}down"
    r"|cosmos_shutdown_on_no_policy_replicas(?!\s*=|['\"]\s*[:,=])"  # not an assignment
    r"|shut(?:ting)?[\s_-]{0,3}down\b.{0,120}?\bno\s{1,3}(?:[a-z]{1,20}\s{1,3})?policy[\s_-]"
    r"{1,3}replicas?"
    r"|\bno\s{1,3}(?:[a-z]{1,20}\s{1,3})?policy[\s_-]{1,3}replicas?\b.{0,120}?shut(?:ting)?"
    r"[\s_-]{0,3}down"
)


def scan_training_log(
    stream: BinaryIO | HashingReader,
    path: str,
    expected_steps: int | None,
    pattern: str | None = None,
    max_events: int = 200,
    max_line: int = DEFAULT_MAX_LINE,
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
    custom = _compile_pattern(pattern) if pattern is not None else None
    scanner = _Scanner(path, expected_steps, custom, max_events)
    reader = _Reader(scanner, max_line, examine_all=custom is not None)
    reader.read(stream)

    findings: list[Finding] = []
    if reader.utf8 is not None:
        line, quote = reader.utf8
        findings.append(catalogue.finding("AUD005", path, [Citation(path, line, quote=quote)]))
    if reader.nul is not None:
        line, quote = reader.nul
        findings.append(catalogue.finding("AUD006", path, [Citation(path, line, quote=quote)]))
    if reader.clipped is not None:
        line, length = reader.clipped
        findings.append(
            catalogue.finding("AUD007", path, [Citation(path, line)], length=length, limit=max_line)
        )
    if reader.unterminated is not None:
        findings.append(catalogue.finding("AUD017", path, [Citation(path, reader.unterminated)],
                                          line=reader.unterminated))
    if scanner.pattern_gave_up is not None:
        findings.append(catalogue.finding(
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

    def __init__(self, scanner: _Scanner, max_line: int, examine_all: bool) -> None:
        self.scanner = scanner
        self.max_line = max_line
        self.examine_all = examine_all
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
            or any(word in data for word in _TRIGGER_WORDS)
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
            for line_start in _hit_lines(chunk, position, stop):
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


def _hit_lines(chunk: bytes, start: int, end: int) -> list[int]:
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
    for _, at, _ in _TRIGGER_SEARCH.find_matches_as_indexes(view):
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


class _Scanner:
    """The state of one scan: what was found so far, and unfinished tracebacks."""

    def __init__(
        self,
        path: str,
        expected_steps: int | None,
        custom: regex.Pattern[str] | None,
        max_events: int,
    ) -> None:
        self.path = path
        self.expected_steps = expected_steps
        self.custom = custom
        self.tail_cap = max_events // 4
        self.head_cap = max_events - self.tail_cap
        self.head: list[LogEvent] = []
        """The first events, up to ``head_cap``."""
        self.tail: deque[LogEvent] = deque(maxlen=self.tail_cap or 1)
        """The last events after the head (only used when ``tail_cap`` > 0)."""
        self.first_of_kind: dict[str, LogEvent] = {}
        self.events_seen = 0
        self.step_lines: deque[tuple[int, str, int]] = deque(maxlen=STEP_LINES_KEPT)
        """(line, start of the segment, step) of the last step lines; events made at the end."""
        self.terminal: LogEvent | None = None
        self.last_step: int | None = None
        self.open_tracebacks: dict[str, int] = {}
        """Process key -> last line of a traceback whose exception line is still due."""
        self.pattern_gave_up: int | None = None
        """The line on which the protocol's pattern ran past :data:`PATTERN_TIMEOUT`."""

    def result(self, lines: int, findings: tuple[Finding, ...]) -> TrainingLogScan:
        """The scan's outcome (events merged in line order, step lines last on a line)."""
        step_lines = [
            LogEvent("step_line", number, _text(segment), str(step))
            for number, segment, step in self.step_lines
        ]
        kept = self._kept_events()
        events = sorted([*kept, *step_lines], key=lambda event: event.line)
        return TrainingLogScan(
            path=self.path,
            lines=lines,
            expected_steps=self.expected_steps,
            terminal_event=self.terminal,
            last_step=self.last_step,
            events=tuple(events),
            events_dropped=self.events_seen - len(kept),
            findings=findings,
        )

    # ------------------------------------------------------------------ lines

    def examine(self, number: int, data: bytes) -> None:
        """Look at one physical line that passed the prefilter (or must be seen)."""
        text = data.decode("utf-8", "replace")
        if "\x1b" in text:
            text = _ANSI.sub("", text)
        if self.open_tracebacks:
            self._expire_tracebacks(number)
        if "\r" not in text:
            if text:
                key, content = _strip_prefixes(text)
                self._examine_segment(number, text, key, content)
            return
        key = ""
        for index, segment in enumerate(text.split("\r")):
            if not segment:
                continue
            segment_key, content = _strip_prefixes(segment)
            if index == 0:
                key = segment_key  # later segments belong to the same process
            self._examine_segment(number, segment, key, content)

    def _examine_segment(self, number: int, segment: str, key: str, content: str) -> None:
        metrics = content.startswith("step:") or (
            content[:1].isspace() and content.lstrip().startswith("step:")
        )
        # A metric line (``step:N - key:value - ...``, kilobytes long and holding words
        # like "memory") cannot be a failure message. Nor can a frame or source line of
        # a traceback: ``raise ValueError("No available memory for the cache blocks")``
        # quoted in a frame is code, not the failure.
        if not metrics and not self._tracebacks(number, segment, key, content):
            self._failures(number, segment, content)
        if self.custom is not None:
            self._custom_steps(number, segment, content)
        elif metrics or "step:" in content:
            self._builtin_steps(number, segment, content)

    def _tracebacks(self, number: int, segment: str, key: str, content: str) -> bool:
        """Follow tracebacks per process; True when the segment is a frame or source line."""
        open_tracebacks = self.open_tracebacks
        if _TRACEBACK in content:
            self._add("traceback", number, segment)
            self._open(key, number)
        elif content.startswith('  File "'):
            self._open(key, number)  # a frame: also opens an excerpt that lost its header
            return True
        elif key in open_tracebacks:
            if not content or content[0] in " \t":
                open_tracebacks[key] = number  # source line, caret markers
                return True
            del open_tracebacks[key]
            match = _EXCEPTION_IN_TRACEBACK.match(content)
            if match:
                self._add("exception", number, segment, match.group(1))
        elif "Error" in content or "Exception" in content:
            match = _EXCEPTION_STANDALONE.match(content)
            if match:
                self._add("exception", number, segment, match.group(1))
        return False

    def _failures(self, number: int, segment: str, content: str) -> None:
        if "emory" in content or "oom" in content:
            host = _first(content, _HOST_OOM)
            if host:
                self._add("host_oom", number, segment, host)
            else:
                gpu = _first(content, _GPU_OOM)
                if gpu:
                    self._add("gpu_oom", number, segment, gpu)
        if ("cache" in content or "Cache" in content) and (
            _KV_CACHE in content
            or (_first(content, _KV_CACHE_NAMES) and _first(content, _KV_CACHE_TROUBLE))
        ):
            exception = _EXCEPTION_STANDALONE.match(content)
            detail = exception.group(1) if exception else ""
            self._add("kv_cache_init_failure", number, segment, detail)
        if "NCCL" in content or "atchdog" in content or "eartbeat" in content \
                or "nccl" in content:
            nccl = _first(content, _NCCL_TIMEOUT)
            if nccl:
                self._add("nccl_timeout", number, segment, nccl)
            elif "Timeout" in content and _nccl_timeout_word(content):
                self._add("nccl_timeout", number, segment, "ProcessGroupNCCL Timeout")
            else:
                error = _first(content, _NCCL_ERROR)
                if error and not _first(content, _NOT_NCCL_FAULT):
                    self._add("nccl_error", number, segment, error)
        if "CANCELLED" in content:
            slurm = _SLURM_CANCEL.search(content)
            if slurm:
                limit = "DUE TO TIME LIMIT" in slurm["rest"].upper()
                kind = "slurm_time_limit" if limit else "slurm_cancelled"
                self._add(kind, number, segment, slurm["id"])
        if "hut" in content or "HUT" in content or "olicy" in content or "OLICY" in content:
            lowered = content.lower()
            if "shut" in lowered and _SHUTDOWN.search(lowered):
                self._add("coordinated_shutdown", number, segment)

    def _builtin_steps(self, number: int, segment: str, content: str) -> None:
        """``step:S ... training/global_step:G`` pairs; S == G is a training step line."""
        keys = list(_STEP_KEY.finditer(content))
        seen_step = False
        for index, key in enumerate(keys):
            step = _integral(key.group(1), key.group(2))
            if step is None:
                continue
            end = keys[index + 1].start() if index + 1 < len(keys) else len(content)
            found = _GLOBAL_STEP_KEY.search(content, key.end(), end)
            if found is not None and _integral(found.group(1), found.group(2)) == step:
                seen_step = True
                self._step(number, segment, step)
        if not seen_step:
            legacy = _LEGACY_STEP_LINE.match(content)
            if legacy:
                legacy_step = _integral(legacy.group(1), legacy.group(2))
                if legacy_step is not None:
                    self.step_lines.append((number, segment[: TEXT_LIMIT + 1], legacy_step))

    def _custom_steps(self, number: int, segment: str, content: str) -> None:
        assert self.custom is not None
        try:  # (materialised under the timeout: a lazy iterator would escape it)
            matches = list(self.custom.finditer(content, timeout=PATTERN_TIMEOUT))
        except TimeoutError:
            # a pattern that backtracks without end ((a|aa)+$): given up for the rest of the
            # log, which the built-in matcher reads, rather than hang the audit
            self.custom = None
            self.pattern_gave_up = number
            return
        for match in matches:
            raw = match.group("step")
            value = _STEP_VALUE.fullmatch(raw) if raw is not None else None
            if value is None:
                continue
            step = _integral(value.group(1), value.group(2))
            if step is not None:
                self._step(number, segment, step)

    def _step(self, number: int, segment: str, step: int) -> None:
        if not self.step_lines or self.step_lines[-1][0] != number:
            self.step_lines.append((number, segment[: TEXT_LIMIT + 1], step))
        if self.last_step is None or step > self.last_step:
            self.last_step = step
        if self.terminal is None and step == self.expected_steps:
            self.terminal = LogEvent("terminal_event", number, _text(segment), str(step))

    # ---------------------------------------------------------------- helpers

    def _add(self, kind: str, number: int, segment: str, detail: str = "") -> None:
        self.events_seen += 1
        event: LogEvent | None = None
        if kind not in self.first_of_kind:
            event = self.first_of_kind[kind] = LogEvent(kind, number, _text(segment), detail)
        if len(self.head) < self.head_cap:
            self.head.append(event or LogEvent(kind, number, _text(segment), detail))
        elif self.tail_cap:
            self.tail.append(event or LogEvent(kind, number, _text(segment), detail))

    def _kept_events(self) -> list[LogEvent]:
        """Head and tail, plus the first event of any kind neither holds, within the cap.

        A log with thousands of repeated tracebacks must not hide the one OOM or
        time-limit line among them: the first event of a missing kind takes the place
        of the latest head event (else the oldest tail event) of a kind that is kept
        more than once.
        """
        head, tail = list(self.head), list(self.tail)
        extra: list[LogEvent] = []
        counts: dict[str, int] = {}
        for event in (*head, *tail):
            counts[event.kind] = counts.get(event.kind, 0) + 1
        for kind, first in self.first_of_kind.items():
            if kind in counts:
                continue
            for events, order in ((head, range(len(head) - 1, -1, -1)), (tail, range(len(tail)))):
                victim = next((i for i in order if counts[events[i].kind] > 1), None)
                if victim is not None:
                    counts[events.pop(victim).kind] -= 1
                    extra.append(first)
                    counts[kind] = 1
                    break
        return [*head, *extra, *tail]

    def _open(self, key: str, number: int) -> None:
        open_tracebacks = self.open_tracebacks
        if key not in open_tracebacks and len(open_tracebacks) >= TRACEBACK_KEYS:
            del open_tracebacks[min(open_tracebacks, key=open_tracebacks.__getitem__)]
        open_tracebacks[key] = number

    def _expire_tracebacks(self, number: int) -> None:
        horizon = number - TRACEBACK_HORIZON
        stale = [key for key, last in self.open_tracebacks.items() if last < horizon]
        for key in stale:
            del self.open_tracebacks[key]


def _compile_pattern(pattern: str) -> regex.Pattern[str]:
    """Compile a protocol terminal pattern, refusing one that cannot work. It is compiled
    by ``regex`` (Python's syntax, and a time limit on each search: :data:`PATTERN_TIMEOUT`),
    as the protocol's reader checks it."""
    import regex  # (only for a protocol that gives a pattern)

    try:
        compiled = regex.compile(pattern)
    except (regex.error, RecursionError, OverflowError, ValueError, TypeError) as exc:
        raise ValueError(
            f"terminal_event.pattern {pattern!r} is not a valid regular expression: {exc}"
        ) from exc
    if "step" not in compiled.groupindex:
        raise ValueError(
            f"terminal_event.pattern {pattern!r} has no named group 'step' "
            "(write it as (?P<step>...))"
        )
    return compiled


def _strip_prefixes(segment: str) -> tuple[str, str]:
    """Split ``segment`` into (process key, content): Ray/rank prefixes form the key."""
    key_parts: list[str] = []
    position = 0
    for _ in range(4):  # prefixes nest: compose | vLLM logger, (Ray) [rank0]: ...
        prefix = _PREFIX.match(segment, position)
        if prefix is None:
            break
        if prefix.group("process") is not None:
            key_parts.append(prefix.group(0).rstrip())
        position = prefix.end()
    return " ".join(key_parts), segment[position:]


def _integral(whole: str, fraction: str | None) -> int | None:
    """``1``, ``1.000`` -> 1; ``1.5`` -> None."""
    if fraction and fraction.strip("0"):
        return None
    return int(whole)


def _text(segment: str) -> str:
    """An event's text: control bytes made visible, clipped."""
    return clip(_visible(segment[: TEXT_LIMIT + 1]), TEXT_LIMIT)


def _nccl_timeout_word(content: str) -> bool:
    """``ProcessGroupNCCL`` followed later by the word ``Timeout`` (linear, no backtracking)."""
    start = content.find("ProcessGroupNCCL")
    return start >= 0 and _TIMEOUT_WORD.search(content, start) is not None


def _first(text: str, needles: tuple[str, ...]) -> str | None:
    """The first of ``needles`` (in their order) that occurs in ``text``."""
    for needle in needles:
        if needle in text:
            return needle
    return None


def _visible(text: str) -> str:
    """Control characters (NUL, BEL, ...) written as ``\\xNN``, so texts stay printable."""
    return _CONTROL.sub(lambda found: f"\\x{ord(found.group(0)):02x}", text)


def _quote(data: bytes, offset: int) -> str:
    """A short visible excerpt of ``data`` around byte ``offset`` (for a citation)."""
    start = max(0, offset - QUOTE_LIMIT // 2)
    text = data[start : start + QUOTE_LIMIT * 2].decode("utf-8", "replace")
    text = _visible(_ANSI.sub("", text))
    return clip(("…" if start else "") + text, QUOTE_LIMIT)


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
