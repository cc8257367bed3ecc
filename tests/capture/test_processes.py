"""Many processes in one attempt (contract v1.2), on this machine: ``auditor run --step``, the
process records, seed ``000``'s rule on the controller's own record, and the audit of what
they leave, in both directions.

A local stand-in for the multi-node launcher (:data:`LAUNCHER`: the cosmos roles of
``auditor.capture.multinode_example`` started in the background, each under ``auditor run
--step``, the controller's status returned, its peers reaped) runs under the batch-side
``auditor run --role launcher``; ``auditor seal`` and ``auditor audit`` follow, all through
the real command line. The multi-node form of the same runs on a real Slurm
(``tests/slurm/test_multinode.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest

from auditor._cli import main
from tests.capture.support import (
    COMMIT,
    FLAG,
    attempt_of,
    auditor,
    clean_env,
    load,
    namespaces,
    schema_errors,
    start_auditor,
    wait_for,
)

pytestmark = pytest.mark.slow  # (real child processes, signals)

HOST = socket.gethostname().split(".", 1)[0]
PAIR = "cosmos-local-s1"
LAUNCHER = r"""
mode=$1; rendezvous=$2
step() {
    local role=$1; shift
    exec "$AUDITOR" run --step "$role" --rank 0 -- "$PY" -m auditor.capture.multinode_example \
        "$role" "$@" "$rendezvous"
}
step controller & controller=$!
step policy --mode "$mode" & policy=$!
step rollout & rollout=$!
while :; do wait "$controller"; status=$?; kill -0 "$controller" 2>/dev/null || break; done
echo "[launcher] controller exited with code $status"
kill -TERM "$policy" "$rollout" 2>/dev/null
wait "$policy" "$rollout"
exit "$status"
"""


@pytest.fixture(autouse=True)
def _no_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith(("SLURM_", "AUDITOR_")) or key == FLAG:
            monkeypatch.delenv(key)


def _protocol(root: Path, **changes: Any) -> None:
    document = {"schema": "run-evidence/protocol/v1", "idle_check": "optional",
                "completion_phases": {"policy": ["actor_update", "weight_sync"],
                                      "rollout": ["weight_sync"]}, **changes}
    root.mkdir(parents=True, exist_ok=True)
    (root / "protocol.json").write_text(json.dumps(document))


def _attempt(root: Path, mode: str, flag: str = "1", job: str = "6001",
             kill: str | None = None, before_seal: Any = None,
             flag_name: str = FLAG, kill_wrapper: bool = False,
             prelude: str = "") -> tuple[int, str]:
    """Run the local launcher as one attempt (the batch node's ``auditor run --role
    launcher``, after ``prelude``'s lines), signal the policy replica once it hangs when
    ``kill`` says so, seal; the batch run's exit status and its stderr."""
    launcher = root.parent / "launcher.sh"
    launcher.write_text(prelude + LAUNCHER)
    env = clean_env(AUDITOR=str(Path(sys.executable).parent / "auditor"), PY=sys.executable)
    run = start_auditor(["run", "--root", str(root), "--pair", PAIR, "--period", "1",
                         "--gpus", "2", "--job-id", job, "--role", "launcher",
                         "--dispatch", "TOTAL_TRAINING_STEPS=1",
                         "--dispatch", f"{flag_name}={flag}",
                         "--", "bash", str(launcher), mode, str(root.parent / f"rdv-{job}")],
                        env)
    if kill is not None:
        outputs = attempt_of(root, job, PAIR) / "worker-logs"
        wait_for(lambda: any("waiting in actor_update" in p.read_text()
                             for p in outputs.glob("*-policy-*.out")), 60)
        (output,) = outputs.glob("*-policy-*.out")
        pid = int(output.stem.rsplit("-", 1)[1])
        if kill_wrapper:  # (its ``--step`` wrapper, as a node's death takes it: no record)
            stat = Path(f"/proc/{pid}/stat").read_bytes()
            pid = int(stat[stat.rfind(b")") + 2:].split()[1])
        os.kill(pid, getattr(signal, kill))
    _, stderr = run.communicate(timeout=120)
    if before_seal is not None:
        before_seal(attempt_of(root, job, PAIR))
    sealed = auditor(["seal", str(root), "--pair", PAIR, "--period", "1", "--gpus", "2",
                      "--attempt-dir", f"{PAIR}-2gpu/attempt-{job}", "--commit", COMMIT,
                      "--workload", "w", "--seed", "1", "--model", "m"])
    assert sealed.returncode == 0, sealed.stderr
    return run.returncode, stderr


def _audit(root: Path, out: Path) -> dict[str, Any]:
    assert main(["audit", str(root), "--out", str(out), "--quiet", "--no-plots"]) == 0
    (row,) = pq.read_table(out / "periods.parquet").to_pylist()
    return row


def _records(root: Path, job: str = "6001") -> dict[str, dict[str, Any]]:
    folder = attempt_of(root, job, PAIR) / "processes"
    return {record["role"]: record for record in map(load, folder.glob("*.json"))}


def test_a_coordinated_shutdown_of_many_processes_resolves(tmp_path: Path) -> None:
    root = tmp_path / "study"
    _protocol(root)
    status, stderr = _attempt(root, "completed")
    assert status == 0, stderr  # (the batch script would not requeue it)
    records = _records(root)
    assert records["controller"]["exit_code"] == 143
    assert records["controller"]["host"] == HOST
    assert records["policy"]["exit_code"] == 0
    for record in records.values():
        assert schema_errors("process", record) == []
    trial = load(attempt_of(root, "6001", PAIR) / "trial-6001.json")
    assert trial["status"] == "completed" and trial["process_records"] >= 2
    row = _audit(root, tmp_path / "out")
    assert (row["verdict"], row["reason"]) == ("resolved", "completed")
    # (contract v1.2: the excused shutdown names the controller, the 143, the flag and its
    # value, and that no signal was received; ranks numbered by role are named by it)
    report = (tmp_path / "out" / "diagnostic.md").read_text()
    assert re.search(r"the controller \(pid \d+ on [^)]+\) exited 143 by coordinated "
                     rf"shutdown \(`{FLAG}=1`\) and no signal was received", report)
    assert "ranks policy 0, rollout 0" in report


@pytest.mark.parametrize(("mode", "kill", "reason", "cause"), [
    ("hang", "SIGTERM", "killed", "signal"),
    ("hang", "SIGKILL", "killed", "signal"),
    ("crash", None, "unclean_exit", "python_exception"),
])
def test_a_replicas_end_is_never_the_controllers_coordinated_shutdown(
        tmp_path: Path, mode: str, kill: str | None, reason: str, cause: str) -> None:
    """Seed 000's false success: the replica died, so the controller shut down
    "coordinated" (its own 143, the flag on, no signal); the kit at run time and the audit
    after both refuse it, naming the replica."""
    root = tmp_path / "study"
    _protocol(root)
    status, stderr = _attempt(root, mode, kill=kill)
    assert status == 143, stderr
    records = _records(root)
    assert (records["controller"]["exit_code"], records["controller"]["received_signal"]) \
        == (143, None)
    policy = records["policy"]
    assert policy["ended_ns"] <= records["controller"]["ended_ns"]
    row = _audit(root, tmp_path / "out")
    assert (row["verdict"], row["reason"], row["cause"]) == ("unresolved", reason, cause)
    if kill is not None:
        assert f"the policy process (pid {policy['pid']} on {HOST})" in row["cause_detail"]


def test_every_step_classifies_by_the_protocols_flag(tmp_path: Path) -> None:
    """The batch run takes the protocol's coordinated_shutdown_flag and each ``--step`` the
    batch run's (``AUDITOR_SHUTDOWN_FLAG``): the controller's step exits 0, not 143."""
    root = tmp_path / "study"
    _protocol(root, coordinated_shutdown_flag="SITE_FLAG")
    status, stderr = _attempt(root, "completed", flag_name="SITE_FLAG")
    assert status == 0, stderr
    assert "[launcher] controller exited with code 0" in (
        attempt_of(root, "6001", PAIR) / "training-6001.log").read_text()
    assert (_audit(root, tmp_path / "out")["verdict"]) == "resolved"


def test_a_step_that_left_no_record_is_never_the_controllers_excuse(tmp_path: Path) -> None:
    """A step's wrapper killed (or still running at the seal) leaves its output and no
    record: the replica may have failed, so the controller's 143 after it is not excused
    (seed 000's case: its replicas gone, the controller shut down "coordinated")."""
    def lose_the_policys_record(attempt: Path) -> None:
        (record,) = (attempt / "processes").glob("*-policy-*.json")
        record.unlink()

    root = tmp_path / "study"
    _protocol(root)
    assert _attempt(root, "completed", before_seal=lose_the_policys_record)[0] == 0
    row = _audit(root, tmp_path / "out")
    assert row["verdict"] == "unresolved", row
    # (what ended it is unrecorded: never the controller's own 143, "killed by SIGTERM")
    assert (row["cause"], row["cause_detail"].split(":")[0]) == (
        "unknown", f"the policy process (pid {row['cause_detail'].split('pid ')[1].split(' ')[0]}"
        f" on {HOST}) left no process record, only its output"), row
    assert "policy process (pid" in (tmp_path / "out" / "diagnostic.md").read_text() \
        and "left no process record, only its output" in (
            tmp_path / "out" / "diagnostic.md").read_text()


def test_a_step_whose_wrapper_died_is_never_the_controllers_excuse_at_run_time(
        tmp_path: Path) -> None:
    """Review R: a replica's node died (its ``--step`` wrapper SIGKILLed: output, no
    record); the controller shut down "coordinated" once its heartbeat stopped. The audit
    refused the 143 (the step's end unknown), but the batch run judged by its records alone
    and exited 0, "completed": a batch script would not requeue the lost run. It now weighs
    the step's output as the audit does."""
    root = tmp_path / "study"
    _protocol(root)
    status, stderr = _attempt(root, "hang", kill="SIGKILL", kill_wrapper=True)
    assert status == 1, stderr  # (the controller's step excused itself: it saw no record)
    trial = load(attempt_of(root, "6001", PAIR) / "trial-6001.json")
    assert trial["status"] == "process_failure"
    assert "policy process (pid" in stderr and "left no process record" in stderr
    assert _audit(root, tmp_path / "out")["verdict"] == "unresolved"


def test_a_replica_lost_with_a_node_nothing_else_names_is_never_the_controllers_excuse(
        tmp_path: Path) -> None:
    """A CPU-only replica on a node of its own (its own hostname, ``n9``), whose node dies
    (its ``--step`` wrapper SIGKILLed: no record, no trace, no device file) before the
    controller's coordinated shutdown: its output is the one file naming that node. The
    batch run kept no worker logs itself (its trial record says so), so that output is a
    step's: the run exits 1, ``process_failure``, and the audit refuses the 143. It was
    weighed only on a host another file named: the 143 was excused, the lost run never
    requeued (seed 000's case)."""
    if namespaces() is None:
        pytest.skip("no user and UTS namespaces here (unshare)")
    # (no pid namespace: its first process, the wrapper, would ignore the command's SIGKILL)
    node = " ".join(["unshare", "--user", "--map-root-user", "--uts", "sh", "-c",
                     "'hostname n9; exec \"$0\" run --step rollout --rank 1 -- sh -c "
                     "\"echo generating; sleep 0.5; kill -KILL \\$PPID; sleep 1\"'"])
    root = tmp_path / "study"
    _protocol(root)
    status, stderr = _attempt(root, "completed", prelude=f'{node} "$AUDITOR"\n')
    trial = load(attempt_of(root, "6001", PAIR) / "trial-6001.json")
    (lost,) = (attempt_of(root, "6001", PAIR) / "worker-logs").glob("n9-rollout-*.out")
    assert (status, trial["status"], trial["worker_logs"]["kept"]) == (1, "process_failure", [])
    assert "rollout process (pid" in stderr and "on n9) left no process record" in stderr
    row = _audit(root, tmp_path / "out")
    assert row["verdict"] == "unresolved", row
    output = lost.relative_to(root).as_posix()
    assert row["diagnosis"].startswith("Exit: exit 1; the rollout process (pid ") \
        and f"on n9) left no process record, only its output `{output}`" in row["diagnosis"]


def test_a_replica_slurm_reaped_after_the_controllers_end_on_a_site_not_on_utc(
        tmp_path: Path) -> None:
    """srun's cancellation reaps the rollout after the controller's coordinated shutdown:
    its wrapper SIGKILLed at once (no record), the batch log's ``*** STEP ... CANCELLED AT
    <time> ***`` after the controller's wrapper's line. slurmstepd prints its local time:
    on a site at UTC-5 that time, read as UTC, was five hours before the controller's end,
    so the reaped replica was the shutdown's cause and every finished run was refused. The
    log's order decides: resolved. The same line before the controller's is never its
    reaping."""
    def reaped_by_srun(before: bool) -> Any:
        def edit(attempt: Path) -> None:
            (record,) = (attempt / "processes").glob("*-rollout-*.json")
            record.unlink()  # (SIGKILLed at once: no provisional record)
            log = attempt / "training-6001.log"
            at = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - 5 * 3600))
            cancelled = f"slurmstepd: error: *** STEP 6001.2 ON {HOST} CANCELLED AT {at} ***\n"
            lines = log.read_text().splitlines(keepends=True)
            (at_line,) = [n for n, line in enumerate(lines)
                          if line.startswith("auditor run --step controller: command exited")]
            lines.insert(at_line + (0 if before else 1), cancelled)
            log.write_text("".join(lines))
        return edit

    for before, verdict in ((False, "resolved"), (True, "unresolved")):
        root = tmp_path / f"study-{before}"
        _protocol(root)
        assert _attempt(root, "completed", before_seal=reaped_by_srun(before))[0] == 0
        assert _audit(root, tmp_path / f"out-{before}")["verdict"] == verdict, before


