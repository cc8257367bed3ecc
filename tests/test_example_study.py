"""The bundled example study (seed ``002`` shape): every fact of the seed must come out."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pandas as pd
import pytest

from auditor._cli import main
from auditor.schema import load_schema
from tests.helpers import EXAMPLE, audit, copy_example, snapshot, verdicts
from tests.test_fixtures_generate import SEED_TABLE as GENERATOR_SEED_TABLE

# seed 002's table, written once (in the generator's tests) and read here too
SEED_TABLE = [(index, *row[:7]) for index, row in sorted(GENERATOR_SEED_TABLE.items())]
SEED_PIDS = {row[2]: ",".join(map(str, row[7])) for row in GENERATOR_SEED_TABLE.values()}


@pytest.fixture(scope="module")
def example_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("example") / "out"
    assert main(["audit", str(EXAMPLE), "--out", str(out), "--quiet"]) == 0
    return out


@pytest.fixture(scope="module")
def summary(example_out: Path) -> dict:
    return orjson.loads((example_out / "summary.json").read_bytes())


def test_reconstruction_matches_the_seed(summary: dict) -> None:
    assert summary["launches"] == 18
    assert summary["verdicts"] == {"resolved": 0, "failed": 9, "unresolved": 9}
    by_period = verdicts(summary)
    four_gpu = [p for p in summary["periods"] if p["gpus"] == 4]
    two_gpu = [p for p in summary["periods"] if p["gpus"] == 2]
    assert len(four_gpu) == len(two_gpu) == 9
    assert {(p["verdict"], p["reason"]) for p in four_gpu} == {
        ("unresolved", "terminal_event_missing")}
    assert {p["verdict"] for p in two_gpu} == {"failed"}
    for index, workload, seed, job, period, *_ in SEED_TABLE:
        subject = f"host-qwen25-7b-{workload}-c2-s{seed}/period-{period}"
        assert by_period[subject] == ("unresolved", "terminal_event_missing"), index
        match = next(p for p in four_gpu if p["pair"].endswith(f"-{workload}-c2-s{seed}"))
        assert match["job_id"] == job


def test_configurations_and_gate(summary: dict) -> None:
    assert summary["configurations_total"] == 6
    assert summary["configurations_resolved"] == 3
    resolved = {f"{c['workload']}@{c['gpus']}": c["outcome"]
                for c in summary["configurations"] if c["status"] == "resolved"}
    assert resolved == {"gsm8k@2": "failed", "math@2": "failed", "code_heavy_tail@2": "failed"}
    assert summary["gate"]["passed"] is False
    assert summary["gate_allow_partial"]["passed"] is True
    assert sorted(summary["gate_allow_partial"]["included_configurations"]) == [
        "code_heavy_tail@2", "gsm8k@2", "math@2"]


def test_accounting_matches_the_seed(summary: dict) -> None:
    accounting = summary["accounting"]
    assert accounting["allocation_gpu_seconds"] == 20828
    assert accounting["allocation_gpu_hours"] == pytest.approx(5.785555556, abs=1e-9)
    assert accounting["task_gpu_seconds"] == pytest.approx(17605.783111, abs=1e-6)
    assert accounting["reservation_gpu_seconds"] == pytest.approx(20199.935106, abs=1e-6)
    assert accounting["wasted_gpu_seconds"] == 0


def test_integrity_all_verified(summary: dict) -> None:
    integrity = summary["integrity"]
    # the contract's seed summary: 144 listed evidence files and the 18 period records
    assert integrity["files_listed"] == integrity["verified"] == 162
    assert integrity["mismatched"] == integrity["missing"] == integrity["unsafe_paths"] == 0


def test_summary_validates_against_its_schema(summary: dict) -> None:
    jsonschema.Draft202012Validator(load_schema("summary")).validate(summary)


def test_diagnostic_carries_every_seed_fact(example_out: Path) -> None:
    text = (example_out / "diagnostic.md").read_text()
    assert "All nine array elements of `5055845` ended `FAILED 2:0`" in text
    assert "no scheduler `OUT_OF_MEMORY` state" in text
    assert "**19:27:18 UTC**" in text
    assert ("**18 launches; 9 eligible 2-GPU rollout-initialization memory failures; "
            "9 unresolved 4-GPU periods; zero eligible completions.**") in text
    assert "Three of six configurations resolve, all 2-GPU failures" in text
    assert "20,828 GPU-seconds = 5.785555556 GPU-hours" in text
    assert "17,605.783111" in text and "20,199.935106" in text
    assert "must not be added" in text
    for index, _workload, _seed, job, period, update, sync, peak in SEED_TABLE:
        row = next(line for line in text.splitlines()
                   if line.startswith(f"| {index} |") and f"{job} / {period}" in line)
        assert update in row and sync in row and f"| {peak} |" in row
        assert f"{job} / {period}: {SEED_PIDS[job]}" in text
    # the diagnosis: what the evidence shows, and its limits, stated once for the nine
    assert "Nine 4-GPU unresolved periods: `terminal_event_missing`" in text
    assert "all 4 ranks recorded `actor_update` followed by a separate post-update " \
           "`weight_sync` at step 1" in text
    assert "not independent proof that optimizer parameters changed" in text
    assert "`TOTAL_TRAINING_STEPS=1`" in text
    assert "`infrastructure_invalid`" in text
    assert "120e29a146294722a6668f55a1e7fed2878eb62a" in text
    assert ("54 allocator traces against the period's workers, the device file name and "
            "content: all agree") in text
    assert "post-period idle checks: 18 of 18 passed" in text


def test_tables_have_documented_dtypes(example_out: Path) -> None:
    periods = pd.read_parquet(example_out / "periods.parquet")
    assert len(periods) == 18
    assert str(periods["actor_update_finished"].dtype) == "datetime64[ns, UTC]"
    last = periods.loc[periods["job_id"] == "5055845"].sort_values("gpus").iloc[-1]
    assert last["post_update_sync_finished"] == pd.Timestamp(
        "2026-09-15 19:27:04.665561977", tz="UTC")
    phases = pd.read_parquet(example_out / "phases.parquet")
    assert {"actor_update", "weight_sync", "rollout_init"} <= set(phases["phase"])
    assert str(phases["started"].dtype) == "datetime64[ns, UTC]"
    evidence = pd.read_parquet(example_out / "evidence.parquet")
    assert set(evidence["status"]) == {"verified"}
    attempts = pd.read_parquet(example_out / "attempts.parquet")
    assert len(attempts) == 18 and attempts["counted"].all()
    findings = pd.read_parquet(example_out / "findings.parquet")
    assert (findings["rule_id"] == "AUD201").sum() == 9


def test_outputs_are_deterministic_and_evidence_untouched(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    before = snapshot(root)
    audit(root, tmp_path / "a")
    audit(root, tmp_path / "b", "--jobs", "2")
    assert snapshot(root) == before
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert "output_manifest.json" in names
    for name in names:
        if name == "output_manifest.json":
            continue
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_plots_are_written_and_linked(example_out: Path) -> None:
    pytest.importorskip("matplotlib")
    text = (example_out / "diagnostic.md").read_text()
    for name in ("plots/phase_timeline.png", "plots/peak_memory.png"):
        assert (example_out / name).read_bytes().startswith(b"\x89PNG")
        assert f"]({name})" in text


@pytest.mark.slow
def test_plots_are_drawn_in_a_helper_beside_the_audit(example_out: Path) -> None:
    """The command draws its plots in a helper process started before the audit (it
    imports matplotlib meanwhile), never in its own; the plots are those drawn here."""
    pytest.importorskip("matplotlib")
    from auditor.pipeline.audit import run_audit
    from auditor.report.plots import render_plots

    out = example_out.parent / "helper-drawn"
    code = ("import sys; from auditor._cli import main; "
            f"code = main(['audit', {str(EXAMPLE)!r}, '--out', {str(out)!r}, '--quiet']); "
            "print(code, 'matplotlib' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False, timeout=120)
    assert done.stdout.split() == ["0", "False"], done.stderr
    drawn_here = render_plots(run_audit(EXAMPLE))
    assert [name for name, _ in drawn_here] == ["plots/phase_timeline.png",
                                                "plots/peak_memory.png"]
    for name, png in drawn_here:
        assert (out / name).read_bytes() == png == (example_out / name).read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("lost", ["no helper", "helper died", "helper killed"])
def test_plots_are_drawn_here_when_the_helper_is_lost(tmp_path: Path, lost: str) -> None:
    """A plot helper that could not start, or died, changes nothing in the outputs."""
    pytest.importorskip("matplotlib")
    import multiprocessing
    from concurrent.futures import Future
    from concurrent.futures.process import BrokenProcessPool

    from auditor.pipeline.audit import run_audit
    from auditor.report.output import write_outputs
    from auditor.report.plots import PlotData, Plotter, render_plots

    class Lost(Plotter):
        def __init__(self) -> None:  # no helper started
            self._pool = None

        def draw(self, data: PlotData) -> Future[list[tuple[str, bytes]]] | None:
            if lost == "no helper":
                return None
            future: Future[list[tuple[str, bytes]]] = Future()
            future.set_exception(BrokenProcessPool("the helper died"))
            return future

    result = run_audit(EXAMPLE)
    if lost == "helper killed":
        before = set(multiprocessing.active_children())
        plotter: Plotter = Plotter()
        for child in set(multiprocessing.active_children()) - before:
            child.kill()
            child.join(30)
    else:
        plotter = Lost()
    try:
        write_outputs(result, tmp_path / "out", plotter=plotter)
    finally:
        plotter.close()
    for name, png in render_plots(result):
        assert (tmp_path / "out" / name).read_bytes() == png
    assert main(["verify", str(tmp_path / "out"), "--quiet"]) == 0


def test_json_flag_prints_summary(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", str(EXAMPLE), "--json"]) == 0
    printed = orjson.loads(capsys.readouterr().out)
    assert printed["verdicts"] == {"resolved": 0, "failed": 9, "unresolved": 9}


def test_terminal_summary_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"gate: FAIL\s+--allow-partial: PASS", out)
    assert "gsm8k@2" in out


def test_the_cyclic_collector_rests_during_an_audit_and_resumes_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Collections would re-scan every record yet free none (they hold no cycles)."""
    import gc

    from auditor import run_audit
    from auditor.reason.engine import PeriodJudge, StudyJudge

    seen: list[tuple[str, bool]] = []
    # (each period validated and judged, here: the study is read in this process; then
    # the study)
    for owner, name in ((PeriodJudge, "judge"), (StudyJudge, "finish")):
        original = getattr(owner, name)

        def spy(*args: object, _original: object = original, _name: str = name) -> object:
            seen.append((_name, gc.isenabled()))
            return _original(*args)  # type: ignore[operator]

        monkeypatch.setattr(owner, name, spy)
    before = gc.isenabled()
    result = run_audit(copy_example(tmp_path))
    assert result.verdicts and seen == [("judge", False)] * len(result.verdicts) + [
        ("finish", False)]
    assert gc.isenabled() == before


