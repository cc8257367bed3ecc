"""The figures the report's per-period table shows (update and sync times, peaks, PIDs)."""

from __future__ import annotations

from auditor.model import AttemptOutcome, PeriodEvidence, PeriodFacts, Protocol


def period_facts(period: PeriodEvidence, protocol: Protocol,
           outcomes: list[AttemptOutcome]) -> PeriodFacts:
    """The facts of ``period``'s counted attempt (its last when none is counted)."""
    record = period.record
    counted = next((o for o in outcomes if o.counted), None)
    attempt = next((a for a in period.attempts if counted and a.spec.index == counted.index),
                   period.attempts[-1] if period.attempts else None)
    update_ns: int | None = None
    sync_ns: int | None = None
    peak: int | None = None
    pids: tuple[int | None, ...] = ()
    log_lines = last_step = None
    if attempt is not None:
        trial = attempt.read.trial
        steps = trial.dispatched_int(protocol.steps_from) if trial else None
        workers = sorted(attempt.spec.workers, key=lambda w: (w.rank is None, w.rank or 0))
        pids = tuple(w.pid for w in workers)
        for trace in attempt.read.traces:
            updates = [r for r in trace.phases if r.phase == "actor_update" and not r.error_type
                       and (steps is None or r.step == steps) and r.finished_ns is not None]
            if not updates:
                continue
            last_update = updates[-1]
            assert last_update.finished_ns is not None
            update_ns = max(update_ns or 0, last_update.finished_ns)
            syncs = [r for r in trace.phases if r.phase == "weight_sync" and not r.error_type
                     and r.step == last_update.step and r.finished_ns is not None
                     and (r.started_ns or 0) >= last_update.finished_ns]
            if syncs and syncs[0].finished_ns is not None:
                sync_ns = max(sync_ns or 0, syncs[0].finished_ns)
        if trial is not None and trial.peak_mib is not None:
            peak = trial.peak_mib
        else:
            device_peaks = [d.peak_reserved_mib for d in attempt.read.devices
                            if d.peak_reserved_mib is not None]
            peak = max(device_peaks) if device_peaks else None
        if attempt.read.log is not None:
            log_lines = attempt.read.log.lines
            last_step = attempt.read.log.last_step
    return PeriodFacts(
        period.subject, record.pair, record.period, record.workload, record.seed, record.gpus,
        record.array_task_id, counted.job_id if counted else None, update_ns, sync_ns, peak,
        pids, log_lines, last_step, record.array_job_id,
    )