def test_an_earlier_attempts_controller_line_printed_again_never_marks_this_ones_end(
        tmp_path: Path) -> None:
    """A launcher prints the previous attempt's log tail at its start (a requeue-aware one
    does): that attempt's controller line, ``auditor run --step controller: command exited
    with 143; ... process record .../attempt-5999/processes/<host>-controller-4242.json``,
    comes first. It marked the controller's end, so a replica Slurm cancelled before this
    controller's real end read as reaped after it, and the 143 was excused. The wrapper's
    line counts only where it names this attempt's controller record: unresolved."""
    def earlier_line_then_lost(attempt: Path) -> None:
        (record,) = (attempt / "processes").glob("*-rollout-*.json")
        record.unlink()  # (its wrapper SIGKILLed: no record)
        log = attempt / "training-6001.log"
        lines = log.read_text().splitlines(keepends=True)
        (at,) = [n for n, line in enumerate(lines)
                 if line.startswith("auditor run --step controller: command exited")]
        lines[at:at] = [
            "auditor run --step controller: command exited with 143; coordinated_shutdown: "
            f"exit 0; process record /x/attempt-5999/processes/{HOST}-controller-4242.json\n",
            f"slurmstepd: error: *** STEP 6001.2 ON {HOST} CANCELLED AT 2026-12-07T09:11:48"
            " ***\n"]
        log.write_text("".join(lines))

    root = tmp_path / "study"
    _protocol(root)
    assert _attempt(root, "completed", before_seal=earlier_line_then_lost)[0] == 0
    row = _audit(root, tmp_path / "out")
    assert row["verdict"] == "unresolved", row
    assert "rollout process (pid" in row["diagnosis"], row["diagnosis"]


