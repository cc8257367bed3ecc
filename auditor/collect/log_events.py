"""Events of a training log: what one examined line shows (see :mod:`auditor.collect.training_log`).

:class:`_Scanner` is handed the lines the reader's prefilter lets through (every line
under a protocol pattern, or while a traceback is open) and follows what they show: step
lines and the terminal event, tracebacks per process, out-of-memory and KV-cache
failures, NCCL timeouts and errors, Slurm cancellations, a coordinated shutdown. Lines are
decoded, ANSI codes removed and Ray/torch/vLLM/compose prefixes stripped before matching.
"""

from __future__ import annotations

import re
from collections import deque
from typing import TYPE_CHECKING

from auditor._text import clip
from auditor.collect.failure_texts import (
    _AGENT_FAILED,
    _CHILD_FAILED,
    _EXCEPTION_STANDALONE,
    _ROOT_CAUSE,
    _ROOT_FIELD,
    CHILD,
    FAILURE_GATE,
    ROOT_CAUSE_LINES,
    _signal_name,
    _unhedged,
    failure_events,
)
from auditor.collect.terminal import MLLOG, Matcher
from auditor.model import Finding, LogEvent, TrainingLogScan
from auditor.model.lines import STEP_CANCELLED

if TYPE_CHECKING:
    import regex

KIT_NOTE = "[auditor run] "
"""How ``auditor run`` starts its own lines in the log: one quotes the command line, which
may hold a terminal line's very text (an argument), so no step is ever read from them."""

_SHELL_TRACE = re.compile(r"\++ ")
"""The start of a shell's trace of a command it runs (``set -x``, bash's default ``PS4``:
one ``+`` a level of nesting, then a space)."""

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

STEP_NODES_KEPT = 100_000
"""Most nodes whose first ``*** STEP ... CANCELLED ***`` line is kept apart from the capped
events (:attr:`~auditor.model.TrainingLogScan.step_ends`); a node past it is never read as
reaped (its replica's end stays unknown: refused, never excused)."""

TRACEBACK_HORIZON = 1000
"""Lines after which an unfinished traceback of one process is forgotten."""

TRACEBACK_KEYS = 64
"""Most processes with an unfinished traceback tracked at once."""


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
    r"|\[[\w.-]{1,100}/[\w.-]{1,100}/[\w.-]{1,100} \(pid \d+\)\] ?"  # Metaflow's task
)
_NEMO_RUN = re.compile(r"[\w.-]{1,100}/\d{1,6} (?=\[default\d+\]:)")
"""nemo-run's task before torchrun's ``[default0]:`` (tried only on a line holding that: a
pattern that starts with any word would be tried, and fail, at every line's start)."""
_OTHER_PREFIX = re.compile(
    r"(?:INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? "
    r"\[?[\w./-]+:\d+\] ?"  # vLLM logger
    r"|[\w.-]+ +\| "  # docker compose service
    r"|\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)? (?=\[)"
    # (a time before a bracketed prefix: Metaflow's, a Slurm >= 25.05 line's)
    r"|\[?[IWEF]\d{3,4} \d\d:\d\d:\d\d(?:\.\d{1,9})?(?: \d+)? [\w./-]{1,200}:\d+\] ?"
    # (torch's and glog's E0321 02:07:08.408271 [pid] file.cpp:607])
    r"|\[pod [\w.-]{1,200}\] ?|\[[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}\] ?"
    # (Metaflow on Kubernetes: its pod; on AWS Batch: the task's uuid)
)
_PREFIX = re.compile(f"(?P<process>{_PROCESS_PREFIX.pattern})|{_OTHER_PREFIX.pattern}")
"""Either prefix, the process one first (one match per prefix instead of two)."""

