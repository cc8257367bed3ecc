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
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from auditor._io import clip, counted
from auditor.catalogue import finding
from auditor.model import (
    AllocatorTrace,
    Citation,
    Finding,
    PhaseRecord,
    Protocol,
    SacctJob,
    Severity,
    TrainingLogScan,
    TrialRecord,
    Verdict,
    VerdictKind,
    Worker,
)
from auditor.reason.exits import ExitClass, classify_exit
from auditor.validate.checks import element_for

if TYPE_CHECKING:
    from auditor.audit import AttemptEvidence, AuditOptions, Collected, PeriodEvidence

UNFINISHED_STATES = frozenset({"PENDING", "RUNNING", "REQUEUED", "SUSPENDED", "RESIZING",
                               "CONFIGURING", "COMPLETING", "REQUEUE_HOLD", "REQUEUE_FED"})
FROZEN_INPUTS = frozenset({"protocol.json", "execution_commits.json"})
"""The study's own rules and commit pins: an error about either fails the gate."""
BLOCKING_COLLECT_RULES = frozenset({"AUD001", "AUD002", "AUD010", "AUD012"})
"""Findings that make a file unusable as evidence (a trace line that is not JSON, AUD003, is
not one: the contract keeps the records around it, unless no record is left)."""
IDENTITY_RULES = frozenset({"AUD110", "AUD111", "AUD112", "AUD113", "AUD114"})
TIMELINE_RULES = frozenset({"AUD115", "AUD116", "AUD117"})
ABSENCE_WORDS = frozenset({"evidence_missing", "idle_check_failed"})
"""Blocker reasons that a scheduler kill explains by itself (nothing altered, just absent)."""
NS = 1_000_000_000

LAUNCHER_STATUS = {
    "resolved": VerdictKind.RESOLVED, "completed": VerdictKind.RESOLVED,
    "complete": VerdictKind.RESOLVED, "success": VerdictKind.RESOLVED,
    "succeeded": VerdictKind.RESOLVED, "ok": VerdictKind.RESOLVED,
    "eligible_completion": VerdictKind.RESOLVED,
    "failed": VerdictKind.FAILED, "eligible_failure": VerdictKind.FAILED,
    "oom": VerdictKind.FAILED, "measured_failure": VerdictKind.FAILED,
}


@dataclass(frozen=True, slots=True)
class AttemptOutcome:
    """How one attempt was judged, and what it cost."""

    subject: str
    index: int
    job_id: str | None
    attempt_dir: str | None
    outcome: str
    """``completed``, ``failed`` or ``unresolved``."""
    reason: str
    exit_kind: str
    exit_code: int | None
    received_signal: str | None
    started_ns: int | None
    finished_ns: int | None
    gpus: int | None
    allocation_gpus: int | None
    counted: bool
    wasted: bool
    launcher_status: str | None

    @property
    def seconds(self) -> float:
        """Invocation wall time."""
        if self.started_ns is None or self.finished_ns is None:
            return 0.0
        return max(0, self.finished_ns - self.started_ns) / NS

    @property
    def task_gpu_seconds(self) -> float:
        """Invocation time x the GPUs the period used."""
        return self.seconds * (self.gpus or 0)

    @property
    def reservation_gpu_seconds(self) -> float:
        """Invocation time x the GPUs the allocation held."""
        return self.seconds * (self.allocation_gpus or self.gpus or 0)


@dataclass(frozen=True, slots=True)
class PeriodFacts:
    """The figures the report's per-period table shows."""

    subject: str
    pair: str
    period: int
    workload: str | None
    seed: int | None
    gpus: int | None
    array_task_id: int | None
    job_id: str | None
    actor_update_finished_ns: int | None
    """Latest ``finished_ns`` across ranks of the final-step actor update."""
    post_update_sync_finished_ns: int | None
    """Latest ``finished_ns`` across ranks of the weight sync after that update."""
    raw_peak_mib: int | None
    pids_by_rank: tuple[int | None, ...]
    log_lines: int | None
    last_step: int | None


@dataclass(frozen=True, slots=True)
class ConfigurationResult:
    """A (workload, gpus) cell across seeds."""

    workload: str
    gpus: int
    status: str
    """``resolved`` when every period is resolved or failed (and none is missing)."""
    outcome: str | None
    """``completed``, ``failed`` or ``mixed`` when resolved."""
    periods: tuple[str, ...]
    seeds: tuple[int, ...]
    missing_seeds: tuple[int, ...]
    task_gpu_seconds: float
    reservation_gpu_seconds: float | None
    """None without a usable scheduler dump (the GPUs the allocations held are unknown)."""

    @property
    def key(self) -> str:
        """``workload@gpus``."""
        return f"{self.workload}@{self.gpus}"


@dataclass(frozen=True, slots=True)
class ElementCost:
    """One sacct allocation row's share of allocation-scope accounting."""

    job_id: str
    job_id_raw: str | None
    state: str
    elapsed_s: int | None
    gpus: int | None
    gpu_seconds: int | None
    array_job_id: str | None = None
    """The array the row is an element of (as sacct's JobID says); None for a job of its
    own (a retry submitted outside the array)."""


