"""``auditor causes LOG [--steps N] [--json]``: what a training log says ended its run.

For a user with a log and no study: one pass over the log (any size or encoding, as the
audit reads it), one line per cause-bearing line found (its line number, the cause word and
what it says), then the cause the audit would name from the log alone (the highest tier
first, the first in time within a tier; the rest are its knock-ons). The training log is
only part of the evidence: in an audit the scheduler's state, the launcher's record and the
allocator traces speak too. With ``--steps N`` a log holding the terminal event for step N
is said to have completed (no cause). Exit 0 whatever it finds; 2 for a file it cannot
read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from auditor.errors import InputError, UsageError

if TYPE_CHECKING:
    from auditor.model.presets import TerminalSpec


def add_parsers(commands: Any) -> None:
    """Add the ``causes`` sub-command to ``commands`` (an argparse sub-parsers action)."""
    causes = commands.add_parser(
        "causes", help="say what a training log shows ended its run",
        description="Scan one training log and say what ended its run: one line per cause "
        "found, then the cause the audit would name from the log alone.")
    causes.add_argument("log", type=Path, help="a training log (any size or encoding)")
    causes.add_argument("--steps", type=int, default=None,
                        help="the dispatched TOTAL_TRAINING_STEPS: a log with its terminal "
                        "event completed (no cause)")
    causes.add_argument("--protocol", type=Path, metavar="FILE",
                        help="apply this protocol.json's terminal_event (a preset, patterns, "
                        "veto, marker, JSON predicates) instead of verl's default")
    causes.add_argument("--json", action="store_true", help="print the result as JSON")


def _causes(args: argparse.Namespace) -> int:
    from auditor._signals import signals_deferred

    with signals_deferred():  # (compiled extensions interrupted while they load can crash)
        from auditor.collect.training_log import scan_training_log
        from auditor.reason.causes import cause_of_log, event_cause
    path: Path = args.log
    if args.steps is not None and not 0 <= args.steps < 1 << 63:  # (no step count is that)
        raise UsageError(f"causes: --steps {args.steps}: a step count is 0 to 2^63-1")
    from auditor._cli.inspect import _regular_file

    _regular_file(path)  # (a FIFO would wait for a writer, a device be read for ever)
    terminal = _terminal_of(args.protocol) if args.protocol is not None else None
    try:
        with open(path, "rb") as handle:
            scan = scan_training_log(handle, str(path), args.steps, terminal=terminal)
    except IsADirectoryError:
        raise InputError(f"causes: {path} is a directory, not a log") from None
    except OSError as error:
        raise InputError(f"causes: cannot read {path}: {error.strerror or error}") from None
    found = list({(event.line, word): (event, word) for event in scan.events
                  if (word := event_cause(event))}.values())  # (a line's cause once)
    completed = scan.terminal_event is not None
    cause = None if completed else cause_of_log(scan.events, str(path))
    clipped = [cite.line for item in scan.findings if item.rule_id == "AUD007"
               for cite in item.citations[:1] if cite.line is not None]  # (read in part)
    if args.json:
        import orjson

        sys.stdout.write(orjson.dumps({
            "log": str(path), "lines": scan.lines,
            "terminal_event": scan.terminal_event.line if scan.terminal_event else None,
            "terminal_evidence": None if scan.terminal_event is None else (
                "marker (no step number shown: weaker evidence)"
                if scan.terminal_event.kind == "terminal_marker" else "step"),
            "found": [{"line": e.line, "cause": word, "kind": e.kind, "detail": e.detail,
                       "text": e.text} for e, word in found],
            "lines_read_in_part": clipped,
            "cause": None if cause is None else {
                "cause": cause.word, "detail": cause.detail,
                "line": cause.citation.line if cause.citation else None,
                "knock_on": list(cause.knock_on)},
        }, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    from auditor._cli import _inert

    for event, word in found:  # (the log's text: a terminal shows it, never obeys it)
        print(f"{event.line}: {word}: {_inert(event.detail)}: {_inert(event.text)}")
    if completed:
        assert scan.terminal_event is not None
        if scan.terminal_event.kind == "terminal_marker":
            print(f"cause: none (an end marker is at line {scan.terminal_event.line}: no step "
                  "number shown, weaker evidence than a step line)")
        else:  # (what a log shows: whether the run then ended cleanly is its exit's to say)
            # (in line order, not the text's: "at line 10" sorted before "at line 9")
            after = [f"{word} at line {line}" for line, word in sorted(
                {(event.line, word) for event, word in found
                 if event.line > scan.terminal_event.line})]
            # (no --steps: a line that states its own last step, `max_steps=N`, was the end)
            which = "" if args.steps is None else f" for step {args.steps}"
            print(f"cause: none (the terminal event{which} is at line "
                  f"{scan.terminal_event.line}: training reached its last step"
                  + (f"; after it, {', '.join(after[:3])}"
                     + (f" and {len(after) - 3} more" if len(after) > 3 else "")
                     + ": its exit code and the scheduler's record say whether it ended "
                     "cleanly" if after else "") + ")")
    elif cause is None:
        print(f"cause: none found in {scan.lines:,} lines (the scheduler's record, the "
              "launcher's and the allocator traces may say more)")
    else:
        knock_on = f"; then, as its knock-ons: {', '.join(cause.knock_on)}" \
            if cause.knock_on else ""
        print(f"cause: {cause.word}: {_inert(cause.detail)}{knock_on}")
    if clipped and not completed:  # (a cause past a line's scanned part is not seen)
        shown = ", ".join(map(str, clipped[:10])) + (", ..." if len(clipped) > 10 else "")
        print(f"note: line{'s' if len(clipped) > 1 else ''} {shown} read only in part "
              "(longer than the scan limit, AUD007): a cause written past that is not seen")
    return 0


def _terminal_of(path: Path) -> TerminalSpec | None:
    """The matcher ``path`` (a protocol.json) gives: refused with one line when the file
    is not a regular one (a FIFO would wait for a writer, a device be read for ever), is
    larger than the audit parses (:data:`~auditor.collect.protocol.PROTOCOL_LIMIT`), cannot
    be read, or its ``terminal_event`` cannot work (an unknown preset, a pattern without
    ``step``)."""
    import io

    from auditor._io import regular_bytes
    from auditor.collect.protocol import PROTOCOL_LIMIT, read_protocol

    try:  # (at most one byte past the limit is read: enough to tell it is over)
        data = regular_bytes(path, limit=PROTOCOL_LIMIT + 1)
    except OSError as error:
        raise InputError(f"causes: --protocol {path}: {error.strerror or error}") from None
    if len(data) > PROTOCOL_LIMIT:
        raise InputError(f"causes: --protocol {path}: larger than the {PROTOCOL_LIMIT:,} "
                         "bytes a protocol file may have")
    protocol = read_protocol(io.BytesIO(data), str(path))
    broken = next((f for f in protocol.findings if f.rule_id in ("AUD014", "AUD002")), None)
    if broken is not None:  # (refused here: no built-in matcher takes its place)
        raise InputError(f"causes: --protocol {path}: "
                         + broken.message.removesuffix("; the built-in matcher applies"))
    if protocol.terminal is not None:
        return protocol.terminal
    if protocol.terminal_pattern is not None:
        from auditor.model.presets import TerminalSpec

        return TerminalSpec(patterns=(protocol.terminal_pattern,))
    return None


HANDLERS = {"causes": _causes}
