"""A real job array built with the producer kit: ``auditor run``, the example, ``auditor seal``.

:data:`SCRIPT` is the README's batch script ("Producing evidence") made to end in every way
the audit must judge: it traps SIGTERM and SIGINT (forwards them to
``auditor run``, which records the first as ``received_signal``) and SIGUSR1 (forwarded only
by the pre-timeout element; the others log it, as a script that does not checkpoint does),
runs ``auditor run ... -- python -m auditor.capture.example --mode M`` (or a ``bash -c``
around it, for the SIGKILL and exit-255 endings), then ``auditor seal`` with a fixed
``--commit`` and ``--idle-check`` (which records "not made": no NVML here; the protocol says
``"idle_check": "optional"``), and exits with ``auditor run``'s status. Each element is one
pair with one period, its workload named by its ending, so each is a configuration of its
own and the gate's inclusion list says which resolved (see :data:`ELEMENTS`).

:func:`run_kit` writes ``protocol.json`` into a study root, submits the array
(``--array=0-12%11``: elements 11 and 12 start pending on the throttle; a one-minute limit;
``--signal=B:USR1@40``; two fake A100s each), drives it from outside (scancel 11 while
pending, scancel 5 and ``scontrol requeue`` 8 once their trainers hang), waits until
sacct shows every row ended, seals element 11's period outside Slurm (see below), and
captures sacct the contract's way and with ``-D`` (the latter into the study as
``accounting/sacct-raw.psv``, as the readme's script does).

Element 11 never runs: cancelled while pending, it has no sacct row. For the audit to know
of it, a period record must name it; the harness stands for a launcher that writes its
period before the element starts: ``auditor run --job-id <absent>`` with the array's
``SLURM_ARRAY_JOB_ID`` and task 11 and the example trainer's ``completed`` mode, then
``auditor seal`` without ``--idle-check``, both on the host, outside any job.
``ABSENT_JOB`` is a job id the cluster never gave out. Element 12, the last to start, takes
the array's own record (its JobIDRaw is the array's id), so no pending range is left that
could name 11 either.

``python -m tests.slurm.kit DIR`` runs it on a fresh cluster and saves the dumps, the study
and the batch outputs into DIR (how ``fixtures/slurm/kit`` was made).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.slurm.cluster import Cluster, ClusterError, ensure_installed

__all__ = ["ABSENT_JOB", "COMMIT", "ELEMENTS", "GPUS", "SCRIPT", "KitRun", "pair_of", "run_kit",
           "wait_accounted"]

PYTHON = Path(sys.executable)
"""The interpreter the batch scripts run the example trainer with (this venv's)."""
AUDITOR = PYTHON.parent / "auditor"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
"""The source commit every period is sealed with (``--commit``)."""
GPUS = 2
ABSENT_JOB = "990011"
"""The job id element 11's pre-written trial record names (never given out here)."""
STUDY = "kit"

ELEMENTS: dict[int, tuple[str, str]] = {
    0: ("completed", "--mode completed, exit 0"),
    1: ("crash", "--mode crash: rank 1's actor_update raises RuntimeError; exit 1"),
    2: ("oom", "--mode oom: rank 0's rollout_init raises torch.OutOfMemoryError; exit 1"),
    3: ("coordinated-on", "--mode coordinated, --role controller, the flag 1: the "
        "controller's 143, auditor run exits 0"),
    4: ("coordinated-off", "--mode coordinated, --role controller, the flag 0: 143 passed on"),
    5: ("cancelled", "--mode hang, scancel while running (SIGTERM recorded)"),
    6: ("time-limit", "--mode hang past the one-minute limit; the USR1 warning only logged, "
        "the limit's SIGTERM recorded"),
    7: ("pre-timeout", "--mode hang; --signal=B:USR1@40 forwarded to auditor run (SIGUSR1 "
        "recorded, the trainer dies of it: 138)"),
    8: ("requeue", "--mode hang, scontrol requeue while running (SIGTERM recorded, sealed); "
        "the rerun (SLURM_RESTART_COUNT=1, attempt-<job>-r1) --mode completed, sealed as "
        "the second attempt"),
    9: ("sigkill", "bash -c: the hanging trainer's whole process group SIGKILLed: 137"),
    10: ("exit-255", "bash -c: the trainer completes, then its wrapper exits 255"),
    11: ("pending-cancelled", "scancel while pending (throttle %11): never runs; its period "
         "record was written by the harness outside Slurm"),
    12: ("throttled", "starts pending on the throttle, runs once a slot frees: --mode completed"),
}
"""Array task -> (workload, what it does)."""

SBATCH_OPTIONS: tuple[str, ...] = (
    "--array=0-12%11", "--job-name=kit", "--time=1", "--mem=1G", "--cpus-per-task=1",
    f"--gres=gpu:a100:{GPUS}", "--signal=B:USR1@40", "--requeue", "--open-mode=append",
)

SCRIPT = r"""#!/bin/bash
# The producer kit's batch script (readme: producing evidence), one ending per array task.
set -u
ROOT=@ROOT@
PY=@PYTHON@
AUDITOR=@AUDITOR@
task=${SLURM_ARRAY_TASK_ID}
RESTART=${SLURM_RESTART_COUNT:-0}
log() { echo "$(date -u +%FT%T.%NZ) task=$task restart=$RESTART $*"; }
RUN=
forward() { log "SIG$1 received"; [ -n "$RUN" ] && kill -s "$1" "$RUN" 2>/dev/null; }
on_usr1() {
    if [ "$task" = 7 ]; then forward USR1; else log "SIGUSR1 received (not forwarded)"; fi
}
trap 'forward TERM' TERM; trap 'forward INT' INT; trap on_usr1 USR1

role=driver; flag=1
example=("$PY" -m auditor.capture.example)
case "$task" in
    0) name=completed; cmd=("${example[@]}" --mode completed) ;;
    1) name=crash; cmd=("${example[@]}" --mode crash) ;;
    2) name=oom; cmd=("${example[@]}" --mode oom) ;;
    3) name=coordinated-on; role=controller; cmd=("${example[@]}" --mode coordinated) ;;
    4) name=coordinated-off; role=controller; flag=0
       cmd=("${example[@]}" --mode coordinated) ;;
    5) name=cancelled; cmd=("${example[@]}" --mode hang) ;;
    6) name=time-limit; cmd=("${example[@]}" --mode hang) ;;
    7) name=pre-timeout; cmd=("${example[@]}" --mode hang) ;;
    8) name=requeue
       if [ "$RESTART" = 0 ]; then cmd=("${example[@]}" --mode hang)
       else cmd=("${example[@]}" --mode completed); fi ;;
    9) name=sigkill
       # (killed once both ranks hang, their traces written: a fixed sleep lost that race
       # on a loaded machine, the period then unresolved for its empty trace instead; the
       # pattern never matches its own text, which the log's first line, the command, holds)
       cmd=(bash -c '"$0" -m auditor.capture.example --mode hang &
           log=$AUDITOR_ATTEMPT_DIR/training-$SLURM_JOB_ID.log
           until [ "$(grep -c "rank [0-9] waiting for rollout" "$log" 2>/dev/null)" -ge 2 ]
           do sleep 0.2; done; kill -KILL 0' "$PY") ;;
    10) name=exit-255
        cmd=(bash -c '"$0" -m auditor.capture.example --mode completed && exit 255' "$PY") ;;
    12) name=throttled; cmd=("${example[@]}" --mode completed) ;;
    *) name=other; cmd=("${example[@]}" --mode completed) ;;
esac
PAIR=kit-$name-s$task GPUS=@GPUS@ PERIOD=1
log "start job=$SLURM_JOB_ID array=$SLURM_ARRAY_JOB_ID pair=$PAIR"

"$AUDITOR" run --root "$ROOT" --pair "$PAIR" --period "$PERIOD" --gpus "$GPUS" --role "$role" \
    --dispatch TOTAL_TRAINING_STEPS=1 --dispatch COSMOS_SHUTDOWN_ON_NO_POLICY_REPLICAS=$flag \
    -- "${cmd[@]}" &
RUN=$!
while :; do wait "$RUN"; status=$?; kill -0 "$RUN" 2>/dev/null || break; done
log "auditor run exited $status"

ATTEMPT=$PAIR-${GPUS}gpu/attempt-$SLURM_JOB_ID$([ "$RESTART" -gt 0 ] && echo "-r$RESTART")
"$AUDITOR" seal "$ROOT" --pair "$PAIR" --period "$PERIOD" --gpus "$GPUS" --attempt-dir "$ATTEMPT" \
    --commit @COMMIT@ --workload "$name" --seed "$task" --model example --study @STUDY@ \
    --idle-check
log "auditor seal exited $?; exit $status"
exit "$status"
"""


def pair_of(task: int) -> str:
    """The pair element ``task`` runs."""
    return f"kit-{ELEMENTS[task][0]}-s{task}"


def protocol() -> dict[str, object]:
    """The study's ``protocol.json``: one configuration per element, idle check optional."""
    return {"schema": "run-evidence/protocol/v1", "name": STUDY, "idle_check": "optional",
            "configurations": [{"workload": name, "gpus": GPUS, "seeds": [task]}
                               for task, (name, _) in sorted(ELEMENTS.items())]}


@dataclass
class KitRun:
    """What :func:`run_kit` did and captured."""

    array: str
    root: Path
    """The study root (sealed periods, attempts, protocol.json, accounting/sacct-raw.psv)."""
    dumps: dict[str, str] = field(default_factory=dict)
    """``contract`` (without ``-D``) and ``contract-D``: sacct's verbatim output."""
    actions: dict[str, float] = field(default_factory=dict)
    """What the harness did, to the seconds after submission it did it."""
    seconds: float = 0.0
    """Submission until sacct showed every row ended."""
    logs: dict[int, str] = field(default_factory=dict)
    """Each task's batch output (both runs of the requeued one)."""


def _script(root: Path) -> str:
    text = SCRIPT
    for key, value in (("ROOT", str(root)), ("PYTHON", str(PYTHON)), ("AUDITOR", str(AUDITOR)),
                       ("COMMIT", COMMIT), ("STUDY", STUDY), ("GPUS", str(GPUS))):
        text = text.replace(f"@{key}@", value)
    return text


def _hanging(root: Path, task: int) -> bool:
    """Whether element ``task``'s trainer is in its hang (both ranks said so)."""
    logs = list((root / f"{pair_of(task)}-{GPUS}gpu").glob("attempt-*/training-*.log"))
    return any(log.read_text(errors="replace").count("waiting for rollout workers") >= 2
               for log in logs)


def _wait_hanging(cluster: Cluster, root: Path, array: str, task: int,
                  timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not _hanging(root, task):
        if time.monotonic() > deadline:
            raise ClusterError(f"{array}_{task} not hanging after {timeout} s "
                               f"(squeue: {cluster.states(array)})")
        time.sleep(0.3)


def run_kit(cluster: Cluster, root: Path) -> KitRun:
    """Write the protocol, submit the array into ``root``, drive it, seal, capture."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "protocol.json").write_text(json.dumps(protocol(), indent=1) + "\n")
    cluster.wait_queue_empty()  # (11 must still be pending once 0-10 have started)
    array = cluster.sbatch(_script(root), *SBATCH_OPTIONS)
    run = KitRun(array=array, root=root)
    submitted = time.monotonic()

    def mark(action: str) -> None:
        run.actions[action] = round(time.monotonic() - submitted, 1)

    for task in range(11):
        cluster.wait_started(f"{array}_{task}", timeout=60)
    mark("tasks 0-10 started")
    queue = cluster.states(array)
    if not any(state == "PENDING" and (job == f"{array}_11" or job.startswith(f"{array}_[11"))
               for job, state in queue.items()):
        raise ClusterError(f"{array}_11 no longer pending: {queue}")
    cluster.run(["scancel", f"{array}_11"])
    mark("scancel 11 (pending)")
    _wait_hanging(cluster, root, array, 8)
    cluster.run(["scontrol", "requeue", f"{array}_8"])
    mark("scontrol requeue 8 (hanging)")
    _wait_hanging(cluster, root, array, 5)
    cluster.run(["scancel", f"{array}_5"])
    mark("scancel 5 (hanging)")
    cluster.wait_done(array, timeout=300)
    wait_accounted(cluster, array, [task for task in ELEMENTS if task != 11])
    run.seconds = time.monotonic() - submitted
    mark("all ended in sacct")
    _seal_absent(root, array, 11)
    run.dumps["contract"] = cluster.sacct(array)
    run.dumps["contract-D"] = cluster.sacct(array, duplicates=True)
    (root / "accounting").mkdir(exist_ok=True)
    (root / "accounting" / "sacct-raw.psv").write_text(run.dumps["contract-D"])
    for task in ELEMENTS:
        out = cluster.root / "jobs" / f"{array}_{task}.out"
        if out.is_file():
            run.logs[task] = out.read_text(errors="replace")
    return run


def wait_accounted(cluster: Cluster, array: str, tasks: list[int], timeout: float = 30) -> None:
    """Wait until sacct has a row of its own for each of ``tasks`` (an element that ended a
    moment ago may not be accounted yet)."""
    deadline = time.monotonic() + timeout
    while True:
        shown = {line.split("|", 1)[0] for line in cluster.sacct(array).splitlines()}
        missing = [task for task in tasks if f"{array}_{task}" not in shown]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise ClusterError(f"sacct has no row for {array}_{missing} after {timeout} s")
        time.sleep(1)


def _seal_absent(root: Path, array: str, task: int) -> None:
    """Element ``task``'s period as a launcher that writes it before the element starts
    would have left it (see the module doc): run and sealed on the host, outside a job."""
    pair = pair_of(task)
    env = {key: value for key, value in os.environ.items() if not key.startswith("SLURM_")}
    env.update(SLURM_ARRAY_JOB_ID=array, SLURM_ARRAY_TASK_ID=str(task))
    common = ["--pair", pair, "--period", "1", "--gpus", str(GPUS)]
    commands = [
        [str(AUDITOR), "run", "--root", str(root), *common, "--job-id", ABSENT_JOB,
         "--dispatch", "TOTAL_TRAINING_STEPS=1", "--", str(PYTHON), "-m",
         "auditor.capture.example", "--mode", "completed"],
        [str(AUDITOR), "seal", str(root), *common, "--attempt-dir",
         f"{pair}-{GPUS}gpu/attempt-{ABSENT_JOB}", "--commit", COMMIT, "--workload",
         ELEMENTS[task][0], "--seed", str(task), "--model", "example", "--study", STUDY],
    ]
    for command in commands:
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60,
                                stdin=subprocess.DEVNULL, check=False)
        if result.returncode != 0:
            raise ClusterError(f"{' '.join(command[:2])} for task {task} exited "
                               f"{result.returncode}: {result.stderr.strip()[-400:]}")


def main(argv: list[str]) -> int:
    """``python -m tests.slurm.kit DIR``: run on a fresh cluster, save everything into DIR."""
    if len(argv) != 1:
        print("usage: python -m tests.slurm.kit DIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    install_s = ensure_installed()
    cluster = Cluster.start()
    work = cluster.root / "kit-study"
    try:
        run = run_kit(cluster, work)
        out.mkdir(parents=True, exist_ok=True)
        for name, text in run.dumps.items():
            (out / f"{name}.psv").write_text(text)
        if (out / "study").exists():
            shutil.rmtree(out / "study")
        shutil.copytree(run.root, out / "study")
        (out / "logs").mkdir(exist_ok=True)
        for task, text in run.logs.items():
            (out / "logs" / f"task-{task}.out").write_text(text)
    finally:
        cluster.stop()
    print(f"array {run.array}: {run.seconds:.0f} s; install {install_s:.0f} s; "
          f"cluster {cluster.timings}; actions {run.actions}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