@pytest.mark.parametrize("jobs", [1, 2])
def test_progress_counts_every_file_read_and_its_bytes(tmp_path: Path, jobs: int) -> None:
    """The audit reports its reading as files of a known total, with the bytes hashed so
    far, the files no period lists included; the same whether it reads here or in
    workers."""
    from auditor.pipeline.audit import AuditOptions, Auditor, Progress, paused_gc

    root = copy_example(tmp_path)
    attempt = next(p for p in sorted(root.glob("host-*/attempt-*")) if p.is_dir())
    for n in range(3):
        (attempt / f"notes-{n}.txt").write_text("x" * (n + 1) * 1000)
    events: list[Progress] = []
    with paused_gc():
        generator = Auditor(root, AuditOptions(jobs=jobs)).run()
        while True:
            try:
                events.append(next(generator))
            except StopIteration as stop:
                result = stop.value
                break
    reads = [e for e in events if e.stage == "read"]
    read_rows = [row for row in result.collected.evidence if row.actual_size is not None]
    assert {e.total for e in reads} == {len(read_rows)}
    done = [e.done for e in reads]
    assert done[0] == 0 and done[-1] == len(read_rows) and done == sorted(done)
    hashed = [e.bytes for e in reads]
    assert hashed[0] == 0 and hashed == sorted(hashed)
    assert hashed[-1] == sum(row.actual_size or 0 for row in read_rows)
    assert sum(row.actual_size or 0 for row in read_rows if row.status == "unlisted") == 6000
    # before the reading: the walk, a top-level directory at a time, then the period records
    stages = [e.stage for e in events]
    assert stages == sorted(stages, key=["list", "periods", "read", "validate", "reason"].index)
    tops = sum(1 for p in root.iterdir() if p.is_dir() and p.name not in ("pairs", "accounting"))
    listing = [(e.done, e.total) for e in events if e.stage == "list"]
    assert listing[0] == (0, tops) and listing[-1] == (tops, tops) and listing == sorted(listing)
    assert len(listing) > tops  # (and after each attempt directory)
    periods = [(e.done, e.total) for e in events if e.stage == "periods"]
    assert periods == [(n, len(result.collected.periods))
                       for n in range(len(result.collected.periods) + 1)]
    assert [e for e in stages if e not in ("list", "periods", "read")] == ["validate", "reason"]


