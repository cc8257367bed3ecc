"""Seed ``000``'s multi-node launcher on a real three-node Slurm 22.05, audited.

``tests/slurm/cosmos.py`` runs the README's multi-node example as an array (a controller, a
policy and a rollout replica on three nodes, each an srun step under ``auditor run --step``;
one ending per element); the
audit of the study it leaves must say what was done: every verdict, reason and cause, the
process records (host, role, exit, signals), each node's idle result, the kit's own exit
statuses, sacct's states and the gate. Expectations are what the harness did, never the
audit's output read back.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from auditor._cli import main
from tests.slurm.cluster import Cluster, Unavailable, ensure_installed, skip_reason
from tests.slurm.conftest import TIMINGS
from tests.slurm.cosmos import ELEMENTS, GPUS, CosmosRun, pair_of, run_cosmos

if (_reason := skip_reason()) is not None:
    pytest.skip(_reason, allow_module_level=True)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

VERDICTS: dict[int, tuple[str, str, str | None]] = {
    # task: (verdict, reason, cause)
    0: ("resolved", "completed", None),
    1: ("unresolved", "killed", "signal"),              # the flag off: its own 143 stands
    2: ("unresolved", "unclean_exit", "python_exception"),  # the replica's crash, not a kill
    3: ("unresolved", "killed", "signal"),              # the replica's SIGTERM, never excused
    4: ("unresolved", "killed", "signal"),
    5: ("unresolved", "unclean_exit", "gpu_oom"),
    6: ("unresolved", "cancelled", "cancelled"),
    7: ("unresolved", "time_limit", "time_limit"),      # not the SIGUSR1: the limit
    8: ("resolved", "completed", None),                 # its own requeue's rerun completed
}
SACCT: dict[int, tuple[str, str]] = {
    0: ("COMPLETED", "0:0"), 1: ("FAILED", "15:0"), 2: ("FAILED", "15:0"),
    3: ("FAILED", "15:0"), 4: ("FAILED", "15:0"), 5: ("FAILED", "15:0"),
    6: ("CANCELLED by 0", "0:0"), 7: ("TIMEOUT", "0:0"), 8: ("COMPLETED", "0:0"),
}
"""What sacct prints for each element's latest record (the batch script exits with the
batch node's ``auditor run``: 0 only for the excused shutdown)."""
POLICY: dict[int, tuple[int, str | None]] = {
    0: (0, None), 1: (0, None), 2: (1, None), 3: (143, "SIGTERM"), 4: (137, "SIGKILL"),
    5: (1, None), 8: (1, None),
}
"""The policy replica's process record on the second node: exit code and signal."""


@pytest.fixture(scope="module")
def cosmos(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CosmosRun]:
    """The array, run once on a three-node cluster of its own (twelve fake GPUs a node, so
    every element runs at once)."""
    try:
        installed = ensure_installed()
        cluster = Cluster.start(nodes=3, gpus=12)
    except Unavailable as error:
        pytest.skip(f"multi-node Slurm not available: {error}")
    if installed:
        TIMINGS["install"] = installed
    TIMINGS["cosmos cluster start"] = cluster.timings["start_s"]
    try:
        run = run_cosmos(cluster, cluster.root / "study")
        TIMINGS["cosmos array"] = run.seconds
        kept = tmp_path_factory.mktemp("cosmos") / "study"
        import shutil

        shutil.copytree(run.root, kept)
        run.root = kept
        yield run
    finally:
        cluster.stop(remove=os.environ.get("AUDITOR_SLURM_KEEP") != "1")


