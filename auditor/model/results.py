"""What reasoning concludes: verdicts, attempts, configurations, accounting, the gate.

:class:`AuditResult` is the only thing reporters see. Nothing here imports a stage or does
I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from auditor.model.core import (
    CauseWord,
    Citation,
    ExitKind,
    Finding,
    Outcome,
    Reason,
    VerdictKind,
)
from auditor.model.study import AuditOptions, Collected

NS = 1_000_000_000


@dataclass(frozen=True, slots=True)
class Cause:
    """What ended a period that did not complete (contract v1.1, "Causes")."""

    word: CauseWord
    """The stable word (``gpu_oom``, ``host_oom``, ``nccl``, ... or ``unknown``)."""
    detail: str
    """Which signal and from whom, the root-cause rank and exit code, the exception type..."""
    citation: Citation | None
    """The line or record it rests on (None for ``unknown``)."""
    knock_on: tuple[str, ...] = ()
    """Other causes the evidence shows after it, named as its knock-ons (peers' NCCL errors
    after one rank ran out of memory)."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """The auditor's conclusion about one period."""

    subject: str
    pair: str
    period: int
    verdict: VerdictKind
    reason: Reason
    """One stable snake_case word: ``completed`` when resolved, ``eligible_failure`` when
    failed, else why it is unresolved (``terminal_event_missing`` ...)."""
    diagnosis: str
    """What the evidence shows, in sentences citing files and lines."""
    limits: str
    """What the evidence does not prove."""
    findings: tuple[Finding, ...] = ()
    citations: tuple[Citation, ...] = field(default=())
    """What it rests on, in order."""
    cause: Cause | None = None
    """What ended the counted attempt when it did not complete (None: it exited cleanly)."""


@dataclass(frozen=True, slots=True)
class AttemptOutcome:
    """How one attempt was judged, and what it cost."""

    subject: str
    index: int
    job_id: str | None
    attempt_dir: str | None
    outcome: Outcome
    reason: Reason
    exit_kind: ExitKind | None
    """How its invocation ended (None: not judged from a trial record)."""
    exit_code: int | None
    received_signal: str | None
    started_ns: int | None
    finished_ns: int | None
    gpus: int | None
    allocation_gpus: int | None
    """The GPUs its job's allocation held, as the scheduler's dump says (None where the dump
    has no row for the job, or names no GPU: the reservation scope then counts the period's,
    as the report says)."""
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
    array_job_id: str | None = None
    """The job array its record names (``auditor rerun`` says which array to resubmit)."""


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
    attempts: tuple[ElementCost, ...] = ()
    """The job's earlier records (``sacct -D``: each requeued or preempted run held the
    GPUs too), oldest first; this row's own figures are its latest record's."""
    outside_array: bool = False
    """A job that is no element of the study's arrays (a retry submitted as a job of its
    own): counted apart from the allocation scope, which the contract defines per element."""

    @property
    def known_gpu_seconds(self) -> int:
        """GPU-seconds of every record (the attempts and this one) whose figure is known
        (:attr:`unknown_records` says how many are not)."""
        return sum(v for v in (self.gpu_seconds, *(a.gpu_seconds for a in self.attempts)) if v)

    @property
    def unknown_records(self) -> int:
        """Records (the attempts and this one) whose GPU-seconds are unknown: an elapsed time
        or a GPU count the dump does not give."""
        return sum(1 for v in (self.gpu_seconds, *(a.gpu_seconds for a in self.attempts))
                   if v is None)

    @property
    def requeued_gpu_seconds(self) -> int:
        """The share lost to requeue or preemption: the earlier records', and this one's when
        it is ``PREEMPTED`` (unknown figures count 0)."""
        lost = sum(a.gpu_seconds or 0 for a in self.attempts)
        return lost + ((self.gpu_seconds or 0) if self.state == "PREEMPTED" else 0)


@dataclass(frozen=True, slots=True)
class Accounting:
    """GPU time in overlapping scopes (never to be added together)."""

    allocation_gpu_seconds: int | None
    """None without a scheduler dump (``AUD123``, or a refused one: ``AUD009``); the known
    records' sum when some are not (:attr:`allocation_records_unknown`)."""
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
    requeued_gpu_seconds: int | None = None
    """The allocation scope's share held by runs lost to requeue or preemption (every
    earlier ``sacct -D`` record of an element, and ``PREEMPTED`` ones); None when the
    allocation scope is unknown."""
    jobs_outside_array: tuple[str, ...] = ()
    """Jobs that ran attempts but are no element of the study's arrays (a retry submitted as
    a job of its own), by sacct's JobID: not in the allocation scope, counted apart."""
    outside_array_gpu_seconds: int | None = None
    """Their GPU-seconds (every record's); None when the allocation scope is unknown."""
    allocation_records_unknown: int = 0
    """Records of the allocation scope's elements whose GPU-seconds are unknown (no elapsed
    time, no GPU count): :attr:`allocation_gpu_seconds` counts the others, a lower bound."""
    attempts_without_times: int = 0
    """Attempts whose invocation time is unknown (no trial record, or one without its start
    or end): the task and reservation figures count the others, lower bounds."""
    wasted_at_least: bool = False
    """Whether a wasted attempt is one of them (:attr:`wasted_gpu_seconds` a lower bound)."""
    unresolved_at_least: bool = False
    """Whether an unresolved period's counted attempt is one of them
    (:attr:`unresolved_gpu_seconds` a lower bound)."""


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

    verdicts: Sequence[Verdict]
    """A tuple; a large study's are kept packed (a sequence that remakes each as read)."""
    attempts: Sequence[AttemptOutcome]
    facts: Sequence[PeriodFacts]
    """Each period's, in the verdicts' order (as are ``attempts``: packed too, when they
    are)."""
    configurations: tuple[ConfigurationResult, ...]
    accounting: Accounting
    gate: GateResult
    gate_partial: GateResult
    gate_reasons: tuple[GateReason, ...]
    waivers: tuple[WaiverUse, ...]
    findings: Sequence[Finding] = field(default=())
    """Every finding reasoning made, before the audit's limits (:attr:`AuditResult.findings`
    keeps those kept)."""
    disagreements: tuple[tuple[str, str, str, str], ...] = ()
    """(subject, launcher status, launcher validation error, auditor verdict)."""


