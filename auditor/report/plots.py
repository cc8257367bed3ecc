"""PNG plots (optional: needs the ``plots`` extra, matplotlib).

- ``plots/phase_timeline.png``: for each period (up to :data:`MAX_TIMELINE_PERIODS`),
  one row per rank, one bar per allocator phase record, failures in red;
- ``plots/peak_memory.png``: each period's raw peak MiB by configuration,
  against the GPU memory capacity the device evidence reports.

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
            for trace in sorted(attempt.read.traces, key=lambda t: t.path):
                records = [r for r in trace.phases if r.started_ns and r.finished_ns]
                if not records:
                    continue
                base = origin if origin is not None else min(r.started_ns or 0 for r in records)
                rows.append((f"{period.subject} r{records[0].rank}", base, records))
    if not rows:
        return None
    figure = figure_type(figsize=(10, min(max(2.0, 0.2 * len(rows) + 1.0), 40)))
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
    axis.set_title("Allocator phases per rank (red: raised)")
    handles = [patch_type(color=c, label=p) for p, c in PHASE_COLOURS.items()]
    handles.append(patch_type(color=ERROR_COLOUR, label="error"))
    axis.legend(handles=handles, fontsize=6, loc="lower right")
    figure.tight_layout()
    return _png(figure, canvas_type)


def _peaks(result: AuditResult, figure_type: Any, canvas_type: Any) -> bytes | None:
    reasoning = reasoning_of(result)
    by_config: dict[str, list[float]] = defaultdict(list)
    for facts in reasoning.facts:
        if facts.raw_peak_mib is not None and facts.workload is not None:
            by_config[f"{facts.workload}@{facts.gpus}"].append(facts.raw_peak_mib)
    if not by_config:
        return None
    capacities = sorted({d.memory_total_mib for p in result.collected.periods
                         for a in p.attempts for d in a.read.devices if d.memory_total_mib})
    keys = sorted(by_config, key=lambda k: (k.rsplit("@", 1)[1].zfill(6), k))
    figure = figure_type(figsize=(8, 4))
    axis = figure.add_subplot()
    for x, key in enumerate(keys):
        values = by_config[key]
        axis.scatter([x] * len(values), values, color="#4c72b0", zorder=3)
    for capacity in capacities:
        axis.axhline(capacity, color=ERROR_COLOUR, linestyle="--", linewidth=1)
        axis.text(len(keys) - 0.5, capacity, f"capacity {capacity} MiB", fontsize=7,
                  color=ERROR_COLOUR, ha="right", va="bottom")
    axis.set_xticks(range(len(keys)))
    axis.set_xticklabels(keys, rotation=30, ha="right", fontsize=7)
    axis.set_ylabel("raw peak MiB")
    axis.set_title("Peak GPU memory per configuration")
    figure.tight_layout()
    return _png(figure, canvas_type)
