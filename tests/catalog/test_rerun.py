"""``auditor rerun DIR``: the unresolved periods by reason group, as ``--array=`` specs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from auditor._cli import main
from auditor.catalog.rerun import array_spec
from tests.catalog.studies import audited, fifo_in_place_of, hardware_study
from tests.helpers import rewrite


@pytest.fixture(scope="module")
def mixed_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("mixed")
    assert main(["example", str(tmp / "study"), "--kind", "mixed"]) == 0
    return audited(tmp / "study", tmp / "out")


def plan(out: Path, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    capsys.readouterr()
    assert main(["rerun", str(out), "--json"]) == 0
    groups: list[dict[str, Any]] = orjson.loads(capsys.readouterr().out)
    return groups


@pytest.mark.parametrize(("ids", "spec"), [
    ([3, 7, 12, 13, 14], "3,7,12-14"), ([14, 3, 13, 12, 7, 13], "3,7,12-14"), ([], ""),
    ([5], "5"), ([1, 2], "1-2"), ([0, 1, 2, 4, 6, 7], "0-2,4,6-7")])
def test_array_specs_compress_runs_into_ranges(ids: list[int], spec: str) -> None:
    assert array_spec(ids) == spec


def test_the_mixed_study_groups_by_reason_never_a_resolved_or_failed_period(
        mixed_out: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Mixed: tasks 0 and 3 (and the retried period, no task id) resolved, task 2 failed
    (the protocol's out-of-memory); the rest unresolved, each for its reason."""
    groups = plan(mixed_out, capsys)
    assert [(g["group"], g["cause"], g["array"], g["reasons"]) for g in groups] == [
        ("infrastructure", "node_failure", "9", ["infrastructure_failure"]),
        ("infrastructure", "signal", "4,6", ["killed"]),
        ("time_limit", "time_limit", "5,8", ["time_limit"]),
        ("cancelled", "cancelled", "7", ["cancelled"]),
        ("incomplete", None, "1", ["terminal_event_missing"]),
    ]
    assert {g["array_job_id"] for g in groups} == {"5061000"}
    listed = {s for g in groups for s in g["subjects"]}
    assert len(listed) == 7
    assert not listed & {"host-qwen25-7b-gsm8k-c2-s161/period-1",   # resolved
                         "host-qwen25-7b-gsm8k-c2-s163/period-1",   # failed
                         "host-qwen25-7b-math-c2-s164/period-1"}    # resolved (retried)
    assert main(["rerun", str(mixed_out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("  #")[0] for line in lines] == [
        "infrastructure/node_failure --array=9 of array 5061000",
        "infrastructure/signal --array=4,6 of array 5061000",
        "time_limit --array=5,8 of array 5061000", "cancelled --array=7 of array 5061000",
        "incomplete --array=1 of array 5061000"]


def test_evidence_problems_are_a_group(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    root = hardware_study(tmp_path / "s", "s", 8700000, [
        ("gpu-node-01", "completed"), ("gpu-node-02", "completed"),
        ("gpu-node-03", "completed"), ("gpu-node-04", "completed")])
    log = next((root / "host-qwen25-7b-gsm8k-c2-s162-2gpu").rglob("training-*.log"))
    rewrite(root, log.relative_to(root).as_posix(), lambda b: b + b"\n",
            update_manifest=False)
    groups = plan(audited(root, tmp_path / "out"), capsys)
    assert [(g["group"], g["array"], g["reasons"]) for g in groups] == [
        ("evidence", "1", ["evidence_mismatch"])]


def test_nothing_to_rerun_and_a_changed_table(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = audited(hardware_study(tmp_path / "s", "s", 8700000,
                                 [("gpu-node-01", "completed")]), tmp_path / "out")
    assert plan(out, capsys) == []
    assert main(["rerun", str(out)]) == 0
    assert "nothing to rerun" in capsys.readouterr().out
    (out / "periods.parquet").write_bytes((out / "periods.parquet").read_bytes() + b"x")
    assert main(["rerun", str(out)]) == 2
    err = capsys.readouterr().err
    assert "does not match" in err and err.count("\n") == 1
    assert main(["rerun", str(tmp_path / "missing")]) == 2


def test_a_period_without_an_array_task_id_is_named(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A period whose attempts ran in two elements has no one task id: named, not lost."""
    from auditor._studygen import (
        MODEL,
        SEED_COMMIT,
        AttemptSpec,
        ElementSpec,
        PeriodSpec,
        StudySpec,
        default_protocol,
        write_study,
    )

    period = PeriodSpec(pair=f"host-{MODEL}-gsm8k-c2-s161", workload="gsm8k", seed=161,
                        model=MODEL, period=1, gpus=2, outcome="retried", attempts=[
                            AttemptSpec(outcome="node_failure", job_id="7000001"),
                            AttemptSpec(outcome="timed_out", job_id="7000002")])
    elements = [ElementSpec(array_task_id=i, job_id=str(7000001 + i), periods=[period],
                            node=f"gpu-node-0{i}", alloc_gpus=2) for i in range(2)]
    write_study(StudySpec(study="r", array_job_id="7000000", elements=elements,
                          protocol=default_protocol([period]),
                          execution_commits={period.pair: SEED_COMMIT}), tmp_path / "s")
    out = audited(tmp_path / "s", tmp_path / "out")
    groups = plan(out, capsys)
    assert [(g["group"], g["array"], g["without_task_id"]) for g in groups] == [
        ("time_limit", "", [f"{period.pair}/period-1"])]
    assert main(["rerun", str(out)]) == 0
    assert capsys.readouterr().out.startswith("time_limit (no array task id)  # 1 period(s)")


@pytest.mark.parametrize("name", ["periods.parquet", "output_manifest.json"])
def test_a_fifo_in_place_of_a_file_is_refused_not_waited_on(
        mixed_out: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        name: str) -> None:
    """A FIFO blocked the read for ever (a writer opening it after 10 s ends the wait, so
    without the guard this fails instead of hanging)."""
    import shutil

    out = tmp_path / "out"
    shutil.copytree(mixed_out, out)
    with fifo_in_place_of(out / name):
        assert main(["rerun", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"rerun: {out / name}: unreadable (not a regular file)" \
        in err, err


def _failed_with(tmp_path: Path, lines: bytes) -> Path:
    """A two-period study whose second period exited 1 with ``lines`` at its log's end."""
    root = hardware_study(tmp_path / "s", "s", 8700000, [
        ("gpu-node-01", "completed"), ("gpu-node-02", "completed")])
    trial = next((root / "host-qwen25-7b-gsm8k-c2-s162-2gpu").rglob("trial-*.json"))
    log = next(trial.parent.glob("training-*.log"))

    def failed(data: bytes) -> bytes:
        document = orjson.loads(data)
        document["invocation"]["exit_code"] = 1
        for process in document["processes"]:
            process["exit_code"] = 1
        return orjson.dumps(document)

    rewrite(root, trial.relative_to(root).as_posix(), failed)
    rewrite(root, log.relative_to(root).as_posix(), lambda data: data + lines)
    return root


def test_a_python_crash_is_not_infrastructure(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """An unclean exit whose cause is the trainer's own (a Python exception) is its own
    line, ``crashed/python_exception``: rerunning it unchanged may crash again, where a
    node failure's rerun will not."""
    root = _failed_with(tmp_path, b"Traceback (most recent call last):\n  File \"train.py\", "
                              b"line 3, in <module>\nRuntimeError: boom\n")
    groups = plan(audited(root, tmp_path / "out"), capsys)
    assert [(g["group"], g["cause"], g["array"], g["array_job_id"]) for g in groups] == [
        ("crashed", "python_exception", "1", "8700000")]
    assert main(["rerun", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.startswith(
        "crashed/python_exception --array=1 of array 8700000  # 1 period(s): unclean_exit")


def test_evidence_text_in_the_plan_reaches_the_terminal_inert(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An array id holding an escape sequence (a title, a screen clear, a colour) is the
    evidence's text: printed escaped, as every other command prints such text (it reached
    the terminal as it was)."""
    root = tmp_path / "study"
    assert main(["example", str(root), "--kind", "mixed"]) == 0
    record = root / "pairs/host-qwen25-7b-gsm8k-c2-s162/period-1.json"
    document = orjson.loads(record.read_bytes())
    document["array_job_id"] = "5061000\x1b]0;owned\x07\x1b[2J"
    record.write_bytes(orjson.dumps(document))
    assert main(["audit", str(root), "--out", str(tmp_path / "out"), "--quiet",
                 "--no-plots"]) == 0
    capsys.readouterr()
    assert main(["rerun", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "\x1b" not in printed and "\x07" not in printed and "\\x1b]0;owned" in printed


def test_a_host_oom_the_report_calls_infrastructure_is_planned_as_such(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Review S: a host memory kill the report calls ``infrastructure_failure`` was planned
    as ``crashed/host_oom`` (the trainer's own failure), contradicting the report's reason;
    the plan follows the reason: ``infrastructure/host_oom``."""
    root = _failed_with(tmp_path, b"ray.exceptions.OutOfMemoryError: Task was killed due to "
                              b"the node running low on memory.\n")
    out = audited(root, tmp_path / "out")
    groups = plan(out, capsys)
    assert [(g["group"], g["cause"]) for g in groups] == [("infrastructure", "host_oom")]
    assert orjson.loads((out / "summary.json").read_bytes())["periods"][1]["reason"] \
        == "infrastructure_failure"
