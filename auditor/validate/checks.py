"""Cross-checks that the pieces of evidence belong together.

Integrity (hash and size against the manifest) is decided while the files are
read (:mod:`auditor.pipeline.audit`); this module checks what only the parsed content
can show: identities (pid / rank / role / job / GPU) agree everywhere they
appear, timelines nest (allocator records inside the invocation, the
invocation inside the scheduler's allocation), the idle check passed, and the
provenance inputs (anchors, pinned commits) match. Every check yields
findings; none stops at the first problem.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from itertools import chain

from auditor.model import (
    CLOCK_SLACK_NS,
    AttemptEvidence,
    AuditOptions,
    Citation,
    Collected,
    Finding,
    PeriodEvidence,
    PeriodRecord,
    SacctDump,
    SacctJob,
)
from auditor.model.kinds import (
    KINDS,
    PER_WORKER,
    REQUIRED,
    TRAINING_LOG,
    TRIAL,
)
from auditor.rules import finding
from auditor.validate.attempts import (
    attempts_twice,
    claimed_twice,
    out_of_order,
    steps_differ,
)
from auditor.validate.identity import worker_identity
from auditor.validate.idle import idle_checks

ATTEMPT_NAME_RE = re.compile(r"(?:^|/)attempt-(?P<job>[^/]+?)(?:-r(?P<restart>\d{1,9}))?$")
"""An attempt directory: ``attempt-<job>`` (restart 0) or ``attempt-<job>-r<restart_count>``
(a requeued job keeps its id, contract v1.1): ``job`` and ``restart`` (None: no suffix)."""
NS = 1_000_000_000


def validate(periods: Iterable[PeriodEvidence], collected: Collected, options: AuditOptions
             ) -> list[Finding]:
    """Every cross-check over the collected study (``periods``: its periods, whole), in the
    order a report lists them: each period's (:func:`period_checks`), the scheduler's
    (:func:`study_checks`), each period's commit pin, then the protocol's anchors (an audit
    makes them a period at a time: :class:`~auditor.reason.engine.StudyJudge`)."""
    own: list[Finding] = []
    pins: list[Finding] = []
    for period in periods:
        checks, pin = period_checks(period, collected)
        own.extend(checks)
        pins.extend(pin)
    scheduler, anchors = study_checks(collected, options)
    return [*own, *scheduler, *pins, *anchors]


def period_checks(period: PeriodEvidence, collected: Collected
                  ) -> tuple[list[Finding], list[Finding]]:
    """One period's cross-checks (its record, then each attempt's identities, job ids and
    timeline), and its commit pin's (``AUD121``, listed apart: after the scheduler's)."""
    findings = list(_period_checks(period, collected))
    for attempt in period.attempts:
        findings.extend(_identity(period, attempt))
        findings.extend(_job_ids(period, attempt, collected.sacct))
        findings.extend(_timeline(attempt, collected.sacct, period))
        findings.extend(_gpus_held(period, attempt, collected.sacct))
    return findings, list(_commit(period.record, collected))


def study_checks(collected: Collected, options: AuditOptions
                 ) -> tuple[list[Finding], list[Finding]]:
    """The checks of the study as a whole, which need no period's evidence (only the period
    records): (the attempts two records list, and the elements the scheduler dump does not
    show; the protocol's anchors). A
    state Slurm does not name (``AUD124``) is the dump's reader's finding."""
    return (list(chain(claimed_twice(collected), _absent_elements(collected))),
            list(_anchors(collected, options)))


def element_for(sacct: SacctDump | None, job_id: str | None) -> SacctJob | None:
    """The sacct allocation row of an attempt's actual job id (as ``job_for``, indexed once
    per dump: audits look up every attempt, and a scan per look-up is quadratic)."""
    if sacct is None or not job_id:
        return None
    cached = _INDEX.get(id(sacct))
    if cached is None or cached[0] is not sacct:
        by_raw: dict[str, SacctJob] = {}
        by_id: dict[str, SacctJob] = {}
        for job in sacct.jobs:
            if job.job_id_raw is not None:
                by_raw.setdefault(job.job_id_raw, job)
            else:
                by_id.setdefault(job.job_id, job)
        _INDEX.clear()
        cached = (sacct, by_raw, by_id)
        _INDEX[id(sacct)] = cached
    wanted = job_id.strip()
    return cached[1].get(wanted) or cached[2].get(wanted)


_INDEX: dict[int, tuple[SacctDump, dict[str, SacctJob], dict[str, SacctJob]]] = {}


def forget_lookups() -> None:
    """Let go of :func:`element_for`'s index (and the dump it holds): the audit's process
    sets a dump's rows aside while its workers judge, and the study's checks, made before,
    may have indexed them all (an array element the records name that the dump does not
    show)."""
    _INDEX.clear()


_RowKey = str | tuple[str | None] | tuple[str, int]
"""What :class:`SchedulerRows` files a row under: a job id, an array's pending ranges
``(array_job_id,)``, an array element ``(array_job_id, array_task_id)``."""


class SchedulerRows:
    """A scheduler dump's rows by what judging a period may look them up by, to give a
    batch of periods only the rows its judging can look up (:meth:`places`, :meth:`at`): a
    worker then holds a batch's few rows, not the whole dump (at a million files, 55,556
    jobs: about 80 MB in each worker, 9 MB pickled).

    A period whose attempts all name their job (the only ones the workers judge:
    :func:`~auditor.reason.engine.batch_ends`) looks rows up by exactly three keys, which
    a row is filed under when it has them: an attempt's job id (:func:`element_for`: the
    row's JobIDRaw, or its printed JobID without one), the record's array element (the
    row of ``(array_job_id, array_task_id)``: the element the record names, when sacct
    knows it by another job id) and the record's array (its pending ranges, which may
    still hold the element). Every row a look-up could return is filed under its key, and
    the narrowed dump keeps the dump's order, so each first match is the whole dump's."""

    def __init__(self, sacct: SacctDump) -> None:
        self.sacct = sacct
        self._at: dict[_RowKey, int | list[int]] = {}
        for place, job in enumerate(sacct.jobs):
            self._file(job.job_id_raw if job.job_id_raw is not None else job.job_id, place)
            if job.array_job_id is not None and job.array_task_id is not None:
                self._file((job.array_job_id, job.array_task_id), place)
            if job.array_task_spec is not None:
                self._file((job.array_job_id,), place)

    def _file(self, key: _RowKey, place: int) -> None:
        held = self._at.setdefault(key, place)
        if held != place:
            if isinstance(held, int):
                self._at[key] = [held, place]
            else:
                held.append(place)

    def places(self, record: PeriodRecord) -> tuple[int, ...]:
        """Where in the dump the rows are that judging this period's attempts may look up
        (each once, any order)."""
        keys: list[_RowKey] = [spec.job_id.strip() for spec in record.attempts if spec.job_id]
        if record.array_task_id is not None:
            keys.append((record.array_job_id,))
            if record.array_job_id:
                keys.append((record.array_job_id, record.array_task_id))
        places: set[int] = set()
        for key in keys:
            held = self._at.get(key)
            if isinstance(held, int):
                places.add(held)
            elif held is not None:
                places.update(held)
        return tuple(places)

    def at(self, places: Iterable[int]) -> SacctDump:
        """The dump with only the rows at ``places`` (:meth:`places`), in its order (the
        audit sends a batch the rows, :meth:`~auditor.reason.engine.PeriodJudge.narrowed`)."""
        jobs = self.sacct.jobs
        return replace(self.sacct, jobs=tuple(jobs[place] for place in sorted(set(places))))


# ------------------------------------------------------------------ per period


def _period_checks(period: PeriodEvidence, collected: Collected) -> Iterator[Finding]:
    record = period.record
    if not record.readable:
        return
    subject = period.subject
    yield from idle_checks(period, collected.protocol.idle_check == "optional")
    yield from attempts_twice(period)
    yield from steps_differ(period, collected.protocol.steps_from)
    yield from out_of_order(period, lambda attempt: _scheduled_start(
        collected, period, attempt))
    yield from _sealed_late(period)
    for attempt in period.attempts:
        trial = attempt.read.trial
        if trial is None:
            continue
        for field_name, trial_value, period_value in (
            ("pair", trial.pair, record.pair),
            ("period", trial.period, record.period),
            ("gpus", trial.gpus, record.gpus),
        ):
            if trial_value is not None and period_value is not None and \
                    trial_value != period_value:
                yield finding(
                    "AUD112", subject, [Citation(trial.path, pointer=f"/{field_name}",
                                                 quote=str(trial_value))],
                    field=field_name, trial_value=trial_value, period_value=period_value,
                )


SEALED_LATE_NS = 3600 * NS
"""A period sealed later than this after its last attempt ended is said to be (``AUD125``)."""


def _sealed_late(period: PeriodEvidence) -> Iterator[Finding]:
    delay = period.seal_delay_ns()
    if delay is None or delay <= SEALED_LATE_NS:
        return
    record = period.record
    yield finding("AUD125", period.subject,
                  [Citation(record.path, pointer="/sealed_ns", quote=str(record.sealed_ns))],
                  delay=_duration(delay), sealed_by=record.sealed_by or "unknown sealer")


def _duration(ns: int) -> str:
    seconds = ns // NS
    if seconds < 3600 * 48:
        return f"{seconds // 3600} h {seconds % 3600 // 60} min"
    return f"{seconds // 86400} days"


def _identity(period: PeriodEvidence, attempt: AttemptEvidence) -> Iterator[Finding]:
    record = period.record
    subject = period.subject
    spec = attempt.spec
    read = attempt.read
    listed_kinds = {row.kind for row in attempt.files}
    for kind in REQUIRED:
        if kind.name not in listed_kinds:
            yield finding("AUD107", subject, [Citation(record.path, pointer=spec.pointer
                                                       + "/evidence")], kind=kind.name)
    if record.gpus is not None and len(spec.workers) != record.gpus:
        yield finding("AUD114", subject, [Citation(record.path, pointer=spec.pointer
                                                   + "/workers")],
                      workers=len(spec.workers), gpus=record.gpus)
    yield from worker_identity(subject, record, spec, read)
    listed_for = _listed_workers(attempt)
    for worker in spec.workers:
        if worker.pid is None:
            continue
        worker_cite = Citation(record.path, pointer=worker.pointer)
        for kind in PER_WORKER:
            if (kind.name, worker.host, worker.pid) not in listed_for \
                    and (kind.name, None, worker.pid) not in listed_for:
                yield finding("AUD107", subject, [worker_cite], form="for_worker",
                              kind=kind.title, pid=worker.pid, rank=worker.rank)
    gpus: dict[str, list[tuple[int | None, str, str]]] = defaultdict(list)
    for device in read.devices:
        if device.gpu_uuid:  # (one GPU however its hex digits are cased)
            gpus[device.gpu_uuid.lower()].append((device.rank, device.path, device.gpu_uuid))
    for _, users in sorted(gpus.items()):
        ranks = sorted({rank for rank, _, _ in users if rank is not None})
        if len(users) > 1:
            yield finding("AUD113", subject,
                          [Citation(path, pointer="/gpu/uuid", quote=uuid)
                           for _, path, uuid in users],
                          uuid=users[0][2], ranks=", ".join(str(r) for r in ranks))


def _listed_workers(attempt: AttemptEvidence) -> set[tuple[str, str | None, int]]:
    """(kind, host, pid) of each file of a per-worker kind the manifest lists named for a
    worker (read or not; host None in a v1 name)."""
    listed = set()
    for row in attempt.files:
        kind = KINDS.get(row.kind)
        who = kind.worker_of(row.path) if kind is not None and kind.per_worker else None
        if kind is not None and who is not None:
            listed.add((kind.name, *who))
    return listed


def _job_ids(
    period: PeriodEvidence, attempt: AttemptEvidence, sacct: SacctDump | None
) -> Iterator[Finding]:
    subject = period.subject
    spec = attempt.spec
    record = period.record
    claims: list[tuple[str, str, Citation]] = []
    if spec.job_id:
        claims.append(("period record", spec.job_id,
                       Citation(record.path, pointer=spec.pointer + "/job_id")))
    if spec.attempt_dir:
        match = ATTEMPT_NAME_RE.search(spec.attempt_dir)
        if match:
            claims.append(("attempt directory", match["job"], Citation(spec.attempt_dir)))
    trial = attempt.read.trial
    if trial is not None and trial.job_id:
        claims.append(("trial", trial.job_id, Citation(trial.path, pointer="/job_id")))
    claims.extend(
        (f"device {device.path.rsplit('/', 1)[-1]}", device.job_id,
         Citation(device.path, pointer="/job_id"))
        for device in attempt.read.devices if device.job_id
    )
    # (the job in a trial record's and a training log's own names: another job's log, listed
    # first, would otherwise be the one read for the terminal event)
    for kind, read in ((TRIAL, trial), (TRAINING_LOG, attempt.read.log)):
        spelled = kind.parts(read.path) if read is not None else None
        if read is not None and spelled is not None:
            claims.append((f"{kind.title} name", spelled["job"], Citation(read.path)))
    values = {value for _, value, _ in claims}
    if len(values) > 1:
        reference = claims[0][1]
        odd = [(who, value, cite) for who, value, cite in claims if value != reference]
        yield finding(
            "AUD111", subject, [claims[0][2]] + [cite for _, _, cite in odd],
            who=claims[0][0], job_id=reference,
            others="; ".join(f"{who} says {value}" for who, value, _ in odd),
        )
    job_id = spec.job_id or (trial.job_id if trial else None)
    if sacct is not None and job_id:
        element = element_for(sacct, job_id)
        # the element the period record names, when sacct knows it by another job id (a
        # period of several attempts may have run in other elements: only a single one)
        named = next((job for job in sacct.jobs
                      if job.array_job_id == record.array_job_id and job.array_task_id is not None
                      and job.array_task_id == record.array_task_id), None) \
            if element is None and record.array_job_id and len(period.attempts) == 1 else None
        if named is not None and named.job_id_raw and named.job_id_raw != job_id:
            said = claims[0] if claims else ("trial", job_id, Citation(record.path))
            yield finding("AUD111", subject, [Citation(sacct.path, line=named.line,
                                                       quote=named.job_id_raw), said[2]],
                          form="sacct_raw", element=named.job_id, job_id_raw=named.job_id_raw,
                          who=said[0], job_id=job_id)
        elif element is None:
            yield finding("AUD119", subject, [Citation(sacct.path)], job_id=job_id)
        else:
            yield from _element_claims(subject, period, attempt, element, sacct.path, job_id)


def _element_claims(subject: str, period: PeriodEvidence, attempt: AttemptEvidence,
                    element: SacctJob, sacct_path: str, job_id: str) -> Iterator[Finding]:
    """``AUD111`` for the first array or element the attempt's records claim that sacct's
    row of its job contradicts: the period record's (its attempt's own element where a
    retried period's attempts give one), then the trial's (contract v1.1's
    ``array_job_id``, ``array_task_id``: a rerun in another element said so unread)."""
    record, spec, trial = period.record, attempt.spec, attempt.read.trial
    task = spec.array_task_id if spec.array_task_id is not None else record.array_task_id
    arrays = [("period record", record.array_job_id, Citation(record.path))]
    tasks = [("period record", task, Citation(record.path))]
    if trial is not None:
        arrays.append(("trial", trial.array_job_id,
                       Citation(trial.path, pointer="/array_job_id")))
        tasks.append(("trial", trial.array_task_id,
                      Citation(trial.path, pointer="/array_task_id")))
    row = Citation(sacct_path, line=element.line)
    for who, claimed, cite in arrays:
        if claimed and element.array_job_id and element.array_job_id != claimed:
            yield finding("AUD111", subject, [row, cite], form="sacct_array", job_id=job_id,
                          sacct_array=element.array_job_id, record_array=claimed, who=who)
            return
    for who, claimed_task, cite in tasks:
        if claimed_task is not None and element.array_task_id is not None \
                and element.array_task_id != claimed_task:
            yield finding("AUD111", subject, [row, cite], form="sacct_element",
                          job_id=job_id, sacct_element=element.array_task_id,
                          record_element=claimed_task, who=who)
            return


def _timeline(attempt: AttemptEvidence, sacct: SacctDump | None,
              period: PeriodEvidence | None = None) -> Iterator[Finding]:
    """Allocator records and process records inside the invocation (AUD116); the invocation
    inside its own allocation record (AUD117): the ``sacct -D`` record of its run (by restart
    count) for a requeued job, else the element's latest. Without ``-D`` an earlier run has
    no record of its own: not compared, and said (AUD119). sacct's End is truncated to its
    second, so the invocation may end up to one second after it, no more; when the scheduler
    ended the job (cancelled, timed out, preempted, requeued), End is the kill request's
    second and the processes then had KillWait (:data:`KILL_WAIT_S`) to end."""
    trial = attempt.read.trial
    if trial is None or trial.started_ns is None or trial.finished_ns is None:
        return
    start, finish = trial.started_ns, trial.finished_ns
    subject = attempt.subject
    if finish < start:
        yield finding("AUD117", subject, [Citation(trial.path, pointer="/invocation")],
                      form="reversed")
    # (on several nodes each trace is on its own node's clock: a minute either side, as for
    # process records; on one node, one clock, no slack)
    slack = CLOCK_SLACK_NS if len(attempt.hosts()) > 1 else 0
    for trace in attempt.read.traces:
        outside = [
            record for record in trace.phases
            if (record.started_ns is not None and record.started_ns < start - slack)
            or (record.finished_ns is not None and record.finished_ns > finish + slack)
        ]
        if outside:
            first = outside[0]
            yield finding(
                "AUD116", subject, [Citation(trace.path, line=first.line)],
                records=len(outside), phase=first.phase, step=first.step,
            )
        elif trace.first_ns is not None and trace.last_ns is not None and (
            trace.first_ns < start - slack or trace.last_ns > finish + slack
        ):
            yield finding("AUD116", subject, [Citation(trace.path)], form="samples")
    for process in attempt.read.processes:  # (contract v1.2: each written as its process ended)
        # (each on its own node's clock, which may disagree with the batch node's by up to
        # CLOCK_SLACK_NS, and a step the scheduler ended may outlive the batch by KillWait)
        early = process.started_ns is not None and process.started_ns < start - CLOCK_SLACK_NS
        if early or (process.ended_ns is not None
                     and process.ended_ns > finish + CLOCK_SLACK_NS):
            field, value, bound = ("started_ns", process.started_ns, start) if early \
                else ("ended_ns", process.ended_ns, finish)
            yield finding("AUD116", subject, [Citation(process.path or trial.path,
                                                       pointer=f"/{field}", quote=str(value))],
                          form="process", path=process.path or trial.path, role=process.role,
                          field=field, value=value, edge="before" if early else "after",
                          bound=bound)
    element = element_for(sacct, attempt.spec.job_id or trial.job_id)
    if element is not None and sacct is not None:
        element, unmatched = own_record(element, attempt, period)
        if element is None:
            yield finding("AUD119", subject, [Citation(sacct.path), Citation(
                trial.path, pointer="/restart_count")], form="restart", **unmatched)
            return
        cite = [Citation(sacct.path, line=element.line), Citation(trial.path,
                                                                  pointer="/invocation")]
        if element.start is not None and start // NS < element.start:
            yield finding("AUD117", subject, cite,
                          edge="starts before", field="Start", sacct=element.start,
                          invocation=start // NS, hint=_zone_hint(element.start, start // NS))
        grace = KILL_WAIT_S if element.state in KILLED_BY_SCHEDULER else 0
        if element.end is not None and (finish + NS - 1) // NS > element.end + 1 + grace:
            yield finding("AUD117", subject, cite,
                          edge="ends after", field="End", sacct=element.end,
                          invocation=finish // NS, hint=_zone_hint(element.end, finish // NS))


def _gpus_held(period: PeriodEvidence, attempt: AttemptEvidence, sacct: SacctDump | None
               ) -> Iterator[Finding]:
    """An ``AUD129`` where the record of the attempt's own run (its ``-D`` record for a
    requeued run, else the element's latest) held fewer GPUs than the period says it ran
    on: one of the two is not this run's, and the reservation scope would come out below
    the task scope. An attempt with no invocation of its own (a run cancelled while
    pending, whose row holds no GPUs) is left to the checks of its missing evidence."""
    trial, gpus = attempt.read.trial, period.record.gpus
    if sacct is None or trial is None or trial.started_ns is None or not gpus:
        return
    element = element_for(sacct, attempt.spec.job_id or trial.job_id)
    record = own_record(element, attempt, period)[0] if element is not None else None
    # (an unknown count is no contradiction, nor is none shown: AllocTRES lists gres/gpu
    # only where the site's accounting tracks it, AccountingStorageTRES)
    if record is None or not record.gpus or record.gpus >= gpus:
        return
    yield finding("AUD129", attempt.subject,
                  [Citation(sacct.path, line=record.line, quote=f"{record.gpus}"),
                   Citation(period.record.path, pointer="/gpus", quote=str(gpus))],
                  job_id=record.job_id, line=record.line, held=record.gpus, gpus=gpus)


def _zone_hint(sacct: int, invocation: int) -> str:
    """What an invocation a whole number of hours (or half hours) from its allocation's time
    likely means: the dump's times are local, not UTC (the contract captures with TZ=UTC)."""
    apart = abs(invocation - sacct)
    hours = round(apart / 1800) / 2
    if not 0.5 <= hours <= 14 or abs(apart - hours * 3600) > 600:  # (a job starts its script late)
        return ""
    return f"; {hours:g} h apart, as local times would be: a dump captured without TZ=UTC?"


