"""Fold evidence and findings into one verdict per period, then configurations and the gate.

The order of judgement for an attempt is fixed and written down here, because
it *is* the policy:

1. evidence that is not intact (missing, altered, unsafe, unreadable, invalid)
   or does not belong together (identity, timeline, idle check, commit)
   -> ``unresolved``; nothing else about the attempt can be trusted;
2. an element still pending or running in sacct -> ``unresolved``
   (``array_partial``), never passed;
3. the exit (:mod:`auditor.reason.exits`); a wall-clock ``TIMEOUT``,
   ``CANCELLED`` or ``NODE_FAIL`` of the element overrides an excused 143 for
   the element's last attempt;
4. clean exit: ``resolved`` only with the exact terminal event *and* every
   rank's completion phases for the final step without error; otherwise
   ``unresolved`` (``terminal_event_missing`` / ``completion_phase_missing``);
5. unclean exit: a protocol-listed failure (e.g. ``rollout_init`` OOM) is a
   measurement, ``failed``; a received signal, time limit, cancellation, node
   failure, host OOM or NCCL timeout is ``unresolved`` with its reason.

A retried period counts its first completed attempt (every attempt after it is
*wasted*), else its last attempt.
"""

from __future__ import annotations

from collections import defaultdict

from auditor.catalogue import finding
from auditor.model import (
    AttemptEvidence,
    AttemptOutcome,
    AuditOptions,
    Citation,
    Collected,
    Finding,
    PeriodEvidence,
    PeriodFacts,
    Reason,
    Reasoning,
    TrialRecord,
    Verdict,
    VerdictKind,
)
from auditor.reason.accounting import accounting
from auditor.reason.configurations import configurations
from auditor.reason.exits import EXIT_KINDS
from auditor.reason.facts import period_facts
from auditor.reason.gate import apply_waivers, decide_gate, gate_reasons
from auditor.reason.verdict import UNFINISHED_STATES, Context, Judgement, judge_attempt
from auditor.validate.checks import element_for

LAUNCHER_STATUS = {
    "resolved": VerdictKind.RESOLVED, "completed": VerdictKind.RESOLVED,
    "complete": VerdictKind.RESOLVED, "success": VerdictKind.RESOLVED,
    "succeeded": VerdictKind.RESOLVED, "ok": VerdictKind.RESOLVED,
    "eligible_completion": VerdictKind.RESOLVED,
    "failed": VerdictKind.FAILED, "eligible_failure": VerdictKind.FAILED,
    "oom": VerdictKind.FAILED, "measured_failure": VerdictKind.FAILED,
}


