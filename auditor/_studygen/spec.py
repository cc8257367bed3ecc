"""Study specifications: the contract's constants, the declarative spec types
(:class:`StudySpec` > :class:`ElementSpec` > :class:`PeriodSpec` > :class:`AttemptSpec`),
deterministic helpers and :func:`default_protocol`."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

NS = 1_000_000_000
"""Nanoseconds per second."""

MS = 1_000_000
"""Nanoseconds per millisecond."""

MIB = 1 << 20
"""Bytes per MiB."""

SEED_DAY_NS = 1_789_430_400 * NS
"""2026-09-15T00:00:00Z, the day of the seed study, in nanoseconds since the epoch."""

SEED_COMMIT = "120e29a146294722a6668f55a1e7fed2878eb62a"
"""The pinned source commit of every pair in the seed study."""

SEED_DISPATCH = {
    "TOTAL_TRAINING_STEPS": "1",
    "TRAINER_LOGGER": '["console"]',
    "RESUME_MODE": "disable",
}
"""Environment the launcher dispatched every seed trial with."""

SHUTDOWN_FLAG = "COSMOS_SHUTDOWN_ON_NO_POLICY_REPLICAS"
"""The flag that turns a controller's self-SIGTERM into a coordinated shutdown (seed 000)."""

TERMINAL_MISSING_ERROR = "ValueError: Successful exit lacks the exact one-step terminal event"
"""The launcher's validation error for the seed's 4-GPU periods."""

GPU_NAME = "NVIDIA A100-SXM4-40GB"
GPU_MEMORY_MIB = 40960
WORKLOADS = ("gsm8k", "math", "code_heavy_tail")
SEEDS = (161, 162, 163)
MODEL = "qwen25-7b"

OUTCOMES = (
    "completed",
    "terminal_missing",
    "rollout_init_oom",
    "coordinated_shutdown",
    "flag_off_143",
    "scancel_sigusr1",
    "sigkill_137",
    "cancelled",
    "timed_out",
    "node_failure",
    "retried",
    "pending",
)
"""Every outcome a period (or, for ``retried``, each attempt but that one) can have."""

OUTCOME_NOTES = {
    "completed": "exit 0, terminal event, all phases ok on every rank; sacct COMPLETED 0:0",
    "terminal_missing": "exit 0, all phases ok, no step line; status infrastructure_invalid; "
    "sacct FAILED 2:0 (the seed's 4-GPU periods)",
    "rollout_init_oom": "rank 0 rollout_init torch.OutOfMemoryError, exit 1, later phases "
    "absent, traceback in the log; sacct FAILED 2:0 (the seed's 2-GPU periods)",
    "coordinated_shutdown": "controller 143, flag on, received_signal null, terminal present, "
    "coordinated-shutdown line; the pre-fix launcher said failed; sacct FAILED 15:0 (143 less 128)",
    "flag_off_143": "as coordinated_shutdown but the flag is '0' and no shutdown line",
    "scancel_sigusr1": "as coordinated_shutdown but received_signal SIGUSR1; sacct FAILED 15:0",
    "sigkill_137": "controller 137, terminal present, all phases ok; sacct FAILED 9:0",
    "cancelled": "received_signal SIGTERM, exit 143, no terminal, phases through "
    "rollout_generate, slurmstepd CANCELLED line; sacct CANCELLED by 1234 0:15",
    "timed_out": "controller 143, flag on, received_signal null, no terminal, slurmstepd "
    "DUE TO TIME LIMIT line; sacct TIMEOUT 0:0 with .batch CANCELLED 0:15",
    "node_failure": "no trial record, log and traces stop mid-run, no idle_check; "
    "sacct NODE_FAIL 1:0",
    "retried": "period record with an 'attempts' list (default: two completed attempts run "
    "by two elements); the second is wasted",
    "pending": "sacct element still PENDING; no period record, no attempt directory",
}

