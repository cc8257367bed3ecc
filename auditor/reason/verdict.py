"""One attempt's verdict, in three steps: what blocks it, what the evidence shows, the decision.

1. :func:`attempt_blockers`: evidence that is not intact or does not belong together. Which
   finding blocks, and with which reason, is each rule's policy
   (:attr:`auditor.rules.Rule.blocks`); an element sacct still shows unfinished blocks
   first (``array_partial``).
2. :func:`evidence_shows`: the exit, the dispatch, the completion records, the terminal line,
   the log's events, whatever the verdict: the diagnosis says all of it.
3. :func:`decide`: blocked -> ``unresolved``; a clean exit resolves only with the terminal
   event and every rank's completion phases; an unclean one is ``failed`` for a protocol-
   listed failure, else ``unresolved`` with its cause (signal, infrastructure, kill).
"""

from __future__ import annotations

import typing
from collections.abc import Container, Mapping
from dataclasses import dataclass, replace

from auditor.model import (
    ENDED_LIMITS,
    UNFINISHED_STATES,
    AttemptEvidence,
    Cause,
    Citation,
    Collected,
    ExitKind,
    Finding,
    Outcome,
    PeriodEvidence,
    Protocol,
    Reason,
    SacctJob,
    TrainingLogScan,
    TrialRecord,
)
from auditor.model.kinds import TRIAL, WORKER_LOG
from auditor.model.lines import launcher_status, step_end
from auditor.reason.causes import cause_of
from auditor.reason.completion import completion, eligible_failures
from auditor.reason.exits import (
    ExitClass,
    attributed_in_log,
    classify_exit,
    controller_records,
    reaped_steps,
    unrecorded_steps,
)
from auditor.reason.infrastructure import (
    cancelled_in_log,
    ended_after,
    follows_a_failure,
    infrastructure,
    run_key,
    run_record,
    scheduler_element,
)
from auditor.reason.shown import (
    Shown,
    idle_shows,
    log_shows,
    params_shows,
    sentence,
    terminal_shows,
    unmeasured_shows,
)
from auditor.rules import RULES, describe, finding, unprefixed
from auditor.validate.checks import restart_of

FILE_STATUS_RULES = {"missing": "AUD101", "mismatched": "AUD102", "unsafe": "AUD103",
                     "unreadable": "AUD104"}
"""The integrity rule of each status an evidence row may have other than verified."""
ABSENCE = frozenset({Reason.EVIDENCE_MISSING, Reason.IDLE_CHECK_FAILED})
"""Blocker reasons that a scheduler kill explains by itself (nothing altered, just absent)."""
KILLED_KINDS = frozenset({ExitKind.SIGKILL, ExitKind.KILLED, ExitKind.SIGTERM})
"""Exit kinds (:mod:`auditor.reason.exits`) that are a kill: ``killed``, never a cause of
their own (an NCCL error before one is its knock-on)."""
ENDED_BY = frozenset({"AUD206", "AUD207", "AUD208", "AUD209", "AUD219"})
"""The infrastructure rules (:func:`~auditor.reason.infrastructure.infrastructure`): a verdict
resting on one names its cause though the command exited cleanly (a driver that caught Ray's
memory monitor's kill of its worker and exited 0)."""
EVENT_KINDS_CITED = ("coordinated_shutdown", "slurm_time_limit", "slurm_cancelled",
                     "nccl_timeout", "nccl_error", "host_oom", "gpu_oom", "kv_cache_init_failure")


class FindingLookup(typing.Protocol):
    """Findings by a key (a subject, or a cited path): a dict of lists, or an index that
    merges the study's with one period's (:class:`auditor.reason.engine.FindingIndex`)."""

    def get(self, key: str, default: list[Finding], /) -> list[Finding]:
        """The findings under ``key``, ``default`` for none."""
        ...


@dataclass(frozen=True)
class Context:
    """What judging any period needs: the study, its rules and the findings, indexed."""

    collected: Collected
    protocol: Protocol
    by_subject: FindingLookup
    by_path: FindingLookup
    last_attempt_of_job: Mapping[str, str]
    """Job id -> ``subject#index`` of the attempt launched last in that job."""