def test_a_step_cancelled_before_the_controllers_end_is_never_reaped_by_a_later_one(
        tmp_path: Path) -> None:
    """Review: two steps on one node, both without their record: Slurm cancelled the policy's
    step before the controller's coordinated shutdown (``STEP 6001.1``), and reaped the
    rollout's after it (``STEP 6001.2``, the same node). By node, the last line decided:
    the policy lost before the controller's end read as reaped, and the 143 was excused. A
    node is reaped only where every line of it comes after the controller's."""
    def cancelled_before_and_reaped_after(attempt: Path) -> None:
        for record in (attempt / "processes").glob("*-*-*.json"):
            if "-controller-" not in record.name:
                record.unlink()  # (both wrappers SIGKILLed: no record)
        log = attempt / "training-6001.log"
        at = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
        lines = log.read_text().splitlines(keepends=True)
        (at_line,) = [n for n, line in enumerate(lines)
                      if line.startswith("auditor run --step controller: command exited")]
        lines.insert(at_line + 1, f"slurmstepd: error: *** STEP 6001.2 ON {HOST} "
                                  f"CANCELLED AT {at} ***\n")
        lines.insert(at_line, f"slurmstepd: error: *** STEP 6001.1 ON {HOST} "
                              f"CANCELLED AT {at} ***\n")
        log.write_text("".join(lines))

    root = tmp_path / "study"
    _protocol(root)
    assert _attempt(root, "completed", before_seal=cancelled_before_and_reaped_after)[0] == 0
    row = _audit(root, tmp_path / "out")
    assert (row["verdict"], row["cause"]) == ("unresolved", "unknown"), row
    assert "policy process (pid" in row["cause_detail"], row


def test_a_replica_reaped_among_many_nodes_lines_is_read_whatever_the_event_cap(
        tmp_path: Path) -> None:
    """Review: Slurm reaps 131 nodes' steps after the controller's coordinated shutdown
    (a ``Killed`` line and a ``STEP`` line each: 262 events after the controller's). The
    reaping was read from the training log's capped events (200: the first 150, the last
    50), so this node's line in the middle was dropped, its replica's end unknown, and the
    finished run refused (the kit, reading the whole log, said completed). Resolved."""
    def reaped_among_many(attempt: Path) -> None:
        (record,) = (attempt / "processes").glob("*-rollout-*.json")
        record.unlink()  # (SIGKILLed at once: no provisional record)
        log = attempt / "training-6001.log"
        at = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
        lines = log.read_text().splitlines(keepends=True)
        (at_line,) = [n for n, line in enumerate(lines)
                      if line.startswith("auditor run --step controller: command exited")]
        nodes = [f"x{i}" for i in range(130)]
        nodes.insert(80, HOST)
        lines[at_line + 1:at_line + 1] = [
            text for node in nodes for text in (
                f"srun: error: {node}: task 0: Killed\n",
                f"slurmstepd: error: *** STEP 6001.9 ON {node} CANCELLED AT {at} ***\n")]
        log.write_text("".join(lines))

    root = tmp_path / "study"
    _protocol(root)
    assert _attempt(root, "completed", before_seal=reaped_among_many)[0] == 0
    row = _audit(root, tmp_path / "out")
    assert (row["verdict"], row["cause"]) == ("resolved", None), row