# Patterns run on decoded lines start with a literal where they can: the regex
# engine then finds candidates with a fast substring search, where a leading
# lookbehind or alternation makes it try every position (100x slower on the
# 3 kB metric lines verl prints once per step).
#
# A step's value is ASCII digits (``[0-9]``, never ``\d``, which also matches a full-width or
# an Arabic-Indic digit: ``int()`` reads those as digits; the contract's ``step:N`` is ASCII).
# A key is ``step:`` (or ``training/global_step:``) not preceded by a character of a
# longer key name (``global_step:``, ``timing_s/step:``, ``val-step:``): the lookbehind
# comes after the literal so the engine still searches for the literal first.
_VALUE = r"(?:np\.[a-z]+[0-9]*\(\s*)?([0-9]{1,18})(?:\.([0-9]*))?\)?(?![\w.])"
_STEP_KEY = re.compile(r"step:(?<![\w/.\-]step:)\s*" + _VALUE)
_GLOBAL_STEP_KEY = re.compile(
    r"training/global_step:(?<![\w/.\-]training/global_step:)\s*" + _VALUE
)
_LEGACY_STEP_LINE = re.compile(r"\s*step:\s*" + _VALUE)

HEDGE_SPAN = 4
"""Lines after a hedge (or after its last listed line) that may still be its list."""
_NEW_RECORD = re.compile(r"\s*(?:Traceback \(|[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)"
                         r"\b|slurmstepd:|srun:|salloc:|\*\*\* |Fatal Python error|Segmentation "
                         r"fault|\[?\d{4}-\d\d-\d\d[ T]\d|(?:INFO|WARNING|WARN|ERROR|CRITICAL)\b)")
"""What starts a record of its own after a hedge (never its list's next line): a traceback,
an exception's line, Slurm's, a crash report, a timestamped or levelled logger line."""
_TRACEBACK = "Traceback (most recent call last)"
_EXCEPTION_IN_TRACEBACK = re.compile(r"([A-Za-z_][\w.]*(?:\([\w.]+\))?)(?::\s|:?$)")


