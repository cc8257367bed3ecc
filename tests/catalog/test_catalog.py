"""``auditor catalog`` and ``auditor query`` on three generated studies with fixed answers.

alpha, beta and gamma (see :func:`tests.catalog.studies.three_studies`): 42 attempts, 10
failures, eight of them on one node (``BAD_NODE``, 9 attempts) across all three studies;
gamma's periods table is of an older layout (no ``last_step``).
"""

from __future__ import annotations

import csv
import hashlib
import io
import shutil
from fractions import Fraction
from math import comb
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest

from auditor._cli import main
from auditor.catalog.query import ALPHA
from tests.catalog.studies import BAD_NODE, FAILING, audited, hardware_study, three_studies

TABLES = ("periods", "attempts", "findings", "evidence", "phases", "devices", "studies")


@pytest.fixture(scope="module")
def outs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return three_studies(tmp_path_factory.mktemp("studies"))


@pytest.fixture
def cat(outs: list[Path], tmp_path: Path) -> Path:
    catalogue = tmp_path / "cat"
    assert main(["catalog", *map(str, outs), "--into", str(catalogue)]) == 0
    return catalogue


def query(cat: Path, sql: str, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    capsys.readouterr()
    assert main(["query", str(cat), sql, "--json"]) == 0
    rows: list[dict[str, Any]] = orjson.loads(capsys.readouterr().out)
    return rows


def tree(folder: Path) -> dict[str, str]:
    """Every file below ``folder`` with its SHA-256 (what 'nothing written' compares)."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def exact_tail(failures: int, attempts: int, p0: Fraction) -> float:
    """P(X >= failures), X ~ Binomial(attempts, p0), in exact rational arithmetic."""
    return float(sum(comb(attempts, i) * p0 ** i * (1 - p0) ** (attempts - i)
                     for i in range(failures, attempts + 1)))


def test_the_audits_become_hive_partitions_with_a_schema_version(
        cat: Path, outs: list[Path]) -> None:
    for table in TABLES:
        assert sorted(p.name for p in (cat / table).iterdir()) == \
            ["study=alpha", "study=beta", "study=gamma"]
        for study in ("alpha", "beta", "gamma"):
            part = pq.read_table(cat / table / f"study={study}" / "part-0.parquet")
            assert "schema_version" in part.column_names and "study" not in part.column_names
    catalog = orjson.loads((cat / "catalog.json").read_bytes())
    entries = {entry["name"]: entry for entry in catalog["studies"]}
    assert sorted(entries) == ["alpha", "beta", "gamma"]
    for out in outs:
        entry = entries[out.name.removesuffix("-out")]
        assert entry["source"] == str(out)
        assert entry["summary_sha256"] == hashlib.sha256(
            (out / "summary.json").read_bytes()).hexdigest()
        assert entry["added_utc"].endswith("Z")
    assert entries["gamma"]["tables"]["periods"] == {
        "rows": 10, "schema_version": 0, "missing_columns": ["last_step"]}
    assert entries["alpha"]["tables"]["periods"]["schema_version"] == 1


def test_queries_read_the_older_layout_beside_the_current_one(
        cat: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = query(cat, "SELECT study, min(schema_version) AS v, count(*) AS n, "
                 "count(last_step) AS steps FROM periods GROUP BY study ORDER BY study", capsys)
    assert rows == [{"study": "alpha", "v": 1, "n": 16, "steps": 12},
                    {"study": "beta", "v": 1, "n": 16, "steps": 11},
                    {"study": "gamma", "v": 0, "n": 10, "steps": 0}]


def test_the_verdicts_view_counts_by_study_and_configuration(
        cat: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = query(cat, "SELECT study, configuration, verdict, reason, cause, periods "
                 "FROM verdicts", capsys)
    assert rows == [
        {"study": s, "configuration": "gsm8k@2", "verdict": v, "reason": r, "cause": c,
         "periods": n}
        for s, done, failed in (("alpha", 12, 4), ("beta", 11, 5), ("gamma", 9, 1))
        for v, r, c, n in (("resolved", "completed", None, done),
                           ("unresolved", "infrastructure_failure", "node_failure", failed))]


def test_the_gpu_seconds_view_is_each_summarys_accounting(
        cat: Path, outs: list[Path], capsys: pytest.CaptureFixture[str]) -> None:
    rows = query(cat, "SELECT study, scope, gpu_seconds FROM gpu_seconds", capsys)
    expected = []
    for out in outs:
        accounting = orjson.loads((out / "summary.json").read_bytes())["accounting"]
        expected += [{"study": out.name.removesuffix("-out"), "scope": scope,
                      "gpu_seconds": accounting[f"{scope}_gpu_seconds"]}
                     for scope in ("allocation", "task", "reservation", "wasted",
                                   "unresolved")]
    assert rows == expected
    assert rows[1]["gpu_seconds"] > 0


def test_suspect_hardware_flags_the_planted_node_and_its_gpus_only(
        cat: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = query(cat, "SELECT * FROM suspect_hardware", capsys)
    units = {(r["kind"], r["unit"]): r for r in rows}
    bad_gpus = {r["unit"] for r in rows if r["kind"] == "gpu" and r["hosts"] == [BAD_NODE]}
    assert len(bad_gpus) == 2  # (a 2-GPU period on the node, ranks 0 and 1)
    assert {key for key, r in units.items() if r["suspect"]} == \
        {("node", BAD_NODE)} | {("gpu", uuid) for uuid in bad_gpus}
    nodes = [r for r in rows if r["kind"] == "node"]
    gpus = [r for r in rows if r["kind"] == "gpu"]
    assert (len(nodes), len(gpus)) == (18, 36)
    p0 = Fraction(10, 42)  # every study's attempts: 42, of which 10 failed
    bad = units[("node", BAD_NODE)]
    assert (bad["attempts"], bad["failures"], bad["studies"]) == (9, 8, ["alpha", "beta",
                                                                          "gamma"])
    assert bad["catalogue_rate"] == pytest.approx(float(p0), rel=1e-12)
    assert bad["p_value"] == pytest.approx(exact_tail(8, 9, p0), rel=1e-9)
    assert bad["threshold"] == pytest.approx(ALPHA / 18)
    for uuid in bad_gpus:
        assert units[("gpu", uuid)]["p_value"] == pytest.approx(exact_tail(8, 9, p0), rel=1e-9)
        assert units[("gpu", uuid)]["threshold"] == pytest.approx(ALPHA / 36)
    # a node that failed once in two attempts is within chance
    healthy = units[("node", "gpu-node-07")]
    assert (healthy["attempts"], healthy["failures"], healthy["suspect"]) == (2, 1, False)
    assert healthy["p_value"] == pytest.approx(exact_tail(1, 2, p0), rel=1e-9)
    assert units[("node", "gpu-node-01")]["p_value"] == 1.0


def test_csv_and_table_output(cat: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["query", str(cat), "SELECT study, count(*) AS n FROM attempts "
                 "GROUP BY study ORDER BY study", "--csv"]) == 0
    assert list(csv.reader(io.StringIO(capsys.readouterr().out))) == [
        ["study", "n"], ["alpha", "16"], ["beta", "16"], ["gamma", "10"]]
    assert main(["query", str(cat), "SELECT unit FROM suspect_hardware WHERE suspect "
                 "AND kind = 'node'"]) == 0
    out = capsys.readouterr().out
    assert BAD_NODE in out and "1 row(s)" in out


def test_bad_sql_is_one_line_and_exit_2(cat: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["query", str(cat), "SELEC * FROM periods"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("auditor: error: query: ") and captured.err.count("\n") == 1
    assert main(["query", str(cat), "SELECT no_such_column FROM periods"]) == 2
    assert main(["query", str(cat.parent), "SELECT 1"]) == 2  # (no catalogue there)
    assert "no catalog.json" in capsys.readouterr().err


def test_the_same_audit_again_replaces_it(cat: Path, outs: list[Path],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    before = tree(cat)
    capsys.readouterr()
    assert main(["catalog", str(outs[0]), "--into", str(cat)]) == 0
    assert capsys.readouterr().out.startswith(f"replaced alpha from {outs[0]}")
    after = tree(cat)  # (the same bytes again: the time is in catalog.json only)
    assert before.pop("catalog.json") != after.pop("catalog.json") and before == after
    rows = query(cat, "SELECT study, count(*) AS n FROM periods GROUP BY study "
                 "ORDER BY study", capsys)
    assert [r["n"] for r in rows] == [16, 16, 10]
    assert len(orjson.loads((cat / "catalog.json").read_bytes())["studies"]) == 3
    assert not [p for p in cat.iterdir() if p.name.startswith(".staging")]


def test_another_study_sharing_a_name_is_refused_unless_named(
        cat: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = audited(hardware_study(tmp_path / "other", "alpha", 8900000,
                                   [("gpu-node-90", "completed"), ("gpu-node-91", FAILING)]),
                    tmp_path / "other-out")
    before = tree(cat)
    capsys.readouterr()
    assert main(["catalog", str(other), "--into", str(cat)]) == 2
    err = capsys.readouterr().err
    assert "already holds a study named 'alpha'" in err and "--name" in err
    assert err.count("\n") == 1
    assert tree(cat) == before
    assert main(["catalog", str(other), "--into", str(cat), "--name", "alpha-2"]) == 0
    rows = query(cat, "SELECT study, count(*) AS n FROM periods GROUP BY study "
                 "ORDER BY study", capsys)
    assert [(r["study"], r["n"]) for r in rows] == [("alpha", 16), ("alpha-2", 2),
                                                    ("beta", 16), ("gamma", 10)]


def test_replace_puts_a_later_audit_of_a_study_in_place_of_the_earlier(
        cat: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A study captured again (more evidence, a dump with its missing rows) is audited again
    under its own name: ``--replace`` swaps it in, whole, rather than counting both. Another
    study's root under that name is never replaced (it would drop that study)."""
    root = hardware_study(tmp_path / "delta", "delta", 8900000,
                          [("gpu-node-90", "completed"), ("gpu-node-91", FAILING)])
    first = audited(root, tmp_path / "delta-out")
    assert main(["catalog", str(first), "--into", str(cat)]) == 0
    dump = root / "accounting" / "sacct-raw.psv"
    dump.write_bytes(dump.read_bytes() + b"\n")  # (captured again: other bytes)
    later = audited(root, tmp_path / "delta-later")
    capsys.readouterr()
    assert main(["catalog", str(later), "--into", str(cat)]) == 2
    assert "--replace" in capsys.readouterr().err
    assert main(["catalog", str(later), "--into", str(cat), "--replace"]) == 0
    assert capsys.readouterr().out.startswith(f"replaced delta from {later}")
    entry = next(e for e in orjson.loads((cat / "catalog.json").read_bytes())["studies"]
                 if e["name"] == "delta")
    assert entry["source"] == str(later)
    summary = orjson.loads((later / "summary.json").read_bytes())
    [study] = query(cat, "SELECT * FROM studies WHERE study = 'delta'", capsys)
    assert study["periods"] == 2 and study["summary_sha256"] == hashlib.sha256(
        (later / "summary.json").read_bytes()).hexdigest()
    assert study["gate_included_configurations"] == summary["gate"]["included_configurations"]
    other = audited(hardware_study(tmp_path / "other", "alpha", 8900001,
                                   [("gpu-node-92", "completed")]), tmp_path / "other-out")
    before = tree(cat)
    assert main(["catalog", str(other), "--into", str(cat), "--replace"]) == 2
    assert "--replace takes a later audit of the same root" in capsys.readouterr().err
    assert tree(cat) == before


def test_the_studies_table_keeps_what_qualifies_the_accounting(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A requeued run's GPU-seconds, the jobs without an element row, the records of unknown
    length (the allocation's figure then a lower bound: the report's "at least") and the
    gate's included configurations reach the catalogue as the summary says them."""
    from tests.helpers import copy_example

    study = copy_example(tmp_path)
    dump = study / "accounting" / "sacct-raw.psv"
    text = dump.read_text()
    # (element 3's first run: a REQUEUED record of the -D dump, of unknown length)
    row = next(line for line in text.splitlines() if line.startswith("5055845_3|"))
    fields = row.split("|")
    fields[3:8] = ["REQUEUED", "0:0", "Unknown", fields[5], ""]
    dump.write_text(text.replace(row + "\n", "|".join(fields) + "\n" + row + "\n"))
    out = tmp_path / "out"
    main(["audit", str(study), "--out", str(out), "--quiet", "--no-plots"])
    summary = orjson.loads((out / "summary.json").read_bytes())
    accounting = summary["accounting"]
    assert accounting["allocation_records_unknown"] == 1
    assert main(["catalog", str(out), "--into", str(tmp_path / "cat")]) == 0
    [row_] = query(tmp_path / "cat", "SELECT * FROM studies", capsys)
    for key in ("allocation_records_unknown", "requeued_gpu_seconds",
                "outside_array_gpu_seconds", "jobs_without_element"):
        assert row_[key] == accounting[key], key
    assert row_["gate_included_configurations"] == summary["gate"]["included_configurations"]
    assert row_["gate_allow_partial_included_configurations"] == \
        summary["gate_allow_partial"]["included_configurations"]
    scopes = query(tmp_path / "cat", "SELECT scope, gpu_seconds, at_least FROM gpu_seconds",
                   capsys)
    assert [(r["scope"], r["at_least"]) for r in scopes] == [
        ("allocation", True), ("task", False), ("reservation", False), ("wasted", False),
        ("unresolved", False)]
    assert scopes[0]["gpu_seconds"] == accounting["allocation_gpu_seconds"]
    assert "at least" in (out / "diagnostic.md").read_text()


def test_two_studies_of_one_name_in_one_command_are_refused(
        outs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = audited(hardware_study(tmp_path / "other", "beta", 8900000,
                                   [("gpu-node-90", "completed")]), tmp_path / "other-out")
    assert main(["catalog", str(outs[1]), str(other), "--into", str(tmp_path / "c")]) == 2
    assert "different studies both named 'beta'" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()
    assert main(["catalog", str(outs[0]), str(outs[1]), "--into", str(tmp_path / "c"),
                 "--name", "x"]) == 2


@pytest.mark.parametrize("tamper", ["output", "evidence"])
def test_a_tampered_audit_is_refused_and_nothing_is_written(
        outs: list[Path], tmp_path: Path, tamper: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    root = hardware_study(tmp_path / "t", "tampered", 8800000, [("gpu-node-80", "completed")])
    out = audited(root, tmp_path / "t-out")
    if tamper == "output":
        path = out / "periods.parquet"
    else:
        path = next((root).rglob("training-*.log"))
    path.write_bytes(path.read_bytes() + b"\n")
    catalogue = tmp_path / "cat"
    assert main(["catalog", str(outs[0]), "--into", str(catalogue)]) == 0
    before = tree(catalogue)
    capsys.readouterr()
    assert main(["catalog", str(outs[1]), str(out), "--into", str(catalogue)]) == 2
    err = capsys.readouterr().err
    assert f"{out} fails verification" in err and err.count("\n") == 1
    assert tree(catalogue) == before  # (not even the good audit beside it)


def test_a_directory_that_is_no_catalogue_is_refused(
        outs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stranger = tmp_path / "stuff"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("mine")
    assert main(["catalog", str(outs[0]), "--into", str(stranger)]) == 2
    assert "has no catalog.json" in capsys.readouterr().err
    assert sorted(p.name for p in stranger.iterdir()) == ["notes.txt"]
    inside = outs[0] / "cat"
    assert main(["catalog", str(outs[0]), "--into", str(inside)]) == 2
    assert not inside.exists()


def test_an_audit_without_a_devices_table_is_catalogued(
        outs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An audit written before devices.parquet existed: its other tables are added, and
    the devices view reads the other studies' rows."""
    old = tmp_path / "old-out"
    shutil.copytree(outs[1], old)
    (old / "devices.parquet").unlink()
    manifest = orjson.loads((old / "output_manifest.json").read_bytes())
    manifest["outputs"] = [o for o in manifest["outputs"] if o["path"] != "devices.parquet"]
    (old / "output_manifest.json").write_bytes(orjson.dumps(manifest))
    catalogue = tmp_path / "cat"
    assert main(["catalog", str(outs[0]), str(old), "--into", str(catalogue)]) == 0
    assert not (catalogue / "devices" / "study=beta").exists()
    rows = query(catalogue, "SELECT study, count(*) AS n FROM devices GROUP BY study", capsys)
    assert rows == [{"study": "alpha", "n": 32}]
    assert query(catalogue, "SELECT count(*) AS n FROM suspect_hardware", capsys)[0]["n"] > 0


def test_without_duckdb_query_says_so_in_one_line(
        cat: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "duckdb", None)  # (import duckdb: ImportError)
    capsys.readouterr()
    assert main(["query", str(cat), "SELECT 1"]) == 2
    err = capsys.readouterr().err
    assert "needs duckdb" in err and err.count("\n") == 1


def test_an_attempt_without_its_invocation_time_makes_the_attempts_figures_lower_bounds(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Review S: an attempt whose trial record is gone counted 0.0 GPU-seconds in
    ``attempts.parquet`` and the report's task-scope and unresolved totals were stated as
    exact. Its row's figures are now null, the summary counts it, the report says "at
    least" and the catalogue's ``gpu_seconds`` says ``at_least`` for the attempts' scopes."""
    import pyarrow.parquet as pq

    from tests.helpers import copy_example

    study = copy_example(tmp_path)
    (trial,) = sorted(study.glob("*/attempt-*/trial-*.json"))[:1]
    trial.unlink()
    out = tmp_path / "out"
    main(["audit", str(study), "--out", str(out), "--quiet", "--no-plots"])
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert summary["accounting"]["attempts_without_times"] == 1
    rows = pq.read_table(out / "attempts.parquet").to_pylist()
    lost = [r for r in rows if r["started"] is None]
    assert len(lost) == 1 and lost[0]["task_gpu_seconds"] is None
    assert all(r["task_gpu_seconds"] is not None for r in rows if r["started"] is not None)
    report = (out / "diagnostic.md").read_text()
    assert "Task scope (each attempt's invocation time × the GPUs its period used): at least" \
        in report and "1 attempt without an invocation time counts none" in report
    assert "Unresolved periods account for at least" in report
    assert main(["catalog", str(out), "--into", str(tmp_path / "cat")]) == 0
    scopes = query(tmp_path / "cat", "SELECT scope, at_least FROM gpu_seconds", capsys)
    assert {r["scope"]: r["at_least"] for r in scopes} == {
        "allocation": False, "task": True, "reservation": True, "wasted": True,
        "unresolved": True}


def test_a_catalogue_of_audits_from_before_a_column_still_answers(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Review U: a catalogue written before ``studies`` had ``attempts_without_times`` (or
    ``allocation_records_unknown``) failed every query (the ``gpu_seconds`` view named the
    column); its ``at_least`` is unknown instead."""
    import pyarrow.parquet as pq

    from tests.helpers import copy_example

    out = tmp_path / "out"
    main(["audit", str(copy_example(tmp_path)), "--out", str(out), "--quiet", "--no-plots"])
    cat = tmp_path / "cat"
    assert main(["catalog", str(out), "--into", str(cat)]) == 0
    (part,) = (cat / "studies").rglob("*.parquet")
    table = pq.read_table(part)
    pq.write_table(table.drop_columns(["attempts_without_times", "allocation_records_unknown"]),
                   part)
    assert [r["n"] for r in query(cat, "SELECT count(*) AS n FROM periods", capsys)] == [18]
    scopes = query(cat, "SELECT scope, at_least FROM gpu_seconds", capsys)
    assert [r["at_least"] for r in scopes] == [None] * 5