@dataclass(frozen=True, slots=True)
class Accounting:
    """GPU time in overlapping scopes (never to be added together)."""

    allocation_gpu_seconds: int | None
    """None without a scheduler dump (``AUD123``, or a refused one: ``AUD009``)."""
    task_gpu_seconds: float
    reservation_gpu_seconds: float | None
    """None without a usable scheduler dump: the GPUs the allocations held are unknown (each
    attempt's row in ``attempts.parquet`` then counts its period's)."""
    wasted_gpu_seconds: float
    unresolved_gpu_seconds: float
    elements: tuple[ElementCost, ...]
    wasted_attempts: int
    jobs_without_element: tuple[str, ...] = ()
    """Actual job ids of attempts that no element row of the scheduler's dump accounts for:
    their allocation is outside the allocation scope, and their reservation scope counts
    the period's own GPUs (the allocation's are unknown)."""


@dataclass(frozen=True, slots=True)
class GateReason:
    """One reason the gate fails, with what a waiver must name to lift it."""

    rule_id: str
    subject: str
    text: str
    integrity: bool
    """True for evidence/anchor problems (they fail even ``--allow-partial``)."""


@dataclass(frozen=True, slots=True)
class GateResult:
    """The gate's decision in one mode."""

    allow_partial: bool
    passed: bool
    included_configurations: tuple[str, ...]
    reasons: tuple[str, ...]
    waived: tuple[str, ...]
    included_by_waiver: tuple[str, ...] = ()
    """Included configurations that are unresolved: a reviewer's waivers lifted every reason
    that kept each out (the rest of the inclusion list resolved)."""


@dataclass(frozen=True, slots=True)
class WaiverUse:
    """A waiver and how many gate reasons it lifted."""

    rule_id: str
    subject: str
    reason: str
    matched: int


@dataclass(frozen=True)
class Reasoning:
    """The reason stage's output."""

    verdicts: tuple[Verdict, ...]
    attempts: tuple[AttemptOutcome, ...]
    facts: tuple[PeriodFacts, ...]
    configurations: tuple[ConfigurationResult, ...]
    accounting: Accounting
    gate: GateResult
    gate_partial: GateResult
    gate_reasons: tuple[GateReason, ...]
    waivers: tuple[WaiverUse, ...]
    findings: tuple[Finding, ...] = field(default=())
    disagreements: tuple[tuple[str, str, str, str], ...] = ()
    """(subject, launcher status, launcher validation error, auditor verdict)."""


# ---------------------------------------------------------------- the engine


@dataclass
class _Judgement:
    outcome: str
    reason: str
    decisive: list[Finding]
    shows: list[str]
    limits: list[str]
    citations: list[Citation]
    exit: ExitClass | None


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
    context = _Context(collected, protocol, by_subject, by_path, _last_attempt_per_job(collected))
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
        facts.append(_facts(period, protocol, period_outcomes))
        counted = next((o for o in period_outcomes if o.counted), None)
        trial = _counted_trial(period, counted)
        if trial is not None and trial.status is not None:
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
    configurations, config_findings = _configurations(collected, verdicts, outcomes)
    new_findings.extend(config_findings)
    accounting = _accounting(collected, outcomes, verdicts)
    reasons = _gate_reasons(collected, verdicts, validation + new_findings, configurations)
    waiver_uses = []
    lifted: set[int] = set()
    for waiver in options.waivers:
        matched = [i for i, r in enumerate(reasons)
                   if r.rule_id == waiver.rule_id and r.subject == waiver.subject]
        lifted.update(matched)
        waiver_uses.append(WaiverUse(waiver.rule_id, waiver.subject, waiver.reason,
                                     len(matched)))
        if matched:
            new_findings.append(finding("AUD215", waiver.subject, [],
                                        waived_rule=waiver.rule_id, reason=waiver.reason))
    gate = _gate(configurations, reasons, lifted, verdicts, allow_partial=False)
    gate_partial = _gate(configurations, reasons, lifted, verdicts, allow_partial=True)
    return Reasoning(
        verdicts=tuple(verdicts),
        attempts=tuple(outcomes),
        facts=tuple(facts),
        configurations=tuple(configurations),
        accounting=accounting,
        gate=gate,
        gate_partial=gate_partial,
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


@dataclass(frozen=True)
class _Context:
    """What judging any period needs: the study, its rules and the findings, indexed."""

    collected: Collected
    protocol: Protocol
    by_subject: dict[str, list[Finding]]
    by_path: dict[str, list[Finding]]
    last_attempt_of_job: dict[str, str]
    """Job id -> ``subject#index`` of the attempt launched last in that job."""


def _judge_period(
    period: PeriodEvidence, context: _Context
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
                    "period_record_unreadable",
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
                    "evidence_missing", "The period record lists no attempt.",
                    "Nothing about this period's run can be concluded from the evidence.",
                    (item,), (Citation(record.path),)),
            [], produced,
        )
    judgements: list[tuple[AttemptEvidence, _Judgement]] = []
    for attempt in period.attempts:
        judgement = _judge_attempt(period, attempt, context)
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
    )
    return verdict, outcomes, produced


