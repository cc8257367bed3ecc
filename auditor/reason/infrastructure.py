"""Infrastructure: which sacct row is an attempt's, what the scheduler and the logs say ended
the attempt (a time limit, a cancellation, a node failure, host memory, an NCCL timeout, a
GPU fault, ...), and whether that end came after the attempt had already exited cleanly.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from auditor.model import (
    AttemptEvidence,
    CauseWord,
    Citation,
    Collected,
    Finding,
    LogEvent,
    PeriodEvidence,
    SacctJob,
    TrainingLogScan,
    TrialRecord,
)
from auditor.reason.causes import TIERS, event_cause, merged_events
from auditor.rules import describe, finding
from auditor.validate.checks import element_for, own_record


def scheduler_element(period: PeriodEvidence, job_id: str | None,
                      collected: Collected) -> SacctJob | None:
    """The sacct row of the attempt's job; for an element still inside a pending range
    (``7000000_[2-3]``), which has no row of its own, that range."""
    element = element_for(collected.sacct, job_id)
    record = period.record
    if element is None and collected.sacct is not None and record.array_task_id is not None:
        element = next((job for job in collected.sacct.jobs
                        if job.array_job_id == record.array_job_id
                        and job.covers(record.array_task_id)), None)
    return element


HARDWARE_STATES = frozenset({"NODE_FAIL", "BOOT_FAIL", "OUT_OF_MEMORY"})
"""States of a run's record (or of one of its steps) that say its node or its memory failed."""
SCHEDULER_STATES = frozenset({"TIMEOUT", "DEADLINE", "PREEMPTED", "CANCELLED"})
"""States of a run's record that say the scheduler ended it: an earlier run's as much as the
latest's (none a success). ``REQUEUED`` is not one: a batch script requeues its own job, as
seed 000's did after a coordinated shutdown it read as a crash (that run may have finished)."""


RUN_END_SLACK_S = 60
"""How long before its run's recorded end an attempt may have ended and still be what that
end hit (a trial record is written as the command returns; clocks of two nodes differ)."""
NS = 1_000_000_000


def run_key(job: str, restart: int | None) -> str | None:
    """The key of one run of a job (``<job>#r<n>``), None when its restart is unknown."""
    return None if restart is None else f"{job}#r{restart}"


def run_record(element: SacctJob, attempt: AttemptEvidence, period: PeriodEvidence,
               last_of_run: bool) -> tuple[SacctJob, bool]:
    """The record that judges an attempt that is not its job's last, and whether it judges
    it as the latest record judges the job's last: the run's own earlier record (``sacct
    -D``) when the attempt is the last its run launched (``last_of_run``: an element runs
    several periods in one job), had not ended before the run did (:data:`RUN_END_SLACK_S`)
    and that record says its node or its memory failed (on it or a step) or the scheduler
    ended it (:data:`SCHEDULER_STATES`: a run preempted, cancelled or timed out, whose 143
    was never the coordinated shutdown); else the job's latest record, as for any earlier
    attempt (False)."""
    if not last_of_run:
        return element, False
    own, _ = own_record(element, attempt, period)
    trial = attempt.read.trial
    finished = trial.finished_ns if trial is not None else None
    if own is not None and own.end is not None and finished is not None \
            and finished < (own.end - RUN_END_SLACK_S) * NS:
        return element, False  # (it had ended before its run did: not what the run's end hit)
    if own is not None and own is not element and (
            own.state in HARDWARE_STATES | SCHEDULER_STATES
            or any(step.state in HARDWARE_STATES for step in own.steps)):
        return own, True
    return element, False


def infrastructure(
    element: SacctJob | None, is_last: bool, logs: Sequence[TrainingLogScan], sacct_path: str,
    subject: str, completed: bool = False,
) -> Finding | None:
    """An infrastructure cause for the attempt's end, from sacct (for the job's last
    attempt) and the logs (the driver's, then the worker logs the kit kept, in the one time
    order causes use: a worker's GPU fault is the period's reason as it is its cause); its
    rule's ``blocks`` is the reason. ``completed``: the attempt exited cleanly with its
    terminal event and every rank's completion phases, so a line it outlived (:data:`OUTLIVED`)
    was not its end."""
    if element is not None and is_last:
        cite = [Citation(sacct_path, line=element.line, quote=element.state_raw)]
        if element.state == "TIMEOUT":
            return finding("AUD207", subject, cite, **_reported(element))
        if element.state == "PREEMPTED":
            return finding("AUD219", subject, cite, **_reported(element))
        if element.state in ("CANCELLED", "DEADLINE"):
            return finding("AUD206", subject, cite, **_reported(element))
        failed_nodes = [s for s in element.steps if s.state in ("NODE_FAIL", "BOOT_FAIL")]
        if element.state in ("NODE_FAIL", "BOOT_FAIL") or failed_nodes:
            # (a step's node may fail under a job that ends otherwise: its own row says it)
            step = failed_nodes[0] if element.state not in ("NODE_FAIL", "BOOT_FAIL") \
                else None
            return finding("AUD208", subject, cite if step is None else [
                Citation(sacct_path, line=step.line, quote=step.state_raw)],
                state=element.state_raw if step is None
                else f"{step.state_raw} (step {step.step})", job_id=element.job_id)
        oom_steps = [s for s in element.steps if s.state == "OUT_OF_MEMORY"]
        if element.state == "OUT_OF_MEMORY" or oom_steps:
            oom = oom_steps[0] if element.state != "OUT_OF_MEMORY" else None
            return finding("AUD209", subject, cite if oom is None else [  # (its own row)
                Citation(sacct_path, line=oom.line, quote=oom.state_raw)], form="sacct_oom",
                where="the job" if oom is None else f"step {oom.step}", job_id=element.job_id)
    merged = merged_events([(log.path, log.events) for log in logs if log.events])
    first: dict[str, int] = {}  # (each kind's first event, by its place in time)
    ended = False  # (a line before that names the machine's end: slurmstepd's memory kill)
    for place, (_, event, _) in enumerate(merged):
        if event.kind == "slurm_cancelled" and ended:
            continue  # (the job's cancellation after the machine's end is that end's knock-on;
            # after any other line, a trainer's SIGTERM or a traceback, it is the cancellation)
        first.setdefault(event.kind, place)
        ended = ended or (event.kind in _ENDS and event.kind != "slurm_cancelled"
                          and not (completed and event.kind in OUTLIVED))
    for kind_name, rule, text in LOG_ENDS:
        at = first.get(kind_name)
        outlived = completed and kind_name in OUTLIVED
        # (what came before it in time; an exception on its own line is it, not before it)
        own = (merged[at][0], merged[at][1].line) if at is not None else None
        knock_on = kind_name == "nccl_timeout" and _outranked(
            e for p, e, _ in merged[:at or 0] if not (e.kind == "exception" and (p, e.line) == own))
        if at is None or outlived or knock_on:
            continue  # (none, outlived, or a knock-on, as every later timeout is)
        path, event, _ = merged[at]
        return finding(rule, subject, [Citation(path, line=event.line, quote=event.text)],
                       form="log", text=text)
    return None