@dataclass
class Judgement:
    """How one attempt was judged: its outcome, reason, and the diagnosis's parts."""

    outcome: Outcome
    reason: Reason
    decisive: list[Finding]
    shows: list[str]
    limits: list[str]
    citations: list[Citation]
    exit: ExitClass | None
    cause: Cause | None = None
    """What ended the attempt, when it did not complete (:mod:`auditor.reason.causes`)."""


def judge_attempt(period: PeriodEvidence, attempt: AttemptEvidence, context: Context,
                  recorded: frozenset[tuple[str | None, int]] | None = None) -> Judgement:
    """The verdict of one attempt of ``period`` (``recorded``: :func:`workers_recorded` of
    the period, made once for all its attempts; made here when not given)."""
    trial = attempt.read.trial
    job_id = attempt.spec.job_id or (trial.job_id if trial else None)
    element = scheduler_element(period, job_id, context.collected)
    blockers = attempt_blockers(period, attempt, context)
    if element is not None and element.state in UNFINISHED_STATES:
        sacct_path = context.collected.sacct.path if context.collected.sacct else ""
        blockers.insert(0, (Reason.ARRAY_PARTIAL, finding(
            "AUD210", period.subject,
            [Citation(sacct_path, line=element.line, quote=element.state_raw)],
            job_id=element.job_id, state=element.state_raw)))
    if trial is None and not blockers:
        present = any(row.kind == TRIAL.name for row in attempt.files)
        blockers.append((Reason.EVIDENCE_INVALID if present else Reason.EVIDENCE_MISSING,
                         finding("AUD214", period.subject, [Citation(period.record.path)],
                                 form="no_trial")))
    is_last = context.last_attempt_of_job.get(job_id or "") \
        == f"{period.subject}#{attempt.spec.index}"
    if not is_last and element is not None and job_id:
        run = run_key(job_id, restart_of(attempt))
        element, is_last = run_record(
            element, attempt, period, run is not None and context.last_attempt_of_job.get(run)
            == f"{period.subject}#{attempt.spec.index}")
    shown = evidence_shows(period, attempt, context.protocol, element, is_last, recorded)
    shown.sacct_path = context.collected.sacct.path if context.collected.sacct else ""
    if period.attempts and attempt is not period.attempts[-1] \
            and shown.exit_class is not None and shown.exit_class.clean:
        # (a run that ended cleanly may be the one counted: never on a failed idle check;
        # one that crashed keeps its own reason)
        blockers.extend(_earlier_idle(period, attempt, context.protocol.idle_check == "optional"))
    judgement = decide(period, blockers, shown, context)
    if judgement.outcome is not Outcome.COMPLETED:
        log = attempt.read.log
        exit_class = shown.exit_class
        if exit_class is not None and exit_class.clean and judgement.decisive \
                and judgement.decisive[0].rule_id in ENDED_BY:
            exit_class = None  # (the exit was clean; what the verdict rests on ended it)
        judgement.cause = cause_of(
            trial, exit_class, element, is_last, shown.sacct_path,
            tuple((record.rank, record) for trace in attempt.read.traces
                  for record in trace.phases if record.error_type),
            log.events if log is not None else (), log.path if log is not None else None,
            attempt.read.processes,
            tuple((scan.path, scan.events) for scan in shown.worker_logs))
        cited = judgement.cause.citation if judgement.cause is not None else None
        if cited is not None and cited.path != shown.sacct_path \
                and cited not in judgement.citations:
            # (the evidence line a cause rests on is the period's too; a dump's row is cited
            # by the scheduler's finding)
            judgement.citations.append(cited)
    return judgement


# ------------------------------------------------------------------ 1. blockers


