"""Seed ``000``'s multi-node launcher on a real three-node Slurm, as a job array: the README's
example (``examples/multinode/study.sbatch`` and ``launcher.sh``), run as shipped.

Each element is one sbatch job over three nodes: the batch node's ``auditor run --role
launcher`` around the launcher, which starts, with ``srun`` on one node each, the controller
(first node), a policy replica (second) and a rollout replica (third) of
``auditor.capture.multinode_example``, each under ``auditor run --step ROLE``. Like seed
``000``'s monitor loop, the launcher returns the controller's status and reaps its peers on
every path. After it, ``srun --ntasks-per-node=1 auditor seal --idle-check-only`` checks each
node and the batch node's ``auditor seal --idle-check`` gathers the results; the script
requeues its own element (never the array) after an unsignalled failure, within its budget.

The elements (:data:`ELEMENTS`, passed as the script's per-element settings) are the
issue's endings: a coordinated shutdown with the flag on and off, a replica crash on the
second node, a replica there SIGTERMed and one SIGKILLed from outside (by the harness, inside
that node's namespaces), a GPU out-of-memory error there, scancel, the time limit after the
pre-timeout SIGUSR1 (forwarded to the trainer, which "checkpoints" and goes on), and a crash
the script's retry line requeues (element 8: the one whose job id is the array's, where the
old ``scontrol requeue "$SLURM_JOB_ID"`` requeued every element); its rerun completes.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.slurm.cluster import Cluster, ClusterError
from tests.slurm.kit import wait_accounted

__all__ = ["ELEMENTS", "EXAMPLE", "GPUS", "CosmosRun", "pair_of", "run_cosmos"]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "multinode"
PYTHON = Path(sys.executable)
AUDITOR = PYTHON.parent / "auditor"
GPUS = 2
"""GPUs of each period: its two workers (the policy and the rollout replica)."""
NODES = 3

ELEMENTS: dict[int, tuple[str, str, str, int, str]] = {
    # task: (name, the policy's mode, the flag, retries, what happens)
    0: ("coordinated-on", "completed", "1", 0, "the controller's own 143 excused"),
    1: ("coordinated-off", "completed", "0", 0, "the flag 0: the controller's 143 passed on"),
    2: ("crash", "crash", "1", 0, "the policy replica on the second node raises RuntimeError"),
    3: ("sigterm", "hang", "1", 0, "the harness SIGTERMs the policy replica"),
    4: ("sigkill", "hang", "1", 0, "the harness SIGKILLs the policy replica"),
    5: ("gpu-oom", "oom", "1", 0, "the policy replica raises torch.OutOfMemoryError"),
    6: ("cancelled", "hang", "1", 0, "scancel while the policy hangs"),
    7: ("time-limit", "hang", "1", 0, "the pre-timeout SIGUSR1 (checkpoint), then the limit"),
    8: ("requeue", "crash", "1", 1, "crashes; the script requeues its own element; the rerun "
        "completes"),
}

SBATCH_OPTIONS: tuple[str, ...] = (
    f"--array=0-{max(ELEMENTS)}", "--job-name=multinode", f"-N{NODES}",
    "--ntasks-per-node=1", "--time=1", "--mem=500M", "--cpus-per-task=1",
    "--gres=gpu:a100:1", "--signal=B:USR1@25", "--requeue", "--open-mode=append",
)
"""On top of the script's own ``#SBATCH`` lines (the command line wins): a one-minute limit,
so the time-limit element ends within the test, its warning 35 s in (every other element
has ended by then)."""


def pair_of(task: int) -> str:
    """The pair element ``task`` runs."""
    return f"multinode-{ELEMENTS[task][0]}-s{task}"


def protocol() -> dict[str, object]:
    """One configuration per element; completion phases by role; the idle check optional
    (no NVML here: each node records that it could not check)."""
    return {"schema": "run-evidence/protocol/v1", "name": "multinode-example",
            "idle_check": "optional",
            "completion_phases": {"policy": ["actor_update", "weight_sync"],
                                  "rollout": ["weight_sync"]},
            "configurations": [{"workload": element[0], "gpus": GPUS, "seeds": [task]}
                               for task, element in sorted(ELEMENTS.items())]}


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
    """Write the protocol, submit the README's example as the array into ``root``, drive
    it, capture."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "protocol.json").write_text(json.dumps(protocol(), indent=1) + "\n")
    jobs = cluster.root / "jobs"
    jobs.mkdir(exist_ok=True)
    settings = {
        "ROOT": str(root), "SRC": str(REPO), "AUDITOR": str(AUDITOR), "PY": str(PYTHON),
        "LAUNCHER": str(EXAMPLE / "launcher.sh"), "RENDEZVOUS": str(jobs / "rendezvous"),
        "NAMES": " ".join(element[0] for _, element in sorted(ELEMENTS.items())),
        "MODES": " ".join(element[1] for _, element in sorted(ELEMENTS.items())),
        "FLAGS": " ".join(element[2] for _, element in sorted(ELEMENTS.items())),
        "MAX_RESTARTS": " ".join(str(element[3]) for _, element in sorted(ELEMENTS.items())),
    }
    script = (EXAMPLE / "study.sbatch").read_text()
    array = cluster.sbatch(script, *SBATCH_OPTIONS, env=settings)
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
    cluster.wait_done(array, timeout=300)
    wait_accounted(cluster, array, list(ELEMENTS))
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
