"""Rich renderables for the terminal (the CLI prints them; nothing here prints).

Text from evidence is passed through :func:`safe` (control and escape
sequences removed) and rendered as plain :class:`rich.text.Text`, never as
markup, so a hostile log line cannot move the cursor or restyle the screen.
"""

from __future__ import annotations

import re
from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from auditor._text import counted, printable
from auditor.model import SacctDump

_CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)?|"
                      r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
"""Escape sequences, control characters and the bidirectional controls that reorder what a
terminal shows (removed: as :mod:`auditor.report.mdformat` removes them from the report)."""


def safe(text: object) -> Text:
    """Evidence text as inert rich Text."""
    return Text(_CONTROL.sub("", printable(str(text))))


def summary_view(summary: dict[str, Any], written: bool = True) -> Group:
    """Verdicts, configurations, integrity and the gate, from ``summary.json``; what the
    findings mean for the gate, and (``written`` False: no ``--out``) that nothing was
    written."""
    verdicts = Table(title="Verdicts", show_header=True)
    for column in ("resolved", "failed", "unresolved", "launches"):
        verdicts.add_column(column, justify="right")
    counts = summary["verdicts"]
    verdicts.add_row(f"{counts['resolved']:,}", f"{counts['failed']:,}",
                     f"{counts['unresolved']:,}", f"{summary['launches']:,}")
    configs = Table(title="Configurations", show_header=True)
    for column in ("configuration", "status", "outcome", "periods"):
        configs.add_column(column)
    for config in summary["configurations"]:
        style = "green" if config["status"] == "resolved" else "red"
        configs.add_row(safe(f"{config['workload']}@{config['gpus']}"),
                        Text(config["status"], style=style), safe(config["outcome"] or "—"),
                        f"{config['periods']:,}")
    integrity = Table(title="Integrity (evidence files and period records)", show_header=True)
    columns = (("listed", "files_listed"), ("verified", "verified"),
               ("mismatched", "mismatched"), ("missing", "missing"), ("unsafe", "unsafe_paths"),
               ("unreadable", "unreadable"), ("unlisted", "unlisted"))
    for header, _ in columns:  # (short headers: the table fits 80 columns)
        integrity.add_column(header, justify="right")
    integrity.add_row(*(f"{summary['integrity'].get(key, 0):,}" for _, key in columns))
    findings = summary["findings"]
    notes = [Text(findings_line(summary, written))]
    if summary["partial"]:
        kept = findings.get("not_kept", 0)
        notes.append(Text("partial audit: " + (f"{counted(kept, 'finding')} counted but not "
                                                "kept (findings limits); " if kept else "")
                          + "a cap was reached (AUD013 / AUD016)", style="yellow"))
    notes.extend(Text.assemble(("waiver matched nothing: ", "yellow"),
                               safe(f"{w['rule_id']}:{w['subject']}"))
                 for w in summary["waivers"] if not w["matched"])
    gate = summary["gate"]
    partial = summary["gate_allow_partial"]
    lines = [
        Text.assemble("gate: ", Text("PASS" if gate["passed"] else "FAIL",
                                     style="bold green" if gate["passed"] else "bold red"),
                      f"   --allow-partial: {'PASS' if partial['passed'] else 'FAIL'}",
                      "   included: ", safe(", ".join(partial["included_configurations"])
                                            or "none"),
                      safe(f" (unresolved, by waiver: {', '.join(waived)})" if (
                          waived := partial.get("included_by_waiver")) else "")),
        Text(f"accounting: allocation {_gpu_seconds(summary['accounting'])}, "
             f"task {summary['accounting']['task_gpu_seconds']:,.1f} GPU-s, "
             f"reservation {_gpu_seconds(summary['accounting'], 'reservation')} "
             "(overlapping scopes; never add them)"),
        *notes,
    ]
    if not written:
        lines.append(Text("nothing was written (no --out): give --out DIR for diagnostic.md, "
                          "evidence.md, the tables and the plots", style="yellow"))
    return Group(verdicts, configs, integrity, *lines)