LOG_ENDS: tuple[tuple[str, str, str], ...] = (
    ("slurm_time_limit", "AUD207", "slurmstepd cancelled the job at its time limit"),
    ("slurm_preempted", "AUD219", "slurmstepd cancelled the job due to preemption"),
    ("node_failure", "AUD208", "the log reports a node failure"),
    ("slurm_cancelled", "AUD206", "slurmstepd cancelled the job"),
    ("nccl_timeout", "AUD209", "NCCL watchdog timeout"),
    ("host_oom", "AUD209", "host-RAM out-of-memory kill"),
    # contract v1.2's more causes that make a period an infrastructure failure
    ("gpu_error", "AUD209", "a GPU or driver fault"),
    ("rendezvous", "AUD209", "the distributed job never formed (rendezvous)"),
    ("ray_system", "AUD209", "Ray's control plane (GCS) failed"),
    ("storage", "AUD209", "the run could not write its files"),
    ("network", "AUD209", "a remote service refused (network)"),
)
"""A log event that makes the attempt's end the infrastructure's (or the scheduler's): its
rule (whose ``blocks`` is the reason) and what it says, first kind first."""

_ENDS = frozenset(kind for kind, _, _ in LOG_ENDS)

OUTLIVED = frozenset({"rendezvous", "ray_system", "storage", "network"})
"""Contract v1.2's causes that a completed run may print and outlive without doubt on what it
measured: a store or GCS gone at teardown (torchrun's agents and Ray's raylets print them as the
head exits first), a remote service retried at start, a write that failed outside training.
They name what ended an attempt that did not complete; a GPU fault, host memory and an NCCL
timeout still leave a completed run unresolved."""


def follows_a_failure(line: int, log: TrainingLogScan) -> bool:
    """Whether the log's NCCL error or timeout at ``line`` only follows a failure that
    outranks it on an earlier line (peers fail their collective after one rank ran out of
    memory, crashed or raised): the cause names that failure, and the period's end is not
    the infrastructure's."""
    return _outranked(event for event in log.events if event.line < line)


def _outranked(before: Iterable[LogEvent]) -> bool:
    """Whether any of the events ``before`` an NCCL failure shows a cause that outranks
    NCCL's (:data:`~auditor.reason.causes.TIERS`)."""
    return any((word := event_cause(event)) is not None and TIERS[word] < TIERS[CauseWord.NCCL]
               for event in before)


def _reported(element: SacctJob) -> dict[str, object]:
    """The values of a finding that sacct reported the job's end."""
    return {"form": "sacct", "state": element.state_raw, "job_id": element.job_id}


def ended_after(cause: Finding, element: SacctJob | None, trial: TrialRecord,
                 subject: str) -> Finding | None:
    """An ``AUD216`` when sacct's end of the job (``cause``: a time limit or cancellation)
    came after the attempt's invocation had exited 0, by the two records' times; None when
    they cannot show it (no end, no finish, or the end first)."""
    if element is None or element.end is None or trial.finished_ns is None \
            or trial.finished_ns > element.end * 1_000_000_000:
        return None
    finished = datetime.fromtimestamp(trial.finished_ns // 1_000_000_000, UTC)
    ended = datetime.fromtimestamp(element.end, UTC)
    return finding(
        "AUD216", subject,
        [*cause.citations, Citation(trial.path, pointer="/invocation/finished_ns",
                                    quote=str(trial.finished_ns))],
        state=element.state_raw, job_id=element.job_id,
        actual=f" (actual job {element.job_id_raw})"
        if element.job_id_raw and element.job_id_raw != element.job_id else "",
        ended=f"{ended:%Y-%m-%d %H:%M:%S}", finished=f"{finished:%H:%M:%S}",
    )


def cancelled_in_log(cause: Finding, trial: TrialRecord, subject: str) -> Finding:
    """An ``AUD216`` for a slurmstepd cancellation line (``cause``) in the log of an attempt
    whose invocation exited 0: the batch job was ended after the command had returned (in
    its teardown or idle check), so the attempt stands. The line's time is the node's
    local time, not placed against the trial's; the report says so rather than nothing."""
    return finding(
        "AUD216", subject,
        [*cause.citations, Citation(trial.path, pointer="/invocation/exit_code", quote="0")],
        form="log", said=describe(cause),
    )
