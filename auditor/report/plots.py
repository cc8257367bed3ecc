"""PNG plots (optional: needs the ``plots`` extra, matplotlib).

- ``plots/phase_timeline.png``: for each attempt of each period (the first
  :data:`MAX_TIMELINE_PERIODS` periods, as its title says when there are more), one row
  per rank, one bar per allocator phase record, a record that raised in black; the
  period's verdict marks its rows (a coloured strip and label), a retried attempt the
  verdict does not rest on is drawn faded;
- ``plots/peak_memory.png``: each period's raw peak MiB by configuration, coloured by
  verdict (a retried attempt's own peak hollow), against the GPU memory capacity the
  device evidence reports.

Text is at least :data:`FONT` points at :data:`DPI` (readable at 100% zoom), and the
legends stand beside the data, never over it.

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

from auditor._signals import helper_args, helper_context, helper_signals, signals_deferred
from auditor.model.results import TIMELINE_PERIODS

if TYPE_CHECKING:  # (not imported at run time: a Plotter starts before the audit's modules)
    from auditor.model import AuditResult

MAX_TIMELINE_PERIODS = TIMELINE_PERIODS
"""The periods the timeline draws (the model's: the audit keeps them whole)."""
DPI = 100
"""Pixels per inch of the saved PNGs: a point is 1.4 pixels, so 9-point text is 12.5
pixels high at 100% zoom."""
FONT = 9
"""The smallest text in a plot, in points (tick labels, legends, notes)."""
ERROR_COLOUR = "#111111"
VERDICT_COLOURS = {"resolved": "#1b7837", "failed": "#d62728", "unresolved": "#8856a7"}
PHASE_COLOURS = {
    "init_model": "#4c72b0", "rollout_init": "#64b5cd", "weight_sync": "#55a868",
    "rollout_generate": "#ccb974", "actor_update": "#dd8452", "idle": "#bbbbbb",
}


@dataclass(frozen=True, slots=True)
class TimelineRow:
    """One rank's row of the phase timeline: its label and its bars."""

    label: str
    """The attempt's label on its first row (``""`` on the others)."""
    spans: tuple[tuple[float, float], ...]
    """(start, width) in seconds since the invocation started."""
    colours: tuple[str, ...]
    verdict: str = "unresolved"
    """The period's verdict (its rows are marked in its colour)."""
    counted: bool = True
    """False for an attempt the verdict does not rest on (a retried one: drawn faded)."""
    attempt: int = 0
    """Which attempt of the timeline the row belongs to (rows of one attempt share it)."""


@dataclass(frozen=True, slots=True)
class PlotData:
    """What the plots show, taken out of a result: small, and picklable to a helper."""

    timeline: tuple[TimelineRow, ...]
    peaks: tuple[tuple[str, tuple[tuple[int, str], ...]], ...]
    """(configuration, its periods' (raw peak MiB, verdict)), in the plot's order; an
    attempt the verdict does not rest on has the verdict ``attempt not counted``."""
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
    figure.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    return buffer.getvalue()


def _timeline_rows(result: AuditResult) -> tuple[TimelineRow, ...]:
    """Every attempt of the first periods (a retried period's each), one row per rank."""
    counted = {o.subject: o.index for o in result.reasoning.attempts if o.counted}
    verdicts = {v.subject: v.verdict.value for v in result.reasoning.verdicts}
    reasons = {v.subject: str(v.reason) if v.verdict.value == "unresolved" else ""
               for v in result.reasoning.verdicts}
    rows = []
    group = 0
    for period in result.collected.timeline[:MAX_TIMELINE_PERIODS]:
        chosen = counted.get(period.subject)
        if chosen is None and period.attempts:
            chosen = period.attempts[-1].spec.index
        verdict = verdicts.get(period.subject, "unresolved")
        for attempt in period.attempts:
            trial = attempt.read.trial
            origin = trial.started_ns if trial and trial.started_ns else None
            first = True
            is_counted = attempt.spec.index == chosen
            for trace in sorted(attempt.read.traces, key=lambda t: t.path):
                records = [r for r in trace.phases if r.started_ns and r.finished_ns]
                if not records:
                    continue
                base = origin if origin is not None else min(r.started_ns or 0 for r in records)
                retry = (f"attempt {attempt.spec.index + 1}"
                         + ("" if is_counted else ", not counted")
                         if len(period.attempts) > 1 else "")
                second = ", ".join(part for part in (
                    retry, reasons.get(period.subject, "") if is_counted else "") if part)
                # one short label per attempt (glyph rendering dominates the cost)
                label = (f"{attempt.spec.job_id or period.record.pair} / {period.record.period}"
                         f" ({period.record.gpus} GPUs)" + (f"\n{second}" if second else "")
                         if first else "")
                spans = tuple((((r.started_ns or 0) - base) / 1e9,
                               max(((r.finished_ns or 0) - (r.started_ns or 0)) / 1e9, 0.05))
                              for r in records)
                colours = tuple(ERROR_COLOUR if r.error_type
                                else PHASE_COLOURS.get(r.phase, "#777777") for r in records)
                rows.append(TimelineRow(label, spans, colours, verdict, is_counted, group))
                first = False
            group += 1
    return tuple(rows)


def _draw_timeline(rows: tuple[TimelineRow, ...], periods: int, figure_type: Any,
                   canvas_type: Any, patch_type: Any) -> bytes:
    from matplotlib.patches import Rectangle

    height = min(max(3.0, 0.22 * len(rows) + 1.6), 40)
    figure = figure_type(figsize=(12, height))
    axis = figure.add_subplot()
    for y, row in enumerate(rows):
        axis.broken_barh(list(row.spans), (y - 0.4, 0.8), facecolors=list(row.colours),
                         alpha=1.0 if row.counted else 0.35)
    starts = [y for y, row in enumerate(rows) if y == 0 or rows[y - 1].attempt != row.attempt]
    ends = starts[1:] + [len(rows)]
    for start, end in zip(starts, ends, strict=True):
        row = rows[start]
        # the period's verdict: a strip left of the bars, in its colour
        axis.add_patch(Rectangle((-0.014, 1 - end / len(rows)), 0.009,
                                 (end - start) / len(rows), transform=axis.transAxes,
                                 clip_on=False,
                                 color=VERDICT_COLOURS.get(row.verdict, "#777777"),
                                 alpha=1.0 if row.counted else 0.35))
        if start:
            axis.axhline(start - 0.5, color="#dddddd", linewidth=0.8)
    axis.set_yticks([(s + e - 1) / 2 for s, e in zip(starts, ends, strict=True)])
    labels = axis.set_yticklabels([rows[s].label for s in starts], fontsize=FONT)
    for label, start in zip(labels, starts, strict=True):
        label.set_color(VERDICT_COLOURS.get(rows[start].verdict, "#333333"))
    axis.tick_params(axis="y", length=0, pad=10)
    axis.tick_params(axis="x", labelsize=FONT)
    axis.set_ylim(len(rows) - 0.5, -0.5)
    axis.set_xlabel("seconds since invocation start", fontsize=FONT + 1)
    shown = (f"; the first {MAX_TIMELINE_PERIODS} of {periods:,} periods (every phase is in "
             "phases.parquet)" if periods > MAX_TIMELINE_PERIODS else "")
    axis.set_title("Allocator phases per rank, by actual job / period, coloured by verdict"
                   f"{shown}", **({"fontsize": FONT} if shown else {}))
    phases = [patch_type(color=c, label=p) for p, c in PHASE_COLOURS.items()]
    phases.append(patch_type(color=ERROR_COLOUR, label="raised an error"))
    verdicts = [patch_type(color=c, label=f"period {v}") for v, c in VERDICT_COLOURS.items()]
    if any(not row.counted for row in rows):
        verdicts.append(patch_type(color="#777777", alpha=0.35, label="attempt not counted"))
    # beside the bars, never over them
    first = axis.legend(handles=phases, fontsize=FONT, title="phase", title_fontsize=FONT,
                        loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    axis.add_artist(first)
    axis.legend(handles=verdicts, fontsize=FONT, title="verdict", title_fontsize=FONT,
                loc="lower left", bbox_to_anchor=(1.01, 0.0), borderaxespad=0)
    # fixed margins: tight_layout would lay the text out twice, doubling the cost
    figure.subplots_adjust(left=0.17, right=0.83, top=1 - 0.45 / height,
                           bottom=0.55 / height)
    return _png(figure, canvas_type)


def _peak_points(result: AuditResult) -> tuple[
        tuple[tuple[str, tuple[tuple[int, str], ...]], ...], tuple[int, ...]]:
    """Each period's raw peak by configuration, with its verdict; an attempt its verdict
    does not rest on (a retried one) with its own peak, as ``attempt not counted``."""
    reasoning = result.reasoning
    verdict_of = {v.subject: v.verdict.value for v in reasoning.verdicts}
    by_config: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for facts in reasoning.facts:
        if facts.raw_peak_mib is not None and facts.workload is not None:
            by_config[f"{facts.workload}@{facts.gpus}"].append(
                (facts.raw_peak_mib, verdict_of.get(facts.subject, "unresolved")))
    counted = {(o.subject, o.index) for o in reasoning.attempts if o.counted}
    for period in result.collected.periods:
        record = period.record
        if len(period.attempts) < 2 or record.workload is None:
            continue
        for attempt in period.attempts:
            trial = attempt.trial
            if (period.subject, attempt.spec.index) not in counted and trial is not None \
                    and trial.peak_mib is not None:
                by_config[f"{record.workload}@{record.gpus}"].append(
                    (trial.peak_mib, "attempt not counted"))
    if not by_config:
        return (), ()
    from auditor.report.tables import device_values  # (pyarrow: not before the audit)

    capacities = sorted(value for value in device_values(result, "memory_total_mib")
                        if value)
    keys = sorted(by_config, key=lambda k: (k.rsplit("@", 1)[1].zfill(6), k))
    return tuple((key, tuple(by_config[key])) for key in keys), tuple(capacities)


def _face(kind: str, kinds: dict[str, str]) -> str:
    """A peak marker's fill: hollow for an attempt the verdict does not rest on."""
    return "none" if kind == "attempt not counted" else kinds.get(kind, "#777777")


def _draw_peaks(peaks: tuple[tuple[str, tuple[tuple[int, str], ...]], ...],
                capacities: tuple[int, ...], figure_type: Any, canvas_type: Any) -> bytes:
    figure = figure_type(figsize=(10, 4.2))
    axis = figure.add_subplot()
    kinds = {**VERDICT_COLOURS, "attempt not counted": "#777777"}
    seen: dict[str, None] = {}
    for x, (_, points) in enumerate(peaks):
        # one collection a configuration, its points in order (a collection a point took
        # over half an hour at a million files); spread sideways: equal peaks stay apart
        spread = min(0.12, 0.6 / max(len(points), 1))
        middle = (len(points) - 1) / 2
        axis.scatter([x + (index - middle) * spread for index in range(len(points))],
                     [peak for peak, _ in points], s=45, zorder=3,
                     facecolors=[_face(kind, kinds) for _, kind in points],
                     edgecolors=[kinds.get(kind, "#777777") for _, kind in points],
                     linewidths=1.5)
        seen.update((kind, None) for _, kind in points)
    for kind in seen:  # (the legend's markers: drawn nowhere else)
        axis.scatter([], [], s=45, zorder=3, facecolors=_face(kind, kinds),
                     edgecolors=kinds.get(kind, "#777777"), linewidths=1.5, label=kind)
    for capacity in capacities:
        axis.axhline(capacity, color="#444444", linestyle="--", linewidth=1)
        axis.text(-0.45, capacity, f"GPU capacity {capacity:,} MiB", fontsize=FONT,
                  color="#444444", ha="left", va="bottom")
    if capacities:
        low, _ = axis.get_ylim()
        axis.set_ylim(low, max(capacities) * 1.015)
    axis.set_xlim(-0.5, len(peaks) - 0.5)
    handles, labels = axis.get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda i: list(kinds).index(labels[i])
                   if labels[i] in kinds else len(kinds))
    axis.legend([handles[i] for i in order], [labels[i] for i in order], fontsize=FONT,
                title="verdict", title_fontsize=FONT, loc="upper left",
                bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    axis.set_xticks(range(len(peaks)))
    axis.set_xticklabels([key for key, _ in peaks], rotation=20, ha="right", fontsize=FONT)
    axis.tick_params(axis="y", labelsize=FONT)
    axis.set_ylabel("raw peak MiB", fontsize=FONT + 1)
    axis.set_title("Raw peak GPU memory per period, by configuration")
    figure.subplots_adjust(left=0.09, right=0.8, top=0.9, bottom=0.2)
    return _png(figure, canvas_type)
