"""What an attempt's evidence shows, whatever its verdict (:mod:`auditor.reason.verdict`'s
step 2), source by source: the log's events and terminal line, where else the terminal event
is (a worker's output, a metrics record, a rank's own record), the parameter digests, the
ranks whose memory was not measured, the post-period idle check. Each adds its sentences and
their citations to a :class:`Shown`."""

from __future__ import annotations

import json
from collections.abc import Container
from dataclasses import dataclass, field

from auditor._text import clip
from auditor.model import (
    AttemptEvidence,
    Citation,
    LogEvent,
    PeriodEvidence,
    PhaseRecord,
    Protocol,
    SacctJob,
    TrainingLogScan,
    TrialRecord,
)
from auditor.model.kinds import METRICS_LOG, TRACE_SOURCE, TRAINING_LOG, WORKER_LOG
from auditor.model.lines import inline_code
from auditor.model.presets import PRESETS, VERL, TerminalSpec
from auditor.reason.completion import Completion
from auditor.reason.exits import ExitClass


@dataclass
class Shown:
    """What an attempt's evidence shows, whatever its verdict (step 2)."""

    trial: TrialRecord | None
    exit_class: ExitClass | None
    steps: int | None
    completion: Completion
    eligible: list[tuple[int | None, PhaseRecord]]
    log: TrainingLogScan | None
    events: dict[str, LogEvent]
    """The first event of each kind in the log."""
    element: SacctJob | None
    is_last: bool
    """Whether this is the attempt launched last in its job (sacct's state is its)."""
    sacct_path: str = ""
    """How the scheduler's dump is cited (``""`` without one)."""
    shows: list[str] = field(default_factory=list)
    citations: list[Citation] = field(default_factory=list)
    terminal: Citation | None = None
    """Where the terminal event is, in a source the protocol allows (contract v1.2: the
    driver's log, else a worker's own output, else a rank's terminal record); None: none."""
    metrics: tuple[TrainingLogScan, ...] = ()
    """The attempt's metrics files, as read (contract v1.2)."""
    worker_logs: tuple[TrainingLogScan, ...] = ()  # (those the kit kept, by path: v1.2)
    params_changed: bool = False
    """Whether parameter digests show the final update changed the parameters on every rank
    that recorded them (contract v1.2; False also when none recorded any)."""


def unmeasured_shows(attempt: AttemptEvidence, shown: Shown) -> None:
    """Which ranks' memory was not measured (null peaks: unknown, never 0), and why."""
    devices = sorted((d for d in attempt.read.devices
                      if d.peak_allocated_mib is None and d.peak_reserved_mib is None
                      and not d.findings),
                     key=lambda d: (d.role or "", d.rank is None, d.rank or 0))
    if not devices:
        return
    # (ranks numbered by role, contract v1.2: "policy 0, rollout 0", never "0, 0")
    by_role = len({d.role for d in devices}) > 1
    ranks = ", ".join(f"{d.role} {d.rank}" if by_role and d.role else str(d.rank)
                      for d in devices)
    why = sorted({d.gpu_unavailable for d in devices if d.gpu_unavailable})
    shown.shows.append(
        f"Memory was not measured for {'rank' if len(devices) == 1 else 'ranks'} {ranks}"
        + (f" (no GPU was visible: {'; '.join(why)})" if why else "")
        + ": their peaks are unknown, not zero.")
    shown.citations.extend(Citation(d.path, pointer="/peak_reserved_mib", quote="null")
                           for d in devices)


def idle_shows(period: PeriodEvidence, protocol: Protocol, shown: Shown) -> None:
    """The post-period idle check: passed, or (under an optional policy) not made."""
    record = period.record
    idle = record.idle_check
    if idle is not None and idle.hosts:  # (contract v1.2: each node's own)
        hosts = {word: [item.host for item in idle.hosts if item.passed is value]
                 for word, value in (("passed on", True), ("it failed on", False),
                                     ("none could be made on", None))}
        if hosts["passed on"]:
            shown.shows.append("The post-period idle check " + "; ".join(
                f"{word} {_some(names)}" for word, names in hosts.items() if names) + ".")
            shown.citations.append(Citation(record.path, pointer="/idle_check/hosts"))
    elif idle is not None and idle.passed is True:
        shown.shows.append("The post-period idle check passed.")
        shown.citations.append(Citation(record.path, pointer="/idle_check/passed",
                                        quote="true"))
    elif protocol.idle_check == "optional" and (idle is None or (
            idle.passed is None and idle.unavailable is not None)):
        why = f"it could not be made: {idle.unavailable}" if idle is not None \
            else "none is recorded"
        shown.shows.append(f"No post-period idle check was made ({why}); the protocol's "
                           "idle-check policy is optional, so it decides nothing.")
        shown.citations.append(Citation(record.path, pointer="/idle_check",
                                        quote=idle.unavailable or "" if idle else ""))


