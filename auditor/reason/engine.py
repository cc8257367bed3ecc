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

import copy
import heapq
from array import array
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import chain

from auditor.model import (
    UNFINISHED_STATES,
    AttemptEvidence,
    AttemptOutcome,
    AuditOptions,
    Citation,
    Collected,
    Finding,
    Outcome,
    PeriodEvidence,
    PeriodFacts,
    Reason,
    Reasoning,
    SacctDump,
    SacctJob,
    TrialRecord,
    Verdict,
    VerdictKind,
)
from auditor.reason.accounting import accounting
from auditor.reason.configurations import configurations
from auditor.reason.exits import EXIT_KINDS
from auditor.reason.facts import period_facts
from auditor.reason.gate import admitted, apply_waivers, decide_gate, gate_reasons
from auditor.reason.infrastructure import run_key
from auditor.reason.verdict import Context, Judgement, judge_attempt, workers_recorded
from auditor.rules import finding
from auditor.store import Held, Kept
from auditor.validate.checks import (
    element_for,
    forget_lookups,
    own_record,
    period_checks,
    restart_of,
    study_checks,
)

LAUNCHER_STATUS = {
    "resolved": VerdictKind.RESOLVED, "completed": VerdictKind.RESOLVED,
    "complete": VerdictKind.RESOLVED, "success": VerdictKind.RESOLVED,
    "succeeded": VerdictKind.RESOLVED, "ok": VerdictKind.RESOLVED,
    "eligible_completion": VerdictKind.RESOLVED,
    "failed": VerdictKind.FAILED, "eligible_failure": VerdictKind.FAILED,
    "oom": VerdictKind.FAILED, "measured_failure": VerdictKind.FAILED,
}


STUDY, RECORD, READ, INTEGRITY, LAYOUT, INPUT, CHECKS, SCHEDULER, COMMIT, ANCHORS = range(10)
"""The lists of findings a whole-study index holds, in its order: the study's inputs', each
period's record's, each attempt's reading's, each file's integrity, the layout's, the
command line's inputs', each period's cross-checks, the scheduler's, each commit pin's, the
protocol anchors'. A period's own lists are merged into the study's by this rank."""
PERIOD_RANKS = (RECORD, READ, INTEGRITY)
"""The collection findings of one period, as :meth:`StudyJudge.add` takes them."""


class FindingIndex:
    """Findings by key (a subject, or a cited path), as one index over every finding of the
    study would list them: the study's, indexed once, merged by rank with one period's own."""

    def __init__(self, study: dict[str, list[tuple[int, Finding]]],
                 own: dict[str, list[tuple[int, Finding]]]) -> None:
        self.study = study
        self.own = own

    def get(self, key: str, default: list[Finding] | None = None, /) -> list[Finding]:
        """The findings under ``key`` (``[]`` for none: ``default`` is ignored)."""
        theirs, own = self.study.get(key), self.own.get(key)
        if not own:
            return [item for _, item in theirs] if theirs else []
        if not theirs:
            return [item for _, item in own]
        return [item for _, item in sorted(theirs + own, key=lambda pair: pair[0])]


def index(ranked: list[tuple[int, Sequence[Finding]]]
          ) -> tuple[dict[str, list[tuple[int, Finding]]], dict[str, list[tuple[int, Finding]]]]:
    """(by subject, by cited path) of lists of findings, each with its list's rank."""
    by_subject: dict[str, list[tuple[int, Finding]]] = defaultdict(list)
    by_path: dict[str, list[tuple[int, Finding]]] = defaultdict(list)
    for rank, items in ranked:
        for item in items:
            by_subject[item.subject].append((rank, item))
            for cite in item.citations:
                by_path[cite.path].append((rank, item))
    return by_subject, by_path


@dataclass(frozen=True)
class Judged:
    """One period's share of the study's reasoning and validation: what judging it gave
    (its cross-checks and commit pin's findings among them), all a study's fold needs of
    it once it is judged (a worker's result, when the workers judge)."""

    verdict: Verdict
    outcomes: list[AttemptOutcome]
    facts: PeriodFacts
    findings: list[Finding]
    disagreement: tuple[str, str, str, str] | None
    checks: list[Finding]
    pins: list[Finding]