FINISHED_CONTROLLER = r"""
mode=$1; rendezvous=$2
step() { local role=$1; shift; exec "$AUDITOR" run --step "$role" --rank 0 -- "$@"; }
step rollout "$PY" -m auditor.capture.multinode_example rollout "$rendezvous" & rollout=$!
step policy "$PY" -m auditor.capture.multinode_example policy --mode "$mode" "$rendezvous" &
policy=$!
wait "$policy"
step controller sh -c 'echo "[controller] the policy finished; exit 0"' & controller=$!
wait "$controller"; status=$?
echo "[launcher] controller exited with code $status"
kill -TERM "$rollout" 2>/dev/null; wait "$rollout"
exit "$status"
"""
"""A launcher whose controller ends cleanly (exit 0) once the policy finished, then stops
the rollout replica that still drains, as launchers do."""


CRASHED_AFTER_CONTROLLER = FINISHED_CONTROLLER.replace(
    'kill -TERM "$rollout" 2>/dev/null; wait "$rollout"',
    # (the rollout's own command dies by SIGSEGV once the controller ended, before the
    # launcher stops it: its record says exit 139, signal SIGSEGV, no signal received)
    'for log in "$AUDITOR_ATTEMPT_DIR"/worker-logs/*-rollout-*.out; do\n'
    '    pid=${log##*-}; kill -SEGV "${pid%.out}"; done\n'
    'wait "$rollout"')


def _finished(tmp_path: Path, launcher: str, edit: Any = None, mode: str = "completed"
              ) -> tuple[int, str, dict[str, dict[str, Any]], dict[str, Any]]:
    """Run ``launcher`` (a :data:`FINISHED_CONTROLLER` of its own) as one attempt, its policy
    in ``mode``, apply
    ``edit`` to the attempt, seal and audit: the batch run's status and stderr, the process
    records, the audit's row."""
    root = tmp_path / "study"
    _protocol(root)
    script = tmp_path / "finished.sh"
    script.write_text(launcher)
    env = clean_env(AUDITOR=str(Path(sys.executable).parent / "auditor"), PY=sys.executable)
    done = auditor(["run", "--root", str(root), "--pair", PAIR, "--period", "1", "--gpus",
                    "2", "--job-id", "6001", "--role", "launcher", "--dispatch",
                    "TOTAL_TRAINING_STEPS=1", "--", "bash", str(script), mode,
                    str(tmp_path / "rdv")], env=env, timeout=120)
    records = _records(root)
    if edit is not None:
        edit(attempt_of(root, "6001", PAIR), records)
    sealed = auditor(["seal", str(root), "--pair", PAIR, "--period", "1", "--gpus", "2",
                      "--attempt-dir", f"{PAIR}-2gpu/attempt-6001", "--commit", COMMIT,
                      "--workload", "w", "--seed", "1", "--model", "m"])
    assert sealed.returncode == 0, sealed.stderr
    return done.returncode, done.stderr, records, _audit(root, tmp_path / "out")


def _reaped_by_srun(attempt: Path, records: dict[str, dict[str, Any]],
                    said: tuple[bool, str] | None = None) -> None:
    """The rollout reaped by srun's cancellation after the controller's exit 0: its record
    gone (its wrapper SIGKILLed at once), Slurm's STEP line after the controller's wrapper
    line; ``said``: a launcher's line put before that wrapper line (True) or after Slurm's."""
    (attempt / "processes" / f"{HOST}-rollout-{records['rollout']['pid']}.json").unlink()
    log = attempt / "training-6001.log"
    lines = log.read_text().splitlines(keepends=True)
    (at,) = [n for n, line in enumerate(lines)
             if line.startswith("auditor run --step controller: command exited with 0")]
    lines.insert(at + 1, f"slurmstepd: error: *** STEP 6001.0 ON {HOST} CANCELLED AT "
                         "2026-12-07T04:11:48 ***\n")
    if said is not None:
        lines.insert(at if said[0] else at + 2, said[1])
    log.write_text("".join(lines))


@pytest.mark.parametrize(("mode", "srun", "status", "verdict"), [
    ("completed", False, 0, "resolved"), ("completed", True, 0, "resolved"),
    ("crash", False, 1, "unresolved")])
def test_a_peer_stopped_after_the_controllers_clean_exit_is_the_launchers_reaping(
        tmp_path: Path, mode: str, srun: bool, status: int, verdict: str) -> None:
    """The controller exits 0 (no coordinated shutdown), then the launcher stops the rollout
    replica (SIGTERM: its record says 143, received SIGTERM, after the controller's end): a
    knock-on of the finished run, as after an excused 143. It was a ``process_failure``: the
    kit exited 1 and the audit refused a finished run (seed 000's bug, another way). Stopped
    by srun's cancellation instead (``srun``: no record, a ``STEP`` line after the
    controller's), the same; the controller's line then says no "coordinated_shutdown", and
    the scan reads it by its "exited with". A policy that crashed before the controller's
    end is never excused so."""
    done, stderr, records, row = _finished(tmp_path, FINISHED_CONTROLLER,
                                           _reaped_by_srun if srun else None, mode)
    assert done == status, stderr
    assert (records["controller"]["exit_code"], records["rollout"]["exit_code"],
            records["rollout"]["received_signal"]) == (0, 143, "SIGTERM"), records
    assert records["rollout"]["ended_ns"] > records["controller"]["ended_ns"]
    assert row["verdict"] == verdict, row
    if verdict == "resolved":
        assert "the controller (pid" in row["diagnosis"] \
            and "exited 0, and the launcher stopped 1 other process after it" \
            in row["diagnosis"], row["diagnosis"]