def test_progress_bar_at_a_terminal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At a terminal the command shows its progress on stderr (a bar naming what it
    counts), then takes it away; the report line follows on stdout."""
    import io

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    shown, printed = Terminal(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", shown)
    monkeypatch.setattr(sys, "stdout", printed)
    out = tmp_path / "out:thumbs_up:[bold]x[/bold]"  # (a path is shown as it is)
    assert main(["audit", str(EXAMPLE), "--out", str(out), "--no-plots"]) == 0
    assert "Traceback" not in shown.getvalue()
    assert f"report: {out / 'diagnostic.md'}\n" in printed.getvalue()
    # the files read, and their bytes (not the count of files shown as bytes)
    from rich.filesize import decimal

    sizes = pd.read_parquet(out / "evidence.parquet")["size"].dropna()
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown.getvalue())
    assert f"{len(sizes):,}/{len(sizes):,} files {decimal(int(sizes.sum()))}" in plain
    # stages that count nothing show no counts (not the last stage's)
    frames = [frame.strip() for frame in plain.replace("\n", "\r").split("\r")]
    later = [frame for frame in frames if frame.startswith(("validating", "reasoning",
                                                             "writing the outputs"))]
    assert later and not [frame for frame in later if "files" in frame]
    assert any(frame.startswith("listing the study") and "arm directories" in frame
               for frame in frames)


def test_progress_lines_in_a_batch_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Where stderr is not a terminal (a batch job's log), a long audit writes a line now
    and then on how far it has come; a short one, or a quiet one, writes nothing there."""
    import auditor._cli

    assert main(["audit", str(EXAMPLE), "--out", str(tmp_path / "a"), "--no-plots"]) == 0
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(auditor._cli, "PROGRESS_EVERY", 0.0)  # every event is long enough
    assert main(["audit", str(EXAMPLE), "--out", str(tmp_path / "b"), "--no-plots",
                 "--quiet"]) == 0
    assert capsys.readouterr().err == ""
    assert main(["audit", str(EXAMPLE), "--out", str(tmp_path / "c"), "--no-plots"]) == 0
    lines = capsys.readouterr().err.splitlines()
    files = int(pd.read_parquet(tmp_path / "c" / "evidence.parquet")["size"].notna().sum())
    reading = [line for line in lines if line.startswith("auditor: reading evidence: ")]
    assert reading[0].startswith(f"auditor: reading evidence: 0 of {files:,} files, 0.00 GB")
    assert reading[-1].startswith(f"auditor: reading evidence: {files:,} of {files:,} files")
    periods = len(list((EXAMPLE / "pairs").glob("*/period-*.json")))
    assert [line.split(" (")[0] for line in lines if not line.startswith(
        ("auditor: listing the study: ", "auditor: reading evidence: "))] == [
        *(f"auditor: reading period records: {n} of {periods} records"
          for n in range(periods + 1)),
        "auditor: validating", "auditor: reasoning", "auditor: writing the outputs"]
    assert lines[0].startswith("auditor: listing the study: 0 of ")
    assert all(re.search(r" \(\d+ s\)$", line) for line in lines)