KILLED_BY_SCHEDULER = frozenset({"CANCELLED", "TIMEOUT", "PREEMPTED", "DEADLINE",
                                 "NODE_FAIL", "REQUEUED"})
"""States whose End is the scheduler's kill request: the job's processes were then sent
SIGTERM and had KillWait to end before SIGKILL (a launcher that traps the signal, forwards
it and writes its record ends inside that window, after End)."""
KILL_WAIT_S = 30
"""Slurm's default KillWait (slurm.conf), the seconds between SIGTERM and SIGKILL."""


def restart_of(attempt: AttemptEvidence) -> int | None:
    """The attempt's run of its job (``SLURM_RESTART_COUNT``): the trial's
    ``restart_count``, else the period record's, else its directory's ``-r<n>`` suffix;
    None when nothing says (a v1 study)."""
    trial = attempt.read.trial
    if trial is not None and trial.restart_count is not None:
        return trial.restart_count
    if attempt.spec.restart_count is not None:
        return attempt.spec.restart_count
    match = ATTEMPT_NAME_RE.search(attempt.spec.attempt_dir or "")
    return int(match["restart"]) if match is not None and match["restart"] else None


def _scheduled_start(collected: Collected, period: PeriodEvidence, attempt: AttemptEvidence
                     ) -> tuple[int, Citation] | None:
    """When the scheduler started the attempt's own run (its record's Start, in ns), with
    the dump's row; None where the dump does not say."""
    sacct = collected.sacct
    trial = attempt.read.trial
    job = attempt.spec.job_id or (trial.job_id if trial else None)
    element = element_for(sacct, job)
    if sacct is None or element is None:
        return None
    record = own_record(element, attempt, period)[0]
    if record is None or record.start is None:
        return None
    return record.start * 1_000_000_000, Citation(sacct.path, line=record.line,
                                                  quote=str(record.start))