def findings_line(summary: dict[str, Any], written: bool = True) -> str:
    """What the findings mean for the gate: the errors are the reasons it counts (the
    unresolved periods' and any other), the warnings and informational ones block
    nothing."""
    findings, gate = summary["findings"], summary["gate"]
    errors, unresolved = findings["error"], summary["verdicts"]["unresolved"]
    reasons = len(gate["reasons"])
    if not errors:
        text = "no error findings"
    elif gate["passed"]:
        text = (f"{counted(errors, 'error finding')}, each waived or outside the included "
                "configurations: the gate passes")
    else:
        # (one period's own: "the 1 unresolved periods' reasons" misread as a count gone wrong)
        whose = ((f"the {unresolved:,} unresolved periods' reasons" if unresolved != 1
                  else "the 1 unresolved period's reason") if errors == unresolved
                 else f"the reasons behind {unresolved:,} unresolved "
                      f"period{'s' if unresolved != 1 else ''} and the gate's others"
                 if unresolved else "what the gate counts")
        text = (f"{counted(errors, 'error finding')}: {whose}; the gate fails on them "
                f"({counted(reasons, 'reason')})")
    rest = (f"{counted(findings['warning'], 'warning')} and {findings['info']:,} "
            "informational findings block nothing")
    where = " (diagnostic.md explains them)" if written else ""
    return f"{text}; {rest}{where}"


MAX_SACCT_ROWS = 200
"""Allocations ``auditor sacct`` shows in its table (``--json`` gives every one)."""


NOTES_LEAST = 20
"""Columns the notes need beside the others; a terminal narrower lists them under the table."""


def sacct_view(dump: SacctDump, summary: dict[str, Any], width: int | None = None) -> Group:
    """``auditor sacct``: one row per record (a job's earlier ``-D`` runs under it), steps
    folded in, then totals. Ids, states and exit codes are never cut (a narrow terminal
    folds the notes column instead, and one of ``width`` too narrow for it lists the notes
    under the table, by row); a code that may have lost 128 says what it may be."""
    table = Table(title=f"sacct: {dump.path}", show_header=True, box=box.SIMPLE_HEAD,
                  pad_edge=False)
    shown = summary["jobs"][:MAX_SACCT_ROWS]  # (made for these only: see the totals)
    rows: list[tuple[Any, ...]] = []
    for job in shown:
        for number, record in enumerate(job["attempts"], start=1):
            rows.append((f"{job['job_id']} run {number}", job["job_id_raw"] or "", record,
                         _sacct_notes(record, "earlier run (sacct -D)")))
        runs = f" run {len(job['attempts']) + 1}" if job["attempts"] else ""
        pending = job.get("pending_tasks")
        rows.append((f"{job['job_id']}{runs}", job["job_id_raw"] or "", job, _sacct_notes(
            job, "" if "pending_tasks" not in job else
            "holds tasks " + (_task_list(pending) if pending is not None else "(too many)"))))
    texts = [(safe(name), safe(raw), record["state"], _exit_text(record),
              "" if record["elapsed_s"] is None else str(record["elapsed_s"]),
              "" if record["gpus"] is None else str(record["gpus"]),
              "" if record["gpu_seconds"] is None else f"{record['gpu_seconds']:,}", notes)
             for name, raw, record, notes in rows]
    headers: tuple[str, ...] = ("job", "raw", "state", "exit", "elapsed", "gpus", "GPU-s",
                                "notes")
    widest = [min(max([len(header), *(len(str(row[position])) for row in texts)]), 40)
              for position, header in enumerate(headers)]
    below = width is not None and sum(widest[:-1]) + 3 * len(headers) + NOTES_LEAST > width
    if below:  # (rich drops a column it has no room for, words and all)
        headers = headers[:-1]
    for position, header in enumerate(headers):
        if header == "notes":
            # (no minimum: one beyond the room left made rich crop every line of it)
            table.add_column(header, overflow="fold")
        else:
            table.add_column(header, justify="left" if position < 3 else "right",
                             no_wrap=True, min_width=widest[position])
    for name, raw, state, exit_text, elapsed, gpus, gpu_s, notes in texts:
        style = "green" if state == "COMPLETED" else "yellow" if state in (
            "PENDING", "RUNNING", "REQUEUED") else "red"
        table.add_row(name, raw, Text(state, style=style), exit_text, elapsed, gpus, gpu_s,
                      *(() if below else (safe(notes),)))
    noted = [Text.assemble(name, ": ", safe(notes)) for name, *_, notes in texts
             if below and notes]
    totals = summary["totals"]
    states = ", ".join(f"{state} {n}" for state, n in sorted(totals["states"].items()))
    seconds = totals["gpu_seconds"]
    gpu_text = ("GPU-seconds unknown (the dump lacks ElapsedRaw/Elapsed or AllocTRES)"
                if seconds is None else
                f"{seconds:,} GPU-seconds ({seconds / 3600:.6f} GPU-hours)")
    if seconds is not None and totals.get("gpu_seconds_unknown"):
        gpu_text += f", {counted(totals['gpu_seconds_unknown'], 'record')} unknown"
    if totals.get("requeued_gpu_seconds"):
        gpu_text += (f", {totals['requeued_gpu_seconds']:,} of them held by runs lost to "
                     "requeue or preemption")
    if totals.get("jobs_outside_array"):
        outside = totals["jobs_outside_array"]
        gpu_text += (f"; {counted(len(outside), 'job')} outside the arrays ("
                     + ", ".join(outside[:5]) + (", ..." if len(outside) > 5 else "")
                     + (f": {totals['outside_array_gpu_seconds']:,} GPU-seconds)"
                        if totals.get("outside_array_gpu_seconds") is not None else ")"))
    footer = safe(f"{totals['jobs']:,} allocations; {gpu_text}; states: {states}")
    notes_after = [safe(f"{f.rule_id} {f.message}") for f in dump.findings[:20]]
    if totals["jobs"] > MAX_SACCT_ROWS:  # (a table of thousands is read by no one, and
        # takes rich seconds a thousand rows to lay out)
        notes_after.insert(0, Text(f"the first {MAX_SACCT_ROWS} of {totals['jobs']:,} "
                                   "allocations are shown; --json gives them all"))
    return Group(table, *noted, footer, *notes_after)


