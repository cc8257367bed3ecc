"""One real job array whose elements end in every way the auditor must judge, and its dumps.

:data:`SCRIPT` is a plain bash batch script that, as real launchers do, runs its work in
the background and traps SIGTERM (forwards it, exits 143) and SIGUSR1 (logs it; element
5, the pre-timeout trap, checkpoints and exits 0). Each array task picks its ending from
``SLURM_ARRAY_TASK_ID`` (see :data:`ENDINGS`); the harness does the rest from outside
(scancel while running and while pending, an external ``scontrol requeue``).

:func:`run_endings` submits the array (``--array=0-15%12``: tasks 12 to 15 start
pending; a one-minute limit; ``--signal=B:USR1@30``; ``--mem=256M``; two fake A100s per
element), drives it, captures sacct mid-run and at the end in every shape the tests and
fixtures need, and returns them with what was done. ``python -m tests.slurm.endings DIR``
runs it on a fresh cluster and saves the dumps into DIR (how ``fixtures/slurm`` was made).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.slurm.cluster import Cluster, ClusterError, ensure_installed

__all__ = ["ENDINGS", "OTHER_FORMAT", "SCRIPT", "EndingsRun", "check_midrun", "run_endings",
           "stale_tasks"]

ENDINGS: dict[int, str] = {
    0: "completed: works 10 s, exit 0",
    1: "exit 1 after 10 s",
    2: "exit 143 from the script after 10 s (the coordinated-shutdown shape, flag off)",
    3: "scancel while running (SIGTERM trapped, forwarded, exit 143)",
    4: "time limit: works past the one-minute limit (SIGTERM trapped, exit 143)",
    5: "pre-timeout trap: --signal=B:USR1@30, the USR1 trap checkpoints and exits 0",
    6: "external requeue: scontrol requeue while running; the second run completes",
    7: "self requeue: the script runs scontrol requeue on itself; the second run completes",
    8: "memory kill: allocates 1 GiB under --mem=256M (JobAcctGatherParams=OverMemoryKill)",
    9: "srun steps fail (exit 3, SIGKILL) under a batch script that exits 0",
    10: "SIGKILL: the work is killed with SIGKILL, the script exits its 137",
    11: "exit 255 after 10 s",
    12: "starts pending (array throttle %12), then completes",
    13: "starts pending (array throttle %12), then completes",
    14: "starts pending (array throttle %12), then completes",
    15: "scancel while pending",
}
"""What each array task does."""

OTHER_FORMAT = "JobIDRaw,JobID,State,ExitCode,Elapsed,AllocTRES,Submit,Timelimit,JobName"
"""A ``--format`` other than the contract's (order, Elapsed instead of ElapsedRaw)."""

SCRIPT = r"""#!/bin/bash
# A batch script shaped like a real launcher's: the work runs in the background, SIGTERM
# is forwarded and the script exits 143, SIGUSR1 is logged (task 5 checkpoints on it).
task=${SLURM_ARRAY_TASK_ID:-0}
restart=${SLURM_RESTART_COUNT:-0}
log() { echo "$(date -u +%FT%T.%NZ) task=$task restart=$restart $*"; }
child=
on_term() {
    log "SIGTERM received"
    [ -n "$child" ] && kill -TERM "$child" 2>/dev/null
    exit 143
}
on_usr1() {
    log "SIGUSR1 received"
    if [ "$task" = 5 ]; then
        log "pre-timeout trap: checkpoint written, exiting 0"
        [ -n "$child" ] && kill -TERM "$child" 2>/dev/null
        exit 0
    fi
}
trap on_term TERM
trap on_usr1 USR1
work() {  # run "$@" in the background; wait through trapped signals; its status
    "$@" & child=$!
    while kill -0 "$child" 2>/dev/null; do wait "$child"; done
    wait "$child"
}
log "start job=$SLURM_JOB_ID array=$SLURM_ARRAY_JOB_ID"
case "$task" in
    0|12|13|14) work sleep 10; log "done"; exit 0 ;;
    1) work sleep 10; exit 1 ;;
    2) work sleep 10; log "coordinated shutdown, launcher exits 143"; exit 143 ;;
    # (Slurm signals every process of the step: when the work dies of the SIGTERM and the
    # wait returns before the trap has run, the script handles it as the trap does; it
    # exited 0 once, a race, and the batch step was COMPLETED 0:0)
    3|4) work sleep 600; [ $? -ge 128 ] && on_term; exit 0 ;;
    5) work sleep 600; exit 0 ;;
    6) if [ "$restart" = 0 ]; then work sleep 600; fi; work sleep 10; exit 0 ;;
    7) if [ "$restart" = 0 ]; then
           work sleep 2
           scontrol requeue "${SLURM_ARRAY_JOB_ID}_${task}"
           work sleep 600
       fi
       work sleep 10; exit 0 ;;
    8) work sleep 10
       work python3 -c "import time; b = b'x' * (1 << 30); time.sleep(600)"; exit $? ;;
    9) work sleep 10
       srun -n1 bash -c 'exit 3'
       srun -n1 bash -c 'kill -KILL $$'
       exit 0 ;;
    10) work sleep 10
        sleep 600 & child=$!; kill -KILL "$child"; wait "$child"; status=$?
        log "work killed by SIGKILL, exiting $status"; exit "$status" ;;
    11) work sleep 10; exit 255 ;;
    *) work sleep 10; exit 0 ;;
esac
"""