def reason(collected: Collected, validation: list[Finding], options: AuditOptions) -> Reasoning:
    """Judge every period, then configurations, accounting and the gate."""
    protocol = collected.protocol
    all_findings = list(collected.findings) + list(validation)
    by_subject: dict[str, list[Finding]] = defaultdict(list)
    by_path: dict[str, list[Finding]] = defaultdict(list)
    for item in all_findings:
        by_subject[item.subject].append(item)
        for cite in item.citations:
            by_path[cite.path].append(item)
    context = Context(collected, protocol, by_subject, by_path, _last_attempt_per_job(collected))
    known = {id(item) for item in all_findings}
    new_findings: list[Finding] = []
    verdicts: list[Verdict] = []
    outcomes: list[AttemptOutcome] = []
    facts: list[PeriodFacts] = []
    disagreements: list[tuple[str, str, str, str]] = []
    for period in collected.periods:
        verdict, period_outcomes, produced = _judge_period(period, context)
        verdicts.append(verdict)
        outcomes.extend(period_outcomes)
        for item in produced:  # decisive findings may be ones collection already reported
            if id(item) not in known:
                known.add(id(item))
                new_findings.append(item)
        facts.append(period_facts(period, protocol, period_outcomes))
        counted = next((o for o in period_outcomes if o.counted), None)
        trial = _counted_trial(period, counted)
        if trial is not None and trial.status is not None \
                and trial.status.lower() not in EXIT_KINDS:  # (how it exited: no verdict)
            said = LAUNCHER_STATUS.get(trial.status.lower(), VerdictKind.UNRESOLVED)
            if said != verdict.verdict:
                error = f" ({trial.validation_error})" if trial.validation_error else ""
                new_findings.append(finding(
                    "AUD211", period.subject, [Citation(trial.path, pointer="/status",
                                                        quote=trial.status)],
                    status=trial.status, error=error, verdict=verdict.verdict.value,
                ))
                disagreements.append((period.subject, trial.status,
                                      trial.validation_error or "", verdict.verdict.value))
    new_findings.extend(_unfinished_elements(collected, outcomes))
    cells, config_findings = configurations(collected, verdicts, outcomes)
    new_findings.extend(config_findings)
    reasons = gate_reasons(collected, verdicts, validation + new_findings, cells)
    lifted, waiver_uses, waived = apply_waivers(reasons, options.waivers)
    new_findings.extend(waived)
    return Reasoning(
        verdicts=tuple(verdicts),
        attempts=tuple(outcomes),
        facts=tuple(facts),
        configurations=tuple(cells),
        accounting=accounting(collected, outcomes, verdicts),
        gate=decide_gate(cells, reasons, lifted, verdicts, allow_partial=False),
        gate_partial=decide_gate(cells, reasons, lifted, verdicts, allow_partial=True),
        gate_reasons=tuple(reasons),
        waivers=tuple(waiver_uses),
        findings=tuple(new_findings),
        disagreements=tuple(disagreements),
    )


def _unfinished_elements(collected: Collected,
                         outcomes: list[AttemptOutcome]) -> list[Finding]:
    """Elements of the study's arrays that sacct still shows unfinished and that no attempt
    covers (a pending range, a requeued element): the array is partial."""
    if collected.sacct is None:
        return []
    arrays = {p.record.array_job_id for p in collected.periods if p.record.array_job_id}
    covered = {o.job_id for o in outcomes if o.job_id}
    out = []
    for job in collected.sacct.jobs:
        if job.array_task_spec is not None and job.pending_tasks == ():
            continue  # (a stale range: every task it names has a row of its own)
        if job.array_job_id in arrays and job.state in UNFINISHED_STATES \
                and job.job_id_raw not in covered and job.job_id not in covered:
            out.append(finding("AUD210", job.job_id,
                               [Citation(collected.sacct.path, line=job.line,
                                         quote=job.state_raw)],
                               detail=f"element {job.job_id} is still {job.state_raw}; "
                                      "the array is partial"))
    return out


def _counted_trial(period: PeriodEvidence,
                   counted: AttemptOutcome | None) -> TrialRecord | None:
    if counted is None:
        return None
    for attempt in period.attempts:
        if attempt.spec.index == counted.index:
            return attempt.read.trial
    return None


def _last_attempt_per_job(collected: Collected) -> dict[str, str]:
    """For each job id, the key of the attempt launched last in it (by invocation start)."""
    latest: dict[str, tuple[int, str]] = {}
    for period in collected.periods:
        for attempt in period.attempts:
            trial = attempt.read.trial
            job = attempt.spec.job_id or (trial.job_id if trial else None)
            if not job:
                continue
            start = trial.started_ns if trial and trial.started_ns is not None else -1
            key = f"{period.subject}#{attempt.spec.index}"
            if job not in latest or start >= latest[job][0]:
                latest[job] = (start, key)
    return {job: key for job, (_, key) in latest.items()}