def attempt_blockers(period: PeriodEvidence, attempt: AttemptEvidence,
                     context: Context) -> list[tuple[Reason, Finding]]:
    """Every finding that makes the attempt's evidence unusable, with the reason its rule
    blocks with, in a fixed order: the files' integrity, their contents, the period
    record's, then the cross-checks of the period and its traces."""
    by_path = context.by_path
    blockers: list[tuple[Reason, Finding]] = []
    for row in attempt.files:
        rule_id = FILE_STATUS_RULES.get(row.status)
        for item in by_path.get(row.path, []) + by_path.get(row.manifest, []):
            if rule_id is not None and item.subject == row.path and item.rule_id == rule_id:
                blockers.append((_blocks(item), item))
                break
    for row in attempt.files:
        # (a trace line that is not JSON, AUD003, blocks nothing: the contract keeps the
        # records around it; one of the wrong shape voids the trace, AUD002)
        blockers.extend((_blocks(item), item) for item in by_path.get(row.path, [])
                        if _blocking(item, "collect"))
    for trace in attempt.read.traces:
        if not trace.phases and not trace.samples and trace.findings:
            blockers.append((Reason.EVIDENCE_INVALID, trace.findings[0]))
    blockers.extend((_blocks(item), item) for item in period.record.findings
                    if RULES[item.rule_id].blocks is not None)
    blockers.extend((_blocks(item), item) for item in context.by_subject.get(period.subject, [])
                    if _blocking(item, "validate"))
    blockers.extend((_blocks(item), item) for trace in attempt.read.traces
                    for item in trace.findings if _blocking(item, "validate"))
    return _dedupe(blockers)


def _earlier_idle(period: PeriodEvidence, attempt: AttemptEvidence, optional: bool
                  ) -> list[tuple[Reason, Finding]]:
    """An earlier attempt's own idle checks (its nodes' ``idle/<host>.json``, and its record
    entry's ``idle_check``) that say its run did not leave the GPUs idle (or, under a
    required policy, that none could be made): that attempt is then never the one the
    period counts. The period record's ``idle_check`` is
    the period's end, its last attempt's (:mod:`auditor.validate.idle`), and ``auditor seal``
    puts a requeue's in place of the earlier one's: a completed first run with a failed check
    resolved on the rerun's passed one."""
    found = []
    checks = [(own.host, own.passed, own.unavailable, Citation(own.path or "", pointer="/passed"),
               own.path or "") for own in attempt.read.idle]
    entry, pointer = attempt.spec.idle_check, f"{attempt.spec.pointer}/idle_check"
    if entry is not None:  # (the entry's own check: one node's, or each host's)
        where = f"{period.record.path}#{pointer}"
        checks += [(item.host, item.passed, item.unavailable,
                    Citation(period.record.path, pointer=f"{pointer}/hosts/{item.host}"), where)
                   for item in entry.hosts] or [
            ("its node", entry.passed, entry.unavailable,
             Citation(period.record.path, pointer=f"{pointer}/passed"), where)]
    for host, passed, unavailable, cite, path in checks:
        if passed is True or (passed is None and optional):
            continue
        word = "null" if passed is None else str(passed).lower()
        found.append((Reason.IDLE_CHECK_FAILED, finding(
            "AUD118", period.subject, [replace(cite, quote=word)], form="earlier_attempt",
            host=host, attempt=attempt.spec.index + 1, path=path, passed=word,
            why=f" ({unavailable})" if unavailable else "")))
    return found


def workers_recorded(period: PeriodEvidence) -> frozenset[tuple[str | None, int]]:
    """The (host, pid) of every worker and process any attempt of the period records (made
    once per period: each attempt's own set of the others' was A² work for A attempts)."""
    if len(period.attempts) < 2:  # (the usual period: no other attempt)
        return frozenset()
    return frozenset(key for attempt in period.attempts for key in _workers_of(attempt))


def _workers_of(attempt: AttemptEvidence) -> set[tuple[str | None, int]]:
    return {(w.host, w.pid) for w in attempt.spec.workers if w.pid is not None} | {
        (p.host, p.pid) for p in attempt.read.processes if p.pid is not None}


@dataclass(frozen=True, slots=True)
class _OthersWorkers:
    """The (host, pid) another attempt of a period records and this one does not, asked one
    at a time (a set of them made per attempt was A² work for A attempts)."""

    recorded: frozenset[tuple[str | None, int]]
    """What any attempt of the period records (:func:`workers_recorded`)."""
    own: set[tuple[str | None, int]]

    def __contains__(self, key: object) -> bool:
        # (what any attempt records and this one does not is what another one records)
        return key in self.recorded and key not in self.own


def _others_workers(period: PeriodEvidence, attempt: AttemptEvidence,
                    recorded: frozenset[tuple[str | None, int]] | None = None
                    ) -> Container[tuple[str | None, int]]:
    """The (host, pid) of every worker and process another attempt of the period records,
    and this one does not: output named for one of them is that run's, never this one's.
    ``recorded``: :func:`workers_recorded` of the period, when its caller made it."""
    if len(period.attempts) < 2:  # (the usual period: no other attempt)
        return frozenset()
    return _OthersWorkers(workers_recorded(period) if recorded is None else recorded,
                          _workers_of(attempt))


