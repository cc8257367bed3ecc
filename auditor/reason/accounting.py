"""GPU time in overlapping scopes: allocation (sacct), task and reservation (invocations)."""

from __future__ import annotations

from auditor.model import Accounting, AttemptOutcome, Collected, ElementCost, Verdict, VerdictKind


def accounting(collected: Collected, outcomes: list[AttemptOutcome],
                verdicts: list[Verdict]) -> Accounting:
    """The study's accounting: the scopes never add up, and unknown ones are None."""
    elements: list[ElementCost] = []
    if collected.sacct is not None:
        arrays = {p.record.array_job_id for p in collected.periods if p.record.array_job_id}
        jobs = {o.job_id for o in outcomes if o.job_id}
        for job in collected.sacct.jobs:
            if job.array_job_id in arrays or job.job_id_raw in jobs or job.job_id in jobs:
                elements.append(ElementCost(job.job_id, job.job_id_raw, job.state, job.elapsed_s,
                                            job.gpus, job.gpu_seconds, job.array_job_id))
    unresolved = {v.subject for v in verdicts if v.verdict is VerdictKind.UNRESOLVED}
    wasted = [o for o in outcomes if o.wasted]
    accounted = {e.job_id for e in elements} | {e.job_id_raw for e in elements if e.job_id_raw}
    missing = sorted({o.job_id for o in outcomes if o.job_id and o.job_id not in accounted}
                     ) if collected.scheduler_usable() else []
    return Accounting(
        allocation_gpu_seconds=sum(e.gpu_seconds or 0 for e in elements)
        if collected.scopes_known()[0] else None,
        task_gpu_seconds=round(sum(o.task_gpu_seconds for o in outcomes), 6),
        reservation_gpu_seconds=round(sum(o.reservation_gpu_seconds for o in outcomes), 6)
        if collected.scopes_known()[1] else None,
        wasted_gpu_seconds=round(sum(o.task_gpu_seconds for o in wasted), 6),
        unresolved_gpu_seconds=round(sum(o.task_gpu_seconds for o in outcomes
                                         if o.counted and o.subject in unresolved), 6),
        elements=tuple(elements),
        wasted_attempts=len(wasted),
        jobs_without_element=tuple(missing),
    )