SBATCH_OPTIONS: tuple[str, ...] = (
    "--array=0-15%12", "--job-name=endings", "--time=1", "--mem=256M", "--cpus-per-task=1",
    "--gres=gpu:a100:2", "--signal=B:USR1@30", "--requeue", "--open-mode=append",
)


@dataclass
class EndingsRun:
    """What :func:`run_endings` did and captured."""

    array: str
    dumps: dict[str, str] = field(default_factory=dict)
    """Dump name (file stem) to sacct's verbatim output."""
    actions: dict[str, float] = field(default_factory=dict)
    """What the harness did, to the seconds after submission it did it."""
    seconds: float = 0.0
    """Wall time from submission until sacct showed every row ended."""
    logs: dict[int, str] = field(default_factory=dict)
    """Each task's batch output."""


def run_endings(cluster: Cluster) -> EndingsRun:
    """Submit the endings array, drive it, capture its dumps; see the module doc."""
    array = cluster.sbatch(SCRIPT, *SBATCH_OPTIONS)
    run = EndingsRun(array=array)
    submitted = time.monotonic()

    def mark(action: str) -> None:
        run.actions[action] = round(time.monotonic() - submitted, 1)

    for task in range(12):
        cluster.wait_started(f"{array}_{task}", timeout=60)
    mark("tasks 0-11 started")
    # accounting lags the controller: wait until sacct shows them and the pending range
    # (task 7 requeues itself 2 s in: it may already be PENDING again, or REQUEUED)
    run.dumps["midrun"] = _poll(cluster, array, lambda text: _running(
        text, array, [task for task in range(12) if task != 7]) and f"{array}_[" in text,
        timeout=20)
    mark("midrun captured")
    cluster.wait_state(f"{array}_3", {"RUNNING"}, timeout=30)
    cluster.run(["scancel", f"{array}_3"])
    mark("scancel 3 (running)")
    cluster.wait_state(f"{array}_6", {"RUNNING"}, timeout=30)
    cluster.run(["scontrol", "requeue", f"{array}_6"])
    mark("scontrol requeue 6 (running)")
    # 3 and 6 (and 7, requeued by itself) free slots for 12-14; 15 stays pending until
    # a fourth slot frees (tasks 0-2 end 10 s in). Cancelling it once 12-14 have started
    # leaves the array's pending record as a range that still names 14 (a stale range).
    for task in (12, 13, 14):
        cluster.wait_started(f"{array}_{task}", timeout=30)
    mark("tasks 12-14 started")
    if cluster.states(f"{array}_15").get(f"{array}_15") != "PENDING":
        raise ClusterError(f"{array}_15 no longer pending: {cluster.states(array)}")
    cluster.run(["scancel", f"{array}_15"])
    mark("scancel 15 (pending)")
    run.dumps["midrun-2"] = cluster.sacct(array)
    run.dumps["midrun-2-D"] = cluster.sacct(array, duplicates=True)
    mark("midrun-2 captured")
    cluster.wait_done(array, timeout=300)
    run.seconds = time.monotonic() - submitted
    mark("all ended in sacct")
    run.dumps["contract"] = cluster.sacct(array)
    run.dumps["contract-D"] = cluster.sacct(array, duplicates=True)
    run.dumps["header"] = cluster.sacct(array, header=True)
    run.dumps["header-D"] = cluster.sacct(array, header=True, duplicates=True)
    run.dumps["caret"] = cluster.sacct(array, delimiter="^")
    run.dumps["other-format"] = cluster.sacct(array, fmt=OTHER_FORMAT, duplicates=True)
    for task in ENDINGS:
        out = cluster.root / "jobs" / f"{array}_{task}.out"
        if out.is_file():
            run.logs[task] = out.read_text(errors="replace")
    return run


