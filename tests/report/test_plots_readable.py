"""Plots a reviewer keeps (issue 20 item 5): every text at least 9 points at the saved
resolution, each period marked in its verdict's colour, a retried period's every attempt
drawn, the legends beside the data, never over it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from auditor import run_audit
from auditor._cli import main
from tests.helpers import EXAMPLE

matplotlib = pytest.importorskip("matplotlib")


def _drawn(monkeypatch: pytest.MonkeyPatch, root: Path) -> tuple[list[Any], Any]:
    """The figures the plots of ``root``'s audit are drawn on, and the plot data."""
    import matplotlib.figure

    import auditor.report.plots as plots

    figures: list[Any] = []

    class Recording(matplotlib.figure.Figure):
        def savefig(self, *args: Any, **kwargs: Any) -> None:
            figures.append((self, kwargs.get("dpi")))
            super().savefig(*args, **kwargs)

    monkeypatch.setattr(matplotlib.figure, "Figure", Recording)
    data = plots.plot_data(run_audit(root))
    plots.draw_plots(data)
    return figures, data


@pytest.fixture(scope="module")
def mixed_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("plots") / "mixed"
    assert main(["example", str(root), "--kind", "mixed"]) == 0
    return root


@pytest.mark.parametrize("which", ["example", "mixed"])
def test_every_text_is_at_least_9_points(monkeypatch: pytest.MonkeyPatch, mixed_root: Path,
                                         which: str) -> None:
    import matplotlib.text

    figures, _ = _drawn(monkeypatch, EXAMPLE if which == "example" else mixed_root)
    assert len(figures) == 2
    for figure, dpi in figures:
        assert dpi is not None and dpi >= 100
        texts = [t for t in figure.findobj(matplotlib.text.Text)
                 if t.get_visible() and t.get_text().strip()]
        assert texts
        small = [(t.get_text(), t.get_fontsize()) for t in texts if t.get_fontsize() < 9]
        assert not small


@pytest.mark.parametrize("which", ["example", "mixed"])
def test_legends_stand_beside_the_data(monkeypatch: pytest.MonkeyPatch, mixed_root: Path,
                                       which: str) -> None:
    figures, _ = _drawn(monkeypatch, EXAMPLE if which == "example" else mixed_root)
    for figure, _ in figures:
        renderer = figure.canvas.get_renderer()
        for axis in figure.axes:
            frame = axis.get_window_extent(renderer)
            legends = [child for child in axis.get_children()
                       if isinstance(child, matplotlib.legend.Legend)]
            assert legends
            for legend in legends:
                assert legend.get_window_extent(renderer).x0 >= frame.x1


def test_each_period_is_marked_in_its_verdicts_colour(monkeypatch: pytest.MonkeyPatch) -> None:
    """The example's 4-GPU periods are unresolved, its 2-GPU ones failed: each label (one
    per attempt) is in its verdict's colour, and the legend names the verdicts."""
    from matplotlib.colors import to_hex

    from auditor.report.plots import VERDICT_COLOURS

    figures, _ = _drawn(monkeypatch, EXAMPLE)
    timeline = figures[0][0].axes[0]
    labels = [t for t in timeline.get_yticklabels() if t.get_text()]
    assert len(labels) == 18
    for label in labels:
        verdict = "unresolved" if "(4 GPUs)" in label.get_text() else "failed"
        assert to_hex(label.get_color()) == VERDICT_COLOURS[verdict], label.get_text()
    names = {t.get_text() for legend in timeline.get_children()
             if isinstance(legend, matplotlib.legend.Legend) for t in legend.get_texts()}
    assert {"period failed", "period unresolved"} <= names


def test_a_retried_periods_every_attempt_is_drawn(monkeypatch: pytest.MonkeyPatch,
                                                  mixed_root: Path) -> None:
    figures, data = _drawn(monkeypatch, mixed_root)
    faded = [row for row in data.timeline if not row.counted]
    assert len(faded) == 4  # (the wasted retry's four ranks)
    labels = [t.get_text() for t in figures[0][0].axes[0].get_yticklabels()]
    assert any("attempt 2, not counted" in label for label in labels)
    assert any("attempt 1" in label and "not counted" not in label for label in labels)
    peaks = [kind for _, points in data.peaks for _, kind in points]
    assert peaks.count("attempt not counted") == 1


def test_the_peak_plot_draws_every_point_in_its_verdicts_colour_as_few_collections(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A collection per configuration (and one legend marker per verdict), not one per
    point: drawn a point at a time, a million files' 111,112 peaks took over half an hour.
    Every point is still there, in its place's order, filled in its verdict's colour and
    hollow for an attempt not counted."""
    import matplotlib.figure
    from matplotlib.colors import to_hex

    import auditor.report.plots as plots

    figures: list[Any] = []

    class Recording(matplotlib.figure.Figure):
        def savefig(self, *args: Any, **kwargs: Any) -> None:
            figures.append(self)
            super().savefig(*args, **kwargs)

    monkeypatch.setattr(matplotlib.figure, "Figure", Recording)
    kinds = ["resolved", "failed", "unresolved", "attempt not counted"]
    peaks = tuple((f"w{c}@{c + 1}", tuple((30_000 + (i * 37) % 9000, kinds[(i + c) % 4])
                                          for i in range(3000))) for c in range(3))
    drawn = plots.draw_plots(plots.PlotData((), peaks, (40_960,)))
    assert [name for name, _ in drawn] == ["plots/peak_memory.png"]
    axis = figures[0].axes[0]
    collections = [c for c in axis.collections if len(c.get_offsets())]
    assert len(axis.collections) <= len(peaks) + len(kinds)
    colours = {**plots.VERDICT_COLOURS, "attempt not counted": "#777777"}
    assert len(collections) == len(peaks)
    for x, ((_, points), collection) in enumerate(zip(peaks, collections, strict=True)):
        offsets = collection.get_offsets()
        assert [int(y) for _, y in offsets] == [peak for peak, _ in points]
        assert all(abs(px - x) < 0.5 for px, _ in offsets)
        faces, edges = collection.get_facecolors(), collection.get_edgecolors()
        for (_, kind), face, edge in zip(points, faces, edges, strict=True):
            assert to_hex(edge) == colours[kind]
            assert (face[3] == 0) if kind == "attempt not counted" \
                else to_hex(face) == colours[kind]
    names = {t.get_text() for legend in axis.get_children()
             if isinstance(legend, matplotlib.legend.Legend) for t in legend.get_texts()}
    assert names == set(kinds)