def _judge_attempt(
    period: PeriodEvidence, attempt: AttemptEvidence, context: _Context
) -> _Judgement:
    collected, protocol = context.collected, context.protocol
    by_subject, by_path = context.by_subject, context.by_path
    record = period.record
    subject = period.subject
    read = attempt.read
    trial = read.trial
    shows: list[str] = []
    limits: list[str] = []
    citations: list[Citation] = []
    blockers: list[tuple[str, Finding]] = []

    # 1. integrity and consistency
    status_reason = {"unsafe": "evidence_unsafe", "missing": "evidence_missing",
                     "mismatched": "evidence_mismatch", "unreadable": "evidence_unreadable"}
    for row in attempt.files:
        if row.status in status_reason:
            for item in by_path.get(row.path, []) + by_path.get(row.manifest, []):
                if item.subject == row.path and item.rule_id in ("AUD101", "AUD102", "AUD103",
                                                                  "AUD104"):
                    blockers.append((status_reason[row.status], item))
                    break
    for row in attempt.files:
        for item in by_path.get(row.path, []):
            # (a trace line that is not JSON leaves the other records counting, as the
            # contract says; one of the wrong shape voids the trace: its values may be
            # kept, out of range, and none of them is then to be relied on)
            if item.rule_id in BLOCKING_COLLECT_RULES:
                blockers.append(("evidence_invalid", item))
    for trace in read.traces:
        if not trace.phases and not trace.samples and trace.findings:
            blockers.append(("evidence_invalid", trace.findings[0]))
    for item in record.findings:
        if item.rule_id == "AUD015":
            blockers.append(("identity_mismatch", item))
        elif item.rule_id in BLOCKING_COLLECT_RULES:
            blockers.append(("evidence_invalid", item))
    for item in by_subject.get(subject, []):
        if item.rule_id in IDENTITY_RULES:
            blockers.append(("identity_mismatch", item))
        elif item.rule_id == "AUD107":
            blockers.append(("evidence_missing", item))
        elif item.rule_id in TIMELINE_RULES:
            blockers.append(("timeline_inconsistent", item))
        elif item.rule_id == "AUD118":
            blockers.append(("idle_check_failed", item))
        elif item.rule_id == "AUD121":
            blockers.append(("commit_mismatch", item))
    for trace in read.traces:
        for item in trace.findings:
            if item.rule_id == "AUD115":
                blockers.append(("timeline_inconsistent", item))
    blockers = _dedupe(blockers)

    # 2. unfinished element
    job_id = attempt.spec.job_id or (trial.job_id if trial else None)
    element = element_for(collected.sacct, job_id)
    if element is None and collected.sacct is not None and record.array_task_id is not None:
        # an element still inside a pending range (``7000000_[2-3]``) has no row of its own
        element = next((job for job in collected.sacct.jobs
                        if job.array_job_id == record.array_job_id
                        and job.covers(record.array_task_id)), None)
    if element is not None and element.state in UNFINISHED_STATES:
        item = finding("AUD210", subject, [Citation(collected.sacct.path if collected.sacct
                                                    else "", line=element.line,
                                                    quote=element.state_raw)],
                       detail=f"job {element.job_id} is {element.state_raw} in sacct")
        blockers.insert(0, ("array_partial", item))

    if trial is None:
        present = any(row.kind == "trial" for row in attempt.files)
        reason_word = "evidence_missing" if not present else "evidence_invalid"
        if not blockers:
            item = finding("AUD214", subject, [Citation(record.path)],
                           detail="no readable trial record for the attempt")
            blockers.append((reason_word, item))

    # what the evidence shows, whatever the verdict
    exit_class = classify_exit(trial, protocol.coordinated_shutdown_flag) if trial else None
    steps = trial.dispatched_int(protocol.steps_from) if trial else None
    completion = _completion(attempt, protocol, steps)
    eligible = _eligible_failures(read.traces, protocol)
    log = read.log
    events = {event.kind: event for event in reversed(log.events)} if log else {}

    if exit_class is not None:
        shows.append(_sentence(f"Exit: {exit_class.detail}"))
        citations.extend(exit_class.citations)
    if steps is not None and trial is not None:
        where = "dispatch" if trial.dispatch_value(protocol.steps_from) is not None else "env"
        shows.append(f"The {'dispatch' if where == 'dispatch' else 'environment'} specifies "
                     f"{protocol.steps_from}={steps}.")
        citations.append(Citation(trial.path, pointer=f"/{where}/{_pointer(protocol.steps_from)}",
                                  quote=str(steps)))
    if not eligible or completion.complete:
        shows.extend(completion.sentences)
        citations.extend(completion.citations)
    if log is not None:
        if log.terminal_event is not None:
            shows.append(f"The training log holds the terminal event for step {steps}.")
            citations.append(Citation(log.path, line=log.terminal_event.line,
                                      quote=log.terminal_event.text))
        elif steps is not None:
            step_lines = [e for e in log.events if e.kind == "step_line"]
            if log.last_step is not None:
                seen = f"the last training step logged is {log.last_step}"
            elif step_lines:
                seen = (f"`step:` lines appear (the last at line {step_lines[-1].line}, step "
                        f"{step_lines[-1].detail}) but none with `training/global_step`")
            else:
                seen = "no `step:` metric line appears at all"
            clipped = next((f for f in log.findings if f.rule_id == "AUD007"), None)
            if clipped is not None:  # (a line read in part: not "at all", only where read)
                seen += " in what was read"
            shows.append(f"The training log holds no line with `step:{steps}` followed by "
                         f"`training/global_step:{steps}`; {seen}.")
            citations.append(Citation(log.path, quote=f"{log.lines} lines scanned"))
            if clipped is not None:
                shows.append(_sentence(
                    f"Line {clipped.citations[0].line} was examined only in part "
                    f"(line of {clipped.message.rsplit(': line of ', 1)[-1]}): a terminal "
                    "line past that point "
                    "would not be seen"))
                citations.append(clipped.citations[0])
        cut = next((f for f in log.findings if f.rule_id == "AUD017"), None)
        if cut is not None:
            shows.append(_sentence(f"The training log ends mid-line at line "
                                   f"{cut.citations[0].line} (no final newline): it was cut "
                                   "while being written, and what followed is lost"))
            citations.append(cut.citations[0])
    for kind_name in ("coordinated_shutdown", "slurm_time_limit", "slurm_cancelled",
                      "nccl_timeout", "nccl_error", "host_oom", "gpu_oom",
                      "kv_cache_init_failure"):
        event = events.get(kind_name)
        if event is not None and log is not None:
            citations.append(Citation(log.path, line=event.line, quote=event.text))
    for _, record_ in eligible:
        message = f": {record_.error_message}" if record_.error_message else ""
        citations.append(Citation(record_.path, line=record_.line,
                                  quote=f"{record_.phase} {record_.error_type}{message}"))
    if trial is not None and trial.status:
        error = f" ({trial.validation_error})" if trial.validation_error else ""
        shows.append(f"The launcher recorded status `{trial.status}`{error}.")
        citations.append(Citation(trial.path, pointer="/status", quote=trial.status))
    idle = record.idle_check
    if idle is not None and idle.passed is True:
        shows.append("The post-period idle check passed.")
        citations.append(Citation(record.path, pointer="/idle_check/passed", quote="true"))

    is_last = context.last_attempt_of_job.get(job_id or "") == f"{subject}#{attempt.spec.index}"
    infra = _infrastructure(element, is_last, log, collected, subject)
    if blockers and infra is not None and element is not None and infra[1].citations \
            and infra[1].citations[0].path == (collected.sacct.path if collected.sacct else "") \
            and all(word in ABSENCE_WORDS for word, _ in blockers):
        # A job killed by the scheduler naturally leaves evidence missing (no trial record,
        # no idle check): the scheduler's word explains the absence, so it is the reason.
        word, item = infra
        shows.insert(0, _sentence(f"The scheduler ended the job: {item.message}"))
        shows.append(_sentence(_blocker_sentence("evidence missing", [f for _, f in blockers])))
        limits.append("An infrastructure failure ends the attempt before it can measure "
                      "anything; the period needs a new run to resolve.")
        return _Judgement("unresolved", word, [item] + [f for _, f in blockers], shows, limits,
                          citations, exit_class)
    if blockers:
        reason_word, item = blockers[0]
        decisive = [f for _, f in blockers]
        shows.insert(0, _sentence(_blocker_sentence(reason_word, decisive)))
        limits.append("Evidence that is missing, altered or inconsistent cannot support a "
                      "verdict; what the remaining files show is reported but not relied on.")
        return _Judgement("unresolved", reason_word, decisive, shows, limits, citations,
                          exit_class)
    assert trial is not None and exit_class is not None

    # 3. infrastructure on the element's last attempt
    after: list[Finding] = []
    if infra is not None and exit_class.kind == "clean" and infra[0] != "infrastructure_failure":
        from_sacct = infra[1].citations[0].path == (collected.sacct.path
                                                   if collected.sacct else "")
        ended = _ended_after(infra[1], element, trial, subject) if from_sacct else \
            _cancelled_in_log(infra[1], trial, subject)
        if ended is not None:
            # exited 0 before the scheduler ended the job (a time limit or scancel in the
            # teardown after it): the attempt stands, and the report says why
            after.append(ended)
            shows.extend(_sentence(f.message.split(": ", 1)[1]) for f in after)
            infra = None
        # (else sacct's end cannot be placed after the exit: the scheduler's word stands)
    if exit_class.clean and infra is None:
        if completion.complete and log is not None and log.terminal_event is not None:
            limits.append("Completed calls and the terminal line show the run reached its "
                          "final step; they do not prove the optimizer changed parameters.")
            decisive = list(after)
            if exit_class.kind == "coordinated_shutdown":
                decisive.append(finding("AUD205", subject, list(exit_class.citations),
                                        detail=exit_class.detail))
            return _Judgement("completed", "completed", decisive, shows, limits, citations,
                              exit_class)
        if completion.complete:
            item = finding("AUD201", subject, [Citation(log.path if log else record.path)],
                           detail=f"clean exit; all {completion.ranks} ranks completed "
                                  f"{' and '.join(protocol.completion_phases)} for step {steps}"
                                  "; terminal event absent from the training log")
            limits.append(
                "These are completed calls, not independent proof that optimizer parameters "
                "changed or that the entire required terminal protocol completed. Nor does "
                "the missing line prove that no training happened: a log can lose its last "
                "lines (for example when the driver shuts Ray down immediately, before actor "
                "output is delivered), and the evidence cannot tell which happened."
            )
            return _Judgement("unresolved", "terminal_event_missing", [item, *after], shows,
                              limits, citations, exit_class)
        item = finding("AUD202", subject, completion.gaps or [Citation(record.path)],
                       detail="; ".join(completion.problems) or "no completion records")
        limits.append("Without every rank's completion records the run cannot be shown to "
                      "have reached its final step, whatever the exit code says.")
        return _Judgement("unresolved", "completion_phase_missing", [item, *after], shows,
                          limits, citations, exit_class)

    # 4. unclean exit
    if exit_class.kind == "signalled":
        signal_name = (trial.received_signal or "").upper()
        word = "time_limit" if "USR1" in signal_name else "cancelled"
        rule = "AUD207" if word == "time_limit" else "AUD206"
        item = finding(rule, subject, list(exit_class.citations), detail=exit_class.detail)
        limits.append("A signalled attempt says nothing about whether the configuration fits; "
                      "it is neither a completion nor an eligible failure.")
        return _Judgement("unresolved", word, [item], shows, limits, citations, exit_class)
    if eligible:
        rank, first = eligible[0]
        item = finding(
            "AUD203", subject, [Citation(first.path, line=first.line,
                                         quote=f"{first.phase} {first.error_type}")],
            detail=f"rank {rank}: {first.phase} ended in {first.error_type}",
        )
        ranks = sorted({r for r, _ in eligible if r is not None})
        shows.insert(0, f"{'Rank' if len(ranks) == 1 else 'Ranks'} "
                        f"{', '.join(str(r) for r in ranks)} recorded `{first.phase}` ending in "
                        f"`{first.error_type}`, a failure the protocol lists as eligible.")
        limits.append("An eligible failure is a measurement of this configuration at this "
                      "seed; it does not show the configuration fails at every seed, nor "
                      "which allocation exhausted the memory.")
        return _Judgement("failed", "eligible_failure", [item], shows, limits, citations,
                          exit_class)
    if infra is not None:
        word, item = infra
        limits.append("An infrastructure failure ends the attempt before it can measure "
                      "anything; the period needs a new run to resolve.")
        return _Judgement("unresolved", word, [item], shows, limits, citations, exit_class)
    nccl = events.get("nccl_error")
    earlier = [event for kind in ("gpu_oom", "host_oom", "kv_cache_init_failure")
               if (event := events.get(kind)) is not None and nccl is not None
               and event.line < nccl.line]
    if nccl is not None and log is not None and not earlier \
            and exit_class.kind not in ("sigkill", "killed", "sigterm"):
        # Only under an unclean exit (a completed run may print one in its teardown), and
        # when no memory failure came first (peers then fail their collectives: a knock-on)
        # nor a kill ended the attempt.
        item = finding("AUD209", subject, [Citation(log.path, line=nccl.line, quote=nccl.text),
                                           *exit_class.citations],
                       detail=f"{nccl.detail} (log line {nccl.line}) before {exit_class.detail}")
        shows.insert(0, _sentence(f"The training log shows an NCCL communication failure at "
                                  f"line {nccl.line} (`{nccl.detail}`), before the attempt's "
                                  f"{exit_class.detail}"))
        limits.append("An NCCL communication failure is the infrastructure's, not the "
                      "configuration's: the attempt measured nothing; the period needs a new "
                      "run to resolve.")
        return _Judgement("unresolved", "infrastructure_failure", [item], shows, limits,
                          citations, exit_class)
    item = finding("AUD204", subject, list(exit_class.citations), detail=exit_class.detail)
    limits.append("An unclean exit without a protocol-listed failure is not a measurement.")
    if completion.complete and log is not None and log.terminal_event is not None:
        limits.append("The completion records and the terminal line suggest the training "
                      "itself finished; only a clean exit (0, or a coordinated shutdown the "
                      "rules excuse) resolves a period, so it stays unresolved.")
    word = "killed" if exit_class.kind in ("sigkill", "killed", "sigterm") else "unclean_exit"
    return _Judgement("unresolved", word, [item], shows, limits, citations, exit_class)