def check_midrun(text: str, array: str) -> None:
    """Assert what the mid-run dump of the endings array must show: tasks 0-11 but 7
    RUNNING; 7 RUNNING, or already REQUEUED or PENDING again (it requeues itself 2 s in);
    15 and the tasks before it that have not started in the array's pending range. Once 7
    has left its slot, task 12 may take it before the dump is read: the range then starts
    at 13 and 12 has a RUNNING row of its own."""
    states = _states(text)
    assert all(states[f"{array}_{task}"] == "RUNNING" for task in range(12) if task != 7)
    seven = states[f"{array}_7"]
    assert seven in {"RUNNING", "REQUEUED", "PENDING"}, seven
    first = 13 if states.get(f"{array}_12") == "RUNNING" else 12
    assert first == 12 or seven != "RUNNING", "task 12 started while 7 held its slot"
    pending = sorted(job for job, state in states.items() if state == "PENDING")
    assert pending == sorted([f"{array}_[{first}-15%12]"] + (
        [f"{array}_7"] if seven == "PENDING" else [])), pending


def stale_tasks(text: str, array: str) -> set[int]:
    """Tasks a pending range ``<array>_[spec]`` names that also have a row of their own."""
    own: set[int] = set()
    named: set[int] = set()
    for line in text.splitlines():
        job_id = line.split("|", 1)[0]
        if job_id.startswith(f"{array}_[") and job_id.endswith("]"):
            for part in job_id[len(array) + 2:-1].split("%")[0].split(","):
                low, _, high = part.partition("-")
                named.update(range(int(low), int(high or low) + 1))
        elif job_id.startswith(f"{array}_") and job_id[len(array) + 1:].isdigit():
            own.add(int(job_id[len(array) + 1:]))
    return own & named


def _running(text: str, array: str, tasks: list[int]) -> bool:
    """Whether sacct shows each of ``tasks`` RUNNING as a row of its own (a task squeue
    says started may still be pending, or absent, in sacct for a moment)."""
    states = _states(text)
    return all(states.get(f"{array}_{task}") == "RUNNING" for task in tasks)


def _states(text: str) -> dict[str, str]:
    """Each job's state in a contract-way dump (job rows only: no ``.batch`` or other step)."""
    rows = (line.split("|") for line in text.splitlines() if line.count("|") >= 3)
    return {row[0]: row[3] for row in rows if "." not in row[0]}


def _poll(cluster: Cluster, array: str, good: Callable[[str], bool], timeout: float,
          fail: bool = True) -> str:
    """The first contract-way dump of ``array`` that is ``good`` within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        text = cluster.sacct(array)
        if good(text):
            return text
        if time.monotonic() > deadline:
            if fail:
                raise ClusterError(f"no sacct dump of {array} as wanted after {timeout} s:\n"
                                   + text)
            return ""
        time.sleep(0.2)


def main(argv: list[str]) -> int:
    """``python -m tests.slurm.endings DIR``: run on a fresh cluster, save dumps into DIR."""
    if len(argv) != 1:
        print("usage: python -m tests.slurm.endings DIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    install_s = ensure_installed()
    cluster = Cluster.start()
    try:
        run = run_endings(cluster)
    finally:
        cluster.stop()
    out.mkdir(parents=True, exist_ok=True)
    for name, text in run.dumps.items():
        (out / f"{name}.psv").write_text(text)
    for task, text in run.logs.items():
        (out / "logs").mkdir(exist_ok=True)
        (out / "logs" / f"task-{task}.out").write_text(text)
    print(f"array {run.array}: {run.seconds:.0f} s; install {install_s:.0f} s; "
          f"cluster {cluster.timings}; actions {run.actions}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