HOSTS_NAMED = 8
"""Nodes a sentence names before it counts the rest (the record names every one: a period on
1,024 nodes said each of them in its diagnosis)."""


def _some(names: list[str]) -> str:
    """``names`` joined, the first :data:`HOSTS_NAMED` of many and how many more."""
    if len(names) <= HOSTS_NAMED:
        return ", ".join(names)
    return f"{', '.join(names[:HOSTS_NAMED])} and {len(names) - HOSTS_NAMED:,} more"


def terminal_shows(attempt: AttemptEvidence, protocol: Protocol, steps: int | None,
                    shown: Shown, others: Container[tuple[str | None, int]] = frozenset()
                    ) -> None:
    """Where the terminal event is (:attr:`Shown.terminal`), among the sources the protocol
    allows, and, when the driver's log lacks it, the sentence saying which other source
    holds it (contract v1.2). ``others``: (host, pid) of another attempt's workers and
    processes; a worker log named for one is that run's output, never this one's end."""
    sources, log = protocol.terminal_sources, shown.log
    shown.metrics = attempt.read.metrics
    if TRAINING_LOG.name in sources and log is not None and log.terminal_event is not None \
            and not _marker_refuted(log, shown):
        shown.terminal = Citation(log.path, line=log.terminal_event.line,
                                  quote=log.terminal_event.text)
        return
    if steps is None:
        return
    spec = _spec(protocol)
    lacks = "no driver's log holds it" if log is None else (
        f"the driver's log lacks `step:{steps}`" if spec is None or spec.builtin
        else f"the driver's log lacks the end of training for step {steps}")
    workers = {w.key: w for w in attempt.spec.workers}
    if WORKER_LOG.name in sources:
        hosts = attempt.hosts()
        for scan in shown.worker_logs:
            found = scan.terminal_event
            if found is None or _marker_refuted(scan, shown):
                continue
            parts = WORKER_LOG.parts(scan.path) or {}
            name = scan.path.rsplit("/", 1)[-1]  # (n-17-4711: host-pid or host-role-pid)
            if hosts and not hosts & {reading.get("host") for form in WORKER_LOG.names
                                      if (reading := form.parts(name)) is not None}:
                continue  # (a node the attempt's own files never name: no output of its run)
            who = scan.path.rsplit("/", 1)[-1].rsplit(".", 1)[0]  # (n2-4711, n2-rank0)
            pid = parts.get("pid")
            if pid and ((parts.get("host"), int(pid)) in others
                        or (None, int(pid)) in others):
                continue  # (another attempt's worker: its run printed it, not this one)
            worker = workers.get((parts.get("host"), int(pid))) if pid else None
            number = worker.rank if worker is not None else parts.get("rank")
            rank = f" (rank {number})" if number is not None else ""
            shown.terminal = Citation(scan.path, line=found.line, quote=found.text)
            shown.shows.append(f"The terminal event for step {steps} is in a worker's own "
                               f"output: {lacks}; worker `{who}`{rank} printed it at "
                               f"`{scan.path}:{found.line}`.")
            shown.citations.append(shown.terminal)
            return
    if METRICS_LOG.name in sources:
        for scan in sorted(attempt.read.metrics, key=lambda s: s.path):
            found = scan.terminal_event
            if found is None:
                continue
            shown.terminal = Citation(scan.path, line=found.line, quote=found.text)
            shown.shows.append(f"The terminal event is the framework's own record: {lacks}; "
                               f"the metrics file `{scan.path}` (line {found.line}) holds a "
                               "record meeting the protocol's JSON predicates.")
            shown.citations.append(shown.terminal)
            return
        for scan in sorted(attempt.read.metrics, key=lambda s: s.path):
            short = next((e for e in scan.events if e.kind == "stopped_short"), None)
            if short is None or any(c.path == scan.path for c in shown.citations):
                continue  # (a refuted marker's sentence names it already)
            # (a record meeting the predicates there may be an earlier run's: said, so the
            # reader who finds it is not left to think the audit missed it)
            shown.shows.append(f"The metrics file `{scan.path}` holds no end of this run: "
                               f"{short.detail} (line {short.line}).")
            shown.citations.append(Citation(scan.path, line=short.line, quote=short.text))
    if TRACE_SOURCE in sources:
        for trace in sorted(attempt.read.traces, key=lambda t: t.path):
            phases_end = max((p.line for p in trace.phases if p.step == steps), default=0)
            line = next((t for n, t in trace.terminals if n == steps and t > phases_end), None)
            if line is None:
                continue
            who = f"rank {trace.ranks[0][0]}" if trace.ranks else "the rank"
            shown.terminal = Citation(trace.path, line=line, quote=f"terminal step {steps}")
            shown.shows.append(f"The terminal event for step {steps} is the rank's own record: "
                               f"{lacks}; {who} recorded its terminal record for step "
                               f"{steps} at `{trace.path}:{line}` (written and fsynced by the "
                               "rank itself, not forwarded).")
            shown.citations.append(shown.terminal)
            return


