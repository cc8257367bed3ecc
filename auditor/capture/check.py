"""The launcher checks too (contract v1.2): at the command's end, ``auditor run`` looks for the
terminal event in what it holds, with the audit's own matcher.

A clean exit (0, or an excused coordinated shutdown) whose evidence holds no terminal event
for the dispatched step count is what seed ``002``'s launcher caught at run time: the trial
record then says ``status: "infrastructure_invalid"`` with the seed's ``validation_error``
("Successful exit lacks the exact N-step terminal event"), so the launcher's word and the
audit's agree. The exit code stays the command's.

The sources are the audit's (``terminal_event.sources`` of ``ROOT/protocol.json`` when there
is one, else all): the training log, the worker logs under ``worker-logs/``, the records
under ``metrics/`` (where the protocol has JSON predicates), and the allocator traces'
terminal records (``Trace.terminal``); the matcher is the audit's, under the protocol's
``terminal_event`` (a preset, patterns, veto, marker, predicates) when it gives one, the
protocol read by the audit's own reader. Imported only at the command's end (and at its start
for the protocol's shutdown flag): a training process's import of the kit stays light.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass
from pathlib import Path

from auditor.capture._files import UNUSABLE_JSON, open_regular
from auditor.collect.metrics import read_metrics
from auditor.collect.terminal import SpecError, resolve
from auditor.collect.training_log import scan_training_log
from auditor.model import DEFAULT_PROTOCOL, LogEvent, Protocol, TrainingLogScan
from auditor.model.kinds import (
    ALLOCATOR_TRACE,
    METRICS_LOG,
    TRACE_SOURCE,
    TRAINING_LOG,
    WORKER_LOG,
)
from auditor.model.presets import TerminalSpec


@dataclass(frozen=True, slots=True)
class TerminalCheck:
    """What the launcher's check found."""

    steps: int | None
    """The dispatched step count (None: none dispatched, no check made)."""
    where: str | None
    """The file (below the attempt) and line holding the terminal event, or None."""

    @property
    def missing(self) -> bool:
        """Whether a check was made and found no terminal event."""
        return self.steps is not None and self.where is None

    def validation_error(self) -> str:
        """The seed's form of the failure."""
        return f"ValueError: Successful exit lacks the exact {self.steps}-step terminal event"


def root_protocol(root: Path | None) -> Protocol | None:
    """``ROOT/protocol.json`` read by the audit's own reader (a file it cannot use gives its
    defaults, as the audit's does); None without a root or the file."""
    from auditor.collect.protocol import PROTOCOL_LIMIT, read_protocol

    if root is None:
        return None
    try:
        with open_regular(root / "protocol.json", follow=True) as handle:  # (nor a FIFO)
            data = handle.read(PROTOCOL_LIMIT + 1)
    except OSError:
        return None
    return read_protocol(io.BytesIO(data), "protocol.json")


def shutdown_flag(root: Path | None) -> str | None:
    """The flag the protocol names as its ``coordinated_shutdown_flag`` (an empty name is a
    flag never on); None without the file: the audit classifies the controller's 143 by
    it, so the run must too."""
    protocol = root_protocol(root)
    return None if protocol is None else protocol.coordinated_shutdown_flag


def _matcher(protocol: Protocol) -> TerminalSpec | None:
    """The protocol's terminal-event matcher, as the audit's scan takes it: its v1.2 spec,
    else its v1 pattern when that compiles; None (the default) otherwise."""
    if protocol.terminal is not None or protocol.terminal_pattern is None:
        return protocol.terminal
    try:
        return resolve(None, patterns=(protocol.terminal_pattern,))
    except SpecError:
        return None


def check_terminal(directory: Path, log: Path, dispatch: dict[str, str],
                   root: Path | None) -> TerminalCheck:
    """Look for the terminal event of the dispatched steps in the attempt ``directory``."""
    protocol = root_protocol(root) or DEFAULT_PROTOCOL
    steps_from = protocol.steps_from
    value = (dispatch.get(steps_from) or os.environ.get(steps_from) or "").strip().strip('"')
    if not value.isdigit():
        return TerminalCheck(None, None)
    steps = int(value)
    pattern = _matcher(protocol)
    sources = protocol.terminal_sources
    logs: list[Path] = [log] if TRAINING_LOG.name in sources else []
    if WORKER_LOG.name in sources:
        logs += sorted(path for path in (directory / WORKER_LOG.directory).glob("*")
                       if path.is_file() and WORKER_LOG.names_loosely(
                           f"{WORKER_LOG.directory}/{path.name}"))
    metrics = [scan for path in sorted((directory / METRICS_LOG.directory).glob("*"))
               if path.is_file() and not path.is_symlink()
               and (scan := _metrics(path, steps, pattern)) is not None] \
        if pattern is not None and pattern.json else []
    # (a step-less marker the framework's own record shows short of its end: not taken)
    refuted = any(e.kind == "stopped_short" for scan in metrics for e in scan.events)
    for path in logs:
        end = _in_log(path, steps, pattern)
        if end is not None and not (refuted and end.kind == "terminal_marker"):
            return TerminalCheck(steps, f"{_shown(path, directory)}:{end.line}")
    if METRICS_LOG.name in sources:
        for scan in metrics:
            if scan.terminal_event is not None:
                return TerminalCheck(steps, f"{scan.path}:{scan.terminal_event.line}")
    if TRACE_SOURCE in sources:
        for path in sorted((directory / ALLOCATOR_TRACE.directory).glob("*.jsonl")):
            found = _in_trace(path, steps)
            if found is not None:
                return TerminalCheck(steps, f"{_shown(path, directory)}:{found}")
    return TerminalCheck(steps, None)


def _shown(path: Path, directory: Path) -> str:
    try:
        return path.relative_to(directory).as_posix()
    except ValueError:
        return path.name


def _in_log(path: Path, steps: int, terminal: TerminalSpec | None) -> LogEvent | None:
    """The terminal event in one log (None: none, or unreadable)."""
    try:
        with open_regular(path) as handle:
            scan = scan_training_log(handle, path.name, steps, terminal=terminal)
    except OSError:
        return None
    return scan.terminal_event


def _metrics(path: Path, steps: int, terminal: TerminalSpec) -> TrainingLogScan | None:
    """One metrics file read for the protocol's JSON predicates (None: unreadable)."""
    try:
        with open_regular(path) as handle:
            return read_metrics(handle, f"{METRICS_LOG.directory}/{path.name}", terminal,
                                steps)
    except OSError:
        return None


def _in_trace(path: Path, steps: int) -> int | None:
    """The line of a rank's terminal record for ``steps`` in one allocator trace."""
    try:
        with open_regular(path) as handle:
            for number, raw in enumerate(handle, 1):
                if b'"terminal"' not in raw:
                    continue
                try:
                    record = json.loads(raw)
                except UNUSABLE_JSON:
                    continue
                if isinstance(record, dict) and record.get("kind") == "terminal" \
                        and record.get("step") == steps:
                    return number
    except OSError:
        return None
    return None
