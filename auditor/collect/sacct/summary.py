"""The ``auditor sacct --json`` document (and the data of its table): one entry per job."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from itertools import islice

from auditor.collect.sacct.values import _RE_JOBID, _RE_UINT
from auditor.model import Finding, SacctDump, SacctJob, SacctStep


def summary_json(dump: SacctDump, entries: int | None = None) -> dict[str, object]:
    """The ``auditor sacct --json`` document: one entry per allocation, totals, findings
    (``entries``: only the first so many entries are made, the totals still count every
    job: the table shows a few hundred of a cluster's million, and an entry per job cost
    more than the dump itself). :func:`summary_parts` gives the same document with the
    entries apart, made one at a time (``--json`` writes each as it is made).

    Entries are sorted by array job (a plain job is its own group), task id (a pending
    range by its first task) and job id, numerically where the ids are numbers. An entry's
    ``exit_code`` is as sacct printed it; ``exit_code_may_be`` says what it may stand for
    (``[15, 143]``: sacct drops 128); a ``sacct --json`` record's code is exact and has no
    ``exit_code_may_be``. ``attempts`` are the job's earlier records (``sacct -D``), oldest first;
    ``gpu_seconds`` is the latest record's. A pending range lists the tasks it still holds
    (``pending_tasks``: not those with rows of their own).
    ``totals.gpu_seconds`` sums every record of every job (attempts too), None when the
    dump lacks ElapsedRaw/Elapsed or AllocTRES (unknown, not 0; ``gpu_seconds_unknown``
    counts the records whose value is unknown in a dump that has both);
    ``totals.requeued_gpu_seconds`` is the share lost to requeue or preemption;
    ``totals.jobs_outside_array`` names the jobs of a dump with array elements that are
    no element of any (a retry submitted on its own), ``outside_array_gpu_seconds`` their
    share. ``findings`` are the dump's (one line each: a header that disagrees with
    ``--format``, rows that could not be read, a dump captured without ``-D``).
    """
    document, made = summary_parts(dump)
    document["jobs"] = list(made if entries is None else islice(made, max(entries, 0)))
    return document


def summary_parts(dump: SacctDump) -> tuple[dict[str, object], Iterator[dict[str, object]]]:
    """:func:`summary_json`'s document with its ``jobs`` list empty, and that list's entries,
    in order, each made when it is asked for: a whole cluster's entries, held together,
    took about 8 times the dump's bytes."""
    jobs = sorted(dump.jobs, key=_sort_key)
    states = Counter(job.state for job in jobs)
    names = {name.lower() for name in dump.fields}
    known = (bool(names & {"elapsedraw", "elapsed"}) or {"start", "end"} <= names) \
        and "alloctres" in names and not dump.gpus_untracked  # (no ElapsedRaw: End - Start)
    records = [record for job in jobs for record in job.records]
    gpu_seconds = sum(value for record in records if (value := record.gpu_seconds) is not None)
    requeued = sum(value for job in jobs for record in job.lost_records
                   if (value := record.gpu_seconds) is not None)  # (each record known)
    arrays = any(job.array_job_id is not None for job in jobs)
    outside = [job for job in jobs if arrays and job.array_job_id is None] \
        if "jobid" in names else []
    document: dict[str, object] = {
        "jobs": [],
        "totals": {
            "jobs": len(jobs),
            "gpu_seconds": gpu_seconds if known else None,
            "gpu_seconds_unknown": sum(1 for r in records if r.gpu_seconds is None)
            if known else len(records),
            "requeued_gpu_seconds": requeued if known else None,
            "jobs_outside_array": [job.job_id for job in outside],
            "outside_array_gpu_seconds": sum(value for job in outside for record in job.records
                                             if (value := record.gpu_seconds) is not None)
            if known else None,
            "states": dict(sorted(states.items())),
        },
        "findings": [{"rule_id": f.rule_id, "line": _line(f), "message": f.message}
                     for f in dump.findings],
    }
    return document, (_entry(job) for job in jobs)


def _entry(job: SacctJob) -> dict[str, object]:
    entry: dict[str, object] = {
        "job_id": job.job_id,
        "job_id_raw": job.job_id_raw,
        "array_job_id": job.array_job_id,
        "array_task_id": job.array_task_id,
        "state": job.state,
        "exit_code": job.exit_code,
        "exit_code_may_be": _possible(job.exit_code_may_be),
        "signal": job.signal,
        "elapsed_s": job.elapsed_s,
        "gpus": job.gpus,
        "gpu_seconds": job.gpu_seconds,
        "steps": [_step(step) for step in job.steps],
        "attempts": [
            _exact({"state": record.state, "exit_code": record.exit_code,
                    "exit_code_may_be": _possible(record.exit_code_may_be),
                    "signal": record.signal, "elapsed_s": record.elapsed_s, "gpus": record.gpus,
                    "gpu_seconds": record.gpu_seconds, "start": record.start,
                    "end": record.end, "line": record.line,
                    "steps": [_step(step) for step in record.steps]}, record.exit_exact)
            for record in job.attempts
        ],
    }
    _exact(entry, job.exit_exact)
    if job.restarts is not None:
        entry["restarts"] = job.restarts
    if job.array_task_spec is not None:
        tasks = job.pending_tasks
        entry["pending_tasks"] = list(tasks) if tasks is not None else None
    return entry


def _step(step: SacctStep) -> dict[str, object]:
    return _exact({"step": step.step, "state": step.state, "exit_code": step.exit_code,
                   "exit_code_may_be": _possible(step.exit_code_may_be), "signal": step.signal},
                  step.exit_exact)


def _exact(item: dict[str, object], exact: bool) -> dict[str, object]:
    """``item`` without ``exit_code_may_be`` when its exit code is exact (``sacct --json``
    of 23.11 on, contract v1.2: "no exit_code_may_be"): nothing for a reader to guess."""
    if exact:
        del item["exit_code_may_be"]
    return item


def _possible(codes: tuple[int, ...] | None) -> list[int] | None:
    return None if codes is None else list(codes)


def _line(item: Finding) -> int | None:
    return item.citations[0].line if item.citations else None



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