def test_a_replica_that_crashed_by_a_signal_after_the_controllers_exit_0_is_no_reaping(
        tmp_path: Path) -> None:
    """Review of 8f4ea29: the controller exits 0, then the rollout's command dies by SIGSEGV
    (exit 139, ``signal`` SIGSEGV, its wrapper told nothing) before the launcher stops it.
    Any ``signal`` in its record read as the launcher's reaping: the kit said completed and
    the audit resolved the run, its diagnosis saying the launcher stopped it. A crash's
    signal is never the launcher's stopping: ``process_failure``, unresolved."""
    status, stderr, records, row = _finished(tmp_path, CRASHED_AFTER_CONTROLLER)
    rollout = records["rollout"]
    assert (rollout["exit_code"], rollout["signal"], rollout["received_signal"]) \
        == (139, "SIGSEGV", None), rollout
    assert rollout["ended_ns"] > records["controller"]["ended_ns"]
    assert status == 1, stderr  # (the kit's own check: process_failure, rerun)
    assert row["verdict"] == "unresolved", row
    assert "rollout process (pid" in row["diagnosis"] and "exited 139" in row["diagnosis"]
    assert "the launcher stopped" not in row["diagnosis"], row["diagnosis"]


@pytest.mark.parametrize(("said_before", "verdict"), [(True, "unresolved"),
                                                      (False, "resolved")])
def test_the_launchers_line_that_a_replica_exited_before_the_controllers_exit_0_is_heard(
        tmp_path: Path, said_before: bool, verdict: str) -> None:
    """Review of 8f4ea29: the rollout's wrapper left no record (SIGKILLed), Slurm's STEP
    line for its node comes after the controller's (exit 0) wrapper line, and the
    launcher's own log says ``rollout exited with code 137`` before it. After an excused
    143 that line refuses the excuse (``attributed_in_log``); after the controller's exit 0
    it was never read, and the lost replica passed for the launcher's reaping: resolved.
    Unresolved now, citing the line; the same line after the controller's end (the
    launcher reporting its own reaping) still resolves."""
    def lost_and_said(attempt: Path, records: dict[str, dict[str, Any]]) -> None:
        _reaped_by_srun(attempt, records, said=(said_before, "[launcher] rollout exited with "
                                                             "code 137\n"))

    _, _, _, row = _finished(tmp_path, FINISHED_CONTROLLER, lost_and_said)
    assert row["verdict"] == verdict, row
    if said_before:
        assert "the launcher's log says rollout exited with code 137 before the controller " \
               "ended" in row["diagnosis"], row["diagnosis"]


def test_the_launchers_word_on_its_own_reaping_after_the_controllers_exit_0_is_no_cause(
        tmp_path: Path) -> None:
    """The launcher reports the rollout it stopped after the controller's exit 0
    (``rollout exited with code 143``, after the controller's wrapper line): its reaping, the
    kit's check and the audit both stop reading the launcher's lines at the controller's end
    (a controller's exit 0 gives no line of its own to stop at). Completed, resolved."""
    reported = FINISHED_CONTROLLER.replace(
        'kill -TERM "$rollout" 2>/dev/null; wait "$rollout"',
        'kill -TERM "$rollout" 2>/dev/null; wait "$rollout"\n'
        'echo "[launcher] rollout exited with code $?"')
    status, stderr, records, row = _finished(tmp_path, reported)
    assert records["rollout"]["exit_code"] == 143, records
    assert status == 0, stderr
    assert row["verdict"] == "resolved", row

def test_a_launchers_late_word_of_a_replicas_failure_still_refuses_a_coordinated_143(
        tmp_path: Path) -> None:
    """After a coordinated 143 the launcher's lines are read up to its own line about the
    controller, as before: a launcher that reports a replica's failure late, between the
    controller's wrapper line and that line (``policy exited with code 1``), still refuses
    the excuse. Only after a controller's exit 0, which gives no such line, does the
    wrapper's line end the reading (516da35's mend stopped there for every ending)."""
    def said_late(attempt: Path) -> None:
        log = attempt / "training-6001.log"
        lines = log.read_text().splitlines(keepends=True)
        (at,) = [n for n, line in enumerate(lines)
                 if line.startswith("auditor run --step controller: command exited")]
        lines.insert(at + 1, "[launcher] policy exited with code 1\n")
        log.write_text("".join(lines))

    root = tmp_path / "study"
    _protocol(root)
    assert _attempt(root, "completed", before_seal=said_late)[0] == 0
    assert _audit(root, tmp_path / "out")["verdict"] == "unresolved"


def test_the_flag_off_passes_the_controllers_143_on(tmp_path: Path) -> None:
    root = tmp_path / "study"
    _protocol(root)
    status, _ = _attempt(root, "completed", flag="0")
    assert status == 143
    row = _audit(root, tmp_path / "out")
    assert (row["verdict"], row["reason"]) == ("unresolved", "killed")


def test_a_role_the_protocol_names_no_phases_for_never_completes(tmp_path: Path) -> None:
    root = tmp_path / "study"
    _protocol(root, completion_phases={"policy": ["actor_update", "weight_sync"]})
    assert _attempt(root, "completed")[0] == 0
    row = _audit(root, tmp_path / "out")
    assert (row["verdict"], row["reason"]) == ("unresolved", "completion_phase_missing")


def test_a_step_writes_only_its_record_and_output(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    attempt = tmp_path / "attempt"
    attempt.mkdir()
    monkeypatch.setenv("AUDITOR_ATTEMPT_DIR", str(attempt))
    assert main(["run", "--step", "policy", "--rank", "1", "--", "sh", "-c",
                 "echo replica says hello; exit 3"]) == 3
    (record,) = (attempt / "processes").iterdir()
    document = load(record)
    assert record.name == f"{HOST}-policy-{document['pid']}.json"
    assert (document["role"], document["rank"], document["exit_code"], document["signal"]) \
        == ("policy", 1, 3, None)
    assert (attempt / "worker-logs" / f"{HOST}-policy-{document['pid']}.out").read_text() \
        .startswith("replica says hello")
    assert sorted(p.name for p in attempt.iterdir()) == ["processes", "worker-logs"]


def test_a_step_whose_record_cannot_be_written_passes_the_commands_exit_on(
        tmp_path: Path) -> None:
    """The process record could not be written (a full disk; here a file-size limit): the
    step says so in one line and exits with the command's own status, 3, not 2 (which a
    launcher passing it on reports as another failure)."""
    import resource
    import subprocess

    attempt = tmp_path / "attempt"
    attempt.mkdir()

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))

    done = subprocess.run([sys.executable, "-m", "auditor", "run", "--step", "policy", "--",
                           "sh", "-c", "exit 3"], env=clean_env(AUDITOR_ATTEMPT_DIR=str(attempt)),
                          capture_output=True, text=True, timeout=60, preexec_fn=limited,
                          check=False)
    assert done.returncode == 3, done.stderr
    assert "the process record could not be written" in done.stderr
    assert "the command's own exit, 3, is passed on" in done.stderr