@pytest.fixture(scope="module")
def audited(cosmos: CosmosRun, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("cosmos-audit") / "out"
    assert main(["audit", str(cosmos.root), "--out", str(out), "--quiet", "--no-plots"]) == 0
    summary = orjson.loads((out / "summary.json").read_bytes())
    import pyarrow.parquet as pq

    periods = {row["pair"]: row for row in pq.read_table(out / "periods.parquet").to_pylist()}
    return {"summary": summary, "periods": periods, "out": out}


def _records(root: Path, task: int) -> dict[str, dict[str, Any]]:
    """Element ``task``'s first attempt's process records, by role."""
    attempt = sorted((root / f"{pair_of(task)}-{GPUS}gpu").glob("attempt-*"))[0]
    found = {}
    for path in (attempt / "processes").glob("*.json"):
        record = json.loads(path.read_text())
        found[record["role"]] = record
        assert path.name == f"{record['host']}-{record['role']}-{record['pid']}.json"
    return found


@pytest.mark.parametrize("task", sorted(ELEMENTS))
def test_each_ending_gets_its_verdict_reason_and_cause(audited: dict[str, Any],
                                                       task: int) -> None:
    row = audited["periods"][pair_of(task)]
    assert (row["verdict"], row["reason"], row["cause"]) == VERDICTS[task], row


def test_a_replica_killed_on_another_node_is_never_excused(audited: dict[str, Any],
                                                          cosmos: CosmosRun) -> None:
    """Seed 000's false success: the controller shuts down "coordinated" because a policy
    replica died; its own record says 143 with the flag on and no signal, and still the kit
    (at run time) and the audit (after) refuse it, naming the replica."""
    for task in (3, 4):
        detail = audited["periods"][pair_of(task)]["cause_detail"]
        assert f"the policy process (pid {cosmos.killed[task]} on n2)" in detail
        assert "auditor run --step controller: command exited with 143; sigterm: exit 143 " \
               "(SIGTERM) is not excused: the policy process" in cosmos.logs[task]
        assert "; exit 143; trial record" in cosmos.logs[task]  # (the batch node's run)
        controller = _records(cosmos.root, task)["controller"]
        assert (controller["exit_code"], controller["received_signal"]) == (143, None)
    assert "; exit 0; trial record" in cosmos.logs[0]
    assert "is a coordinated shutdown: the controller (pid" in cosmos.logs[0]


@pytest.mark.parametrize("task", sorted(POLICY))
def test_every_step_leaves_its_process_record_with_its_host(cosmos: CosmosRun,
                                                            task: int) -> None:
    records = _records(cosmos.root, task)
    assert records["controller"]["host"] == "n1"
    assert records["controller"]["exit_code"] == 143  # (it SIGTERMs itself every time)
    policy = records["policy"]
    assert policy["host"] == "n2"
    assert (policy["exit_code"], policy["signal"]) == POLICY[task]


def test_each_node_checks_itself_and_the_batch_seal_gathers_them(cosmos: CosmosRun) -> None:
    for task in (0, 1, 2, 3, 4, 5, 8):
        record = json.loads((cosmos.root / "pairs" / pair_of(task) / "period-1.json")
                            .read_text())
        assert sorted(record["idle_check"]["hosts"]) == ["n1", "n2", "n3"], task
        assert record["idle_check"]["passed"] is None  # (no NVML: not made, not passed)
        workers = record["workers"] if "workers" in record else record["attempts"][-1][
            "workers"]
        assert {(w["role"], w["host"]) for w in workers} == {("policy", "n2"),
                                                             ("rollout", "n3")}


def test_sacct_and_the_gate(audited: dict[str, Any], cosmos: CosmosRun) -> None:
    latest: dict[str, tuple[str, str]] = {}
    records: dict[str, int] = {}
    for line in cosmos.dumps["contract-D"].splitlines():
        fields = line.split("|")
        if "." not in fields[0]:
            latest[fields[0]] = (fields[3], fields[4])
            records[fields[0]] = records.get(fields[0], 0) + 1
    assert {int(job.split("_")[1]): state for job, state in latest.items()} == SACCT
    # the retry line requeued its own element only (8, whose job id is the array's): every
    # other element ran once
    assert {int(job.split("_")[1]): n for job, n in records.items() if n > 1} == {8: 2}
    attempts = sorted(p.name for p in (cosmos.root / f"{pair_of(8)}-{GPUS}gpu").iterdir())
    assert len(attempts) == 2 and attempts[1] == f"{attempts[0]}-r1"
    gate = audited["summary"]["gate_allow_partial"]
    assert gate["passed"] is True
    assert sorted(gate["included_configurations"]) == [f"coordinated-on@{GPUS}",
                                                       f"requeue@{GPUS}"]
    assert audited["summary"]["gate"]["passed"] is False


def test_a_step_line_after_a_replica_failed_is_not_the_jobs_cancellation(
        cosmos: CosmosRun, audited: dict[str, Any]) -> None:
    """The launcher stops its other steps once the controller ended; slurmstepd says
    ``*** STEP <job>.<n> ... CANCELLED ***`` for each. Only element 6 was scancelled."""
    for task in (2, 3, 4, 5):
        assert "CANCELLED AT" in cosmos.logs[task], task
        assert audited["periods"][pair_of(task)]["cause"] != "cancelled"


def test_the_pre_timeout_warning_lets_the_trainer_checkpoint(cosmos: CosmosRun) -> None:
    log = cosmos.logs[7]
    assert "[launcher] SIGUSR1: checkpoint requested" in log
    assert "[policy] SIGUSR1: checkpointing" in log
    assert "DUE TO TIME LIMIT" in log  # (it lived on to the limit: USR1 killed nothing)
    for record in _records(cosmos.root, 7).values():
        assert record["received_signal"] == "SIGUSR1"