@dataclass(frozen=True)
class JudgeContext:
    """What judging any one period needs of its study, sendable to the workers once: the
    study as first seen (its inputs and the scheduler's dump, no period; the dump without
    its rows while they are set aside, :meth:`StudyJudge.set_rows_aside`), the options,
    and the study-level findings by their rank (the study's inputs', the layout's, the
    command line's inputs', the scheduler's, the anchors')."""

    study: Collected
    options: AuditOptions
    ranked: tuple[tuple[int, tuple[Finding, ...]], ...]

    def for_workers(self) -> JudgeContext:
        """This context as the workers need it: the study's layout without its listings
        (every period record's and attempt directory's path, the stray files), which judging
        a period never reads (its commit pin cites only the pins' file) and each worker would
        otherwise hold for the audit's life (at a million files, about 12 MB pickled), and
        the scheduler's dump without its rows and the pinned commits without a pair: each
        batch brings the rows it may look up and its pairs' pins
        (:class:`~auditor.validate.checks.SchedulerRows`, :meth:`PeriodJudge.narrowed`; a
        million files' 55,556 pins were 11 MB in each worker)."""
        sacct, pins = self.study.sacct, self.study.execution_commits
        return replace(self, study=replace(
            self.study, layout=self.study.layout.without_listings(),
            sacct=replace(sacct, jobs=()) if sacct is not None else None,
            execution_commits={} if pins is not None else None))


class PeriodJudge:
    """Validates and judges one period at a time against a :class:`JudgeContext` (in this
    process, or in a worker given the context once): its cross-checks, its verdict and
    outcomes, the findings judging it made that no one reported before."""

    def __init__(self, context: JudgeContext) -> None:
        self.context = context
        self.study = context.study
        self._subject, self._path = index(list(context.ranked))
        self._known = {id(item) for _, items in context.ranked for item in items}

    def narrowed(self, rows: tuple[SacctJob, ...] | None, pins: dict[str, str] | None
                 ) -> PeriodJudge:
        """This judge with ``rows`` as the study's scheduler dump's rows and ``pins`` as its
        pinned commits: the rows a batch of periods may look up
        (:meth:`~auditor.validate.checks.SchedulerRows.places`), in the dump's order, and the
        pins of its periods' pairs (each None when the study has none)."""
        twin = copy.copy(self)
        sacct = self.study.sacct
        twin.study = replace(self.study, execution_commits=pins, sacct=replace(
            sacct, jobs=rows) if sacct is not None and rows is not None else sacct)
        return twin

    def judge(self, period: PeriodEvidence, collection: Sequence[Sequence[Finding]],
              last: Mapping[str, str], share: dict[str, str] | None = None) -> Judged:
        """``period`` validated and judged, with its collection findings
        (:data:`PERIOD_RANKS`) and ``last``, the attempt each of its jobs launched last
        (``share``: the texts its verdict may share with the study's others, see
        :func:`_sharing`)."""
        checks, pins = period_checks(period, self.study)
        ranked = [*zip(PERIOD_RANKS, collection, strict=True), (CHECKS, checks),
                  (COMMIT, pins)]
        by_subject, by_path = index(ranked)
        known = {id(item) for _, items in ranked for item in items}
        context = Context(self.study, self.study.protocol,
                          FindingIndex(self._subject, by_subject),
                          FindingIndex(self._path, by_path), last)
        verdict, outcomes, produced = _judge_period(period, context)
        if share is not None:
            verdict = _sharing(verdict, share)
        findings: list[Finding] = []
        for item in produced:  # decisive findings may be ones collection already reported
            if id(item) not in known and id(item) not in self._known:
                known.add(id(item))
                findings.append(item)
        disagreement = _disagreement(period, verdict, outcomes)
        if disagreement is not None:
            findings.append(disagreement[0])
        return Judged(verdict, outcomes, period_facts(period, self.study.protocol, outcomes),
                      findings, disagreement[1] if disagreement else None, checks, pins)


def judge_together(judge: PeriodJudge, periods: Sequence[PeriodEvidence],
                   collections: Sequence[Sequence[Sequence[Finding]]]) -> list[Judged]:
    """Judge ``periods``, consecutive in the study's order and closed under their jobs
    (no period outside them names one of their attempts' jobs: :func:`batch_ends`), each
    with its collection findings: what :class:`StudyJudge` gives them."""
    latest: dict[str, tuple[int, str]] = {}
    _launched_last(list(periods), latest)
    last = _LastAttempts(latest)
    return [judge.judge(period, collection, last)
            for period, collection in zip(periods, collections, strict=True)]


