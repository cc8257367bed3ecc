"""Planning: resolve a :class:`~auditor._studygen.spec.StudySpec` to concrete attempts
(times, pids, hosts) and check they are consistent."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from auditor._studygen.spec import (
    _ATTEMPT_OUTCOMES,
    _DEFAULT_DURATION_S,
    _ELEMENT_STATE_ORDER,
    _FULL_PHASE_OUTCOMES,
    MS,
    NS,
    AttemptSpec,
    ElementSpec,
    PeriodSpec,
    StudySpec,
    _ceil_s,
    _jitter,
)

# --------------------------------------------------------------------------- planning


@dataclass
class _Run:
    """One attempt, resolved to concrete times, pids and hosts."""

    element: ElementSpec
    period: PeriodSpec
    attempt: AttemptSpec
    attempt_number: int
    step_index: int
    node: str
    started_ns: int
    finished_ns: int
    kill_ns: int | None
    driver_pid: int
    worker_pids: list[int]
    peak_mib: int
    actor_update_finished_ns: int | None
    weight_sync_finished_ns: int | None

    @property
    def job_id(self) -> str:
        return self.element.job_id

    @property
    def attempt_dir(self) -> str:
        return f"{self.period.pair}-{self.period.gpus}gpu/attempt-{self.job_id}"

    @property
    def outcome(self) -> str:
        return self.attempt.outcome

    @property
    def idle_check_ns(self) -> int:
        return self.finished_ns + _jitter(
            f"idle:{self.job_id}:{self.step_index}", 600 * MS, 950 * MS
        )


@dataclass
class _ElementPlan:
    element: ElementSpec
    state: str
    exit_code: str
    start_ns: int | None
    end_ns: int | None
    node: str
    runs: list[_Run]


def _attempts_of(period: PeriodSpec) -> list[AttemptSpec]:
    """The attempts a period stands for (a single attempt built from the period's fields)."""
    if period.attempts:
        return period.attempts
    if period.outcome == "retried":
        return [AttemptSpec("completed"), AttemptSpec("completed")]
    return [
        AttemptSpec(
            outcome=period.outcome,
            started_ns=period.started_ns,
            duration_ns=period.duration_ns,
            worker_pids=period.worker_pids,
            driver_pid=period.driver_pid,
            peak_mib=period.peak_mib,
            actor_update_finished_ns=period.actor_update_finished_ns,
            weight_sync_finished_ns=period.weight_sync_finished_ns,
        )
    ]


def _assign_attempt_jobs(spec: StudySpec) -> dict[int, list[tuple[AttemptSpec, str]]]:
    """Map each period object (by id) to its attempts paired with the job that ran them."""
    listing: dict[int, list[str]] = {}
    periods: dict[int, PeriodSpec] = {}
    for element in spec.elements:
        for period in element.periods:
            listing.setdefault(id(period), []).append(element.job_id)
            periods[id(period)] = period
    assigned: dict[int, list[tuple[AttemptSpec, str]]] = {}
    for key, period in periods.items():
        jobs = listing[key]
        pairs: list[tuple[AttemptSpec, str]] = []
        for index, attempt in enumerate(_attempts_of(period)):
            if attempt.outcome not in _ATTEMPT_OUTCOMES and period.outcome != "pending":
                raise ValueError(f"{period.pair}: attempt outcome {attempt.outcome!r} invalid")
            if attempt.job_id is not None:
                job = attempt.job_id
            elif index < len(jobs):
                job = jobs[index]
            else:
                raise ValueError(
                    f"{period.pair} period {period.period}: attempt {index + 1} has no job; "
                    "list the period in one element per attempt or set AttemptSpec.job_id"
                )
            if job not in jobs:
                raise ValueError(f"{period.pair}: attempt job {job} does not list the period")
            pairs.append((attempt, job))
        assigned[key] = pairs
    return assigned


def _element_state(element: ElementSpec, outcomes: Sequence[str]) -> tuple[str, str]:
    for outcome, state, code in _ELEMENT_STATE_ORDER:
        if outcome in outcomes:
            derived = (state, code)
            break
    else:
        derived = ("COMPLETED", "0:0")
    return element.state or derived[0], element.exit_code or derived[1]


def _default_pids(label: str, gpus: int) -> list[int]:
    first = _jitter(f"pid:{label}", 200_000, 3_900_000)
    return [first + rank for rank in range(gpus)]


def _default_peak(label: str, outcome: str) -> int:
    if outcome == "rollout_init_oom":
        return _jitter(f"peak:{label}", 39_950, 40_210)
    return _jitter(f"peak:{label}", 37_900, 39_850)


def _plan(spec: StudySpec) -> list[_ElementPlan]:
    """Resolve every attempt to concrete times and identities, and check they are consistent."""
    if len({element.job_id for element in spec.elements}) != len(spec.elements):
        raise ValueError("two elements share a job id")
    assigned = _assign_attempt_jobs(spec)
    plans: list[_ElementPlan] = []
    previous_end = spec.epoch_ns - 20 * NS
    for position, element in enumerate(spec.elements):
        node = element.node or f"gpu-node-{position % 48 + 1:02d}"
        todo: list[tuple[PeriodSpec, AttemptSpec, int]] = []
        for period in element.periods:
            if period.outcome == "pending":
                continue
            for number, (attempt, job) in enumerate(assigned[id(period)], start=1):
                if job == element.job_id:
                    todo.append((period, attempt, number))
        outcomes = [attempt.outcome for _, attempt, _ in todo]
        if any(period.outcome == "pending" for period in element.periods):
            outcomes.append("pending")
        state, exit_code = _element_state(element, outcomes)
        if state == "PENDING":
            if todo:
                raise ValueError(f"element {element.array_task_id} is PENDING but ran attempts")
            plans.append(_ElementPlan(element, state, exit_code, None, None, node, []))
            continue
        start = element.start_ns if element.start_ns is not None else previous_end + 20 * NS
        start = _ceil_s(start) if element.start_ns is None else start
        if start % NS:
            raise ValueError(f"element {element.array_task_id}: start_ns must be whole seconds")
        runs = _plan_runs(element, todo, start, node)
        end = _element_end(element, start, runs)
        for run in runs:
            if run.idle_check_ns >= end:
                raise ValueError(
                    f"element {element.array_task_id}: attempt of {run.period.pair} "
                    "does not end (and get checked idle) before the element's sacct End"
                )
        plans.append(_ElementPlan(element, state, exit_code, start, end, node, runs))
        previous_end = end
    _check_attempt_order(plans)
    return plans


def _plan_runs(
    element: ElementSpec, todo: Sequence[tuple[PeriodSpec, AttemptSpec, int]], start: int,
    node: str,
) -> list[_Run]:
    """The attempts ``element`` runs, one after the other from its ``start``."""
    cursor = start + _jitter(f"lead:{element.job_id}", 2_000 * MS, 6_000 * MS)
    runs: list[_Run] = []
    for step_index, (period, attempt, number) in enumerate(todo):
        if runs and runs[-1].kill_ns is not None:
            raise ValueError(f"element {element.array_task_id}: nothing runs after a kill")
        label = f"{element.job_id}:{period.pair}:{period.period}:{number}"
        begin = attempt.started_ns if attempt.started_ns is not None else cursor
        duration = attempt.duration_ns
        if duration is None:
            duration = _DEFAULT_DURATION_S[attempt.outcome] * NS
            duration += _jitter(f"dur:{label}", 0 * MS, 9_999 * MS)
        kill_ns = None
        finished = begin + duration
        if attempt.outcome in ("cancelled", "timed_out"):
            kill_ns = _ceil_s(begin + duration)
            finished = kill_ns + _jitter(f"exit:{label}", 400 * MS, 900 * MS)
        elif attempt.outcome == "node_failure":
            kill_ns = finished
        pids = list(attempt.worker_pids or _default_pids(label, period.gpus))
        if len(pids) != period.gpus or len(set(pids)) != len(pids):
            raise ValueError(f"{label}: need {period.gpus} distinct worker pids")
        driver = attempt.driver_pid if attempt.driver_pid is not None else pids[0] - 125
        update_ns = attempt.actor_update_finished_ns
        sync_ns = attempt.weight_sync_finished_ns
        if attempt.outcome in _FULL_PHASE_OUTCOMES:
            if sync_ns is None:
                sync_ns = finished - _jitter(f"post:{label}", 1_500 * MS, 3_500 * MS)
            if update_ns is None:
                update_ns = sync_ns - _jitter(f"sync:{label}", 30_000 * MS, 70_000 * MS)
            if not begin + 60 * NS < update_ns < sync_ns - NS // 2 < finished - NS:
                raise ValueError(f"{label}: actor update / sync times do not fit the run")
        run = _Run(
            element=element,
            period=period,
            attempt=attempt,
            attempt_number=number,
            step_index=step_index,
            node=node,
            started_ns=begin,
            finished_ns=finished,
            kill_ns=kill_ns,
            driver_pid=driver,
            worker_pids=pids,
            peak_mib=attempt.peak_mib or _default_peak(label, attempt.outcome),
            actor_update_finished_ns=update_ns,
            weight_sync_finished_ns=sync_ns,
        )
        if runs and begin <= runs[-1].idle_check_ns:
            raise ValueError(f"{label}: starts before the previous attempt was checked idle")
        if begin < start + NS:
            raise ValueError(f"{label}: starts before its element's sacct Start")
        runs.append(run)
        cursor = run.finished_ns + _jitter(f"gap:{label}", 4_000 * MS, 9_000 * MS)
    return runs


def _element_end(element: ElementSpec, start: int, runs: Sequence[_Run]) -> int:
    """The element's sacct End: its elapsed time if given, else after its last attempt."""
    if element.elapsed_s is not None:
        end = start + element.elapsed_s * NS
    elif runs and runs[-1].kill_ns is not None and runs[-1].outcome != "node_failure":
        end = runs[-1].kill_ns + 2 * NS
    elif runs:
        tail = _jitter(f"tail:{element.job_id}", 2_000 * MS, 6_000 * MS)
        end = _ceil_s(runs[-1].finished_ns + tail)
    else:
        end = start + 30 * NS
    return end


def _check_attempt_order(plans: Sequence[_ElementPlan]) -> None:
    by_period: dict[int, list[_Run]] = {}
    for plan in plans:
        for run in plan.runs:
            by_period.setdefault(id(run.period), []).append(run)
    for runs in by_period.values():
        runs.sort(key=lambda run: run.attempt_number)
        for earlier, later in zip(runs, runs[1:], strict=False):
            if later.started_ns <= earlier.finished_ns:
                raise ValueError(f"{later.period.pair}: attempts overlap or are out of order")