def _marker_refuted(log: TrainingLogScan, shown: Shown) -> bool:
    """Whether ``log``'s end is only a marker (no step shown) that the framework's own record
    of the run's state contradicts (a metrics document short of its end: ``global_step`` 300
    of ``max_steps`` 1000 under an early stop, whose final metrics line is the same marker);
    the sentence saying so is added."""
    event = log.terminal_event
    short = next(((scan.path, e) for scan in shown.metrics for e in scan.events
                  if e.kind == "stopped_short"), None) \
        if event is not None and event.kind == "terminal_marker" else None
    if event is None or short is None:
        return False
    path, record = short
    shown.shows.append(f"The marker of the end at `{log.path}:{event.line}` is not taken: the "
                       f"framework's own record `{path}` shows the run short of its end "
                       f"({record.detail}).")
    shown.citations.append(Citation(path, line=record.line, quote=record.text))
    return True


def params_shows(attempt: AttemptEvidence, steps: int | None, shown: Shown) -> None:
    """Whether the final update changed the parameters, by the ranks' digests before and
    after it (contract v1.2: the proof seed 002 lacked); nothing when none were recorded."""
    if steps is None:
        return
    changed: list[str] = []
    same: list[tuple[str, Citation]] = []
    for trace in sorted(attempt.read.traces, key=lambda t: t.path):
        at = [(when, digest, line) for step, when, digest, line in trace.params if step == steps]
        before = next(((d, n) for w, d, n in at if w == "before"), None)
        after = next(((d, n) for w, d, n in reversed(at) if w == "after"), None)
        if before is None or after is None:
            continue
        rank = str(trace.ranks[0][0]) if trace.ranks else trace.path
        cite = Citation(trace.path, line=after[1], quote=after[0][:12])
        shown.citations.append(cite)
        if before[0] != after[0]:
            changed.append(rank)
        else:
            same.append((rank, cite))
    if changed:
        shown.shows.append(f"The parameter digests (a fixed sample of each trainable tensor) "
                           f"changed across the step-{steps} update on "
                           f"{'rank' if len(changed) == 1 else 'ranks'} {', '.join(changed)}.")
    for rank, cite in same:
        shown.shows.append(f"Rank {rank}'s final update changed nothing: its parameter digests "
                           f"before and after step {steps} are equal (`{cite.path}:{cite.line}`).")
    shown.params_changed = bool(changed) and not same


