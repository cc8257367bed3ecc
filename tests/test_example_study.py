"""The bundled example study (seed ``002`` shape): every fact of the seed must come out."""

from __future__ import annotations

import re
from pathlib import Path

import jsonschema
import orjson
import pandas as pd
import pytest

from auditor._cli import main
from auditor.schema import load_schema
from tests.helpers import EXAMPLE, audit, copy_example, snapshot, verdicts

SEED_TABLE = [  # index, workload, seed, job, period, update finished, sync finished, peak
    (0, "code_heavy_tail", 161, "5055846", 1, "19:01:31.699704267", "19:02:18.386028932", 39842),
    (1, "gsm8k", 163, "5055847", 2, "19:05:57.381348829", "19:08:02.327763208", 38560),
    (2, "code_heavy_tail", 162, "5055848", 2, "19:04:48.459750884", "19:05:59.536233566", 39392),
    (3, "gsm8k", 162, "5055858", 1, "19:09:58.895325061", "19:10:32.865654877", 38560),
    (4, "math", 162, "5055859", 2, "19:14:44.017014711", "19:15:55.046759828", 39086),
    (5, "code_heavy_tail", 163, "5055860", 2, "19:16:12.444318056", "19:17:22.263802288", 39648),
    (6, "math", 163, "5055863", 1, "19:19:05.722544967", "19:20:47.573877478", 39086),
    (7, "math", 161, "5055864", 1, "19:21:44.142735712", "19:22:20.560774115", 39086),
    (8, "gsm8k", 161, "5055845", 2, "19:25:33.619484057", "19:27:04.665561977", 38560),
]
SEED_PIDS = {
    "5055846": "758712,758713,758714,758715",
    "5055847": "3563810,3563811,3563812,3563813",
    "5055848": "3495668,3495669,3495670,3495671",
    "5055858": "802123,802124,802125,802126",
    "5055859": "3539673,3539674,3539675,3539676",
    "5055860": "3613579,3613580,3613582,3613583",
    "5055863": "843954,843955,843956,843957",
    "5055864": "3571156,3571157,3571158,3571159",
    "5055845": "3657525,3657526,3657527,3657528",
}


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
    assert integrity["files_listed"] == integrity["verified"] > 0
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
    assert "TOTAL\\_TRAINING\\_STEPS=1" in text
    assert "`infrastructure_invalid`" in text
    assert "The post-period idle check passed." in text
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


def test_json_flag_prints_summary(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", str(EXAMPLE), "--json"]) == 0
    printed = orjson.loads(capsys.readouterr().out)
    assert printed["verdicts"] == {"resolved": 0, "failed": 9, "unresolved": 9}


def test_terminal_summary_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"gate: FAIL\s+--allow-partial: PASS", out)
    assert "gsm8k@2" in out