_FULL_PHASE_OUTCOMES = frozenset(
    {
        "completed",
        "terminal_missing",
        "coordinated_shutdown",
        "flag_off_143",
        "scancel_sigusr1",
        "sigkill_137",
    }
)
_PARTIAL_PHASE_OUTCOMES = frozenset({"cancelled", "timed_out", "node_failure"})
_TERMINAL_OUTCOMES = frozenset(
    {"completed", "coordinated_shutdown", "flag_off_143", "scancel_sigusr1", "sigkill_137"}
)
_CONTROLLER_OUTCOMES = frozenset(
    {
        "coordinated_shutdown",
        "flag_off_143",
        "scancel_sigusr1",
        "sigkill_137",
        "cancelled",
        "timed_out",
    }
)
_ATTEMPT_OUTCOMES = frozenset(OUTCOMES) - {"retried", "pending"}

_DEFAULT_DURATION_S = {
    "completed": 420,
    "terminal_missing": 415,
    "rollout_init_oom": 140,
    "coordinated_shutdown": 430,
    "flag_off_143": 428,
    "scancel_sigusr1": 405,
    "sigkill_137": 425,
    "cancelled": 260,
    "timed_out": 600,
    "node_failure": 300,
}

_LAUNCHER_VERDICT: dict[str, tuple[str, str | None]] = {
    "completed": ("completed", None),
    "terminal_missing": ("infrastructure_invalid", TERMINAL_MISSING_ERROR),
    "rollout_init_oom": ("eligible_failure", None),
    # The pre-fix launcher of seed 000 read every 143 as a crash.
    "coordinated_shutdown": ("failed", "RuntimeError: Job failed with status 143"),
    "flag_off_143": ("failed", "RuntimeError: Job failed with status 143"),
    "scancel_sigusr1": ("failed", "RuntimeError: Job failed with status 143"),
    "sigkill_137": ("failed", "RuntimeError: Job failed with status 137"),
    "cancelled": ("cancelled", "RuntimeError: Job was manually cancelled (SIGTERM)"),
    "timed_out": ("failed", "RuntimeError: Job failed with status 143"),
}

# (state, exit code) of the srun step that ran one attempt.
_STEP_STATE = {
    "completed": ("COMPLETED", "0:0"),
    "terminal_missing": ("COMPLETED", "0:0"),
    "rollout_init_oom": ("FAILED", "1:0"),
    "coordinated_shutdown": ("FAILED", "15:0"),  # (sacct prints 143 less 128: print.c)
    "flag_off_143": ("FAILED", "15:0"),
    "scancel_sigusr1": ("FAILED", "15:0"),
    "sigkill_137": ("FAILED", "9:0"),
    "cancelled": ("CANCELLED", "0:15"),
    "timed_out": ("CANCELLED", "0:15"),
    "node_failure": ("CANCELLED by 0", "-2:0"),
}

# Element (outer sacct row) state per outcome, most decisive first.
_ELEMENT_STATE_ORDER = (
    ("pending", "PENDING", "0:0"),
    ("node_failure", "NODE_FAIL", "1:0"),
    ("timed_out", "TIMEOUT", "0:0"),
    ("cancelled", "CANCELLED by 1234", "0:15"),
    ("sigkill_137", "FAILED", "9:0"),  # (137 and 143 less 128, as sacct prints them)
    ("coordinated_shutdown", "FAILED", "15:0"),
    ("flag_off_143", "FAILED", "15:0"),
    ("scancel_sigusr1", "FAILED", "15:0"),
    ("terminal_missing", "FAILED", "2:0"),
    ("rollout_init_oom", "FAILED", "2:0"),
)

_PCI_BUS_IDS = (
    "00000000:07:00.0",
    "00000000:0B:00.0",
    "00000000:48:00.0",
    "00000000:4C:00.0",
    "00000000:88:00.0",
    "00000000:8B:00.0",
    "00000000:C8:00.0",
    "00000000:CB:00.0",
)

