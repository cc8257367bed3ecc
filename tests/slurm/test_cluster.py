"""A real Slurm 22.05 ran the endings array: sacct says what each ending looks like.

These tests need the cluster (``AUDITOR_SLURM=1``, root; see ``conftest.py``). They check
the scheduler's own record of what the harness did (each task's state and ExitCode, the
``-D`` requeue history, the absent pending-cancelled task, the mid-run shapes), then read
every captured dump with ``auditor sacct --json`` and check the parts the auditor reads
right today. What it reads wrong is tested on the saved copies (``test_saved_dumps.py``).
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from auditor._cli import main
from tests.slurm.cluster import Cluster, skip_reason
from tests.slurm.endings import OTHER_FORMAT, EndingsRun, check_midrun, stale_tasks

if (_reason := skip_reason()) is not None:
    pytest.skip(_reason, allow_module_level=True)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

EXPECTED: dict[int, tuple[str, str, str, str]] = {
    # task: (job state, job ExitCode, batch step state, batch ExitCode), latest record
    0: ("COMPLETED", "0:0", "COMPLETED", "0:0"),
    1: ("FAILED", "1:0", "FAILED", "1:0"),
    2: ("FAILED", "15:0", "FAILED", "15:0"),           # exit 143, minus 128
    3: ("CANCELLED by 0", "0:0", "FAILED", "15:0"),    # trap exits 143
    4: ("TIMEOUT", "0:0", "FAILED", "15:0"),
    5: ("COMPLETED", "0:0", "COMPLETED", "0:0"),
    6: ("COMPLETED", "0:0", "COMPLETED", "0:0"),
    7: ("COMPLETED", "0:0", "COMPLETED", "0:0"),
    8: ("FAILED", "0:9", "CANCELLED by 0", "0:9"),     # not OUT_OF_MEMORY: no cgroups
    9: ("COMPLETED", "0:0", "COMPLETED", "0:0"),
    10: ("FAILED", "9:0", "FAILED", "9:0"),            # exit 137, minus 128
    11: ("FAILED", "127:0", "FAILED", "127:0"),        # exit 255, minus 128
    12: ("COMPLETED", "0:0", "COMPLETED", "0:0"),
    13: ("COMPLETED", "0:0", "COMPLETED", "0:0"),
    14: ("COMPLETED", "0:0", "COMPLETED", "0:0"),
}


def rows(text: str, delimiter: str = "|") -> list[list[str]]:
    """sacct -P lines split (these dumps hold no delimiter inside a value)."""
    return [line.split(delimiter) for line in text.splitlines() if line]


def records(text: str, array: str, task: int) -> list[list[str]]:
    """The allocation records of ``<array>_<task>`` in dump order."""
    return [row for row in rows(text) if row[0] == f"{array}_{task}"]


def step(text: str, array: str, task: int, name: str) -> list[str]:
    """The latest ``.name`` step row of ``<array>_<task>``."""
    found = [row for row in rows(text) if row[0] == f"{array}_{task}.{name}"]
    assert found, f"no {array}_{task}.{name} row"
    return found[-1]


def auditor_json(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, text: str,
                 *extra: str) -> dict[str, object]:
    path = tmp_path / f"{name}.psv"
    path.write_text(text)
    capsys.readouterr()
    assert main(["sacct", str(path), "--json", *extra]) == 0
    document = orjson.loads(capsys.readouterr().out)
    assert isinstance(document, dict)
    return document


def test_cluster_daemons_are_its_own(slurm_cluster: Cluster) -> None:
    pids = slurm_cluster.pids()
    assert set(pids) == {"munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd"}
    for name, pid in pids.items():
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        assert comm.startswith(name[:15]), (name, comm)
    state = slurm_cluster.run(["sinfo", "-h", "-o", "%T %G"]).stdout.split()
    assert state[0] in {"idle", "mixed", "allocated"}
    assert state[1] == "gpu:a100:24"


def test_stop_ends_only_the_daemons_it_started(slurm_cluster: Cluster) -> None:
    """A second cluster started and stopped beside the first leaves the first running."""
    other = Cluster.start()
    mine = other.pids()
    other.stop()
    for pid in mine.values():
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid)
    assert not other.root.exists()
    for pid in slurm_cluster.pids().values():
        os.kill(pid, 0)  # still there


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def test_each_ending_as_sacct_records_it(endings: EndingsRun) -> None:
    final = endings.dumps["contract"]
    for task, (state, code, batch_state, batch_code) in EXPECTED.items():
        latest = records(final, endings.array, task)
        assert len(latest) == 1, (task, latest)
        assert (latest[0][3], latest[0][4]) == (state, code), task
        batch = step(final, endings.array, task, "batch")
        assert (batch[3], batch[4]) == (batch_state, batch_code), task
        assert "gres/gpu:a100=2,gres/gpu=2" in latest[0][8]


def test_time_limit_and_pre_timeout_trap(endings: EndingsRun) -> None:
    final = endings.dumps["contract"]
    limit = records(final, endings.array, 4)[0]
    trap = records(final, endings.array, 5)[0]
    assert 60 <= int(limit[7]) <= 100, limit          # the one-minute limit fired late
    assert int(trap[7]) < 60, trap                     # USR1 came before the limit
    assert "pre-timeout trap" in endings.logs[5]
    assert "SIGTERM received" in endings.logs[4]


def test_srun_steps_fail_under_a_completed_job(endings: EndingsRun) -> None:
    final = endings.dumps["contract"]
    assert step(final, endings.array, 9, "0")[3:5] == ["FAILED", "3:0"]
    assert step(final, endings.array, 9, "1")[3:5] == ["CANCELLED", "0:9"]


def test_requeues_show_with_D_only(endings: EndingsRun) -> None:
    for task in (6, 7):
        history = records(endings.dumps["contract-D"], endings.array, task)
        assert [row[3] for row in history] == ["REQUEUED", "COMPLETED"], task
        assert history[0][1] == history[1][1]            # the same JobIDRaw
        assert history[1][5] > history[0][6]             # the rerun starts after the first end
        assert len(records(endings.dumps["contract"], endings.array, task)) == 1
    assert "restart=1" in endings.logs[6] and "restart=1" in endings.logs[7]


def test_cancelled_while_pending_has_no_row(endings: EndingsRun) -> None:
    """Task 15 never gets a row of its own; the array's pending record, when sacct still
    prints it, is a range holding 15 left CANCELLED (it may still name tasks that ran)."""
    for name in ("contract", "contract-D", "header"):
        text = endings.dumps[name]
        assert not records(text, endings.array, 15), name
        ranges = [row for row in rows(text) if row[0].startswith(f"{endings.array}_[")]
        for row in ranges:
            assert row[3].startswith("CANCELLED") and "15" in row[0], row
        assert stale_tasks(text, endings.array) <= {12, 13, 14}, name


def test_mid_run_dump_shows_running_and_pending(endings: EndingsRun) -> None:
    check_midrun(endings.dumps["midrun"], endings.array)


def test_auditor_reads_each_final_state(endings: EndingsRun, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """What the auditor reads right today: each element's final state and GPUs."""
    wanted = {task: expected[0].split()[0] for task, expected in EXPECTED.items()}
    for name, extra in (("contract", ()), ("contract-D", ()), ("header", ()),
                        ("caret", ("--delimiter", "^")),
                        ("other-format", ("--format", OTHER_FORMAT))):
        document = auditor_json(tmp_path, capsys, name, endings.dumps[name], *extra)
        jobs = document["jobs"]
        assert isinstance(jobs, list)
        seen = {job["array_task_id"]: job["state"] for job in jobs}
        assert seen.pop(None, "CANCELLED") == "CANCELLED", name  # a range left cancelled
        assert seen == wanted, name
        assert {job["gpus"] for job in jobs if job["array_task_id"] is not None} == {2}, name


def test_auditor_reads_the_mid_run_dump(endings: EndingsRun, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    document = auditor_json(tmp_path, capsys, "midrun", endings.dumps["midrun"])
    totals = document["totals"]
    assert isinstance(totals, dict)
    states = [row[3] for row in rows(endings.dumps["midrun"]) if "." not in row[0]]
    assert totals["states"] == {state: states.count(state) for state in set(states)}
    assert totals["states"]["RUNNING"] >= 11 and totals["states"]["PENDING"] >= 1
