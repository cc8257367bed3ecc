"""GPU time in overlapping scopes: allocation (sacct), task and reservation (invocations).

The allocation scope is the contract's: per array element, every record of it (a ``sacct
-D`` dump keeps one per requeued or preempted run, each of which held the GPUs), with the
share lost to requeue or preemption named apart. A job that ran attempts but is no element
of the study's arrays (a retry submitted as a job of its own) is counted apart, named.
"""

from __future__ import annotations

from collections.abc import Sequence

from auditor.model import (
    Accounting,
    AttemptOutcome,
    Collected,
    ElementCost,
    SacctJob,
    Verdict,
    VerdictKind,
)


def accounting(collected: Collected, outcomes: Sequence[AttemptOutcome],
                verdicts: Sequence[Verdict]) -> Accounting:
    """The study's accounting: the scopes never add up, and unknown ones are None."""
    elements: list[ElementCost] = []
    if collected.sacct is not None:
        arrays = {p.record.array_job_id for p in collected.periods if p.record.array_job_id}
        jobs = {o.job_id for o in outcomes if o.job_id}
        accounted = [job for job in collected.sacct.jobs
                     if job.array_job_id in arrays or job.job_id_raw in jobs
                     or job.job_id in jobs]
        arrays = arrays or {job.array_job_id for job in accounted if job.array_job_id}
        by_id = "jobid" in {name.lower() for name in collected.sacct.fields}
        elements = [_cost(job, outside=by_id and bool(arrays)
                          and job.array_job_id not in arrays) for job in accounted]
    unresolved = {v.subject for v in verdicts if v.verdict is VerdictKind.UNRESOLVED}
    wasted = [o for o in outcomes if o.wasted]
    untimed = [o for o in outcomes if o.started_ns is None or o.finished_ns is None]
    accounted_ids = {e.job_id for e in elements} | {e.job_id_raw for e in elements
                                                    if e.job_id_raw}
    missing = sorted({o.job_id for o in outcomes if o.job_id and o.job_id not in accounted_ids}
                     ) if collected.scheduler_usable() else []
    allocation_known = collected.scopes_known()[0]
    inside = [e for e in elements if not e.outside_array]
    outside = [e for e in elements if e.outside_array]
    return Accounting(
        allocation_gpu_seconds=sum(e.known_gpu_seconds for e in inside)
        if allocation_known else None,
        task_gpu_seconds=round(sum(o.task_gpu_seconds for o in outcomes), 6),
        reservation_gpu_seconds=round(sum(o.reservation_gpu_seconds for o in outcomes), 6)
        if collected.scopes_known()[1] else None,
        wasted_gpu_seconds=round(sum(o.task_gpu_seconds for o in wasted), 6),
        unresolved_gpu_seconds=round(sum(o.task_gpu_seconds for o in outcomes
                                         if o.counted and o.subject in unresolved), 6),
        elements=tuple(elements),
        wasted_attempts=len(wasted),
        jobs_without_element=tuple(missing),
        requeued_gpu_seconds=sum(e.requeued_gpu_seconds for e in inside)
        if allocation_known else None,
        jobs_outside_array=tuple(e.job_id for e in outside),
        outside_array_gpu_seconds=sum(e.known_gpu_seconds for e in outside)
        if allocation_known else None,
        allocation_records_unknown=sum(e.unknown_records for e in inside)
        if allocation_known else 0,
        attempts_without_times=len(untimed),
        wasted_at_least=any(o.wasted for o in untimed),
        unresolved_at_least=any(o.counted and o.subject in unresolved for o in untimed),
    )


def _cost(job: SacctJob, outside: bool = False) -> ElementCost:
    """One record's figures, its earlier records (``-D``) as its attempts."""
    return ElementCost(job.job_id, job.job_id_raw, job.state, job.elapsed_s, job.gpus,
                       job.gpu_seconds, job.array_job_id,
                       attempts=tuple(_cost(record) for record in job.attempts),
                       outside_array=outside)