def _blocking(item: Finding, stage: str) -> bool:
    rule = RULES[item.rule_id]
    return rule.blocks is not None and rule.stage == stage


def _blocks(item: Finding) -> Reason:
    reason = RULES[item.rule_id].blocks
    assert reason is not None  # (callers take only rules that block)
    return reason


def _dedupe(items: list[tuple[Reason, Finding]]) -> list[tuple[Reason, Finding]]:
    seen: set[int] = set()
    out = []
    for word, item in items:
        if id(item) not in seen:
            seen.add(id(item))
            out.append((word, item))
    return out


# ------------------------------------------------------------- 2. what it shows


def _exit_class(trial: TrialRecord, attempt: AttemptEvidence, protocol: Protocol,
                log: TrainingLogScan | None) -> ExitClass:
    """The attempt's exit by seed 000's rule, judged with its process records and the
    launcher's own lines naming another role's non-zero exit before the controller's
    (contract v1.2)."""
    records = attempt.read.processes
    logs = [row.path for row in attempt.files if row.kind == WORKER_LOG.name]
    # (not the capped events: a node's line in the cap's middle read as never reaped)
    controllers = controller_records(records)
    cancelled = reaped_steps(((("controller", e.detail) if e.kind == "controller_ended"
                               else step_end(e.text)) for e in log.step_ends),
                             controllers) if log else {}
    exit_class = classify_exit(trial, protocol.coordinated_shutdown_flag, (
        *records, *unrecorded_steps(records, logs, attempt.hosts()
                                    | {p.host for p in records if p.host}, cancelled,
                                    trial.kept_worker_logs)))
    if log is None:
        return exit_class
    said = []
    # (a controller's exit 0 gives no role_exit line to stop at: its wrapper's line does,
    # kept apart from the cap, and a launcher's line after it is its reaping; a coordinated
    # 143 still reads on to the launcher's own line about the controller, as it always did)
    ended = next((e.line for e in log.step_ends if e.kind == "controller_ended"
                  and e.detail in controllers), None) if exit_class.reaped else None
    for event in log.events:  # (until the controller's own exit, as the kit's check reads)
        if ended is not None and event.line > ended:
            break
        if event.kind == "role_exit":
            role, _, code = event.detail.rpartition(" ")
            if role == "controller":
                break
            said.append((role, int(code), Citation(log.path, line=event.line,
                                                   quote=event.text)))
    return attributed_in_log(exit_class, said)


def evidence_shows(period: PeriodEvidence, attempt: AttemptEvidence, protocol: Protocol,
                   element: SacctJob | None, is_last: bool,
                   recorded: frozenset[tuple[str | None, int]] | None = None) -> Shown:
    """What the attempt's evidence shows, in sentences with their citations
    (``recorded``: as :func:`judge_attempt` takes it)."""
    trial = attempt.read.trial
    log = attempt.read.log
    steps = trial.dispatched_int(protocol.steps_from) if trial else None
    shown = Shown(
        trial=trial,
        exit_class=_exit_class(trial, attempt, protocol, log) if trial else None,
        steps=steps, completion=completion(attempt, protocol, steps),
        eligible=eligible_failures(attempt.read.traces, protocol), log=log,
        events={event.kind: event for event in reversed(log.events)} if log else {},
        element=element, is_last=is_last,
        worker_logs=tuple(sorted(attempt.read.worker_logs, key=lambda s: s.path)),
    )
    if shown.exit_class is not None:
        shown.shows.append(sentence(f"Exit: {shown.exit_class.detail}"))
        shown.citations.extend(shown.exit_class.citations)
    if steps is not None and trial is not None:
        where = "dispatch" if trial.dispatch_value(protocol.steps_from) is not None else "env"
        shown.shows.append(f"The {'dispatch' if where == 'dispatch' else 'environment'} "
                           f"specifies {protocol.steps_from}={steps}.")
        shown.citations.append(Citation(
            trial.path, pointer=f"/{where}/{_pointer(protocol.steps_from)}", quote=str(steps)))
    if not shown.eligible or shown.completion.complete:
        shown.shows.extend(shown.completion.sentences)
        shown.citations.extend(shown.completion.citations)
    if log is not None:
        log_shows(log, steps, shown, protocol)
        shown.citations.extend(Citation(log.path, line=event.line, quote=event.text)
                               for kind in EVENT_KINDS_CITED
                               if (event := shown.events.get(kind)) is not None)
    terminal_shows(attempt, protocol, steps, shown, _others_workers(period, attempt, recorded))
    params_shows(attempt, steps, shown)
    for _, record in shown.eligible:
        message = f": {record.error_message}" if record.error_message else ""
        shown.citations.append(Citation(record.path, line=record.line,
                                        quote=f"{record.phase} {record.error_type}{message}"))
    if trial is not None and trial.status:
        shown.shows.append(launcher_status(trial.status, trial.validation_error))
        shown.citations.append(Citation(trial.path, pointer="/status", quote=trial.status))
    unmeasured_shows(attempt, shown)
    idle_shows(period, protocol, shown)
    return shown