def _pointer(key: str) -> str:
    """``key`` as one JSON pointer token (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def _ended_after(cause: Finding, element: SacctJob | None, trial: TrialRecord,
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
        detail=f"sacct reports {element.state_raw} for job {element.job_id}"
               + (f" (actual job {element.job_id_raw})"
                  if element.job_id_raw and element.job_id_raw != element.job_id else "")
               + ", which ended at "
               f"{ended:%Y-%m-%d %H:%M:%S} UTC, after the attempt's invocation exited 0 at "
               f"{finished:%H:%M:%S} UTC; the attempt's evidence stands",
    )


def _cancelled_in_log(cause: Finding, trial: TrialRecord, subject: str) -> Finding:
    """An ``AUD216`` for a slurmstepd cancellation line (``cause``) in the log of an attempt
    whose invocation exited 0: the batch job was ended after the command had returned (in
    its teardown or idle check), so the attempt stands. The line's time is the node's
    local time, not placed against the trial's; the report says so rather than nothing."""
    return finding(
        "AUD216", subject,
        [*cause.citations, Citation(trial.path, pointer="/invocation/exit_code", quote="0")],
        detail=f"the training log says {cause.message.split(': ', 1)[-1]}, but the trial "
               "record has the invocation exit 0: the job was ended after the command "
               "returned; the attempt's evidence stands",
    )


