"""The presets: the seed study (:func:`example_spec`), one period per outcome
(:func:`mixed_spec`), large studies for benchmarks (:func:`scale_spec`), and :func:`generate`."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from auditor._studygen.spec import (
    MODEL,
    MS,
    NS,
    OUTCOMES,
    SEED_COMMIT,
    SEED_DAY_NS,
    WORKLOADS,
    ElementSpec,
    PeriodSpec,
    StudySpec,
    _ceil_s,
    _floor_s,
    _jitter,
    _pair_name,
    default_protocol,
)
from auditor._studygen.write import write_study

# --------------------------------------------------------------------------- presets

# index -> (workload, seed, actual job, 4-GPU period, actor update finished, post-update sync
# finished, raw peak MiB, worker pids of the 4-GPU period in rank order), from seed 002.
_SEED_TABLE = (
    (
        "code_heavy_tail",
        161,
        "5055846",
        1,
        "19:01:31.699704267",
        "19:02:18.386028932",
        39842,
        (758712, 758713, 758714, 758715),
    ),
    (
        "gsm8k",
        163,
        "5055847",
        2,
        "19:05:57.381348829",
        "19:08:02.327763208",
        38560,
        (3563810, 3563811, 3563812, 3563813),
    ),
    (
        "code_heavy_tail",
        162,
        "5055848",
        2,
        "19:04:48.459750884",
        "19:05:59.536233566",
        39392,
        (3495668, 3495669, 3495670, 3495671),
    ),
    (
        "gsm8k",
        162,
        "5055858",
        1,
        "19:09:58.895325061",
        "19:10:32.865654877",
        38560,
        (802123, 802124, 802125, 802126),
    ),
    (
        "math",
        162,
        "5055859",
        2,
        "19:14:44.017014711",
        "19:15:55.046759828",
        39086,
        (3539673, 3539674, 3539675, 3539676),
    ),
    (
        "code_heavy_tail",
        163,
        "5055860",
        2,
        "19:16:12.444318056",
        "19:17:22.263802288",
        39648,
        (3613579, 3613580, 3613582, 3613583),
    ),
    (
        "math",
        163,
        "5055863",
        1,
        "19:19:05.722544967",
        "19:20:47.573877478",
        39086,
        (843954, 843955, 843956, 843957),
    ),
    (
        "math",
        161,
        "5055864",
        1,
        "19:21:44.142735712",
        "19:22:20.560774115",
        39086,
        (3571156, 3571157, 3571158, 3571159),
    ),
    (
        "gsm8k",
        161,
        "5055845",
        2,
        "19:25:33.619484057",
        "19:27:04.665561977",
        38560,
        (3657525, 3657526, 3657527, 3657528),
    ),
)
_SEED_NODES = (3, 11, 6, 21, 8, 14, 25, 9, 17)
SEED_ARRAY_JOB_ID = "5055845"
SEED_ELAPSED_TOTAL_S = 5207
"""Sum of the nine outer ElapsedRaw values (x4 GPUs = 20,828 GPU-seconds)."""
SEED_LAST_END = "19:27:18"
SEED_TASK_GPU_NS = 17_605_783_111_000
"""Task scope of the seed, 17,605.783111 GPU-seconds, in GPU-nanoseconds."""
SEED_RESERVATION_GPU_NS = 20_199_935_106_000
"""Reservation scope of the seed, 20,199.935106 GPU-seconds, in GPU-nanoseconds."""


def _seed_clock(text: str) -> int:
    """``HH:MM:SS[.fraction]`` on the seed day -> nanoseconds since the epoch."""
    clock, _, fraction = text.partition(".")
    hours, minutes, seconds = (int(part) for part in clock.split(":"))
    return (
        SEED_DAY_NS
        + ((hours * 60 + minutes) * 60 + seconds) * NS
        + int((fraction or "0").ljust(9, "0"))
    )


def _seed_durations() -> tuple[list[int], list[int]]:
    """Per-element 2-GPU and 4-GPU invocation lengths that give the seed's two scopes.

    With D2, D4 the sums over elements: 2*D2 + 4*D4 = task scope and 4*(D2 + D4) =
    reservation scope, so D2 = (reservation - task) / 2 and D4 = reservation / 4 - D2.
    Elements 0..7 get plausible lengths; element 8 takes the exact remainders.
    """
    total_2 = (SEED_RESERVATION_GPU_NS - SEED_TASK_GPU_NS) // 2
    total_4 = SEED_RESERVATION_GPU_NS // 4 - total_2
    assert 2 * total_2 + 4 * total_4 == SEED_TASK_GPU_NS
    d2 = [_jitter(f"d2:{index}", 136 * NS, 152 * NS) for index in range(8)]
    d4 = [_jitter(f"d4:{index}", 400 * NS, 436 * NS) for index in range(8)]
    d2.append(total_2 - sum(d2))
    d4.append(total_4 - sum(d4))
    return d2, d4


def example_spec() -> StudySpec:
    """The seed study of ``002_968e25e0521cc66f.txt``: 9 elements, 18 launches, 0 completions.

    Every 4-GPU period is ``terminal_missing`` with the worker pids, actor-update and
    post-update sync times and raw peaks of seed 002's table; every 2-GPU period is
    ``rollout_init_oom``. All elements are ``FAILED 2:0`` with 4 GPUs, ElapsedRaw sums to
    5207 s, and element 8 (job 5055845) ends at 19:27:18 UTC.
    """
    d2, d4 = _seed_durations()
    elements: list[ElementSpec] = []
    pairs: list[PeriodSpec] = []
    windows: list[tuple[int, int]] = []
    for index, row in enumerate(_SEED_TABLE):
        workload, seed, job, period4, update, sync, peak, pids4 = row
        update_ns, sync_ns = _seed_clock(update), _seed_clock(sync)
        finish4 = sync_ns + _jitter(f"post:{index}", 1_200 * MS, 3_500 * MS)
        start4 = finish4 - d4[index]
        gap = _jitter(f"gap:{index}", 4_000 * MS, 9_000 * MS)
        pid_step = _jitter(f"pid2:{index}", 1_800, 6_000)
        if period4 == 1:
            start2 = finish4 + gap
            first, last = start4, start2 + d2[index]
            pid2 = pids4[-1] + pid_step
        else:
            start2 = start4 - gap - d2[index]
            first, last = start2, finish4
            pid2 = pids4[0] - pid_step
        lead = _jitter(f"lead:{index}", 2_000 * MS, 6_000 * MS)
        tail = _jitter(f"tail:{index}", 2_000 * MS, 6_000 * MS)
        windows.append((_floor_s(first - lead), _ceil_s(last + tail)))
        pair = _pair_name(MODEL, workload, seed)
        four = PeriodSpec(
            pair=pair,
            workload=workload,
            seed=seed,
            model=MODEL,
            period=period4,
            gpus=4,
            outcome="terminal_missing",
            started_ns=start4,
            duration_ns=d4[index],
            worker_pids=list(pids4),
            driver_pid=pids4[0] - 125,
            peak_mib=peak,
            actor_update_finished_ns=update_ns,
            weight_sync_finished_ns=sync_ns,
        )
        two = PeriodSpec(
            pair=pair,
            workload=workload,
            seed=seed,
            model=MODEL,
            period=3 - period4,
            gpus=2,
            outcome="rollout_init_oom",
            started_ns=start2,
            duration_ns=d2[index],
            worker_pids=[pid2, pid2 + 1],
            driver_pid=pid2 - 125,
            peak_mib=_jitter(f"peak2:{index}", 39_950, 40_210),
        )
        periods = [four, two] if period4 == 1 else [two, four]
        pairs.extend(periods)
        elements.append(
            ElementSpec(
                array_task_id=index,
                job_id=job,
                state="FAILED",
                exit_code="2:0",
                alloc_gpus=4,
                periods=periods,
                node=f"gpu-node-{_SEED_NODES[index]:02d}",
            )
        )
    # Element 8 ends at 19:27:18; its Start is placed so ElapsedRaw sums to 5207 s.
    last_end = _seed_clock(SEED_LAST_END)
    others = sum(end - start for start, end in windows[:-1]) // NS
    windows[-1] = (last_end - (SEED_ELAPSED_TOTAL_S - others) * NS, last_end)
    for element, (start, end) in zip(elements, windows, strict=True):
        element.start_ns = start
        element.elapsed_s = (end - start) // NS
    return StudySpec(
        study="estimation_host_capacity",
        array_job_id=SEED_ARRAY_JOB_ID,
        elements=elements,
        protocol=default_protocol(pairs),
        execution_commits={period.pair: SEED_COMMIT for period in pairs},
    )


MIXED_ARRAY_JOB_ID = "5061000"

# outcome -> (workload, seed, gpus, knobs)
_MIXED_TABLE: tuple[tuple[str, str, int, int, dict[str, Any]], ...] = (
    ("completed", "gsm8k", 161, 4, {"ansi": True}),
    ("terminal_missing", "gsm8k", 162, 4, {}),
    ("rollout_init_oom", "gsm8k", 163, 2, {}),
    ("coordinated_shutdown", "math", 161, 4, {"terminal_style": "np"}),
    ("flag_off_143", "math", 162, 4, {}),
    ("scancel_sigusr1", "math", 163, 4, {}),
    ("sigkill_137", "code_heavy_tail", 161, 4, {}),
    ("cancelled", "code_heavy_tail", 162, 4, {}),
    ("timed_out", "code_heavy_tail", 163, 4, {}),
    ("node_failure", "gsm8k", 164, 4, {}),
    ("retried", "math", 164, 4, {"terminal_style": "float", "validation_tail": True}),
    ("pending", "code_heavy_tail", 164, 4, {}),
)


def mixed_spec() -> StudySpec:
    """One period of every outcome in :data:`OUTCOMES`, one pair each, period 1.

    Elements are numbered in :data:`OUTCOMES` order; the retried period's second attempt
    runs in the next element, and the pending element (last) is job ``5061000`` itself,
    as SLURM keeps the array id for the pending meta-record.
    """
    elements: list[ElementSpec] = []
    periods: list[PeriodSpec] = []
    task = 0
    for outcome, workload, seed, gpus, knobs in _MIXED_TABLE:
        period = PeriodSpec(
            pair=_pair_name(MODEL, workload, seed),
            workload=workload,
            seed=seed,
            model=MODEL,
            period=1,
            gpus=gpus,
            outcome=outcome,
            **knobs,
        )
        periods.append(period)
        copies = 2 if outcome == "retried" else 1
        for _ in range(copies):
            job = MIXED_ARRAY_JOB_ID if outcome == "pending" else str(5061001 + task)
            elements.append(
                ElementSpec(
                    array_task_id=task,
                    job_id=job,
                    periods=[period],
                    node=f"gpu-node-{31 + task:02d}",
                )
            )
            task += 1
    return StudySpec(
        study="mixed_outcomes",
        array_job_id=MIXED_ARRAY_JOB_ID,
        elements=elements,
        protocol=default_protocol(periods),
        execution_commits={period.pair: SEED_COMMIT for period in periods},
        epoch_ns=SEED_DAY_NS + 8 * 3600 * NS,
    )


def scale_spec(elements: int = 100, trace_samples: int = 1000, log_lines: int = 1000) -> StudySpec:
    """A big seed-shaped study for benchmarks: ``elements`` elements of two periods each.

    The 4-GPU period cycles completed / terminal_missing / completed, the 2-GPU period is
    always ``rollout_init_oom``; each allocator trace holds ``trace_samples`` memory samples
    and each log ``log_lines`` filler lines besides the usual ones.
    """
    if elements < 1:
        raise ValueError("a scale study needs at least one element")
    array = 6_000_000
    specs: list[ElementSpec] = []
    periods: list[PeriodSpec] = []
    cycle = ("completed", "terminal_missing", "completed")
    for index in range(elements):
        workload = WORKLOADS[index % len(WORKLOADS)]
        seed = 161 + index // len(WORKLOADS)
        pair = _pair_name(MODEL, workload, seed)
        period4 = 1 + _jitter(f"order:{index}", 0, 1)
        four = PeriodSpec(
            pair=pair,
            workload=workload,
            seed=seed,
            model=MODEL,
            period=period4,
            gpus=4,
            outcome=cycle[index % len(cycle)],
        )
        two = PeriodSpec(
            pair=pair,
            workload=workload,
            seed=seed,
            model=MODEL,
            period=3 - period4,
            gpus=2,
            outcome="rollout_init_oom",
        )
        pair_periods = [four, two] if period4 == 1 else [two, four]
        periods.extend(pair_periods)
        job = str(array) if index == elements - 1 else str(array + 1 + index)
        specs.append(ElementSpec(array_task_id=index, job_id=job, periods=pair_periods))
    return StudySpec(
        study="scale_study",
        array_job_id=str(array),
        elements=specs,
        protocol=default_protocol(periods),
        execution_commits={period.pair: SEED_COMMIT for period in periods},
        trace_samples=trace_samples,
        log_filler_lines=log_lines,
    )


PRESETS = ("example", "mixed", "scale")


def generate(
    kind: str, root: Path, *, elements: int = 100, trace_samples: int = 1000, log_lines: int = 1000
) -> Path:
    """Write the preset ``kind`` (one of :data:`PRESETS`) under ``root``; return ``root``."""
    if kind == "example":
        spec = example_spec()
    elif kind == "mixed":
        spec = mixed_spec()
    elif kind == "scale":
        spec = scale_spec(elements, trace_samples, log_lines)
    else:
        raise ValueError(f"unknown preset {kind!r}; choose one of {', '.join(PRESETS)}")
    return write_study(spec, Path(root))


def with_outcome(period: PeriodSpec, outcome: str) -> PeriodSpec:
    """A copy of ``period`` with another outcome (handy for defect fixtures)."""
    if outcome not in OUTCOMES:
        raise ValueError(f"unknown outcome {outcome!r}")
    return replace(period, outcome=outcome)