def batch_ends(study: Collected) -> Sequence[int] | None:
    """Where the study's periods (``study.periods``, records only) may be cut into
    batches that :func:`judge_together` judges apart: each end (a count of periods, the
    last the number of periods) after which no later period names a job of an earlier
    one. None when an attempt names no job (it is known only from its trial record, once
    read: the periods can then only be judged together, as the study's fold does)."""
    return _ends(_ready_at(study))


def _ends(ready: Sequence[int] | None) -> Sequence[int] | None:
    """:func:`batch_ends` from :func:`_ready_at`'s counts (machine integers, as those)."""
    if ready is None:
        return None
    ends = array("q")
    reach = 0
    for slot, needed in enumerate(ready):
        reach = max(reach, needed)
        if reach == slot + 1:
            ends.append(slot + 1)
    return ends


@dataclass
class _Waiting:
    """A period judged only once every period naming one of its attempts' jobs is in
    (which attempt a job launched last, the one its scheduler state is of, is theirs)."""

    slot: int
    period: PeriodEvidence
    collection: tuple[Sequence[Finding], ...]


class StudyJudge:
    """Validates and judges a study one period at a time, as the periods are collected, then
    the study as a whole (:meth:`finish`): the same verdicts and findings, in the same
    order, as one pass over the whole study, without holding every period's evidence.

    A period is judged once every period that names one of its attempts' jobs is in: a
    job's scheduler state is that of the attempt it launched last, which may be a later
    period's (the arms of a pair often share their array element). ``study`` is the study
    before its evidence is read: its inputs, the scheduler's dump, and each period's record
    (``periods`` without attempts read). ``findings`` are the study-level lists of
    collection: its inputs', the layout's, the command line's inputs'. Periods judged
    elsewhere (by the workers, :meth:`add_judged`) are folded in as they are."""

    def __init__(self, study: Collected, options: AuditOptions, findings: tuple[
            list[Finding], list[Finding], list[Finding]]) -> None:
        self.options = options
        scheduler, anchors = study_checks(study, options)
        self.scheduler, self.anchors = scheduler, anchors
        self._ready = _ready_at(study)
        self.ends = _ends(self._ready)
        """Where the periods may be cut for judging apart (:func:`batch_ends`)."""
        # each period's record went into the checks above; judging one reads only the
        # study's inputs and scheduler's dump, and the period it is given (the records
        # would be a second copy of what the fold keeps)
        self.context = JudgeContext(replace(study, periods=()), options, (
            (STUDY, tuple(findings[0])), (LAYOUT, tuple(findings[1])),
            (INPUT, tuple(findings[2])), (SCHEDULER, tuple(scheduler)),
            (ANCHORS, tuple(anchors))))
        self.judge = PeriodJudge(self.context)
        self.study = self.context.study
        self._added = 0
        """Periods added so far (judged here or elsewhere)."""
        self._judged: Kept[Judged] = Kept()
        """The periods judged, in the study's order, as far as every one is."""
        self._early: dict[int, Judged] = {}
        """Periods judged here ahead of one before them, by slot."""
        self._waiting: list[tuple[int, int, _Waiting]] = []
        """A heap of (periods needed, slot, period): the next ready on top."""
        self._at_end: list[_Waiting] = []
        """Periods that wait for the end (an attempt no record names the job of)."""
        self._latest: dict[str, tuple[int, str]] = {}
        """Job id -> (start, ``subject#index``) of the attempt it launched last so far."""
        self._texts: dict[str, str] = {}
        """One of each text the verdicts repeat (see :func:`_sharing`; at most
        :data:`SHARED_TEXTS`)."""
        self._rows: Held[tuple[SacctJob, ...]] | None = None
        """The scheduler dump's rows, while set aside (:meth:`set_rows_aside`)."""

    def set_rows_aside(self) -> None:
        """Keep the scheduler dump's rows packed (:class:`~auditor.store.Held`) until
        they are next wanted (judging a period here, :attr:`sacct`, :meth:`finish`): while
        the workers judge every period, each batch with the rows it may look up, this
        process holds none of them through the reading (a million files' 55,556 jobs: 55
        MB as objects, 2.2 MB packed)."""
        sacct = self.study.sacct
        if sacct is not None and self._rows is None:
            self._rows = Held(tuple(sacct.jobs))
            self._use(replace(sacct, jobs=()))
            forget_lookups()  # (the study's checks may have indexed the dump's rows)

    @property
    def sacct(self) -> SacctDump | None:
        """The study's scheduler dump, whole (its rows made again if set aside)."""
        self._rows_back()
        return self.study.sacct

    def _rows_back(self) -> None:
        """The dump's rows made again, if set aside (:meth:`set_rows_aside`)."""
        if self._rows is not None:
            rows, self._rows = self._rows, None
            assert self.study.sacct is not None
            self._use(replace(self.study.sacct, jobs=rows.load()))

    def _use(self, sacct: SacctDump) -> None:
        """Judge with ``sacct`` as the study's dump from here on."""
        self.context = replace(self.context, study=replace(self.context.study, sacct=sacct))
        self.judge = PeriodJudge(self.context)
        self.study = self.context.study

    def add(self, period: PeriodEvidence, collection: tuple[Sequence[Finding], ...]
            ) -> list[int]:
        """Validate ``period`` (the next in the study's order) with its collection findings
        (:data:`PERIOD_RANKS`: its record's, its reading's, its files'), and judge every
        period now ready (this one, or earlier ones that waited for it): their slots (the
        periods' places, from 0); a period not among them waits, its records needed."""
        _launched_last([period], self._latest)
        slot = self._added
        self._added += 1
        waiting = _Waiting(slot, period, collection)
        if self._ready is None:
            self._at_end.append(waiting)
            return []
        heapq.heappush(self._waiting, (self._ready[slot], slot, waiting))
        return self._judge_ready(slot + 1)

    def add_judged(self, judged: Judged) -> None:
        """The study's next period, judged already (:func:`judge_together`, in a worker):
        its verdict's texts shared with the study's others."""
        if self._early:
            raise RuntimeError("a period judged apart after one waiting to be judged here")
        self._added += 1
        self._judged.append(replace(judged, verdict=_sharing(judged.verdict, self._texts)))

    def _judge_ready(self, added: int) -> list[int]:
        """Judge the waiting periods that ``added`` periods in make ready: their slots."""
        done = []
        last = _LastAttempts(self._latest)
        if self._waiting and self._waiting[0][0] <= added:
            self._rows_back()  # (judging reads them)
        while self._waiting and self._waiting[0][0] <= added:
            _, slot, item = heapq.heappop(self._waiting)
            self._early[slot] = self.judge.judge(item.period, item.collection, last,
                                                 self._texts)
            done.append(slot)
        while len(self._judged) in self._early:
            self._judged.append(self._early.pop(len(self._judged)))
        return done

    def finish(self, collected: Collected) -> tuple[Sequence[Finding], Reasoning]:
        """The study's validation findings and reasoning, once every period is in
        (``collected``: the study as collected, its ``periods`` those added, in order)."""
        self._rows_back()
        self._judge_ready(self._added)
        last = _LastAttempts(self._latest)
        for item in self._at_end:
            self._early[item.slot] = self.judge.judge(item.period, item.collection, last,
                                                      self._texts)
        self._at_end = []
        while len(self._judged) in self._early:
            self._judged.append(self._early.pop(len(self._judged)))
        if self._early or len(self._judged) != self._added:
            raise RuntimeError("a period was never judged")
        # (kept by the store until the report is made, as the periods are)
        verdicts: Kept[Verdict] = Kept()
        outcomes: Kept[AttemptOutcome] = Kept()
        facts: Kept[PeriodFacts] = Kept()
        new_findings: Kept[Finding] = Kept()
        checks: Kept[Finding] = Kept()
        pins: Kept[Finding] = Kept()
        disagreements = []
        for one in self._judged.drain():  # (one pass: each made anew, then let go)
            verdicts.append(one.verdict)
            outcomes.extend(one.outcomes)
            facts.append(one.facts)
            new_findings.extend(one.findings)
            checks.extend(one.checks)
            pins.extend(one.pins)
            if one.disagreement is not None:
                disagreements.append(one.disagreement)
        validation: Kept[Finding] = Kept(chain(checks.drain(), self.scheduler, pins.drain(),
                                               self.anchors))
        new_findings.extend(_unfinished_elements(collected, outcomes))
        cells, config_findings = configurations(collected, verdicts, outcomes)
        new_findings.extend(config_findings)
        reasons = gate_reasons(collected, verdicts, chain(validation, new_findings), cells)
        lifted, waiver_uses, waived = apply_waivers(reasons, self.options.waivers)
        new_findings.extend(waived)
        gate, gate_partial = admitted(
            decide_gate(cells, reasons, lifted, verdicts, allow_partial=False),
            decide_gate(cells, reasons, lifted, verdicts, allow_partial=True))
        return validation, Reasoning(
            verdicts=verdicts,
            attempts=outcomes,
            facts=facts,
            configurations=tuple(cells),
            accounting=accounting(collected, outcomes, verdicts),
            gate=gate,
            gate_partial=gate_partial,
            gate_reasons=tuple(reasons),
            waivers=tuple(waiver_uses),
            findings=new_findings,
            disagreements=tuple(disagreements),
        )