def _infrastructure(
    element: SacctJob | None, is_last: bool, log: TrainingLogScan | None, collected: Collected,
    subject: str,
) -> tuple[str, Finding] | None:
    """An infrastructure cause for the attempt's end, from sacct and the log."""
    sacct_path = collected.sacct.path if collected.sacct else ""
    events = {event.kind: event for event in reversed(log.events)} if log else {}
    if element is not None and is_last:
        cite = [Citation(sacct_path, line=element.line, quote=element.state_raw)]
        if element.state == "TIMEOUT":
            return "time_limit", finding("AUD207", subject, cite,
                                         detail=f"sacct reports {element.state_raw} for job "
                                                f"{element.job_id}")
        if element.state in ("CANCELLED", "PREEMPTED", "DEADLINE"):
            return "cancelled", finding("AUD206", subject, cite,
                                        detail=f"sacct reports {element.state_raw} for job "
                                               f"{element.job_id}")
        if element.state in ("NODE_FAIL", "BOOT_FAIL"):
            return "infrastructure_failure", finding(
                "AUD208", subject, cite,
                detail=f"sacct reports {element.state_raw} for job {element.job_id}")
        oom_steps = [s for s in element.steps if s.state == "OUT_OF_MEMORY"]
        if element.state == "OUT_OF_MEMORY" or oom_steps:
            where = f"step {oom_steps[0].step}" if oom_steps else "the job"
            return "infrastructure_failure", finding(
                "AUD209", subject, cite,
                detail=f"sacct reports OUT_OF_MEMORY (host memory) on {where} of job "
                       f"{element.job_id}")
    if log is not None:
        for kind_name, word, rule, text in (
            ("slurm_time_limit", "time_limit", "AUD207", "slurmstepd cancelled the job at its "
                                                         "time limit"),
            ("slurm_cancelled", "cancelled", "AUD206", "slurmstepd cancelled the job"),
            ("nccl_timeout", "infrastructure_failure", "AUD209", "NCCL watchdog timeout"),
            ("host_oom", "infrastructure_failure", "AUD209", "host-RAM out-of-memory kill"),
        ):
            event = events.get(kind_name)
            if event is not None:
                return word, finding(rule, subject, [Citation(log.path, line=event.line,
                                                              quote=event.text)],
                                     detail=f"{text} (log line {event.line})")
    return None