SACCT_FORMAT = (
    "JobID,JobIDRaw,JobName,State,ExitCode,Start,End,ElapsedRaw,AllocTRES,NodeList,Reason"
)
"""The ``--format`` the contract's ``sacct-raw.psv`` was captured with."""


# --------------------------------------------------------------------------- specs


@dataclass
class AttemptSpec:
    """One execution of a period by one actual SLURM job.

    ``None`` fields are filled with deterministic defaults by :func:`write_study`.
    """

    outcome: str
    """One of :data:`OUTCOMES` except ``retried`` and ``pending``."""
    job_id: str | None = None
    """Actual job that ran it; ``None`` means the (first) element listing the period."""
    started_ns: int | None = None
    """Invocation start; ``None`` schedules it after the element's previous attempt."""
    duration_ns: int | None = None
    """Invocation length (for killed outcomes: time until the kill)."""
    worker_pids: list[int] | None = None
    """One pid per GPU in rank order."""
    driver_pid: int | None = None
    """The driver (TaskRunner) or controller pid."""
    peak_mib: int | None = None
    """Raw trial peak: the trial's ``peak_mib`` and rank 0's device ``peak_reserved_mib``."""
    actor_update_finished_ns: int | None = None
    """Latest ``actor_update`` finished_ns across ranks (the last rank gets it exactly)."""
    weight_sync_finished_ns: int | None = None
    """Latest post-update ``weight_sync`` finished_ns across ranks."""


@dataclass
class PeriodSpec:
    """One launch of one arm of one pair; single-attempt fields mirror :class:`AttemptSpec`."""

    pair: str
    workload: str
    seed: int
    model: str
    period: int
    gpus: int
    outcome: str
    attempts: list[AttemptSpec] = field(default_factory=list)
    """For ``retried``: the attempts in launch order (default: two completed attempts,
    the second by the element listed after the first one that lists this period)."""
    started_ns: int | None = None
    duration_ns: int | None = None
    worker_pids: list[int] | None = None
    driver_pid: int | None = None
    peak_mib: int | None = None
    actor_update_finished_ns: int | None = None
    weight_sync_finished_ns: int | None = None
    terminal_style: str = "int"
    """How the terminal event prints its values: ``int``, ``float`` (``1.000``) or ``np``."""
    validation_tail: bool = False
    """Add a validation-only ``step:2`` line after the terminal event."""
    ansi: bool = False
    """Colour the Ray prefixes with ANSI codes, as a terminal-attached run does."""
    extra_log_lines: list[str] = field(default_factory=list)
    """Appended verbatim to the end of every attempt's training log."""


@dataclass
class ElementSpec:
    """One array element = one actual SLURM job (one allocation)."""

    array_task_id: int
    job_id: str
    state: str | None = None
    """sacct State; ``None`` derives it from the periods' outcomes."""
    exit_code: str | None = None
    """sacct ExitCode ``exit:signal``; ``None`` derives it."""
    elapsed_s: int | None = None
    """sacct ElapsedRaw; ``None`` ends the element a few seconds after its last attempt."""
    alloc_gpus: int = 4
    """GPUs the allocation row holds (AllocTRES); raised to its periods' largest ``gpus``."""
    start_ns: int | None = None
    """sacct Start (whole seconds); ``None`` starts after the previous element."""
    periods: list[PeriodSpec] = field(default_factory=list)
    """Periods run by this element, in launch order (a retried period is listed by
    every element that ran one of its attempts)."""
    node: str | None = None
    """NodeList and hostname; ``None`` picks ``gpu-node-NN``."""