SHARED_TEXTS = 8192
"""The most texts kept for sharing (:func:`_sharing`): the texts a group's periods repeat
come back at once after the dict is emptied; those of one period only (a quote with its
time) would otherwise be held, once each, for the whole study."""


def _sharing(verdict: Verdict, texts: dict[str, str]) -> Verdict:
    """``verdict`` with the texts that recur from period to period one object each across
    the study (``texts`` keeps one of each): the diagnosis and limits a group's periods
    share, and its citations' quotes and pointers. A study's verdicts are held until the
    report is written; four thousand periods' diagnoses were four thousand copies of three
    texts."""
    if len(texts) > SHARED_TEXTS:
        texts.clear()  # (a large study's unique texts would grow it with every period)
    share = texts.setdefault
    citations = tuple(
        Citation(cite.path, cite.line,
                 share(cite.pointer, cite.pointer) if cite.pointer else cite.pointer,
                 share(cite.quote, cite.quote))
        for cite in verdict.citations)
    return replace(verdict, diagnosis=share(verdict.diagnosis, verdict.diagnosis),
                   limits=share(verdict.limits, verdict.limits), citations=citations)


class _LastAttempts(Mapping[str, str]):
    """Job id -> ``subject#index`` of the attempt it launched last (a view of the
    judge's running fold, which the jobs of a period ready to be judged have finished)."""

    def __init__(self, latest: dict[str, tuple[int, str]]) -> None:
        self.latest = latest

    def __getitem__(self, job: str) -> str:
        return self.latest[job][1]

    def __iter__(self) -> Iterator[str]:
        return iter(self.latest)

    def __len__(self) -> int:
        return len(self.latest)


