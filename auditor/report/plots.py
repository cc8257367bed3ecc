"""PNG plots (optional: needs the ``plots`` extra, matplotlib).

- ``plots/phase_timeline.png``: for each period (the first :data:`MAX_TIMELINE_PERIODS`,
  as its title says when there are more),
  one row per rank, one bar per allocator phase record, failures in red;
- ``plots/peak_memory.png``: each period's raw peak MiB by configuration, coloured by
  verdict, against the GPU memory capacity the device evidence reports.

Without matplotlib the report is written without plots. Figures are drawn with
the object API on the Agg canvas (no pyplot, no global state, no GUI), one
``broken_barh`` artist per row, and saved without a software stamp, so the PNG
bytes depend only on the data.

Drawing is split from the audit: :func:`plot_data` takes the little a figure
shows out of a result, and :func:`draw_plots` draws it. A :class:`Plotter` draws
in a helper process started before the audit, so importing matplotlib (0.35 s)
and drawing overlap the audit and the tables instead of adding to them.
"""

from __future__ import annotations

import contextlib
import io
from collections import defaultdict
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from auditor._process import helper_args, helper_context, helper_signals, signals_deferred

if TYPE_CHECKING:  # (not imported at run time: a Plotter starts before the audit's modules)
    from auditor.model import AuditResult

MAX_TIMELINE_PERIODS = 24
ERROR_COLOUR = "#c44e52"
VERDICT_COLOURS = {"resolved": "#55a868", "failed": "#c44e52", "unresolved": "#8c8c8c"}
PHASE_COLOURS = {
    "init_model": "#4c72b0", "rollout_init": "#8172b2", "weight_sync": "#55a868",
    "rollout_generate": "#ccb974", "actor_update": "#dd8452", "idle": "#bbbbbb",
}


@dataclass(frozen=True, slots=True)
class TimelineRow:
    """One rank's row of the phase timeline: its label and its bars."""

    label: str
    spans: tuple[tuple[float, float], ...]
    """(start, width) in seconds since the invocation started."""
    colours: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PlotData:
    """What the plots show, taken out of a result: small, and picklable to a helper."""

    timeline: tuple[TimelineRow, ...]
    peaks: tuple[tuple[str, tuple[tuple[int, str], ...]], ...]
    """(configuration, its periods' (raw peak MiB, verdict)), in the plot's order."""
    capacities: tuple[int, ...]
    """The GPU memory capacities (MiB) the device evidence reports."""
    periods: int = 0
    """How many periods the study has (the timeline shows the first
    :data:`MAX_TIMELINE_PERIODS`)."""


def render_plots(result: AuditResult) -> list[tuple[str, bytes]]:
    """(name, PNG bytes) for each plot; empty when matplotlib is not installed."""
    return draw_plots(plot_data(result))


def plot_data(result: AuditResult) -> PlotData:
    """The data of every plot of ``result``."""
    return PlotData(_timeline_rows(result), *_peak_points(result),
                    periods=len(result.collected.periods))