@dataclass
class StudySpec:
    """A whole study: one job array and its evidence root."""

    study: str
    array_job_id: str
    elements: list[ElementSpec]
    protocol: dict[str, Any] | None = None
    """Written as ``protocol.json`` when set."""
    execution_commits: dict[str, str] | None = None
    """Written as ``execution_commits.json`` (pair -> commit) when set."""
    sacct_extra_lines: list[str] = field(default_factory=list)
    """Appended verbatim to ``sacct-raw.psv`` (after the generated rows)."""
    commit: str = SEED_COMMIT
    """The commit put into every period record."""
    job_name: str = "host-capacity"
    """sacct JobName of the allocation rows."""
    trace_samples: int = 2
    """Memory-sample lines per allocator trace (besides the phase records)."""
    log_filler_lines: int = 0
    """Extra ordinary console lines per training log (for big benchmark studies)."""
    protocol_inputs: dict[str, bytes] | None = None
    """Files written under ``protocol-inputs/``; their SHA-256 go into ``anchors``."""
    epoch_ns: int = SEED_DAY_NS + 18 * 3600 * NS
    """Start of the first element when its ``start_ns`` is not given."""


# --------------------------------------------------------------------------- helpers


def _jitter(label: str, low: int, high: int) -> int:
    """A deterministic integer in ``[low, high]`` derived from ``label`` (no RNG state)."""
    digest = hashlib.sha256(label.encode()).digest()
    return low + int.from_bytes(digest[:8], "big") % (high - low + 1)


def _sacct_time(ns: int) -> str:
    """``YYYY-MM-DDTHH:MM:SS`` in UTC, as ``TZ=UTC SLURM_TIME_FORMAT=standard`` prints it."""
    return datetime.fromtimestamp(ns // NS, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")


def _iso_z(ns: int) -> str:
    """ISO time with a ``Z``, for launcher lines."""
    return _sacct_time(ns) + "Z"


def _ray_time(ns: int) -> str:
    """Python logging's ``2026-09-15 18:55:22,104`` form used by Ray's driver lines."""
    stamp = datetime.fromtimestamp(ns // NS, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")
    return f"{stamp},{(ns % NS) // MS:03d}"


def _vllm_time(ns: int) -> str:
    """vLLM's ``09-15 18:58:12`` log time."""
    return datetime.fromtimestamp(ns // NS, tz=UTC).strftime("%m-%d %H:%M:%S")


def _floor_s(ns: int) -> int:
    return (ns // NS) * NS


def _ceil_s(ns: int) -> int:
    return -(-ns // NS) * NS


def _dumps(obj: Any) -> bytes:
    """Pretty JSON with a trailing newline; key order is the order the dict was built in."""
    return orjson.dumps(obj, option=orjson.OPT_INDENT_2) + b"\n"


def _gpu_uuid(node: str, index: int) -> str:
    digest = hashlib.sha256(f"gpu:{node}:{index}".encode()).hexdigest()
    return f"GPU-{digest[0:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def _node_ip(node: str) -> str:
    number = int(node.rsplit("-", 1)[-1]) if node.rsplit("-", 1)[-1].isdigit() else 0
    return f"10.0.{number // 250}.{number % 250 + 1}"


def _pair_name(model: str, workload: str, seed: int) -> str:
    return f"host-{model}-{workload}-c2-s{seed}"


def default_protocol(periods: Iterable[PeriodSpec]) -> dict[str, Any]:
    """The contract's example protocol with one configuration per (workload, gpus) seen."""
    seeds: dict[tuple[str, int], set[int]] = {}
    for period in periods:
        seeds.setdefault((period.workload, period.gpus), set()).add(period.seed)
    workload_rank = {name: index for index, name in enumerate(WORKLOADS)}
    keys = sorted(seeds, key=lambda key: (workload_rank.get(key[0], 99), key[0], key[1]))
    return {
        "schema": "run-evidence/protocol/v1",
        "name": "host-capacity",
        "terminal_event": {"steps_from": "TOTAL_TRAINING_STEPS"},
        "completion_phases": ["actor_update", "weight_sync"],
        "eligible_failures": [
            {
                "phase": "rollout_init",
                "error_types": ["torch.OutOfMemoryError", "torch.cuda.OutOfMemoryError"],
            }
        ],
        "coordinated_shutdown_flag": SHUTDOWN_FLAG,
        "configurations": [
            {"workload": workload, "gpus": gpus, "seeds": sorted(seeds[(workload, gpus)])}
            for workload, gpus in keys
        ],
    }
