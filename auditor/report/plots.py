"""PNG plots (optional: needs the ``plots`` extra, matplotlib).

- ``plots/phase_timeline.png``: for each period (up to :data:`MAX_TIMELINE_PERIODS`),
  one row per rank, one bar per allocator phase record, failures in red;
- ``plots/peak_memory.png``: each period's raw peak MiB by configuration, coloured by
  verdict, against the GPU memory capacity the device evidence reports.

Without matplotlib the report is written without plots. Figures are drawn with
the object API on the Agg canvas (no pyplot, no global state, no GUI), one
``broken_barh`` artist per row, and saved without a software stamp, so the PNG
bytes depend only on the data.
"""

from __future__ import annotations

import io
from collections import defaultdict
from typing import Any

from auditor.audit import AuditResult
from auditor.report.summary import reasoning_of

MAX_TIMELINE_PERIODS = 24
ERROR_COLOUR = "#c44e52"
VERDICT_COLOURS = {"resolved": "#55a868", "failed": "#c44e52", "unresolved": "#8c8c8c"}
PHASE_COLOURS = {
    "init_model": "#4c72b0", "rollout_init": "#8172b2", "weight_sync": "#55a868",
    "rollout_generate": "#ccb974", "actor_update": "#dd8452", "idle": "#bbbbbb",
}


def render_plots(result: AuditResult) -> list[tuple[str, bytes]]:
    """(name, PNG bytes) for each plot; empty when matplotlib is not installed."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError:
        return []
    out = []
    timeline = _timeline(result, Figure, FigureCanvasAgg, Patch)
    if timeline is not None:
        out.append(("plots/phase_timeline.png", timeline))
    peaks = _peaks(result, Figure, FigureCanvasAgg)
    if peaks is not None:
        out.append(("plots/peak_memory.png", peaks))
    return out


def _png(figure: Any, canvas_type: Any) -> bytes:
    canvas_type(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=80, metadata={"Software": None})
    return buffer.getvalue()


def _timeline(result: AuditResult, figure_type: Any, canvas_type: Any,
              patch_type: Any) -> bytes | None:
    rows = []
    for period in result.collected.periods[:MAX_TIMELINE_PERIODS]:
        for attempt in period.attempts[-1:]:
            trial = attempt.read.trial
            origin = trial.started_ns if trial and trial.started_ns else None
            first = True
            for trace in sorted(attempt.read.traces, key=lambda t: t.path):
                records = [r for r in trace.phases if r.started_ns and r.finished_ns]
                if not records:
                    continue
                base = origin if origin is not None else min(r.started_ns or 0 for r in records)
                # one short label per period (glyph rendering dominates the cost)
                label = (f"{attempt.spec.job_id or period.record.pair} p{period.record.period}"
                         f" {period.record.gpus}g" if first else "")
                rows.append((label, base, records))
                first = False
    if not rows:
        return None
    height = min(max(2.0, 0.2 * len(rows) + 1.0), 40)
    figure = figure_type(figsize=(10, height))
    axis = figure.add_subplot()
    for y, (_, base, records) in enumerate(rows):
        spans = [(((r.started_ns or 0) - base) / 1e9,
                  max(((r.finished_ns or 0) - (r.started_ns or 0)) / 1e9, 0.05))
                 for r in records]
        colours = [ERROR_COLOUR if r.error_type else PHASE_COLOURS.get(r.phase, "#777777")
                   for r in records]
        axis.broken_barh(spans, (y - 0.4, 0.8), facecolors=colours)
    axis.set_yticks(range(len(rows)))
    axis.set_yticklabels([label for label, _, _ in rows], fontsize=5)
    axis.set_ylim(len(rows) - 0.5, -0.5)
    axis.set_xlabel("seconds since invocation start")
    axis.set_title("Allocator phases per rank, by job / period / GPUs (red: raised)")
    handles = [patch_type(color=c, label=p) for p, c in PHASE_COLOURS.items()]
    handles.append(patch_type(color=ERROR_COLOUR, label="error"))
    axis.legend(handles=handles, fontsize=6, loc="lower right")
    # fixed margins: tight_layout would lay the text out twice, doubling the cost
    figure.subplots_adjust(left=0.14, right=0.98, top=1 - 0.5 / height, bottom=0.6 / height)
    return _png(figure, canvas_type)


def _peaks(result: AuditResult, figure_type: Any, canvas_type: Any) -> bytes | None:
    reasoning = reasoning_of(result)
    verdict_of = {v.subject: v.verdict.value for v in reasoning.verdicts}
    by_config: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for facts in reasoning.facts:
        if facts.raw_peak_mib is not None and facts.workload is not None:
            by_config[f"{facts.workload}@{facts.gpus}"].append(
                (facts.raw_peak_mib, verdict_of.get(facts.subject, "unresolved")))
    if not by_config:
        return None
    capacities = sorted({d.memory_total_mib for p in result.collected.periods
                         for a in p.attempts for d in a.read.devices if d.memory_total_mib})
    keys = sorted(by_config, key=lambda k: (k.rsplit("@", 1)[1].zfill(6), k))
    figure = figure_type(figsize=(8, 4))
    axis = figure.add_subplot()
    seen: set[str] = set()
    for x, key in enumerate(keys):
        for verdict, colour in VERDICT_COLOURS.items():
            values = [peak for peak, kind in by_config[key] if kind == verdict]
            if values:
                axis.scatter([x] * len(values), values, color=colour, zorder=3,
                             label=verdict if x == 0 or verdict not in seen else None)
                seen.add(verdict)
    for capacity in capacities:
        axis.axhline(capacity, color="#444444", linestyle="--", linewidth=1)
        axis.text(-0.45, capacity, f"GPU capacity {capacity} MiB", fontsize=7,
                  color="#444444", ha="left", va="bottom")
    if capacities:
        low, _ = axis.get_ylim()
        axis.set_ylim(low, max(capacities) * 1.01)
    axis.set_xlim(-0.5, len(keys) - 0.5)
    axis.legend(fontsize=7, loc="lower left")
    axis.set_xticks(range(len(keys)))
    axis.set_xticklabels(keys, rotation=30, ha="right", fontsize=7)
    axis.set_ylabel("raw peak MiB")
    axis.set_title("Peak GPU memory per configuration")
    figure.subplots_adjust(left=0.12, right=0.97, top=0.9, bottom=0.28)
    return _png(figure, canvas_type)