def _exit_text(record: dict[str, Any]) -> str:
    return "" if record["exit_code"] is None else f"{record['exit_code']}:{record['signal']}"


def _sacct_notes(record: dict[str, Any], first: str) -> str:
    """A row's notes: what it is, what a code that lost 128 may be, its failing steps."""
    notes = [first] if first else []
    possible = record.get("exit_code_may_be") or []
    if len(possible) == 2:
        notes.append(f"exit {possible[0]} or {possible[1]}")
    notes.extend(f"{s['step']} {s['state']}"
                 + ("" if s["exit_code"] is None else f" {s['exit_code']}:{s['signal']}")
                 for s in record["steps"] if s["state"] not in ("COMPLETED", "RUNNING",
                                                                "PENDING"))
    return "; ".join(notes)


def _task_list(tasks: list[int]) -> str:
    """``12-15``, ``15``, ``1, 3-5``: a task list as runs (the first 20 runs)."""
    runs: list[str] = []
    start = previous = None
    for task in [*tasks, None]:
        if task is not None and previous is not None and task == previous + 1:
            previous = task
            continue
        if start is not None:
            runs.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = task
    return ", ".join(runs[:20]) + (", ..." if len(runs) > 20 else "") if runs else "none"


def _gpu_seconds(accounting: dict[str, Any], scope: str = "allocation") -> str:
    """A scope as shown: unknown without a usable scheduler dump (or one without the
    allocations' GPUs or elapsed times)."""
    seconds = accounting[f"{scope}_gpu_seconds"]
    if seconds is None:
        return "unknown (see the report's accounting)"
    return f"{seconds:,.1f} GPU-s" if isinstance(seconds, float) else f"{seconds:,} GPU-s"