def decide(period: PeriodEvidence, blockers: list[tuple[Reason, Finding]], shown: Shown,
           context: Context) -> Judgement:
    """The attempt's outcome from its blockers and what its evidence shows."""
    collected = context.collected
    sacct_path = collected.sacct.path if collected.sacct else ""
    logs = [shown.log, *shown.worker_logs] if shown.log else list(shown.worker_logs)
    completed = shown.exit_class is not None and shown.exit_class.clean \
        and shown.completion.complete and shown.terminal is not None
    infra = infrastructure(shown.element, shown.is_last, logs, sacct_path, period.subject,
                           completed)
    if blockers:
        return _blocked(blockers, infra, shown, sacct_path)
    trial, exit_class = shown.trial, shown.exit_class
    assert trial is not None and exit_class is not None
    after: list[Finding] = []
    if infra is not None and exit_class.kind is ExitKind.CLEAN \
            and _blocks(infra) is not Reason.INFRASTRUCTURE_FAILURE:
        from_sacct = bool(infra.citations) and infra.citations[0].path == sacct_path
        ended = ended_after(infra, shown.element, trial, period.subject) if from_sacct \
            else cancelled_in_log(infra, trial, period.subject)
        if ended is not None:
            # exited 0 before the scheduler ended the job (a time limit or scancel in the
            # teardown after it): the attempt stands, and the report says why
            after.append(ended)
            shown.shows.extend(sentence(describe(f)) for f in after)
            infra = None
        # (else sacct's end cannot be placed after the exit: the scheduler's word stands)
    if exit_class.clean and infra is None:
        return _clean(period, shown, after, context.protocol)
    return _unclean(period.subject, shown, infra)


def _judgement(outcome: Outcome, reason: Reason, decisive: list[Finding], shown: Shown,
               limits: list[str]) -> Judgement:
    return Judgement(outcome, reason, decisive, shown.shows, limits, shown.citations,
                     shown.exit_class)


def _blocked(blockers: list[tuple[Reason, Finding]], infra: Finding | None, shown: Shown,
             sacct_path: str) -> Judgement:
    """Unresolved: the evidence cannot support a verdict (unless a scheduler kill explains
    why it is absent: its word is then the reason)."""
    decisive = [f for _, f in blockers]
    if infra is not None and shown.element is not None and infra.citations \
            and infra.citations[0].path == sacct_path \
            and all(word in ABSENCE for word, _ in blockers):
        # A job killed by the scheduler naturally leaves evidence missing (no trial record,
        # no idle check): the scheduler's word explains the absence, so it is the reason.
        shown.shows.insert(0, sentence(f"The scheduler ended the job: {unprefixed(infra)}"))
        shown.shows.append(sentence(_blocker_sentence(  # (the consequence, not the reason)
            "", decisive, lead="That end left evidence missing")))
        return _judgement(Outcome.UNRESOLVED, _blocks(infra), [infra, *decisive], shown,
                          [ENDED_LIMITS.get(_blocks(infra), ENDED_LIMITS[None])])
    reason = blockers[0][0]
    shown.shows.insert(0, sentence(_blocker_sentence(reason.replace("_", " "), decisive)))
    return _judgement(Outcome.UNRESOLVED, reason, decisive, shown, [
        "Evidence that is missing, altered or inconsistent cannot support a verdict; what the "
        "remaining files show is reported but not relied on."])