def _job_of(attempt: AttemptEvidence) -> str | None:
    trial = attempt.read.trial
    return attempt.spec.job_id or (trial.job_id if trial else None)


@dataclass(frozen=True, slots=True)
class _JobRuns:
    """What a period's attempts of one job say of its runs (:func:`restart_of`)."""

    named: int
    """How many attempts name a run."""
    latest: int | None
    """The latest run named (None: none named)."""
    copies: Counter[int]
    """Of each attempt naming a run (by ``id``), how many times the period lists it."""


_RUNS: tuple[PeriodEvidence, dict[str | None, _JobRuns]] | None = None
"""The last period's :func:`_job_runs` (one reference, swapped whole: its attempts are
asked of one after another, by several checks each)."""


def _job_runs(period: PeriodEvidence) -> dict[str | None, _JobRuns]:
    """Each job's runs among the period's attempts, made once for the period."""
    global _RUNS
    cached = _RUNS
    if cached is not None and cached[0] is period:
        return cached[1]
    named: dict[str | None, list[tuple[AttemptEvidence, int]]] = defaultdict(list)
    jobs: set[str | None] = set()
    for attempt in period.attempts:
        jobs.add(job := _job_of(attempt))
        if (run := restart_of(attempt)) is not None:
            named[job].append((attempt, run))
    runs = {job: _JobRuns(len(named[job]), max((n for _, n in named[job]), default=None),
                          Counter(id(a) for a, _ in named[job])) for job in jobs}
    _RUNS = (period, runs)
    return runs


