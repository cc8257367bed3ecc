"""Seed ``000``'s multi-node launcher on a real three-node Slurm, as a job array.

Each element is one sbatch job over three nodes (``-N3``): its batch script runs the batch
node's ``auditor run --role launcher`` around :data:`LAUNCHER`, a cosmos-shaped launcher that
starts, with ``srun`` on one node each, the controller (first node), a policy replica
(second) and a rollout replica (third), each wrapped in ``auditor run --step ROLE``
(``tests/slurm/cosmos_roles.py`` is what they run). Like seed ``000``'s monitor loop, the
launcher waits for the controller, returns its status, and reaps its peers on every path.
After it, ``srun --ntasks-per-node=1 auditor seal --idle-check-only`` checks each node and
the batch node's ``auditor seal --idle-check`` gathers the results; the script exits with
``auditor run``'s status, and requeues nothing itself.

The elements (:data:`ELEMENTS`) are the issue's endings: a coordinated shutdown with the flag
on and off, a replica crash on the second node, a replica there SIGTERMed and one SIGKILLed
from outside (by the harness, inside that node's namespaces), a GPU out-of-memory error
there, scancel, the time limit after the pre-timeout SIGUSR1 (forwarded to the trainer, which
"checkpoints" and goes on), and a requeue (the rerun completes).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.slurm.cluster import Cluster, ClusterError

__all__ = ["COMMIT", "ELEMENTS", "GPUS", "CosmosRun", "pair_of", "run_cosmos"]

PYTHON = Path(sys.executable)
AUDITOR = PYTHON.parent / "auditor"
ROLES = Path(__file__).with_name("cosmos_roles.py")
COMMIT = "89abcdef0123456789abcdef0123456789abcdef"
GPUS = 2
"""GPUs of each period: its two workers (the policy and the rollout replica)."""
STUDY = "cosmos"
NODES = 3

ELEMENTS: dict[int, tuple[str, str, str]] = {
    # task: (workload, the policy's mode, what happens)
    0: ("coordinated-on", "completed", "the flag 1: the controller's own 143 excused"),
    1: ("coordinated-off", "completed", "the flag 0: the controller's 143 passed on"),
    2: ("crash", "crash", "the policy replica on the second node raises RuntimeError"),
    3: ("sigterm", "hang", "the harness SIGTERMs the policy replica on the second node"),
    4: ("sigkill", "hang", "the harness SIGKILLs the policy replica on the second node"),
    5: ("gpu-oom", "oom", "the policy replica raises torch.OutOfMemoryError"),
    6: ("cancelled", "hang", "scancel while the policy hangs"),
    7: ("time-limit", "hang", "the pre-timeout SIGUSR1 (checkpoint), then the time limit"),
    8: ("requeue", "hang", "scontrol requeue while it hangs; the rerun completes"),
}

SBATCH_OPTIONS: tuple[str, ...] = (
    f"--array=0-{max(ELEMENTS)}", "--job-name=cosmos", f"-N{NODES}", "--ntasks-per-node=1",
    "--time=1", "--mem=500M", "--cpus-per-task=1", "--gres=gpu:a100:1",
    "--signal=B:USR1@40", "--requeue", "--open-mode=append",
)

LAUNCHER = r"""#!/bin/bash
# A cosmos-shaped multi-node launcher (seed 000's template): the controller on the first
# node, a policy replica on the second, a rollout replica on the third, each one srun step
# wrapped in 'auditor run --step'. Its status is the controller's, as the seed's monitor
# loop has it (the step wrapper applies the seed's rule); its peers are reaped on both paths.
mode=$1; rendezvous=$2; first=$3; second=$4; third=$5
trap 'echo "[launcher] SIGUSR1: checkpoint requested"' USR1
step() {  # (exec: the background subshell becomes srun; a bare subshell would die of the
          # SIGUSR1 that reaches the launcher's process group, its traps being reset)
    local node=$1 role=$2; shift 2
    exec srun --overlap -N1 -n1 -w "$node" @AUDITOR@ run --step "$role" --rank 0 -- \
        @PYTHON@ @ROLES@ "$role" "$@" "$rendezvous"
}
step "$first" controller & controller=$!
step "$second" policy --mode "$mode" & policy=$!
step "$third" rollout & rollout=$!
while :; do wait "$controller"; status=$?; kill -0 "$controller" 2>/dev/null || break; done
echo "[launcher] controller exited with code $status"
kill -TERM "$policy" "$rollout" 2>/dev/null
wait "$policy" "$rollout"
exit "$status"
"""

SCRIPT = r"""#!/bin/bash
set -u
ROOT=@ROOT@
AUDITOR=@AUDITOR@
task=${SLURM_ARRAY_TASK_ID}
RESTART=${SLURM_RESTART_COUNT:-0}
log() { echo "$(date -u +%FT%T.%NZ) task=$task restart=$RESTART $*"; }
RUN=
forward() { log "SIG$1 received"; [ -n "$RUN" ] && kill -s "$1" "$RUN" 2>/dev/null; }
trap 'forward TERM' TERM; trap 'forward INT' INT; trap 'forward USR1' USR1
flag=1
case "$task" in
    0) name=coordinated-on; mode=completed ;;
    1) name=coordinated-off; mode=completed; flag=0 ;;
    2) name=crash; mode=crash ;;
    3) name=sigterm; mode=hang ;;
    4) name=sigkill; mode=hang ;;
    5) name=gpu-oom; mode=oom ;;
    6) name=cancelled; mode=hang ;;
    7) name=time-limit; mode=hang ;;
    8) name=requeue; mode=hang; [ "$RESTART" -gt 0 ] && mode=completed ;;