def draw_plots(data: PlotData) -> list[tuple[str, bytes]]:
    """(name, PNG bytes) for each plot of ``data``; empty without matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError:
        return []
    out = []
    if data.timeline:
        out.append(("plots/phase_timeline.png",
                    _draw_timeline(data.timeline, data.periods, Figure, FigureCanvasAgg,
                                   Patch)))
    if data.peaks:
        out.append(("plots/peak_memory.png",
                    _draw_peaks(data.peaks, data.capacities, Figure, FigureCanvasAgg)))
    return out


class Plotter:
    """Draws plots in a helper process, started at once so that it imports matplotlib
    while the caller audits. :meth:`draw` hands it the data; :meth:`close` ends it.

    If the helper cannot start or dies, the plots are drawn in the calling process
    instead: a plotter changes when the plots are drawn, never what they are."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None
        try:
            context = helper_context()
            self._pool = ProcessPoolExecutor(max_workers=1, mp_context=context,
                                             initializer=helper_signals,
                                             initargs=helper_args(context))
            with signals_deferred():  # (started at the first task: born with signals held)
                self._pool.submit(_import_matplotlib)
        except (OSError, RuntimeError):  # no process to spare: draw in the caller
            self.close()
        except BaseException:  # a signal held while the helper started: end it first
            self.close()
            raise

    def draw(self, data: PlotData) -> Future[list[tuple[str, bytes]]] | None:
        """Start drawing ``data`` in the helper; None when there is no helper."""
        if self._pool is None:
            return None
        try:
            with signals_deferred():  # (see Auditor._map)
                return self._pool.submit(draw_plots, data)
        except RuntimeError:  # the helper died (BrokenProcessPool is a RuntimeError)
            return None

    def close(self) -> None:
        """End the helper: it finishes the task in hand (an import, or a drawing no longer
        wanted) and exits."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            with signals_deferred():  # (never cut short: see Auditor.run)
                pool.shutdown(cancel_futures=True)


def _import_matplotlib() -> None:
    """In the helper: import what drawing needs, ahead of the data (without matplotlib,
    :func:`draw_plots` draws nothing)."""
    with contextlib.suppress(ImportError):
        import matplotlib.backends.backend_agg  # noqa: F401
        import matplotlib.figure  # noqa: F401
        import matplotlib.patches  # noqa: F401


def _png(figure: Any, canvas_type: Any) -> bytes:
    canvas_type(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=80, metadata={"Software": None})
    return buffer.getvalue()


def _timeline_rows(result: AuditResult) -> tuple[TimelineRow, ...]:
    # the attempt each period's verdict rests on (not a wasted retry after it)
    counted = {o.subject: o.index for o in result.reasoning.attempts if o.counted}
    rows = []
    for period in result.collected.periods[:MAX_TIMELINE_PERIODS]:
        chosen = counted.get(period.subject)
        shown = [a for a in period.attempts if a.spec.index == chosen] or period.attempts[-1:]
        for attempt in shown:
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
                spans = tuple((((r.started_ns or 0) - base) / 1e9,
                               max(((r.finished_ns or 0) - (r.started_ns or 0)) / 1e9, 0.05))
                              for r in records)
                colours = tuple(ERROR_COLOUR if r.error_type
                                else PHASE_COLOURS.get(r.phase, "#777777") for r in records)
                rows.append(TimelineRow(label, spans, colours))
                first = False
    return tuple(rows)


def _draw_timeline(rows: tuple[TimelineRow, ...], periods: int, figure_type: Any,
                   canvas_type: Any, patch_type: Any) -> bytes:
    height = min(max(2.0, 0.2 * len(rows) + 1.0), 40)
    figure = figure_type(figsize=(10, height))
    axis = figure.add_subplot()
    for y, row in enumerate(rows):
        axis.broken_barh(list(row.spans), (y - 0.4, 0.8), facecolors=list(row.colours))
    axis.set_yticks(range(len(rows)))
    axis.set_yticklabels([row.label for row in rows], fontsize=5)
    axis.set_ylim(len(rows) - 0.5, -0.5)
    axis.set_xlabel("seconds since invocation start")
    shown = (f"; the first {MAX_TIMELINE_PERIODS} of {periods:,} periods (every phase is in "
             "phases.parquet)" if periods > MAX_TIMELINE_PERIODS else "")
    axis.set_title(f"Allocator phases per rank, by job / period / GPUs (red: raised){shown}",
                   **({"fontsize": 8} if shown else {}))
    handles = [patch_type(color=c, label=p) for p, c in PHASE_COLOURS.items()]
    handles.append(patch_type(color=ERROR_COLOUR, label="error"))
    # beside the bars, not over them
    axis.legend(handles=handles, fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    # fixed margins: tight_layout would lay the text out twice, doubling the cost
    figure.subplots_adjust(left=0.14, right=0.84, top=1 - 0.5 / height, bottom=0.6 / height)
    return _png(figure, canvas_type)


def _peak_points(result: AuditResult) -> tuple[
        tuple[tuple[str, tuple[tuple[int, str], ...]], ...], tuple[int, ...]]:
    reasoning = result.reasoning
    verdict_of = {v.subject: v.verdict.value for v in reasoning.verdicts}
    by_config: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for facts in reasoning.facts:
        if facts.raw_peak_mib is not None and facts.workload is not None:
            by_config[f"{facts.workload}@{facts.gpus}"].append(
                (facts.raw_peak_mib, verdict_of.get(facts.subject, "unresolved")))
    if not by_config:
        return (), ()
    capacities = sorted({d.memory_total_mib for p in result.collected.periods
                         for a in p.attempts for d in a.read.devices if d.memory_total_mib})
    keys = sorted(by_config, key=lambda k: (k.rsplit("@", 1)[1].zfill(6), k))
    return tuple((key, tuple(by_config[key])) for key in keys), tuple(capacities)


def _draw_peaks(peaks: tuple[tuple[str, tuple[tuple[int, str], ...]], ...],
                capacities: tuple[int, ...], figure_type: Any, canvas_type: Any) -> bytes:
    figure = figure_type(figsize=(8, 4))
    axis = figure.add_subplot()
    seen: set[str] = set()
    for x, (_, points) in enumerate(peaks):
        for verdict, colour in VERDICT_COLOURS.items():
            values = [peak for peak, kind in points if kind == verdict]
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
    axis.set_xlim(-0.5, len(peaks) - 0.5)
    axis.legend(fontsize=7, loc="lower left")
    axis.set_xticks(range(len(peaks)))
    axis.set_xticklabels([key for key, _ in peaks], rotation=30, ha="right", fontsize=7)
    axis.set_ylabel("raw peak MiB")
    axis.set_title("Peak GPU memory per configuration")
    figure.subplots_adjust(left=0.12, right=0.97, top=0.9, bottom=0.28)
    return _png(figure, canvas_type)