@dataclass
class _Completion:
    complete: bool
    ranks: int
    sentences: list[str]
    problems: list[str]
    citations: list[Citation]
    gaps: list[Citation] = field(default_factory=list)
    """Where each incomplete rank falls short: the record that raised, or its trace."""


def _completion(attempt: AttemptEvidence, protocol: Protocol, steps: int | None) -> _Completion:
    """Does every rank hold the completion phases for the final step, in order, error-free?"""
    traces_by_pid: dict[int, AllocatorTrace] = {}
    for trace in attempt.read.traces:
        name = trace.path.rsplit("/", 1)[-1]
        if name.startswith("allocator-") and name.endswith(".jsonl"):
            try:
                traces_by_pid[int(name[len("allocator-"):-len(".jsonl")])] = trace
            except ValueError:
                pass
    workers = sorted(attempt.spec.workers, key=lambda w: (w.rank is None, w.rank or 0))
    problems: list[str] = []
    citations: list[Citation] = []
    gaps: list[Citation] = []
    phases = protocol.completion_phases
    if steps is None:
        return _Completion(False, len(workers), [],
                           [f"the dispatch does not name {protocol.steps_from}"], [])
    complete_ranks = 0
    for worker in workers:
        worker_trace = traces_by_pid.get(worker.pid or -1)
        if worker_trace is None:
            problems.append(f"rank {worker.rank}: no allocator trace")
            continue  # (its absence is a finding of its own, citing where it should be)
        cursor: int | None = None
        ok = True
        for phase in phases:
            found = _find_phase(worker_trace.phases, phase, steps, cursor)
            if found is None:
                failed = [r for r in worker_trace.phases if r.phase == phase and r.step == steps
                          and r.error_type]
                if failed:
                    message = f": {clip(failed[0].error_message, 160)}" \
                        if failed[0].error_message else ""
                    problems.append(f"rank {worker.rank}: {phase} step {steps} raised "
                                    f"{failed[0].error_type}{message}")
                    gap = Citation(worker_trace.path, line=failed[0].line,
                                   quote=failed[0].error_type)
                    citations.append(gap)
                    gaps.append(gap)
                else:
                    problems.append(f"rank {worker.rank}: no error-free {phase} at step {steps}")
                    gaps.append(Citation(worker_trace.path,
                                         quote=f"{len(worker_trace.phases)} phase records"))
                ok = False
                break
            citations.append(Citation(worker_trace.path, line=found.line,
                                      quote=f"{found.phase} step {found.step}"))
            cursor = found.finished_ns
        if ok:
            complete_ranks += 1
    sentences: list[str] = []
    n = len(workers)
    if n and complete_ranks == n:
        everyone = f"all {n} ranks" if n > 2 else "both ranks" if n == 2 else "the one rank"
        described = " followed by a separate post-update ".join(f"`{p}`" for p in phases)
        sentences.append(
            f"In this period {everyone} recorded {described} at step {steps}, "
            "each call returning without an exception, in that order."
        )
        tail = _phase_sequence(traces_by_pid, workers)
        if tail:
            sentences.append(f"The recorded phase sequence reaches {tail}.")
    elif n:
        sentences.append(f"{complete_ranks} of {n} ranks recorded every completion phase "
                         f"({', '.join(phases)}) at step {steps} without error"
                         + (f"; {'; '.join(problems)}" if problems else "") + ".")
    return _Completion(bool(n) and complete_ranks == n, n, sentences, problems, citations,
                       gaps)


def _find_phase(records: tuple[PhaseRecord, ...], phase: str, step: int,
                after_ns: int | None) -> PhaseRecord | None:
    for record in records:
        if record.phase != phase or record.step != step or record.error_type:
            continue
        if after_ns is not None and record.started_ns is not None and record.started_ns < after_ns:
            continue
        return record
    return None