def test_the_timeline_says_when_it_shows_only_the_first_periods(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A study of thousands of periods gets a timeline of the first few: its title says so
    (and where every phase is), rather than passing them off as the study."""
    pytest.importorskip("matplotlib")
    import matplotlib.figure

    import auditor.report.plots as plots
    from auditor.pipeline.audit import run_audit

    titles: list[str] = []
    sizes: list[float | str] = []

    class Recording(matplotlib.figure.Figure):
        def savefig(self, *args: Any, **kwargs: Any) -> None:
            titles.extend(axis.get_title() for axis in self.axes)
            sizes.extend(axis.title.get_fontsize() for axis in self.axes)
            super().savefig(*args, **kwargs)

    monkeypatch.setattr(matplotlib.figure, "Figure", Recording)
    result = run_audit(EXAMPLE)
    periods = len(result.collected.periods)
    plots.draw_plots(plots.plot_data(result))
    assert titles and not any("periods" in title for title in titles)  # (every one shown)
    default = matplotlib.figure.Figure().add_subplot().title.get_fontsize()
    assert set(sizes) == {default}  # (a title that says nothing more keeps its size)
    titles.clear()
    monkeypatch.setattr(plots, "MAX_TIMELINE_PERIODS", 2)
    plots.draw_plots(plots.plot_data(result))
    assert any(f"the first 2 of {periods} periods (every phase is in phases.parquet)" in title
               for title in titles)