def own_record(element: SacctJob, attempt: AttemptEvidence, period: PeriodEvidence | None
                ) -> tuple[SacctJob | None, dict[str, object]]:
    """The record of the attempt's own run (the element itself when its run is unknown or
    the latest), or None and what the dump lacks (``job_id``, ``restart``, ``latest``)."""
    job = _job_of(attempt)
    restart = restart_of(attempt)
    # (the other attempts of its job that name a run: the attempt's own runs taken from its
    # job's, made once per period, as a scan of the period per attempt was A² for A attempts)
    runs = _job_runs(period).get(job) if period is not None else None
    others = 0 if runs is None else runs.named - (runs.copies[id(attempt)] if restart is not None
                                                  else 0)
    match = ATTEMPT_NAME_RE.search(attempt.spec.attempt_dir or "")
    if restart is None and match is not None and others > 0:
        restart = 0  # (``attempt-<job>`` beside an ``attempt-<job>-r<n>``: the first run)
    if restart is None:
        return element, {}
    # (the job's latest run named counts this attempt's own too, which is ``restart``
    # itself: the same maximum as the other attempts' latest)
    latest = max([restart, *((runs.latest,) if runs is not None and others > 0 else ()),
                  len(element.attempts), element.restarts or 0])
    record = element.record_for_restart(restart, latest)
    if record is not None:
        return record, {}
    return None, {"job_id": job, "restart": restart, "latest": latest}