def _phase_sequence(traces_by_pid: dict[int, AllocatorTrace], workers: list[Worker]) -> str:
    """The common tail of phases after the final update (e.g. ``actor_update, weight_sync,
    then idle``) when every rank agrees."""
    tails = set()
    for worker in workers:
        trace = traces_by_pid.get(worker.pid or -1)
        if trace is None:
            return ""
        names = [r.phase for r in trace.phases]
        if "actor_update" not in names:
            return ""
        start = len(names) - 1 - names[::-1].index("actor_update")
        tails.add(tuple(names[start:]))
    if len(tails) != 1:
        return ""
    tail = list(next(iter(tails)))
    if len(tail) < 2:
        return ""
    return ", ".join(f"`{p}`" for p in tail[:-1]) + f", then `{tail[-1]}`"


def _eligible_failures(
    traces: tuple[AllocatorTrace, ...], protocol: Protocol
) -> list[tuple[int | None, PhaseRecord]]:
    rules = {rule.phase: set(rule.error_types) for rule in protocol.eligible_failures}
    found = []
    for trace in traces:
        for record in trace.phases:
            if record.error_type and record.error_type in rules.get(record.phase, ()):
                found.append((record.rank, record))
    return sorted(found, key=lambda item: (item[0] is None, item[0] or 0, item[1].line))


def _dedupe(items: list[tuple[str, Finding]]) -> list[tuple[str, Finding]]:
    seen: set[int] = set()
    out = []
    for word, item in items:
        if id(item) not in seen:
            seen.add(id(item))
            out.append((word, item))
    return out


def _blocker_sentence(word: str, decisive: list[Finding]) -> str:
    first = decisive[0].message
    more = f" ({len(decisive) - 1} more problem(s) listed in the findings)" \
        if len(decisive) > 1 else ""
    label = word.replace("_", " ")
    return f"Unresolved because of {label}: {first}{more}"


def _sentence(text: str) -> str:
    text = text.strip()
    return text if text.endswith((".", "!", "?")) else text + "."


# ------------------------------------------------------------- per period facts


def _facts(period: PeriodEvidence, protocol: Protocol,
           outcomes: list[AttemptOutcome]) -> PeriodFacts:
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
        pids, log_lines, last_step,
    )


# ------------------------------------------------------------- configurations


def _configurations(
    collected: Collected, verdicts: list[Verdict], outcomes: list[AttemptOutcome]
) -> tuple[list[ConfigurationResult], list[Finding]]:
    findings: list[Finding] = []
    cells: dict[tuple[str, int], list[tuple[PeriodEvidence, Verdict]]] = defaultdict(list)
    for period, verdict in zip(collected.periods, verdicts, strict=True):
        record = period.record
        if record.workload is None or record.gpus is None:
            continue
        cells[(record.workload, record.gpus)].append((period, verdict))
    expected = {(c.workload, c.gpus): c.seeds for c in collected.protocol.configurations}
    cost: dict[str, tuple[float, float]] = defaultdict(lambda: (0.0, 0.0))
    for attempt in outcomes:
        task, reservation = cost[attempt.subject]
        cost[attempt.subject] = (task + attempt.task_gpu_seconds,
                                 reservation + attempt.reservation_gpu_seconds)
    results = []
    for key in sorted(set(cells) | set(expected), key=lambda k: (k[1], k[0])):
        members = cells.get(key, [])
        seeds = tuple(sorted({p.record.seed for p, _ in members if p.record.seed is not None}))
        missing = tuple(s for s in expected.get(key, ()) if s not in seeds)
        subject = f"{key[0]}@{key[1]}"
        unexpected = bool(expected) and key not in expected \
            and collected.protocol.path is not None  # (a protocol.json says what is run)
        if unexpected:  # (a renamed or mistyped workload: never in the inclusion list)
            findings.append(finding(
                "AUD217", subject, [Citation(members[0][0].record.path, pointer="/workload",
                                             quote=key[0])],
                detail=f"{counted(len(members), 'period')} of {key[0]} with {key[1]} GPUs, "
                       f"a configuration {collected.protocol.path} does not list"))
        if missing or not members:
            findings.append(finding(
                "AUD213", subject, [Citation(collected.protocol.path or "protocol.json",
                                             pointer="/configurations")],
                detail=f"no period covers seed(s) {', '.join(map(str, missing))}" if missing
                else "no period covers this configuration",
            ))
        kinds = {v.verdict for _, v in members}
        resolved = bool(members) and not missing and not unexpected \
            and VerdictKind.UNRESOLVED not in kinds
        outcome: str | None = None
        if resolved:
            outcome = ("completed" if kinds == {VerdictKind.RESOLVED} else
                       "failed" if kinds == {VerdictKind.FAILED} else "mixed")
        results.append(ConfigurationResult(
            key[0], key[1], "resolved" if resolved else "unresolved", outcome,
            tuple(p.subject for p, _ in members), seeds, missing,
            round(sum(cost[p.subject][0] for p, _ in members), 6),
            round(sum(cost[p.subject][1] for p, _ in members), 6)
            if scopes_known(collected)[1] else None,
        ))
    return results, findings


# ------------------------------------------------------------------ accounting


def scheduler_usable(collected: Collected) -> bool:
    """Whether a scheduler dump was read with records in it (not missing, ``AUD123``, nor
    refused or empty, ``AUD009``): what the allocation scope and the cross-checks against
    sacct need."""
    return collected.sacct is not None \
        and not any(item.rule_id == "AUD009" for item in collected.sacct.findings)


def scopes_known(collected: Collected) -> tuple[bool, bool]:
    """Whether the allocation and the reservation scope can be counted: a usable dump that
    holds the GPUs each allocation held (AllocTRES) and, for the allocation scope, how long
    it ran (ElapsedRaw or Elapsed); else they are unknown, never a fallback's figure."""
    if not scheduler_usable(collected):
        return False, False
    assert collected.sacct is not None
    fields = {field.lower() for field in collected.sacct.fields}
    gpus = "alloctres" in fields
    return gpus and bool(fields & {"elapsedraw", "elapsed"}), gpus