def _clean(period: PeriodEvidence, shown: Shown, after: list[Finding],
           protocol: Protocol) -> Judgement:
    """A clean exit: resolved with the terminal event and every rank's completion phases,
    else unresolved."""
    subject, log, steps = period.subject, shown.log, shown.steps
    exit_class, done = shown.exit_class, shown.completion
    assert exit_class is not None
    abort, where = next(((e, scan.path) for scan in ([log] if log else []) + list(
        shown.metrics) for e in scan.events if e.kind == "aborted"), (None, ""))
    if abort is not None:  # (contract v1.2: the trainer's own abort, never a missing line)
        item = finding("AUD204", subject, [Citation(where, line=abort.line,
                                                    quote=abort.text)],
                       exit=f"{exit_class.detail}, but the trainer recorded its own abort "
                            f"({abort.detail}, line {abort.line})")
        return _judgement(Outcome.UNRESOLVED, Reason.UNCLEAN_EXIT, [item, *after], shown, [
            "A run the trainer itself aborted is not a completion, whatever its exit code; "
            "it is not a measurement unless the protocol lists the failure."])
    if done.complete and shown.terminal is not None:
        decisive = list(after)
        if exit_class.kind is ExitKind.COORDINATED_SHUTDOWN:
            decisive.append(finding("AUD205", subject, list(exit_class.citations),
                                    exit=exit_class.detail))
        return _judgement(Outcome.COMPLETED, Reason.COMPLETED, decisive, shown, [
            "Completed calls, the terminal event and the ranks' parameter digests show the run "
            "reached its final step and its final update changed the parameters (of a fixed "
            "sample of each tensor)." if shown.params_changed else
            "Completed calls and the terminal line show the run reached its final step; they "
            "do not prove the optimizer changed parameters."])
    if done.complete:
        item = finding("AUD201", subject, [Citation(log.path if log else period.record.path)],
                       ranks=done.ranks, phases=" and ".join(protocol.completion_phases),
                       step=steps)
        return _judgement(Outcome.UNRESOLVED, _blocks(item), [item, *after], shown, [
            "These are completed calls, not independent proof that optimizer parameters "
            "changed or that the entire required terminal protocol completed. Nor does the "
            "missing line prove that no training happened: a log can lose its last lines (for "
            "example when the driver shuts Ray down immediately, before actor output is "
            "delivered), and the evidence cannot tell which happened."])
    item = finding("AUD202", subject, done.gaps or [Citation(period.record.path)],
                   **({"problems": "; ".join(done.problems)} if done.problems
                      else {"form": "none"}))
    return _judgement(Outcome.UNRESOLVED, _blocks(item), [item, *after], shown, [
        "Without every rank's completion records the run cannot be shown to have reached its "
        "final step, whatever the exit code says."])


def _unclean(subject: str, shown: Shown, infra: Finding | None) -> Judgement:
    """An unclean exit: a signal, an eligible failure, infrastructure, or a bare unclean
    exit or kill."""
    exit_class, trial = shown.exit_class, shown.trial
    assert exit_class is not None and trial is not None
    if exit_class.kind is ExitKind.SIGNALLED:
        # (a node failure or a preemption also signals the batch script: its word names why)
        item = infra if infra is not None and infra.rule_id in ("AUD208", "AUD219") \
            else _signalled(subject, shown)
        return _judgement(Outcome.UNRESOLVED, _blocks(item), [item], shown, [
            "A signalled attempt says nothing about whether the configuration fits; it is "
            "neither a completion nor an eligible failure."])
    if shown.eligible:
        return _eligible(subject, shown)
    if infra is not None:
        return _judgement(Outcome.UNRESOLVED, _blocks(infra), [infra], shown,
                          [ENDED_LIMITS.get(_blocks(infra), ENDED_LIMITS[None])])
    nccl = _nccl_failure(subject, shown)
    if nccl is not None:
        return nccl
    item = finding("AUD204", subject, list(exit_class.citations), exit=exit_class.detail)
    limits = ["An unclean exit without a protocol-listed failure is not a measurement."]
    if shown.completion.complete and shown.terminal is not None:
        limits.append("The completion records and the terminal line suggest the training "
                      "itself finished; only a clean exit (0, or a coordinated shutdown the "
                      "rules excuse) resolves a period, so it stays unresolved.")
    word = Reason.KILLED if exit_class.kind in KILLED_KINDS else _blocks(item)
    return _judgement(Outcome.UNRESOLVED, word, [item], shown, limits)