def log_shows(log: TrainingLogScan, steps: int | None, shown: Shown,
              protocol: Protocol | None = None) -> None:
    """What the training log shows of the terminal event, and whether it was cut; when it
    lacks the event, what the protocol's matcher looks for (``protocol``: None, or one
    giving no ``terminal_event`` matcher, is verl's built-in one)."""
    if log.terminal_event is not None and log.terminal_event.kind == "terminal_marker":
        shown.shows.append("The training log holds only a marker of the end (an end line "
                           "that names no step: weaker evidence, no step number shown), which "
                           "the protocol accepts.")
        shown.citations.append(Citation(log.path, line=log.terminal_event.line,
                                        quote=log.terminal_event.text))
    elif log.terminal_event is not None:
        shown.shows.append(f"The training log holds the terminal event for step {steps}.")
        shown.citations.append(Citation(log.path, line=log.terminal_event.line,
                                        quote=log.terminal_event.text))
    elif steps is not None:
        spec = _spec(protocol)
        if spec is None or spec.builtin:  # (verl's words: its sentence as it always was)
            lacks = f"line with `step:{steps}` followed by `training/global_step:{steps}`" \
                + "".join(f" nor a line matching the protocol's marker {form}"
                          for form in _own_markers(spec))
            seen: str | None = _verl_seen(log)
        else:
            lacks, seen = _lacks(spec, steps), _seen(spec, log)
        clipped = next((f for f in log.findings if f.rule_id == "AUD007"), None)
        if clipped is not None:  # (a line read in part: not "at all", only where read)
            if seen:
                seen += " in what was read"
            else:
                lacks += " in what was read"
        vetoed = next((e for e in log.events if e.kind == "terminal_vetoed"), None)
        # (a tuner's restore: the trial fits' end and step lines before it are in the file)
        forgotten = next((e for e in reversed(log.events) if e.kind == "terminal_forgotten"),
                         None)
        if vetoed is not None or forgotten is not None:  # (an end line there may be: it
            lacks += " that counts"  # counts for nothing)
        if forgotten is not None and seen:
            seen += f" after line {forgotten.line}"
        quoted = log.quoted_terminal
        if quoted is not None:  # (what a grep finds: said, so that the sentence stays true)
            lacks += (f", only a copy quoted inside another line (line {quoted.line}), "
                      "which does not count")
        shown.shows.append(f"The training log holds no {lacks}"
                           + (f"; {seen}." if seen else "."))
        shown.citations.append(Citation(  # (what the whole file lacks: no line to quote)
            log.path, quote=f"no terminal event in {log.lines} "
                            f"line{'' if log.lines == 1 else 's'}"))
        if vetoed is not None:
            shown.shows.append(f"Line {vetoed.line} of the training log "
                               f"({inline_code(vetoed.text)}) voids every end line of the "
                               "file, as the protocol's matcher says.")
        if forgotten is not None:
            shown.shows.append(f"Line {forgotten.line} of the training log "
                               f"({inline_code(forgotten.text)}) restores the state a tuner's "
                               "trial fits began from: the end and step lines before it were "
                               "theirs, and do not count.")
        for event in (vetoed, forgotten, quoted):
            if event is not None:
                shown.citations.append(Citation(log.path, line=event.line, quote=event.text))
        if clipped is not None:
            shown.shows.append(sentence(
                f"Line {clipped.citations[0].line} was examined only in part (line of "
                f"{clipped.value('length')} bytes clipped to {clipped.value('limit')}): a "
                "terminal line past that point would not be seen"))
            shown.citations.append(clipped.citations[0])
    cut = next((f for f in log.findings if f.rule_id == "AUD017"), None)
    if cut is not None:
        shown.shows.append(sentence(f"The training log ends mid-line at line "
                                    f"{cut.citations[0].line} (no final newline): it was cut "
                                    "while being written, and what followed is lost"))
        shown.citations.append(cut.citations[0])


PATTERN_SHOWN = 120
"""Characters of a protocol's own pattern a sentence shows (a pattern may be long)."""


def _spec(protocol: Protocol | None) -> TerminalSpec | None:
    """The matcher the logs were scanned with, as the collector takes it from ``protocol``:
    its ``terminal_event`` spec, else its v1 ``pattern``; None for verl's built-in one."""
    if protocol is None:
        return None
    if protocol.terminal is not None:
        return None if protocol.terminal == VERL else protocol.terminal
    if protocol.terminal_pattern is not None:
        return TerminalSpec(patterns=(protocol.terminal_pattern,))
    return None