class _Scanner:
    """The state of one scan: what was found so far, and unfinished tracebacks."""

    def __init__(
        self,
        path: str,
        expected_steps: int | None,
        matcher: Matcher | None,
        max_events: int,
    ) -> None:
        self.path = path
        self.expected_steps = expected_steps
        self.matcher = matcher
        """The terminal matcher (None: verl's built-in one alone)."""
        self.veto: tuple[int, str] | None = None
        """(line, segment) of the first line that voids the file's terminal events."""
        self.marker: tuple[int, str] | None = None
        """(line, segment) of the first step-less end line."""
        self.tail_cap = max_events // 4
        self.head_cap = max_events - self.tail_cap
        self.head: list[LogEvent] = []
        """The first events, up to ``head_cap``."""
        self.tail: deque[LogEvent | tuple[str, int, str, str]] = deque(
            maxlen=self.tail_cap or 1)
        """The last events after the head (only used when ``tail_cap`` > 0): (kind, line,
        start of the segment, detail) made events at the end, as most are pushed out (a log
        dense with one failure adds one a line)."""
        self.first_of_kind: dict[str, LogEvent] = {}
        self.step_ends: dict[str, LogEvent] = {}
        """The first ``controller_ended`` event of each controller record named and each
        node's first ``slurm_step_cancelled`` one: kept whatever the cap on events, as their
        order decides a reaping (a replica's end read from a log of many nodes' lines was
        lost in the cap's middle, and a finished run refused)."""
        self.events_seen = 0
        self.step_lines: deque[tuple[int, str, int]] = deque(maxlen=STEP_LINES_KEPT)
        """(line, start of the segment, step) of the last step lines; events made at the end."""
        self.terminal: LogEvent | None = None
        self.quoted: tuple[int, str] | None = None
        """(line, segment) of the first copy of the terminal line quoted in another line."""
        self.last_step: int | None = None
        self.open_tracebacks: dict[str, int] = {}
        """Process key -> last line of a traceback whose exception line is still due."""
        self.frame_indent: dict[str, int] = {}
        """Process key -> the indentation of its open traceback's ``File`` lines (a log
        indented whole, or one that lost its indentation: Metaflow's): its source lines are
        indented further, its exception line less (or as much, when frames are not)."""
        self.root_cause: list[object] | None = None
        """torchrun's root-cause table being read: [header line, its text, rank, exit code]."""
        self.hedge: tuple[int, str] | None = None
        """(line, process key) of the last line of a hedge (Ray's "There are some potential
        root causes", hard-wrapped or one item a line): what follows it closely is its list."""
        self.agent_failure: tuple[int, str, int, int] | None = None
        """torchrun's agent line ``failed (exitcode: X) local_rank: L``: (line, text, L, X)."""
        self.memo: dict[str, tuple[tuple[str, str], ...]] = {}
        """:func:`~auditor.collect.failure_texts.failure_events` of the texts seen (no
        root-cause table open), up to :data:`MEMO_TEXTS`: a log dense with one warning (a
        NCCL or ``UserWarning`` line every step, a retry loop's error) repeats its text once
        the prefixes (time, pid, rank) are stripped, and the dozens of tests a line takes
        are then one look-up."""
        self.pattern_gave_up: int | None = None
        """The line on which the protocol's pattern ran past :data:`PATTERN_TIMEOUT`."""

    def result(self, lines: int, findings: tuple[Finding, ...]) -> TrainingLogScan:
        """The scan's outcome (events merged in line order, step lines last on a line)."""
        if self.root_cause is not None:  # (a log cut inside torchrun's root-cause table)
            self._root_cause_read()
        step_lines = [
            LogEvent("step_line", number, _text(segment), str(step))
            for number, segment, step in self.step_lines
        ]
        terminal = self.terminal
        if self.veto is not None:  # (torchtitan's `Ran out of data`: nothing it printed counts)
            number, segment = self.veto
            self._add("terminal_vetoed", number, segment, "voids the file's terminal events")
            terminal = None
        elif terminal is None and self.marker is not None and self.matcher is not None \
                and self.matcher.spec.markers_count:
            number, segment = self.marker
            terminal = LogEvent("terminal_marker", number, _text(segment),
                                "no step number shown")
        kept = self._kept_events()
        events = sorted([*kept, *step_lines], key=lambda event: event.line)
        return TrainingLogScan(
            path=self.path,
            lines=lines,
            expected_steps=self.expected_steps,
            terminal_event=terminal,
            last_step=self.last_step,
            events=tuple(events),
            events_dropped=self.events_seen - len(kept),
            findings=findings,
            step_ends=tuple(sorted(self.step_ends.values(), key=lambda event: event.line)),
            quoted_terminal=None if self.quoted is None else LogEvent(
                "terminal_quoted", self.quoted[0], _text(self.quoted[1]),
                "quoted inside another line: never the event"),
        )

    # ------------------------------------------------------------------ lines

    def _hedged(self, number: int, key: str, content: str) -> bool:
        """Whether the line continues the hedge just before it: within
        :data:`HEDGE_SPAN` lines, from the same process, and no record of its own
        (:data:`_NEW_RECORD`)."""
        hedge = self.hedge
        return hedge is not None and number - hedge[0] <= HEDGE_SPAN and key == hedge[1] \
            and _NEW_RECORD.match(content) is None

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
        if self.root_cause is not None and number != self.root_cause[0]:
            self.root_cause_line(number, content)
        metrics = content.startswith("step:") or (
            content[:1].isspace() and content.lstrip().startswith("step:")
        )
        # A metric line (``step:N - key:value - ...``, kilobytes long and holding words
        # like "memory") cannot be a failure message. Nor can a frame or source line of
        # a traceback: ``raise ValueError("No available memory for the cache blocks")``
        # quoted in a frame is code, not the failure.
        framed = not metrics and self._tracebacks(number, segment, key, content)
        if not metrics and not framed:
            said = "" if self._hedged(number, key, content) else _unhedged(content)
            if len(said) < len(content):
                self.hedge = (number, key)  # (a hedge starts, or its list goes on)
            self._failures(number, segment, said)
        if content.startswith(KIT_NOTE) or _SHELL_TRACE.match(content):
            # (the wrapper's own line quotes the command, and a shell's trace (set -x) the
            # commands a script runs, a grep for the terminal line among them: never a
            # step that ran)
            return
        # (a traceback's frame or source line is code that quotes text: never an end of the
        # run, yet a veto or an abort there is heeded, which errs towards unresolved)
        ends = not framed
        if MLLOG in content:
            self._mllog(number, segment, content, ends)
        matcher = self.matcher
        if matcher is None or matcher.spec.builtin:
            if ends and (metrics or "step:" in content):
                self._builtin_steps(number, segment, content)
            if matcher is None:
                return
        try:
            if ends and matcher.patterns:
                quoting = bool(matcher.spec.triggers)  # (a preset's: its framework's own
                # line; a message quoting it is none. A protocol's own pattern says itself)
                for found in matcher.steps(content):
                    if not (quoting and _quoted(content, found.at)):
                        self._step(number, segment, found.step, found.total)
                    elif self.quoted is None and self._final(found.step, found.total):
                        self.quoted = (number, segment[: TEXT_LIMIT + 1])  # (for the report)
            if self.veto is None and matcher.veto and matcher.vetoes(content):
                self.veto = (number, segment[: TEXT_LIMIT + 1])
            if ends and self.marker is None and matcher.marker and matcher.marks(content):
                self.marker = (number, segment[: TEXT_LIMIT + 1])
            if ends and matcher.restart and matcher.restarts(content):
                self._forget(number, segment)
        except TimeoutError:
            # a protocol's pattern that backtracks without end ((a|aa)+$): given up for the
            # rest of the log, which the built-in matcher reads, rather than hang the audit
            self.matcher = None
            self.pattern_gave_up = number

    def _mllog(self, number: int, segment: str, content: str, ends: bool = True) -> None:
        """An MLPerf ``:::MLLOG`` record: its ``run_stop`` with status ``aborted`` is the
        trainer's own abort (every protocol); one meeting the spec's predicates is the
        terminal event (the record names no step: its own end, as the framework says),
        where the line may be one (``ends``)."""
        from auditor.collect.terminal import aborted, holds, record_of  # (rare lines)

        record = record_of(content)
        if record is None:
            return
        if aborted(record):
            self._add("aborted", number, segment, "MLPerf run_stop with status aborted")
        elif ends and self.terminal is None and self.matcher is not None \
                and holds(self.matcher.spec.json, record, self.expected_steps):
            self.terminal = LogEvent("terminal_event", number, _text(segment),
                                     str(record.get("key", "record")))

    def _tracebacks(self, number: int, segment: str, key: str, content: str) -> bool:
        """Follow tracebacks per process; True when the segment is a frame or source line."""
        open_tracebacks = self.open_tracebacks
        stripped = content.lstrip()
        indent = len(content) - len(stripped)
        if _TRACEBACK in content:
            self._add("traceback", number, segment)
            self._open(key, number)
            self.frame_indent.pop(key, None)
        elif stripped.startswith('File "') and (indent or key in open_tracebacks):
            self._open(key, number)  # a frame: also opens an excerpt that lost its header
            self.frame_indent[key] = indent
            return True
        elif key in open_tracebacks:
            frames = self.frame_indent.get(key, 2)
            if not stripped or (indent > frames if frames else indent > 0) or (
                    not frames and _EXCEPTION_IN_TRACEBACK.match(stripped) is None):
                open_tracebacks[key] = number  # source line, caret markers
                return True
            del open_tracebacks[key]
            self.frame_indent.pop(key, None)
            match = _EXCEPTION_IN_TRACEBACK.match(stripped)
            if match:
                self._add("exception", number, segment, match.group(1))
        elif "Error" in content or "Exception" in content:
            match = _EXCEPTION_STANDALONE.match(content)
            if match:
                self._add("exception", number, segment, match.group(1))
        return False

    def _failures(self, number: int, segment: str, content: str) -> None:
        """Add the events ``content`` shows (:func:`~auditor.collect.failure_texts.
        failure_events`): none where it holds none of its gate's words
        (:data:`~auditor.collect.failure_texts.FAILURE_GATE_WORDS`); remembered for a short
        text already seen, unless torchrun's root-cause table is being read (its lines
        depend on it)."""
        if self.root_cause is not None:
            found = failure_events(content, True)
        elif not FAILURE_GATE.find_matches_as_indexes(content):
            return  # (none of its tests can hold: one automaton pass, not dozens of tests)
        elif len(content) > MEMO_TEXT:
            found = failure_events(content)
        else:
            memo = self.memo
            remembered = memo.get(content)
            if remembered is None:
                remembered = failure_events(content)
                if len(memo) >= MEMO_TEXTS:
                    memo.clear()  # (bounded; a dense log's texts come back at once)
                memo[content] = remembered
            found = remembered
        for kind, detail in found:
            if kind == CHILD:
                self._child_failed(number, segment, content)
            else:
                self._add(kind, number, segment, detail)

    def _child_failed(self, number: int, segment: str, text: str) -> None:
        """torchrun's summary of a failed child: its root-cause rank and exit code come from
        the table after ``Root Cause``, else from the agent's ``failed (exitcode: X)``."""
        if _ROOT_CAUSE in text:
            self.root_cause = [number, segment, None, None]
            self._open(_ROOT_CAUSE, number)  # (the reader hands on every line meanwhile)
            return
        agent = _AGENT_FAILED.search(text)
        if agent:
            self.agent_failure = (number, segment, int(agent.group(2)), int(agent.group(1)))
            self._add("child_failed", number, segment, self._child_detail())
        elif _CHILD_FAILED in text and "raise ChildFailedError" not in text:
            self._add("child_failed", number, segment, self._child_detail())

    def _child_detail(self) -> str:
        if self.agent_failure is None:
            return "a child process failed"
        _, _, local_rank, code = self.agent_failure
        return f"local rank {local_rank} exited {code}{_as_signal(code)}"

    def root_cause_line(self, number: int, content: str) -> None:
        """A line of torchrun's root-cause table (within :data:`ROOT_CAUSE_LINES` of its
        header): the rank and the exit code of the first child that failed."""
        pending = self.root_cause
        assert pending is not None
        found = _ROOT_FIELD.match(content)
        if found is not None:
            pending[2 if found.group(1) == "rank" else 3] = int(found.group(2))
        header = pending[0]
        assert isinstance(header, int)
        if content.lstrip().startswith("===") or number - header > ROOT_CAUSE_LINES:
            self._root_cause_read()

    def _root_cause_read(self) -> None:
        """The root-cause table is over: its ``child_failed`` event, at its header."""
        pending = self.root_cause
        assert pending is not None
        header, segment, rank, code = pending
        assert isinstance(header, int)
        text = (f"exit code {code}{_as_signal(code)}" if isinstance(code, int)
                else "exit code unknown")
        self.root_cause = None
        self.open_tracebacks.pop(_ROOT_CAUSE, None)
        self._add("child_failed", header, str(segment),
                  f"root cause rank {rank if rank is not None else '?'}, {text}")

    def _builtin_steps(self, number: int, segment: str, content: str) -> None:
        """``step:S ... training/global_step:G`` pairs; S == G is a training step line."""
        keys = list(_STEP_KEY.finditer(content))
        seen_step = False
        for index, key in enumerate(keys):
            step = _integral(key.group(1), key.group(2))
            if step is None:
                continue
            quoted = _quoted(content, key.start())
            if quoted and (self.quoted is not None or step != self.expected_steps):
                continue  # (quoted in a message about it, as the launcher's "lacks ... 'step:1
                # - ...'": a JSON forwarder's double-quoted line still counts; the first copy
                # of the end line is kept, for the report to say it does not count)
            end = keys[index + 1].start() if index + 1 < len(keys) else len(content)
            found = _GLOBAL_STEP_KEY.search(content, key.end(), end)
            if found is not None and _integral(found.group(1), found.group(2)) == step:
                if quoted:
                    self.quoted = (number, segment[: TEXT_LIMIT + 1])
                    continue
                seen_step = True
                self._step(number, segment, step)
        if not seen_step:
            legacy = _LEGACY_STEP_LINE.match(content)
            if legacy:
                legacy_step = _integral(legacy.group(1), legacy.group(2))
                if legacy_step is not None:
                    self.step_lines.append((number, segment[: TEXT_LIMIT + 1], legacy_step))

    def _step(self, number: int, segment: str, step: int, total: int | None = None) -> None:
        """A step line: ``step`` (of ``total`` when the line states its own last step). It is
        the terminal event when it is the dispatched step, and the line's last where it
        states one (``step == total``: with no dispatched count, that alone)."""
        if not self.step_lines or self.step_lines[-1][0] != number:
            self.step_lines.append((number, segment[: TEXT_LIMIT + 1], step))
        if self.last_step is None or step > self.last_step:
            self.last_step = step
        if self.terminal is None and self._final(step, total):
            self.terminal = LogEvent("terminal_event", number, _text(segment), str(step))

    def _final(self, step: int, total: int | None) -> bool:
        """Whether a line stating ``step`` (of ``total``) is the end line: the dispatched
        step, and the line's last where it states one (with no dispatched count, that
        alone)."""
        expected = self.expected_steps
        return step == expected if total is None else (
            step == total and expected in (None, total))

    def _forget(self, number: int, segment: str) -> None:
        """A tuner restores the state its trial fits began from: the end lines and steps
        before this line were the trials' (Lightning's ``max_steps=100`` of ``lr_find``),
        never this run's end."""
        # (steps alone too: a report saying the log shows no end line "for any step" is
        # contradicted by the trial fits' own `max_steps=100 reached`)
        if self.terminal is not None or self.marker is not None or self.last_step is not None:
            self._add("terminal_forgotten", number, segment,
                      "a tuner's trial fits ended before it: their end lines are forgotten")
        self.terminal = self.marker = None
        self.last_step = None

    # ---------------------------------------------------------------- helpers

    def _add(self, kind: str, number: int, segment: str, detail: str = "") -> None:
        self.events_seen += 1
        event: LogEvent | None = None
        if kind not in self.first_of_kind:
            event = self.first_of_kind[kind] = LogEvent(kind, number, _text(segment), detail)
        if kind in ("controller_ended", "slurm_step_cancelled"):
            self._step_end(kind, number, segment, detail, event)
        if len(self.head) < self.head_cap:
            self.head.append(event or LogEvent(kind, number, _text(segment), detail))
        elif self.tail_cap:
            self.tail.append(event or (kind, number, segment[: TEXT_LIMIT + 1], detail))

    def _step_end(self, kind: str, number: int, segment: str, detail: str,
                  event: LogEvent | None) -> None:
        """Keep the first end line of each controller record named (a launcher may print an
        earlier attempt's log, its controller's line among it), and ``segment``'s node's
        first STEP line (:attr:`step_ends`)."""
        if kind == "controller_ended":
            key = "\x00" + detail  # (never a node's name)
        elif (match := STEP_CANCELLED.search(segment)) is not None:
            key = match[1]
        else:  # (a STEP line with no node or time: never a reaping)
            return
        if key not in self.step_ends and len(self.step_ends) <= STEP_NODES_KEPT:
            self.step_ends[key] = event or LogEvent(kind, number, _text(segment), detail)

    def _kept_events(self) -> list[LogEvent]:
        """Head and tail, plus the first event of any kind neither holds, within the cap.

        A log with thousands of repeated tracebacks must not hide the one OOM or
        time-limit line among them: the first event of a missing kind takes the place
        of the latest head event (else the oldest tail event) of a kind that is kept
        more than once.
        """
        head = list(self.head)
        tail = [event if isinstance(event, LogEvent)
                else LogEvent(event[0], event[1], _text(event[2]), event[3])
                for event in self.tail]
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
        if horizon <= 1:  # (no traceback's last line, at least 1, lies before it)
            return
        stale = [key for key, last in self.open_tracebacks.items() if last < horizon]
        for key in stale:
            del self.open_tracebacks[key]