# ------------------------------------------------------------------ provenance


def _absent_elements(collected: Collected) -> Iterator[Finding]:
    """An ``AUD126`` for each array element the period records name that the scheduler's
    dump shows neither as a row of its own nor inside a pending range (nor by the job id an
    attempt ran as)."""
    sacct = collected.sacct
    if sacct is None or not collected.scheduler_usable():
        return
    shown = {(job.array_job_id, job.array_task_id) for job in sacct.jobs
             if job.array_task_id is not None}
    named: dict[tuple[str, int], list[tuple[int, str, str | None]]] = defaultdict(list)
    """Where the period records name each element: (place of the period, pointer, the job id
    the attempt ran as) (a large study's periods are kept packed: only those of an element
    not shown are made again)."""
    for place, period in enumerate(collected.periods):
        record = period.record
        if not record.array_job_id:
            continue
        # (each attempt's element, else its period's: a retried period's attempts may have
        # run in other elements, the one its verdict rests on among them)
        for spec in record.attempts:
            task = spec.array_task_id if spec.array_task_id is not None \
                else record.array_task_id
            if task is not None:
                named[(record.array_job_id, task)].append(
                    (place, f"{spec.pointer}/array_task_id", spec.job_id))
        if not record.attempts and record.array_task_id is not None:
            named[(record.array_job_id, record.array_task_id)].append(
                (place, "/array_task_id", None))
    for (array, task), where in sorted(named.items()):
        if (array, task) in shown or any(job.array_job_id == array and job.covers(task)
                                         for job in sacct.jobs):
            continue
        if any(element_for(sacct, job_id) is not None for _, _, job_id in where):
            continue  # (known by its job id: AUD111 says where the two disagree)
        paths = [collected.periods[place].record.path for place, _, _ in where]
        yield finding("AUD126", f"{array}_{task}",
                      [Citation(sacct.path), *(Citation(path, pointer=pointer, quote=str(task))
                                               for path, (_, pointer, _) in zip(paths, where,
                                                                                strict=True))],
                      records=", ".join(dict.fromkeys(paths)))


