"""Collector for a metrics file, ``metrics/<name>`` (contract v1.2): a framework's own record
of its run, read for the terminal event the protocol's JSON predicates describe.

Three forms, told apart by the name and the bytes: a JSON document (``*.json``: the HF
Trainer's ``trainer_state.json``), JSON lines (LlamaFactory's ``trainer_log.jsonl``, verl's
file logger) and ``:::MLLOG`` lines (an MLPerf log). The first record meeting every predicate
is the event (its line, its text); where the dispatch gives N, fields compared with each
other that hold integers must also equal N (``current_steps == total_steps == N``), as a
line's ``total`` must. A line is kept to :data:`MAX_RECORD` bytes, a document to
:data:`MAX_DOCUMENT`; what is not JSON is passed over, never a crash (a line that opens an
object and is none is named, up to the traces' cap of line findings, the rest counted).
"""

from __future__ import annotations

from typing import BinaryIO

import orjson

from auditor import rules
from auditor._io import HashingReader, iter_lines, read_limited
from auditor._text import clip
from auditor.collect.allocator_trace import FINDINGS_CAP
from auditor.collect.terminal import MLLOG, aborted, holds, record_of, short_of, step_count
from auditor.model import Citation, Finding, LogEvent, TrainingLogScan
from auditor.model.presets import TerminalSpec

MAX_RECORD = 1 << 20
"""Bytes of one JSON line kept (a longer one is passed over)."""
MAX_DOCUMENT = 64 << 20
"""Bytes of a JSON document parsed (``trainer_state.json`` holds the whole log history)."""
TEXT_LIMIT = 300


def read_metrics(stream: BinaryIO | HashingReader, path: str, spec: TerminalSpec,
                 steps: int | None) -> TrainingLogScan:
    """The metrics file ``path`` read for the record meeting ``spec.json``: a scan whose
    terminal event is that record (and whose events hold an MLPerf abort). The stream is
    read to its end."""
    terminal: LogEvent | None = None
    events: list[LogEvent] = []
    findings: list[Finding] = []
    lines = dropped = 0
    if path.endswith(".json"):
        data = read_limited(stream, MAX_DOCUMENT)
        record = None
        try:
            record = orjson.loads(data) if data is not None else None
        except orjson.JSONDecodeError as error:
            findings.append(rules.finding("AUD003", path, [Citation(path)], form="document",
                                          error=clip(str(error), 160)))
        if data is None:
            findings.append(rules.finding(
                "AUD003", path, [Citation(path)], form="document",
                error=f"larger than {MAX_DOCUMENT >> 20} MiB: not parsed"))
        lines = data.count(b"\n") + 1 if data else 0
        if holds(spec.json, record, steps):
            terminal = LogEvent("terminal_event", 1, _shown(spec, record), "record")
        elif (short := short_of(spec.json, record, steps)) is not None:
            # (a snapshot of the run's state short of its end: a step-less marker's refutal)
            events.append(LogEvent("stopped_short", 1, _shown(spec, record), short))
    else:
        compared = any(how == "field" for _, how, _ in spec.json)
        end_count: int | None = None
        went_back: LogEvent | None = None
        for line in iter_lines(stream, MAX_RECORD):
            lines = line.number
            if (terminal is not None and end_count is None) or line.length > MAX_RECORD:
                continue
            text = line.data.decode("utf-8", "replace")
            record = record_of(text) if MLLOG in text else _json_line(line.data)
            if terminal is not None:
                # (a record whose step went back after the end: a later run appended to the
                # file, as LlamaFactory's trainer_log.jsonl of a resumed run; the end is its)
                count = step_count(spec.json, record)
                if count is not None and end_count is not None and count < end_count:
                    went_back = LogEvent("stopped_short", line.number, clip(text, TEXT_LIMIT),
                                         f"the records go back to step {count} after the "
                                         f"end at line {terminal.line} (a later run "
                                         "appended to the file)")
                    terminal = end_count = None
                continue
            if record is None:
                if MLLOG not in text and line.data.lstrip().startswith(b"{"):
                    if len(findings) < FINDINGS_CAP:  # (a file of them: counted, not kept)
                        findings.append(_not_json(path, line.number, line.data))
                    else:
                        dropped += 1
                continue
            if isinstance(record, dict) and aborted(record) and not events:
                events.append(LogEvent("aborted", line.number, clip(text, TEXT_LIMIT),
                                       "MLPerf run_stop with status aborted"))
            elif holds(spec.json, record, steps):
                terminal = LogEvent("terminal_event", line.number, clip(text, TEXT_LIMIT),
                                    "record")
                end_count = step_count(spec.json, record) if compared else None
                went_back = None
        if went_back is not None:
            events.append(went_back)
    if dropped:
        findings.append(rules.finding("AUD013", path, [Citation(path)], dropped=dropped,
                                      cap=FINDINGS_CAP))
    return TrainingLogScan(path=path, lines=lines, expected_steps=steps,
                           terminal_event=terminal, last_step=None, events=tuple(events),
                           events_dropped=0, findings=tuple(findings))


def _not_json(path: str, line: int, data: bytes) -> Finding:
    """``AUD003`` for a line that opens a JSON object and is none (cut, or malformed)."""
    try:
        orjson.loads(data)
        error = "not an object"
    except orjson.JSONDecodeError as problem:
        error = clip(str(problem), 160)
    return rules.finding("AUD003", path, [Citation(
        path, line=line, quote=clip(data.decode("utf-8", "replace"), TEXT_LIMIT))],
        error=error)


def _json_line(data: bytes) -> object:
    if not data.lstrip().startswith(b"{"):
        return None
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def _shown(spec: TerminalSpec, record: object) -> str:
    """A document's deciding fields, as its event's text (the whole may be megabytes)."""
    from auditor.collect.terminal import field

    assert isinstance(record, dict)
    names = [path for path, _, _ in spec.json] + [str(value) for _, how, value in spec.json
                                                   if how == "field"]
    shown = {name: field(record, name)[1] for name in dict.fromkeys(names)}
    return clip(orjson.dumps(shown).decode(), TEXT_LIMIT)
