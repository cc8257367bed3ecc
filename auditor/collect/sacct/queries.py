"""Queries on a read dump: the allocation of a job id, the step that explains a failure."""

from __future__ import annotations

from auditor.model import SacctDump, SacctJob, SacctStep

_SEVERITY: dict[str, int] = {
    "OUT_OF_MEMORY": 7,
    "NODE_FAIL": 6,
    "BOOT_FAIL": 6,
    "FAILED": 5,
    "TIMEOUT": 4,
    "DEADLINE": 4,
    "PREEMPTED": 4,
    "CANCELLED": 3,
    "REVOKED": 3,
    "COMPLETED": 0,
}
"""How much a step state says about a failure (unlisted non-COMPLETED states count 1)."""


def job_for(dump: SacctDump, job_id_raw: str) -> SacctJob | None:
    """The allocation whose JobIDRaw is ``job_id_raw`` (the contract's ``<job>``).

    When the dump has no JobIDRaw column, a job whose printed JobID equals
    ``job_id_raw`` (a plain job) is returned instead. A linear scan: index
    ``dump.jobs`` yourself for many look-ups.
    """
    wanted = job_id_raw.strip()
    for job in dump.jobs:
        if job.job_id_raw == wanted:
            return job
    for job in dump.jobs:
        if job.job_id_raw is None and job.job_id == wanted:
            return job
    return None


def worst_step(job: SacctJob) -> SacctStep | None:
    """The step that best explains a failure, possibly hidden under the job's state.

    E.g. ``.0 OUT_OF_MEMORY 0:125`` under ``FAILED 90:0``, ``.batch CANCELLED 0:15``
    under ``TIMEOUT``, ``.0 CANCELLED 0:10`` under ``COMPLETED``. Steps are ranked by
    state (OUT_OF_MEMORY, NODE_FAIL/BOOT_FAIL, FAILED, TIMEOUT/DEADLINE/PREEMPTED,
    CANCELLED, any other unfinished state, then a COMPLETED step with a non-zero exit
    or signal); ties prefer numbered ``srun`` steps over ``batch``/``interactive`` over
    ``extern``, then a signal, then the earliest line. None when every step is
    COMPLETED ``0:0`` (or there are no steps).
    """
    best: SacctStep | None = None
    best_key: tuple[int, int, int, int] | None = None
    for step in job.steps:
        score = 0 if step.state == "UNKNOWN" else _SEVERITY.get(step.state, 1)
        if score == 0 and (step.exit_code or step.signal):
            score = 1
        if score == 0:
            continue
        if step.step.isdigit():
            kind = 3
        elif step.step in ("batch", "interactive"):
            kind = 2
        elif step.step == "extern":
            kind = 0
        else:
            kind = 1
        key = (score, kind, 1 if step.signal else 0, -step.line)
        if best_key is None or key > best_key:
            best, best_key = step, key
    return best