@pytest.mark.parametrize("linked", ["worker-logs", "processes"])
def test_a_step_never_writes_through_a_folder_that_is_a_link(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, linked: str) -> None:
    """A link put in the place of ``processes`` or ``worker-logs`` (docs/security.md: a
    group member who can write the study's folders) led the step's files out of the attempt:
    refused, nothing written there."""
    attempt, outside = tmp_path / "attempt", tmp_path / "outside"
    attempt.mkdir()
    outside.mkdir()
    (attempt / linked).symlink_to(outside)
    monkeypatch.setenv("AUDITOR_ATTEMPT_DIR", str(attempt))
    assert main(["run", "--step", "policy", "--", "sh", "-c", "exit 3"]) in (2, 3)
    assert list(outside.iterdir()) == []


def test_a_step_killed_in_its_grace_leaves_when_it_was_told_to_end(tmp_path: Path) -> None:
    """srun's cancellation of a step: SIGTERM, then SIGKILL after KillWait, shorter than the
    wrapper's grace. The wrapper writes a provisional record as it is told to end (no exit
    yet, the signal, the time), so a replica reaped after the controller's end is never
    a process of unknown end; one that ends in its grace replaces it with its own."""
    attempt = tmp_path / "attempt"
    attempt.mkdir()
    env = clean_env(AUDITOR_ATTEMPT_DIR=str(attempt))
    step = start_auditor(["run", "--step", "rollout", "--", "sh", "-c",
                          "trap '' TERM; echo up; sleep 30"], env)

    def up() -> bool:
        outputs = list((attempt / "worker-logs").glob("*-rollout-*.out"))
        return bool(outputs) and "up" in outputs[0].read_text()

    wait_for(up)
    told = time.time_ns()
    step.send_signal(signal.SIGTERM)
    wait_for(lambda: any((attempt / "processes").glob("*.json")), 10)
    step.kill()
    step.communicate(timeout=30)
    (record,) = (attempt / "processes").glob("*-rollout-*.json")
    document = load(record)
    assert (document["provisional"], document["exit_code"], document["received_signal"]) \
        == (True, None, "SIGTERM")
    assert told <= document["ended_ns"] <= time.time_ns()
    with contextlib.suppress(ProcessLookupError):  # (the command, left: ours to end)
        os.kill(int(record.stem.rsplit("-", 1)[1]), signal.SIGKILL)


def test_a_step_outside_an_attempt_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--step", "policy", "--", "true"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "AUDITOR_ATTEMPT_DIR is not set" in err[0]
    assert main(["run", "--step", "po-licy", "--attempt-dir", ".", "--", "true"]) == 2
    assert main(["run", "--step", "policy", "--pair", "p", "--", "true"]) == 2


def test_a_launchers_line_names_another_roles_143_in_evidence_without_records(
        tmp_path: Path) -> None:
    """The v1.1 placement (one ``auditor run --role controller`` around the whole launcher,
    no process records): a launcher that says ``policy exited with code 143`` before its
    controller's end makes the controller's 143 a kill, in the kit and in the audit; the
    same run without that line is the coordinated shutdown it always was."""
    root = tmp_path / "study"
    _protocol(root, completion_phases=["actor_update", "weight_sync"])
    for job, said in (("6101", "echo '[launcher] policy exited with code 143'; "), ("6102", "")):
        code = main(["run", "--root", str(root), "--pair", PAIR, "--period", "1",
                     "--gpus", "2", "--job-id", job, "--role", "controller", "--dispatch",
                     f"{FLAG}=1", "--", "bash", "-c", f"{said}kill -TERM $$"])
        trial = load(attempt_of(root, job, PAIR) / f"trial-{job}.json")
        if said:
            assert code == 143 and trial["status"] == "sigterm"
            assert "the launcher's log says policy exited with code 143" in \
                trial["status_detail"]
        else:
            assert code == 0 and trial["status"] == "completed"


def test_the_pre_timeout_signal_starts_no_kill_timer(tmp_path: Path) -> None:
    """``--grace`` counts from SIGTERM or SIGINT; SIGUSR1 (Slurm's warning) is forwarded
    and recorded and kills nothing: a trainer that checkpoints goes on."""
    marker = tmp_path / "started"
    code = (f"import pathlib, signal, time; signal.signal(signal.SIGUSR1, lambda *_: "
            f"print('checkpoint', flush=True)); pathlib.Path({str(marker)!r}).touch(); "
            "time.sleep(2.5); print('finished', flush=True)")
    wrapper = start_auditor(["run", "--pair", PAIR, "--period", "1", "--gpus", "2", "--root",
                             str(tmp_path), "--job-id", "6201", "--grace", "0.5", "--",
                             sys.executable, "-c", code], clean_env())
    wait_for(marker.exists, 30)
    wrapper.send_signal(signal.SIGUSR1)
    wrapper.communicate(timeout=60)
    log = (attempt_of(tmp_path, "6201", PAIR) / "training-6201.log").read_text()
    assert "checkpoint" in log and "finished" in log  # (alive 2 s past the grace)
    trial = load(attempt_of(tmp_path, "6201", PAIR) / "trial-6201.json")
    assert trial["killed_after_grace"] is False
    assert trial["invocation"]["received_signal"] == "SIGUSR1"
    assert wrapper.returncode == 128 + signal.SIGUSR1  # (signalled: never a success)
    # the record says the wrapper's status, and its detail says the same (the command's own
    # 0 is its process's): as the audit will read it
    assert trial["invocation"]["exit_code"] == 138 and trial["processes"][0]["exit_code"] == 0
    assert "(invocation exit 138)" in trial["status_detail"], trial["status_detail"]