def _judge_period(
    period: PeriodEvidence, context: Context
) -> tuple[Verdict, list[AttemptOutcome], list[Finding]]:
    collected = context.collected
    record = period.record
    subject = period.subject
    produced: list[Finding] = []
    if not record.readable:
        decisive = [f for f in record.findings if f.rule_id in ("AUD001", "AUD011", "AUD002")]
        if not decisive:
            decisive = list(context.by_subject.get(record.path, []))
        return (
            Verdict(subject, record.pair, record.period, VerdictKind.UNRESOLVED,
                    Reason.PERIOD_RECORD_UNREADABLE,
                    "The period record could not be read or parsed, so none of its evidence "
                    "could be located or checked.",
                    "Nothing about this period's run can be concluded from the evidence.",
                    tuple(decisive), (Citation(record.path),)),
            [], produced,
        )
    if not period.attempts:
        item = finding("AUD214", subject, [Citation(record.path)],
                       detail="the period record lists no attempt")
        produced.append(item)
        return (
            Verdict(subject, record.pair, record.period, VerdictKind.UNRESOLVED,
                    Reason.EVIDENCE_MISSING, "The period record lists no attempt.",
                    "Nothing about this period's run can be concluded from the evidence.",
                    (item,), (Citation(record.path),)),
            [], produced,
        )
    judgements: list[tuple[AttemptEvidence, Judgement]] = []
    for attempt in period.attempts:
        judgement = judge_attempt(period, attempt, context)
        judgements.append((attempt, judgement))
    counted_index = next(
        (i for i, (_, j) in enumerate(judgements) if j.outcome == "completed"),
        len(judgements) - 1,
    )
    outcomes: list[AttemptOutcome] = []
    for i, (attempt, judgement) in enumerate(judgements):
        trial = attempt.read.trial
        element = element_for(collected.sacct, attempt.spec.job_id)
        wasted = judgements[counted_index][1].outcome == "completed" and i > counted_index
        outcome = AttemptOutcome(
            subject=subject, index=attempt.spec.index, job_id=attempt.spec.job_id,
            attempt_dir=attempt.spec.attempt_dir, outcome=judgement.outcome,
            reason=judgement.reason, exit_kind=judgement.exit.kind if judgement.exit else "",
            exit_code=trial.exit_code if trial else None,
            received_signal=trial.received_signal if trial else None,
            started_ns=trial.started_ns if trial else None,
            finished_ns=trial.finished_ns if trial else None,
            gpus=record.gpus,
            allocation_gpus=element.gpus if element and element.gpus else record.gpus,
            counted=i == counted_index, wasted=wasted,
            launcher_status=trial.status if trial else None,
        )
        outcomes.append(outcome)
        if wasted:
            produced.append(finding(
                "AUD212", subject, [Citation(attempt.spec.attempt_dir or record.path)],
                attempt=attempt.spec.index + 1, job_id=attempt.spec.job_id,
                gpu_seconds=f"{outcome.task_gpu_seconds:.6f}",
            ))
    attempt, judgement = judgements[counted_index]
    produced.extend(judgement.decisive)
    cause = judgement.cause
    if cause is not None:
        knock_on = f" (then, as its knock-on: {', '.join(cause.knock_on)})" \
            if cause.knock_on else ""
        produced.append(finding("AUD218", subject,
                                [cause.citation] if cause.citation else [],
                                cause=cause.word, detail=cause.detail, knock_on=knock_on))
    kind = {"completed": VerdictKind.RESOLVED, "failed": VerdictKind.FAILED}.get(
        judgement.outcome, VerdictKind.UNRESOLVED)
    shows = list(judgement.shows)
    if len(judgements) > 1:
        shows.insert(0, f"The period ran {len(judgements)} attempts; attempt "
                        f"{counted_index + 1} counts.")
    verdict = Verdict(
        subject, record.pair, record.period, kind,
        judgement.reason,
        " ".join(shows), " ".join(judgement.limits), tuple(judgement.decisive),
        tuple(judgement.citations) or tuple(
            cite for item in judgement.decisive for cite in item.citations),
        judgement.cause,
    )
    return verdict, outcomes, produced