def _verl_seen(log: TrainingLogScan) -> str:
    """What a log scanned by verl's built-in matcher shows of its steps, in verl's words."""
    step_lines = [e for e in log.events if e.kind == "step_line"]
    if log.last_step is not None:
        return f"the last training step logged is {log.last_step}"
    if step_lines:
        return (f"`step:` lines appear (the last at line {step_lines[-1].line}, step "
                f"{step_lines[-1].detail}) but none with `training/global_step`")
    return "no `step:` metric line appears at all"


def _own_markers(spec: TerminalSpec | None) -> list[str]:
    """The marker patterns ``spec`` adds to its preset's, as code (none unless they count)."""
    if spec is None or not spec.markers_count:
        return []
    preset = PRESETS.get(spec.preset or "")
    return [inline_code(clip(pattern, PATTERN_SHOWN))
            for pattern in spec.marker[len(preset.spec.marker) if preset else 0:]]


def _lacks(spec: TerminalSpec, steps: int) -> str:
    """What ``spec`` would take for the end of ``steps`` in a training log, as the object of
    "holds no": the preset's end line in its framework's words, the protocol's own patterns,
    JSON predicates (an ``:::MLLOG`` record is the only one a log holds), markers that count;
    each as the matcher reads it, never verl's ``step:`` words (contract v1.2)."""
    preset = PRESETS.get(spec.preset or "") if spec.preset != "verl" else None
    name = f"the {spec.preset} preset's end of training"
    matching: list[str] = []
    if preset is not None and preset.spec.patterns:
        forms = " or ".join(inline_code(form.format(step=steps - spec.offset))
                            for form in preset.ends)
        matching.append(f"{name} for step {steps}" + (f" ({forms})" if forms else ""))
    own = spec.patterns[len(preset.spec.patterns) if preset else 0:]
    if own:
        matching.append(f"the protocol's pattern{'s' if len(own) > 1 else ''} "
                        + " or ".join(inline_code(clip(p, PATTERN_SHOWN)) for p in own)
                        + f" for step {steps}")
    parts = [f"line matching {' or '.join(matching)}"] if matching else []
    # (hf-trainer's and LlamaFactory's predicates read their metrics files, never a log line)
    metrics_only = preset is not None and spec.json == preset.spec.json \
        and not preset.json_in_log
    if spec.json and not metrics_only:
        tests = " and ".join(
            f"{inline_code(path)} equal to "
            + inline_code(str(value) if how == "field" else clip(
                json.dumps(value, ensure_ascii=False, sort_keys=True), PATTERN_SHOWN))
            for path, how, value in spec.json)
        counted = any(how == "field" for _, how, _ in spec.json)  # (a count: the dispatch's)
        whose = name if preset is not None and spec.json == preset.spec.json \
            else "the protocol's JSON predicates"
        parts.append(f"`:::MLLOG` record matching {whose} ({tests}"
                     + (f", step {steps}" if counted else "") + ")")
    if spec.markers_count:
        markers = [inline_code(form) for form in (preset.markers if preset else ())] \
            + _own_markers(spec)
        if markers:
            parts.append(f"marker of the end of training ({' or '.join(markers)})")
    if not parts:  # (no spec the protocol reader resolves comes here; said plainly)
        return f"end of training for step {steps} that the protocol's matcher accepts"
    return parts[0] + "".join(f" nor a {part}" for part in parts[1:])


def _seen(spec: TerminalSpec, log: TrainingLogScan) -> str | None:
    """What a log scanned by ``spec`` shows of its steps: the last step its lines stated
    (the logger's own count beside it, for a 0-based one), none for any step, or nothing
    where the matcher reads no steps (JSON predicates, markers)."""
    if log.last_step is not None:
        return f"the last step the log shows is {log.last_step}" + (
            f" (the logger's {log.last_step - spec.offset}, counted from {1 - spec.offset})"
            if spec.offset else "")
    if spec.patterns:
        return "no such line appears for any step"
    return None


# -------------------------------------------------------------------- 3. decide


def sentence(text: str) -> str:
    """``text`` stripped, ending in a full stop."""
    text = text.strip()
    return text if text.endswith((".", "!", "?")) else text + "."