def _ready_at(study: Collected) -> Sequence[int] | None:
    """For each period, how many periods must be in before it is judged: up to the last
    period that names one of its attempts' jobs. None when an attempt names no job (its
    job is its trial record's, known only once read: every period waits for the end).
    Machine integers (an ``array``), held through the reading: as a list, with
    :func:`_ends`', 6 MB of a million-file study's 55,556 periods."""
    last: dict[str, int] = {}
    for slot, period in enumerate(study.periods):
        for spec in period.record.attempts:
            if not spec.job_id:  # (``""`` too: the trial's job id is then looked up)
                return None
            last[spec.job_id] = slot
    return array("q", (max((last[spec.job_id] + 1 for spec in period.record.attempts
                            if spec.job_id is not None), default=slot + 1)
                       for slot, period in enumerate(study.periods)))


def _disagreement(period: PeriodEvidence, verdict: Verdict, outcomes: list[AttemptOutcome]
                  ) -> tuple[Finding, tuple[str, str, str, str]] | None:
    """An ``AUD211`` when the launcher's status for the counted attempt says other than the
    verdict, with the row the report lists it by."""
    counted = next((o for o in outcomes if o.counted), None)
    trial = _counted_trial(period, counted)
    if trial is None or trial.status is None or trial.status.lower() in EXIT_KINDS:
        return None  # (a status that says how it exited is no verdict)
    said = LAUNCHER_STATUS.get(trial.status.lower(), VerdictKind.UNRESOLVED)
    if said == verdict.verdict:
        return None
    error = f" ({trial.validation_error})" if trial.validation_error else ""
    item = finding("AUD211", period.subject, [Citation(trial.path, pointer="/status",
                                                       quote=trial.status)],
                   status=trial.status, error=error, verdict=verdict.verdict.value)
    return item, (period.subject, trial.status, trial.validation_error or "",
                  verdict.verdict.value)