esac
PAIR=cosmos-$name-s$task GPUS=@GPUS@ PERIOD=1
ATTEMPT=$PAIR-${GPUS}gpu/attempt-$SLURM_JOB_ID$([ "$RESTART" -gt 0 ] && echo "-r$RESTART")
NODES=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))
log "start job=$SLURM_JOB_ID array=$SLURM_ARRAY_JOB_ID pair=$PAIR nodes=${NODES[*]}"

"$AUDITOR" run --root "$ROOT" --pair "$PAIR" --period "$PERIOD" --gpus "$GPUS" --role launcher \
    --dispatch TOTAL_TRAINING_STEPS=1 --dispatch COSMOS_SHUTDOWN_ON_NO_POLICY_REPLICAS=$flag \
    -- bash @LAUNCHER@ "$mode" "@JOBS@/rendezvous-$SLURM_JOB_ID-$RESTART" "${NODES[@]}" &
RUN=$!
while :; do wait "$RUN"; status=$?; kill -0 "$RUN" 2>/dev/null || break; done
log "auditor run exited $status"

srun --overlap --ntasks-per-node=1 -N "$SLURM_JOB_NUM_NODES" "$AUDITOR" seal "$ROOT" \
    --pair "$PAIR" --period "$PERIOD" --gpus "$GPUS" --attempt-dir "$ATTEMPT" --idle-check-only
log "idle checks exited $?"
"$AUDITOR" seal "$ROOT" --pair "$PAIR" --period "$PERIOD" --gpus "$GPUS" --attempt-dir "$ATTEMPT" \
    --commit @COMMIT@ --workload "$name" --seed "$task" --model cosmos --study @STUDY@ \
    --idle-check