MEMO_TEXT = 512
"""Longest text whose events are remembered (``_Scanner.memo``): repeated warnings
are short; a long line is rarely seen twice, and the memory stays bounded."""

MEMO_TEXTS = 2048
"""Most texts remembered at once (all forgotten when full): a few MB at most."""


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
    if "[default" in segment and (nemo := _NEMO_RUN.match(segment)) is not None:
        key_parts.append(nemo.group(0).rstrip())
        position = nemo.end()
    for _ in range(4):  # prefixes nest: compose | vLLM logger, (Ray) [rank0]: ...
        prefix = _PREFIX.match(segment, position)
        if prefix is None:
            break
        if prefix.group("process") is not None:
            key_parts.append(prefix.group(0).rstrip())
        position = prefix.end()
    return " ".join(key_parts), segment[position:]


_OPENS_VALUE = re.compile(r"(?:\"\s*:|[=\[{,])\s*\"\Z")
"""A double quote that opens a value (``"msg": "``, ``msg="``): a forwarder's record of the
line, not a message quoting it. A colon counts after a JSON key's closing quote only: a
message's ``lacks the terminal event: "step:1 ..."`` quotes the line."""


def _quoted(content: str, at: int) -> bool:
    """Whether the end line's text at ``at`` (verl's ``step:`` key, a preset's match) is text
    a message quotes, never a step that ran: inside single quotes (Python's repr) or
    backticks; inside double quotes that open no value (the launcher's ``lacks the terminal
    event "step:1 ..."``, an echoed ``grep "step:1 ..."``; a forwarder's ``"msg": "`` opens
    one); or after an exception's name (``ValueError: ... step:1 - ...``: its message is
    about the run). A framework's own line has no quote before its end text."""
    if at == 0:
        return False
    before = content[:at]
    if before.count("'") % 2 or before.count("`") % 2:  # (inside: opened, not yet closed)
        return True
    if before.count('"') % 2:
        quote = before.rfind('"')
        if _OPENS_VALUE.search(content, max(0, quote - 16), quote + 1) is None:
            return True
    return _EXCEPTION_STANDALONE.search(content, 0, at) is not None


def _integral(whole: str, fraction: str | None) -> int | None:
    """``1``, ``1.000`` -> 1; ``1.5`` -> None."""
    if fraction and fraction.strip("0"):
        return None
    return int(whole)


def _text(segment: str) -> str:
    """An event's text: control bytes made visible, clipped."""
    return clip(_visible(segment[: TEXT_LIMIT + 1]), TEXT_LIMIT)


def _as_signal(code: int) -> str:
    """`` (SIGKILL)`` for a negative exit code -9 (killed by that signal), else nothing."""
    return f" ({_signal_name(str(-code))})" if code < 0 else ""


def _visible(text: str) -> str:
    """Control characters (NUL, BEL, ...) written as ``\\xNN``, so texts stay printable."""
    return _CONTROL.sub(lambda found: f"\\x{ord(found.group(0)):02x}", text)


def _quote(data: bytes, offset: int) -> str:
    """A short visible excerpt of ``data`` around byte ``offset`` (for a citation)."""
    start = max(0, offset - QUOTE_LIMIT // 2)
    text = data[start : start + QUOTE_LIMIT * 2].decode("utf-8", "replace")
    text = _visible(_ANSI.sub("", text))
    return clip(("…" if start else "") + text, QUOTE_LIMIT)