def _signalled(subject: str, shown: Shown) -> Finding:
    """Why the batch script was signalled: the pre-timeout SIGUSR1 and a SIGTERM the
    scheduler's TIMEOUT explains are the time limit (``AUD207``), any other a cancellation
    (``AUD206``). A wall-clock SIGTERM shows in sacct as TIMEOUT: a launcher that traps it
    (as real ones do) records it as a received signal, like a scancel's."""
    exit_class, trial, element = shown.exit_class, shown.trial, shown.element
    assert exit_class is not None and trial is not None
    signal_name = (trial.received_signal or "").upper()
    if "USR1" in signal_name:
        return finding("AUD207", subject, list(exit_class.citations), exit=exit_class.detail)
    if element is not None and shown.is_last and element.state == "TIMEOUT":
        return finding(
            "AUD207", subject,
            [Citation(shown.sacct_path, line=element.line, quote=element.state_raw),
             *exit_class.citations],
            form="sacct_after", exit=exit_class.detail, state=element.state_raw,
            job_id=element.job_id)
    if element is not None and shown.is_last and element.state == "PREEMPTED":
        return finding(
            "AUD219", subject,
            [Citation(shown.sacct_path, line=element.line, quote=element.state_raw),
             *exit_class.citations],
            form="sacct_after", exit=exit_class.detail, state=element.state_raw,
            job_id=element.job_id)
    return finding("AUD206", subject, list(exit_class.citations), exit=exit_class.detail)


def _eligible(subject: str, shown: Shown) -> Judgement:
    """Failed: a rank's listed phase raised a listed error type (a measurement)."""
    rank, first = shown.eligible[0]
    item = finding(
        "AUD203", subject, [Citation(first.path, line=first.line,
                                     quote=f"{first.phase} {first.error_type}")],
        rank=rank, phase=first.phase, error_type=first.error_type,
    )
    ranks = sorted({r for r, _ in shown.eligible if r is not None})
    shown.shows.insert(0, f"{'Rank' if len(ranks) == 1 else 'Ranks'} "
                          f"{', '.join(str(r) for r in ranks)} recorded `{first.phase}` ending "
                          f"in `{first.error_type}`, a failure the protocol lists as eligible.")
    return _judgement(Outcome.FAILED, Reason.ELIGIBLE_FAILURE, [item], shown, [
        "An eligible failure is a measurement of this configuration at this seed; it does not "
        "show the configuration fails at every seed, nor which allocation exhausted the "
        "memory."])


def _nccl_failure(subject: str, shown: Shown) -> Judgement | None:
    """Unresolved as an infrastructure failure when the log's NCCL error is the
    communication's own: only under an unclean exit (a completed run may print one in its
    teardown), when no failure that outranks it came first (peers then fail their
    collectives: a knock-on) and no kill ended the attempt."""
    exit_class, log, events = shown.exit_class, shown.log, shown.events
    assert exit_class is not None
    nccl = events.get("nccl_error")
    if nccl is None or log is None or exit_class.kind in KILLED_KINDS:
        return None
    if follows_a_failure(nccl.line, log):
        return None
    item = finding("AUD209", subject, [Citation(log.path, line=nccl.line, quote=nccl.text),
                                       *exit_class.citations],
                   nccl=nccl.detail, exit=exit_class.detail)
    shown.shows.insert(0, sentence(f"The training log shows an NCCL communication failure at "
                                   f"line {nccl.line} (`{nccl.detail}`), before the attempt's "
                                   f"{exit_class.detail}"))
    return _judgement(Outcome.UNRESOLVED, Reason.INFRASTRUCTURE_FAILURE, [item], shown, [
        "An NCCL communication failure is the infrastructure's, not the configuration's: the "
        "attempt measured nothing; the period needs a new run to resolve."])


def _pointer(key: str) -> str:
    """``key`` as one JSON pointer token (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def _blocker_sentence(label: str, decisive: list[Finding], lead: str | None = None) -> str:
    more = len(decisive) - 1
    listed = f" ({more} more {'problem' if more == 1 else 'problems'} listed in the " \
             "findings)" if more else ""
    return f"{lead or f'Unresolved because of {label}'}: {unprefixed(decisive[0])}{listed}"