def test_a_library_launcher_records_its_childrens_exits(tmp_path: Path) -> None:
    import subprocess

    from auditor.capture.processes import record_exit

    child = subprocess.Popen([sys.executable, "-c", "import os; os.kill(os.getpid(), 15)"])
    started = time.time_ns()
    child.wait()
    path = record_exit("rollout", child.pid, child.returncode, started_ns=started, rank=2,
                       attempt_dir=tmp_path)
    document = orjson.loads(path.read_bytes())
    assert (document["exit_code"], document["signal"], document["rank"]) == (143, "SIGTERM", 2)
    # (outside a job, no AUDITOR_JOB_ID nor SLURM_JOB_ID: no job_id, never a null the
    # kit's own schema refuses)
    assert "job_id" not in document and schema_errors("process", document) == []
    with pytest.raises(FileExistsError):
        record_exit("rollout", child.pid, 0, attempt_dir=tmp_path)
    with pytest.raises(ValueError, match="role"):
        record_exit("roll-out", 1, 0, attempt_dir=tmp_path)


def test_a_broken_process_record_is_a_finding_naming_it(tmp_path: Path) -> None:
    """A process record of the wrong shape (or not JSON) is a finding about that file, never
    a crash, and never an excuse: the attempt cannot resolve on it."""
    root = tmp_path / "study"
    _protocol(root)
    assert _attempt(root, "completed")[0] == 0
    folder = attempt_of(root, "6001", PAIR) / "processes"
    records = sorted(folder.glob("*.json"))
    records[0].write_text('{"role": 5, "pid": "x", "exit_code": "143", "host": null}')
    records[-1].write_bytes(b"\xff\xfe not json")
    row = _audit(root, tmp_path / "out")
    assert row["verdict"] == "unresolved"
    findings = pq.read_table(tmp_path / "out" / "findings.parquet").to_pylist()
    named = {f["subject"] for f in findings if f["rule_id"] in ("AUD001", "AUD002", "AUD003")}
    relative = {p.relative_to(root).as_posix() for p in (records[0], records[-1])}
    assert relative <= named, sorted(named)


@pytest.mark.parametrize("forged", ["a_policys_record_says_controller", "another_pid",
                                    "a_policys_record_says_rank"])
def test_a_process_records_name_content_and_the_workers_must_agree(tmp_path: Path,
                                                                   forged: str) -> None:
    """Seed 000's rule reads a process record's role: a policy's record whose content says
    controller (exit 143, the real controller's record gone) would excuse another role's
    143; a controller's record whose content names another pid is no one's. Each is
    ``AUD110``, never a resolved period."""
    def forge(attempt: Path) -> None:
        records = {p.name.split("-")[1]: p for p in (attempt / "processes").glob("*.json")}
        if forged == "another_pid":
            record = load(records["controller"])
            records["controller"].write_text(json.dumps({**record, "pid": 99999}))
            return
        if forged == "a_policys_record_says_rank":  # (srun auditor run --step rank: the
            # wrapper's word for the trainer's role; no contradiction of the controller's)
            record = load(records["policy"])
            records["policy"].unlink()
            (attempt / "processes" / records["policy"].name.replace("-policy-", "-rank-")
             ).write_text(json.dumps({**record, "role": "rank"}))
            return
        records["controller"].unlink()
        record = load(records["policy"])
        records["policy"].write_text(json.dumps(
            {**record, "role": "controller", "exit_code": 143, "signal": "SIGTERM"}))

    root = tmp_path / "study"
    _protocol(root)
    assert _attempt(root, "completed", before_seal=forge)[0] == 0
    row = _audit(root, tmp_path / "out")
    if forged == "a_policys_record_says_rank":
        assert (row["verdict"], row["reason"]) == ("resolved", "completed")
        return
    assert (row["verdict"], row["reason"]) == ("unresolved", "identity_mismatch")
    findings = [f["message"] for f in pq.read_table(tmp_path / "out" / "findings.parquet")
                .to_pylist() if f["rule_id"] == "AUD110"]
    if forged == "another_pid":
        assert any("file name says pid" in m and "content says 99999" in m for m in findings)
    else:
        assert any("file name says role policy, content says controller" in m
                   for m in findings), findings
        assert any("role controller but the period lists pid" in m and "as role policy" in m
                   for m in findings), findings


def test_two_processes_of_one_pid_in_one_trace_is_a_finding_naming_both(tmp_path: Path) -> None:
    """Pids repeat across nodes: a trace whose phase records name two hosts was written by
    two processes (the kit names each node's apart; a v1 launcher's did not)."""
    root = tmp_path / "study"
    _protocol(root)

    def second_writer(attempt: Path) -> None:
        (device,) = (attempt / "device-evidence").glob("worker-policy-*.json")
        trace = attempt / "allocator-traces" / f"allocator-{HOST}-{load(device)['pid']}.jsonl"
        first = json.loads(trace.read_text().splitlines()[0])
        with trace.open("a") as handle:
            handle.write(json.dumps({**first, "host": "other-node", "seq": 10**6}) + "\n")

    assert _attempt(root, "completed", before_seal=second_writer)[0] == 0
    row = _audit(root, tmp_path / "out")
    assert (row["verdict"], row["reason"]) == ("unresolved", "identity_mismatch")
    findings = pq.read_table(tmp_path / "out" / "findings.parquet").to_pylist()
    (two,) = [f["message"] for f in findings if "two processes" in f["message"]]
    assert f"on {HOST} (line 1)" in two and "on other-node (line" in two


def _drop_step_lines(files: list[Path]) -> None:
    """Remove the verl step lines from ``files``, as seed 002's ``ray.shutdown()`` dropped
    the driver's copy of its last one."""
    for path in files:
        path.write_text("".join(line for line in path.read_text().splitlines(True)
                                if "training/global_step" not in line))


def test_a_terminal_line_only_a_worker_printed_resolves_citing_it(tmp_path: Path) -> None:
    root = tmp_path / "study"
    _protocol(root)

    def lose(attempt: Path) -> None:
        _drop_step_lines([attempt / "training-6001.log"])
        for trace in (attempt / "allocator-traces").iterdir():  # (only the worker's copy)
            trace.write_text("".join(line for line in trace.read_text().splitlines(True)
                                     if '"kind":"terminal"' not in line))

    assert _attempt(root, "completed", before_seal=lose)[0] == 0
    row = _audit(root, tmp_path / "out")
    assert (row["verdict"], row["reason"]) == ("resolved", "completed")
    assert "the driver's log lacks `step:1`; worker `" in row["diagnosis"]
    assert "-policy-" in row["diagnosis"] and "printed it at `" in row["diagnosis"]