def _unfinished_elements(collected: Collected,
                         outcomes: Sequence[AttemptOutcome]) -> list[Finding]:
    """Elements of the study's arrays that sacct still shows unfinished and that no attempt
    covers (a pending range, a requeued element): the array is partial."""
    if collected.sacct is None:
        return []
    arrays = {p.record.array_job_id for p in collected.periods if p.record.array_job_id}
    covered = {o.job_id for o in outcomes if o.job_id}
    out = []
    for job in collected.sacct.jobs:
        ranged = job.array_task_spec is not None
        if ranged and job.pending_tasks == ():
            continue  # (a stale range: every task it names has a row of its own)
        # (a range's JobIDRaw is the array's own id, which the task that started last runs
        # under: an attempt in that job covers none of the tasks the range still holds)
        if job.array_job_id in arrays and job.state in UNFINISHED_STATES and (
                ranged or (job.job_id_raw not in covered and job.job_id not in covered)):
            out.append(finding("AUD210", job.job_id,
                               [Citation(collected.sacct.path, line=job.line,
                                         quote=job.state_raw)],
                               form="array", job_id=job.job_id, state=job.state_raw))
    return out


def _counted_trial(period: PeriodEvidence,
                   counted: AttemptOutcome | None) -> TrialRecord | None:
    if counted is None:
        return None
    for attempt in period.attempts:
        if attempt.spec.index == counted.index:
            return attempt.read.trial
    return None


def _launched_last(periods: list[PeriodEvidence], latest: dict[str, tuple[int, str]]) -> None:
    """Fold ``periods`` (in the study's order) into ``latest``: for each job id, and for
    each run of a job whose restart is known (``<job>#r<n>``: :func:`run_key`), the start and
    ``subject#index`` of the attempt launched last in it (by invocation start; of equal
    starts, the later in order)."""
    for period in periods:
        for attempt in period.attempts:
            trial = attempt.read.trial
            job = attempt.spec.job_id or (trial.job_id if trial else None)
            if not job:
                continue
            start = trial.started_ns if trial and trial.started_ns is not None else -1
            who = f"{period.subject}#{attempt.spec.index}"
            for key in (job, run_key(job, restart_of(attempt))):
                if key is not None and (key not in latest or start >= latest[key][0]):
                    latest[key] = (start, who)


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
        item = finding("AUD214", subject, [Citation(record.path)])
        produced.append(item)
        return (
            Verdict(subject, record.pair, record.period, VerdictKind.UNRESOLVED,
                    Reason.EVIDENCE_MISSING, "The period record lists no attempt.",
                    "Nothing about this period's run can be concluded from the evidence.",
                    (item,), (Citation(record.path),)),
            [], produced,
        )
    judgements: list[tuple[AttemptEvidence, Judgement]] = []
    recorded = workers_recorded(period)  # (once per period, not once per attempt)
    for attempt in period.attempts:
        judgement = judge_attempt(period, attempt, context, recorded)
        judgements.append((attempt, judgement))
    counted_index = next(
        (i for i, (_, j) in enumerate(judgements) if j.outcome is Outcome.COMPLETED),
        len(judgements) - 1,
    )
    outcomes: list[AttemptOutcome] = []
    for i, (attempt, judgement) in enumerate(judgements):
        trial = attempt.read.trial
        element = element_for(collected.sacct, attempt.spec.job_id)
        if element is not None:  # (a requeued run held its own record's GPUs, -D's)
            element = own_record(element, attempt, period)[0] or element
        wasted = judgements[counted_index][1].outcome is Outcome.COMPLETED and i > counted_index
        outcome = AttemptOutcome(
            subject=subject, index=attempt.spec.index, job_id=attempt.spec.job_id,
            attempt_dir=attempt.spec.attempt_dir, outcome=judgement.outcome,
            reason=judgement.reason, exit_kind=judgement.exit.kind if judgement.exit else None,
            exit_code=trial.exit_code if trial else None,
            received_signal=trial.received_signal if trial else None,
            started_ns=trial.started_ns if trial else None,
            finished_ns=trial.finished_ns if trial else None,
            gpus=record.gpus,
            allocation_gpus=element.gpus if element and element.gpus else None,
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
                                cause=cause.word, cause_detail=cause.detail, knock_on=knock_on))
    kind = {Outcome.COMPLETED: VerdictKind.RESOLVED, Outcome.FAILED: VerdictKind.FAILED}.get(
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