log "auditor seal exited $?; exit $status"
exit "$status"
"""


def pair_of(task: int) -> str:
    """The pair element ``task`` runs."""
    return f"cosmos-{ELEMENTS[task][0]}-s{task}"


def protocol() -> dict[str, object]:
    """One configuration per element; completion phases by role; the idle check optional
    (no NVML here: each node records that it could not check)."""
    return {"schema": "run-evidence/protocol/v1", "name": STUDY, "idle_check": "optional",
            "completion_phases": {"policy": ["actor_update", "weight_sync"],
                                  "rollout": ["weight_sync"]},
            "configurations": [{"workload": name, "gpus": GPUS, "seeds": [task]}
                               for task, (name, _, _) in sorted(ELEMENTS.items())]}


@dataclass
class CosmosRun:
    """What :func:`run_cosmos` did and captured."""

    array: str
    root: Path
    dumps: dict[str, str] = field(default_factory=dict)
    actions: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    logs: dict[int, str] = field(default_factory=dict)
    killed: dict[int, int] = field(default_factory=dict)
    """Task -> the policy replica's pid (in its node's namespace) the harness signalled."""


def _fill(text: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    return text


def _attempt(root: Path, task: int) -> Path | None:
    found = sorted((root / f"{pair_of(task)}-{GPUS}gpu").glob("attempt-*"))
    return found[-1] if found else None


def _policy_pid(root: Path, task: int) -> tuple[str, int] | None:
    """(node, pid) of element ``task``'s policy replica once it says it hangs."""
    attempt = _attempt(root, task)
    if attempt is None:
        return None
    for output in (attempt / "worker-logs").glob("*-policy-*.out"):
        if "waiting in actor_update" in output.read_text(errors="replace"):
            host, _, pid = output.stem.rpartition("-policy-")
            return host, int(pid)
    return None


def _wait_policy(cluster: Cluster, root: Path, array: str, task: int,
                 timeout: float = 90) -> tuple[str, int]:
    deadline = time.monotonic() + timeout
    while (found := _policy_pid(root, task)) is None:
        if time.monotonic() > deadline:
            raise ClusterError(f"{array}_{task}: the policy replica not hanging after "
                               f"{timeout} s (squeue: {cluster.states(array)})")
        time.sleep(0.3)
    return found


def run_cosmos(cluster: Cluster, root: Path) -> CosmosRun:
    """Write the protocol, submit the array into ``root``, drive it, capture."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "protocol.json").write_text(json.dumps(protocol(), indent=1) + "\n")
    jobs = cluster.root / "jobs"
    jobs.mkdir(exist_ok=True)
    values = {"ROOT": str(root), "PYTHON": str(PYTHON), "AUDITOR": str(AUDITOR),
              "ROLES": str(ROLES), "COMMIT": COMMIT, "STUDY": STUDY, "GPUS": str(GPUS),
              "JOBS": str(jobs)}
    launcher = jobs / "cosmos-launcher.sh"
    launcher.write_text(_fill(LAUNCHER, values))
    values["LAUNCHER"] = str(launcher)
    array = cluster.sbatch(_fill(SCRIPT, values), *SBATCH_OPTIONS)
    run = CosmosRun(array=array, root=root)
    submitted = time.monotonic()

    def mark(action: str) -> None:
        run.actions[action] = round(time.monotonic() - submitted, 1)

    for task, how in ((3, "-TERM"), (4, "-KILL")):
        node, pid = _wait_policy(cluster, root, array, task)
        cluster.on_node(node, ["kill", how, str(pid)])
        run.killed[task] = pid
        mark(f"kill {how} policy of {task} on {node}")
    _wait_policy(cluster, root, array, 6)
    cluster.run(["scancel", f"{array}_6"])
    mark("scancel 6")
    _wait_policy(cluster, root, array, 8)
    cluster.run(["scontrol", "requeue", f"{array}_8"])
    mark("scontrol requeue 8")
    cluster.wait_done(array, timeout=300)
    _wait_accounted(cluster, array, list(ELEMENTS))
    run.seconds = time.monotonic() - submitted
    mark("all ended in sacct")
    run.dumps["contract"] = cluster.sacct(array)
    run.dumps["contract-D"] = cluster.sacct(array, duplicates=True)
    (root / "accounting").mkdir(exist_ok=True)
    (root / "accounting" / "sacct-raw.psv").write_text(run.dumps["contract-D"])
    for task in ELEMENTS:
        out = jobs / f"{array}_{task}.out"
        if out.is_file():
            run.logs[task] = out.read_text(errors="replace")
    return run


def _wait_accounted(cluster: Cluster, array: str, tasks: list[int], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        shown = {line.split("|", 1)[0] for line in cluster.sacct(array).splitlines()}
        missing = [task for task in tasks if f"{array}_{task}" not in shown]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise ClusterError(f"sacct has no row for {array}_{missing} after {timeout} s")
        time.sleep(1)