def _commit(record: PeriodRecord, collected: Collected) -> Iterator[Finding]:
    """An ``AUD121`` when the period ran another commit than the pinned one."""
    pinned = collected.execution_commits
    if pinned is None or not record.readable:
        return
    cite_path = collected.layout.execution_commits or "execution_commits.json"
    subject = record.subject
    expected = pinned.get(record.pair)
    if expected is None:
        yield finding("AUD121", subject, [Citation(cite_path)],
                      actual=record.commit, expected="nothing (pair not listed)")
    elif record.commit != expected:
        yield finding("AUD121", subject,
                      [Citation(record.path, pointer="/commit", quote=str(record.commit)),
                       Citation(cite_path, pointer="/" + record.pair)],
                      actual=record.commit, expected=expected)


def _anchors(collected: Collected, options: AuditOptions) -> Iterator[Finding]:
    expected = dict(collected.protocol.anchors)
    expected.update(dict(options.anchors))
    given = {i.path: i for i in collected.inputs if i.group == "protocol_inputs"}
    protocol_path = collected.protocol.path or "protocol.json"
    for name, sha in sorted(expected.items()):
        source = given.get(name)
        if source is None:
            yield finding("AUD120", name, [Citation(protocol_path, pointer=f"/anchors/{name}")],
                          form="not_given", name=name)
        elif source.digest.sha256 != sha.lower():
            yield finding("AUD120", name, [Citation(source.path, quote=source.digest.sha256)],
                          name=name, expected=sha, found=source.digest.sha256)