def test_a_ranks_own_terminal_record_resolves_and_nothing_at_all_does_not(tmp_path: Path
                                                                            ) -> None:
    root = tmp_path / "study"
    _protocol(root)
    assert _attempt(root, "completed", before_seal=lambda attempt: _drop_step_lines(
        [attempt / "training-6001.log", *(attempt / "worker-logs").iterdir()]))[0] == 0
    row = _audit(root, tmp_path / "out")
    assert (row["verdict"], row["reason"]) == ("resolved", "completed")
    assert "rank 0 recorded its terminal record for step 1" in row["diagnosis"]
    # the same evidence, the protocol allowing the driver's log only: the seed's verdict
    _protocol(root, terminal_event={"sources": ["training_log"]})
    row = _audit(root, tmp_path / "out-driver-only")
    assert (row["verdict"], row["reason"]) == ("unresolved", "terminal_event_missing")


def test_a_study_without_a_scheduler_needs_no_dump(tmp_path: Path) -> None:
    """``"scheduler": "none"`` (plain torchrun, Ray on Kubernetes): no sacct dump is expected,
    its absence fails nothing, and the allocation scope is said to be not measured; the same
    study under the default protocol fails the gate for the missing dump (AUD123)."""
    root = tmp_path / "study"
    _protocol(root, scheduler="none")
    assert _attempt(root, "completed")[0] == 0
    out = tmp_path / "out"
    row = _audit(root, out)
    assert (row["verdict"], row["reason"]) == ("resolved", "completed")
    rules = {f["rule_id"] for f in pq.read_table(out / "findings.parquet").to_pylist()}
    assert "AUD123" not in rules
    assert main(["gate", str(out)]) == 0
    report = (out / "diagnostic.md").read_text()
    assert "the allocation scope is not measured" in report and "**not measured**" in report
    _protocol(root)
    assert main(["audit", str(root), "--out", str(tmp_path / "slurm"), "--quiet",
                 "--no-plots"]) == 0
    assert main(["gate", str(tmp_path / "slurm")]) == 1


@pytest.mark.parametrize(("written", "rule_form"), [
    ({HOST: True}, None),
    ({HOST: False}, "host_failed"),
    ({"other-node": True}, "host_absent"),
    ({HOST: None}, "host_unavailable"),
])
def test_every_worker_hosts_own_idle_check_decides_under_a_required_policy(
        tmp_path: Path, written: dict[str, bool | None], rule_form: str | None) -> None:
    """Contract v1.2: the seal gathers each node's ``idle/<host>.json``; under
    ``"idle_check": "required"`` the period needs a passed check of every worker's host:
    one that failed, is absent, or could not be made leaves it unresolved, naming the host."""
    root = tmp_path / "study"
    _protocol(root, idle_check="required")

    def checks(attempt: Path) -> None:
        (attempt / "idle").mkdir()
        for host, passed in written.items():
            (attempt / "idle" / f"{host}.json").write_text(json.dumps(
                {"schema": "run-evidence/idle-check/v1", "host": host, "passed": passed,
                 "unavailable": None if passed is not None else "no NVML",
                 "checked_ns": time.time_ns()}))  # (after the run, as a node's check is)

    assert _attempt(root, "completed", before_seal=checks)[0] == 0
    record = load(root / "pairs" / PAIR / "period-1.json")
    assert sorted(record["idle_check"]["hosts"]) == sorted(written)
    row = _audit(root, tmp_path / "out")
    findings = pq.read_table(tmp_path / "out" / "findings.parquet").to_pylist()
    idle = [f["message"] for f in findings if f["rule_id"] == "AUD118"]
    if rule_form is None:
        assert (row["verdict"], idle) == ("resolved", [])
    else:
        assert (row["verdict"], row["reason"]) == ("unresolved", "idle_check_failed")
        assert len(idle) == 1 and HOST in idle[0], idle


def test_the_wrappers_notes_never_split_a_line_of_the_commands(tmp_path: Path) -> None:
    """A signal that reaches the wrapper while the command is half-way through a line: the
    wrapper's note waits for the line's end, so a terminal line stays whole."""
    marker = tmp_path / "half"
    # (the command finishes its line half a second after the forwarded signal reached it:
    # the wrapper's note, made as the signal came, would be written in between)
    code = ("import pathlib, signal, sys, time; got = []; "
            "signal.signal(signal.SIGUSR1, lambda *_: got.append(1)); "
            "sys.stdout.write('step:1 - train'); sys.stdout.flush(); "
            f"pathlib.Path({str(marker)!r}).touch(); end = time.monotonic() + 30\n"
            "while not got and time.monotonic() < end: time.sleep(0.01)\n"
            "time.sleep(0.5); print('ing/global_step:1', flush=True); time.sleep(0.3)")
    wrapper = start_auditor(["run", "--pair", PAIR, "--period", "1", "--gpus", "2", "--root",
                             str(tmp_path), "--job-id", "6202", "--", sys.executable, "-c",
                             code], clean_env())
    wait_for(marker.exists, 30)
    log_path = attempt_of(tmp_path, "6202", PAIR) / "training-6202.log"
    wait_for(lambda: b"step:1 - train" in log_path.read_bytes(), 30)  # (the half line)
    wrapper.send_signal(signal.SIGUSR1)
    wrapper.communicate(timeout=60)
    log = (attempt_of(tmp_path, "6202", PAIR) / "training-6202.log").read_text().splitlines()
    assert "step:1 - training/global_step:1" in log, log
    assert any(line.startswith("[auditor run] received SIGUSR1") for line in log), log


def test_the_kits_check_reads_every_wording_the_audit_reads(tmp_path: Path) -> None:
    """``auditor run``'s own check finds the launcher's lines the audit finds, in each
    wording, up to the controller's own exit (lines past a block's end included)."""
    from auditor.capture.launch import said_in_log

    log = tmp_path / "training.log"
    log.write_bytes(b"x" * (1 << 20) + b"\n"
                    + b"[launcher] policy terminated with exit code 143\n"
                    + b"[launcher] rollout exited, rc=1\n"
                    + b"[launcher] reward exited with return code 2\n"
                    + b"[launcher] controller exited with code 143\n"
                    + b"[launcher] policy exited with code 137\n")
    said = said_in_log(log, "training.log")
    assert [(role, code, cite.line) for role, code, cite in said] == [
        ("policy", 143, 2), ("rollout", 1, 3), ("reward", 2, 4)]
