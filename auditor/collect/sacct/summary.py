"""The ``auditor sacct --json`` document (and the data of its table): one entry per job."""

from __future__ import annotations

import re
from collections import Counter

from auditor.collect.sacct.values import _RE_JOBID, _RE_UINT
from auditor.model import SacctDump, SacctJob


def summary_json(dump: SacctDump) -> dict[str, object]:
    """The ``auditor sacct --json`` document: one entry per allocation row, and totals.

    Entries are sorted by array job (a plain job is its own group), task id (a pending
    range by its first task) and job id, numerically where the ids are numbers.
    ``totals.gpu_seconds`` sums the jobs whose ElapsedRaw and GPUs are both known.
    """
    jobs = sorted(dump.jobs, key=_sort_key)
    entries: list[dict[str, object]] = [
        {
            "job_id": job.job_id,
            "job_id_raw": job.job_id_raw,
            "array_job_id": job.array_job_id,
            "array_task_id": job.array_task_id,
            "state": job.state,
            "exit_code": job.exit_code,
            "signal": job.signal,
            "elapsed_s": job.elapsed_s,
            "gpus": job.gpus,
            "gpu_seconds": job.gpu_seconds,
            "steps": [
                {
                    "step": step.step,
                    "state": step.state,
                    "exit_code": step.exit_code,
                    "signal": step.signal,
                }
                for step in job.steps
            ],
        }
        for job in jobs
    ]
    states = Counter(job.state for job in jobs)
    gpu_seconds = sum(value for job in jobs if (value := job.gpu_seconds) is not None)
    return {
        "jobs": entries,
        "totals": {
            "jobs": len(entries),
            "gpu_seconds": gpu_seconds,
            "states": dict(sorted(states.items())),
        },
    }



def _number_key(text: str) -> tuple[int, int, str]:
    return (0, int(text), "") if _RE_UINT.fullmatch(text) else (1, 0, text)


def _sort_key(job: SacctJob) -> tuple[tuple[int, int, str], tuple[int, int], tuple[int, int, str]]:
    if job.array_job_id is not None:
        group = job.array_job_id
    else:
        match = _RE_JOBID.fullmatch(job.job_id)
        group = match.group("base") if match is not None else job.job_id
    if job.array_task_id is not None:
        task = (job.array_task_id, 0)
    elif job.array_task_spec is not None:
        first = re.match(r"\d{1,18}", job.array_task_spec)
        task = (int(first.group()) if first else 0, 1)
    else:
        task = (-1, 0)
    return _number_key(group), task, _number_key(job.job_id)