def _accounting(collected: Collected, outcomes: list[AttemptOutcome],
                verdicts: list[Verdict]) -> Accounting:
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
                     ) if scheduler_usable(collected) else []
    return Accounting(
        allocation_gpu_seconds=sum(e.gpu_seconds or 0 for e in elements)
        if scopes_known(collected)[0] else None,
        task_gpu_seconds=round(sum(o.task_gpu_seconds for o in outcomes), 6),
        reservation_gpu_seconds=round(sum(o.reservation_gpu_seconds for o in outcomes), 6)
        if scopes_known(collected)[1] else None,
        wasted_gpu_seconds=round(sum(o.task_gpu_seconds for o in wasted), 6),
        unresolved_gpu_seconds=round(sum(o.task_gpu_seconds for o in outcomes
                                         if o.counted and o.subject in unresolved), 6),
        elements=tuple(elements),
        wasted_attempts=len(wasted),
        jobs_without_element=tuple(missing),
    )


# ------------------------------------------------------------------------ gate


def _gate_reasons(collected: Collected, verdicts: list[Verdict], findings: list[Finding],
                  configurations: list[ConfigurationResult]) -> list[GateReason]:
    reasons: list[GateReason] = []
    rule_for = {"missing": "AUD101", "mismatched": "AUD102", "unsafe": "AUD103",
                "unreadable": "AUD104"}
    for row in collected.evidence:
        if row.status in rule_for:
            reasons.append(GateReason(rule_for[row.status], row.path,
                                      f"evidence {row.status}: {row.path}", True))
    reasons.extend(  # (the scheduler's word is evidence too: without it no element's
        # state, a pending or running one, can be known)
        GateReason(item.rule_id, item.subject, f"scheduler dump unusable: {item.message}", True)
        for item in collected.findings if item.rule_id in ("AUD009", "AUD021", "AUD123"))
    # the study's frozen rules and pins, given but not usable: the verdicts were reached under
    # other rules, or without the commit check (one reason a file: AUD014 names a protocol's)
    frozen: dict[str, Finding] = {}
    for item in sorted(collected.findings, key=lambda f: f.rule_id != "AUD014"):
        if item.subject in FROZEN_INPUTS and item.severity is Severity.ERROR:
            frozen.setdefault(item.subject, item)
    reasons.extend(GateReason(item.rule_id, subject, f"frozen input unusable: {item.message}",
                              True) for subject, item in sorted(frozen.items()))
    reasons.extend(GateReason("AUD022", item.subject, f"unsafe path: {item.message}", True)
                   for item in collected.findings if item.rule_id == "AUD022")
    for period in collected.periods:
        if not period.record.readable:
            reasons.append(GateReason("AUD011", period.record.path,
                                      f"period record unreadable: {period.record.path}", True))
    reasons.extend(
        GateReason("AUD120", item.subject, item.message, True)
        for item in findings if item.rule_id == "AUD120"
    )
    by_subject = {v.subject: v for v in verdicts}
    for config in configurations:
        if config.status == "resolved":
            continue
        for subject in config.periods:
            verdict = by_subject[subject]
            if verdict.verdict is VerdictKind.UNRESOLVED:
                rule = verdict.findings[0].rule_id if verdict.findings else "AUD214"
                reasons.append(GateReason(
                    rule, subject,
                    f"configuration {config.key} unresolved: {subject} is unresolved "
                    f"({verdict.reason})", False))
        if config.missing_seeds or not config.periods:
            reasons.append(GateReason("AUD213", config.key,
                                      f"configuration {config.key} unresolved: missing seed(s) "
                                      f"{', '.join(map(str, config.missing_seeds))}", False))
    reasons.extend(GateReason("AUD217", item.subject, f"configuration {item.subject} "
                              "unresolved: the protocol does not list it", False)
                   for item in findings if item.rule_id == "AUD217")
    # elements still pending or running that no period covers: the study is not finished
    # (the periods of those that have one are unresolved, and counted above)
    reasons.extend(GateReason("AUD210", item.subject, f"array partial: {item.message}", False)
                   for item in findings
                   if item.rule_id == "AUD210" and item.subject not in by_subject)
    return reasons


def _gate(configurations: list[ConfigurationResult], reasons: list[GateReason], lifted: set[int],
          verdicts: list[Verdict], *, allow_partial: bool) -> GateResult:
    active = [r for i, r in enumerate(reasons) if i not in lifted]
    waived = [r.text for i, r in enumerate(reasons) if i in lifted]
    blocked_subjects = {r.subject for r in active if not r.integrity}
    included = []
    for config in configurations:
        if config.status == "resolved" or (
            not config.missing_seeds and config.periods
            and not any(s in blocked_subjects for s in config.periods)
            and config.key not in blocked_subjects
        ):
            included.append(config.key)
    if allow_partial:
        failing = [r.text for r in active if r.integrity]
        if not included:
            failing.append("no configuration resolved")
    else:
        failing = [r.text for r in active]
        if not configurations:
            failing.append("no configuration found")
    resolved = {config.key for config in configurations if config.status == "resolved"}
    return GateResult(allow_partial, not failing, tuple(included), tuple(failing), tuple(waived),
                      tuple(key for key in included if key not in resolved))