TIMELINE_PERIODS = 24
"""The periods the phase timeline draws (``plots/phase_timeline.png``): the first this
many, with every record they were read with; every later one's phases are rows of
``phases.parquet``."""

TABLES: tuple[str, ...] = ("periods", "findings", "evidence", "attempts", "phases", "devices")
"""The Parquet tables an audit writes (``<name>.parquet``), in the order it writes them (the
report lists its outputs so); each one's columns are :data:`auditor.store.tables.SCHEMAS`'."""


def folder_of(path: str) -> str:
    """The first two parts of a root-relative path: an attempt directory's
    (``arm/attempt-<job>``) for a file in one."""
    return "/".join(path.split("/", 2)[:2])


@dataclass(frozen=True)
class AuditResult:
    """Everything reporters may see."""

    collected: Collected
    findings: tuple[Finding, ...]
    verdicts: Sequence[Verdict]
    """The reasoning's (:attr:`Reasoning.verdicts`)."""
    reasoning: Reasoning
    options: AuditOptions = field(default_factory=AuditOptions)
    partial: bool = False
    """A cap was reached (``AUD013``, ``AUD016``): some findings or phase records were
    counted, not kept."""
    findings_not_kept: int = 0
    """Findings counted but not kept: by the audit's limits (``--max-findings``,
    ``--max-findings-per-file``) and by the collectors' own, as they read (each cap reached
    is an ``AUD013``)."""

    def __repr__(self) -> str:
        """One line: the study, its verdicts, the gate (the dataclass's own repr would print
        every record of the study)."""
        counts = {kind.value: 0 for kind in VerdictKind}
        for verdict in self.verdicts:
            counts[verdict.verdict.value] += 1
        said = ", ".join(f"{count} {word}" for word, count in counts.items())
        gate = "passed" if self.reasoning.gate.passed else "failed"
        partial = "passed" if self.reasoning.gate_partial.passed else "failed"
        return (f"<AuditResult {self.collected.root.name}: {len(self.verdicts)} periods "
                f"({said}); gate {gate}, --allow-partial {partial}; "
                f"{len(self.findings)} findings{'; partial' if self.partial else ''}>")

    def periods_of_files(self, findings: Iterable[Finding]) -> dict[str, list[str]]:
        """The attempt directory (``arm/attempt-<job>``) of each of ``findings`` about a
        file in one -> the periods whose attempts it holds: a finding about such a file (a
        log that ends mid-line) is about them. Only those directories are kept (a million
        files' attempts would be some 30 MB)."""
        wanted = {folder_of(f.subject) for f in findings if f.subject.count("/") >= 2}
        found: dict[str, list[str]] = {}
        if not wanted:
            return found
        for attempt in self.reasoning.attempts:
            folder = (attempt.attempt_dir or "").rstrip("/")
            if folder in wanted:
                subjects = found.setdefault(folder, [])
                if attempt.subject not in subjects:
                    subjects.append(attempt.subject)
        return found

    def rule_ids(self) -> Iterator[list[str]]:
        """Each period's rules, sorted, in the verdicts' order: those its verdict rests on
        and every other finding about it (a retry's ``AUD212``, its cause's ``AUD218``, one
        about a file of its attempts'), as summary.json and periods.parquet give them. Made
        as they are read (a million periods' lists were about 20 MB held through the
        writing of a table)."""
        said: dict[str, set[str]] = {}
        owners = self.periods_of_files(self.findings)
        for item in self.findings:
            said.setdefault(item.subject, set()).add(item.rule_id)
            for subject in owners.get(folder_of(item.subject), ()):
                said.setdefault(subject, set()).add(item.rule_id)
        nothing: set[str] = set()
        for verdict in self.verdicts:
            yield sorted({f.rule_id for f in verdict.findings}
                         | said.get(verdict.subject, nothing))

    def anchor_status(self) -> list[tuple[str, str, str]]:
        """(name, expected sha256, status) for every anchor, for the report."""
        collected = self.collected
        expected = dict(collected.protocol.anchors)
        expected.update(dict(self.options.anchors))
        given = {i.path: i for i in collected.inputs if i.group == "protocol_inputs"}
        rows = []
        for name, sha in sorted(expected.items()):
            source = given.get(name)
            if source is None:
                status = "not checked (no input given)"
            elif source.digest.sha256 == sha.lower():
                status = "verified"
            else:
                status = f"MISMATCH (found {source.digest.sha256})"
            rows.append((name, sha, status))
        return rows
