"""The study's fold of its periods into the audit's result, a period at a time.

:class:`Fold` takes each period in the study's order, judged already in a worker
(:meth:`Fold.add_folded`, from :mod:`auditor.pipeline.worker`) or read here and judged as it
comes (:meth:`Fold.add`, :class:`StudyJudge`; a merge of shards, or a study whose records
leave a job unnamed, whose periods :class:`Joining` joins with their attempts' reads as they
arrive). Either way the fold spills its per-file rows (evidence, phases, devices) out of memory
and keeps of each period what the report needs; :meth:`Fold.finish` assembles the study
(:func:`assemble_collected`), runs the study-level checks and applies the findings' limits
(:func:`apply_limits`). A single audit folds its periods as they are read, a merge those of its
shards: the same judge, the same bytes.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import replace
from itertools import chain
from typing import TYPE_CHECKING

from auditor._text import clip
from auditor.model import (
    TIMELINE_PERIODS,
    AttemptRead,
    AttemptSummary,
    AuditOptions,
    AuditResult,
    Citation,
    Collected,
    CollectedParts,
    EvidenceFile,
    EvidenceRows,
    Finding,
    InputFile,
    PeriodEvidence,
    PeriodRecord,
    PeriodSummary,
    PeriodUnit,
    Progress,
    Severity,
    TraceDigest,
    input_order,
)
from auditor.pipeline.worker import (
    KEPT_WHOLE,
    FoldedPeriod,
    UnitRows,
    forget_judges,
    unit_findings,
    unit_rows,
)
from auditor.reason.engine import (
    PERIOD_RANKS,
    StudyJudge,
)
from auditor.rules import finding
from auditor.store import EvidenceStore, Kept, Mapped, kept_sorted
from auditor.validate.integrity import (
    assemble,
    integrity_findings,
    layout_findings,
    unlisted_rows,
)

if TYPE_CHECKING:  # (pyarrow: imported where the tables are made, never in the workers)
    from auditor.store.tables import TableRows

CAP_SUMMARIES = frozenset({"AUD013", "AUD016"})
"""Findings that report a cap: never dropped by the per-file cap (the study's counts them)."""


class Joining:
    """Joins each period's manifest with its attempts' reads as they arrive (in the
    periods' order), a period as soon as the last of its attempts is in; each joined
    period goes to the fold, if any, which keeps what is left of it. ``queue``: the
    periods to join, (index, record, its input, the problems opening it), each let go
    once joined; ``whole``: by index, the records with their manifest entries, when the
    queue's are without (put there as a period's reads are planned, taken once joined)."""

    def __init__(self, queue: deque[tuple[int, PeriodRecord, InputFile | None, list[Finding]]],
                 pre: dict[str, list[EvidenceFile]], fold: Fold | None,
                 whole: dict[int, PeriodRecord] | None = None) -> None:
        self.queue, self.pre, self.fold = queue, pre, fold
        self.whole = whole
        self.reads: dict[str, AttemptRead] = {}
        self.units_read: list[PeriodUnit] = []
        """The periods joined, when there is no fold (which keeps them itself)."""

    def add(self, read: AttemptRead) -> None:
        """One attempt's read; every period now complete is joined."""
        self.reads[read.key] = read
        self._join_ready()

    def _join_ready(self) -> None:
        while self.queue:
            index, record, record_input, problems = self.queue[0]
            keys = [record.attempt_key(spec.index, index) for spec in record.attempts]
            if not all(key in self.reads for key in keys):
                return
            self.queue.popleft()
            if self.whole is not None and record.attempts:  # (unpacked when planned)
                record = self.whole.pop(index)
            (evidence,), _ = assemble([record], self.pre, self.reads, index)
            for key in keys:
                del self.reads[key]
                self.pre.pop(key, None)
            unit = PeriodUnit(index, evidence, tuple(problems), record_input)
            if self.fold is not None:
                self.fold.add(unit)
            else:
                self.units_read.append(unit)

    def units(self) -> list[PeriodUnit]:
        """Every period, joined (those after the last read need none: no attempt); with
        a fold, none (it keeps them: :attr:`Fold.periods`)."""
        self._join_ready()
        if self.queue:
            raise RuntimeError("an attempt's evidence was never read")
        return [] if self.fold is not None else self.units_read


def assemble_collected(parts: CollectedParts,
                       pieces: Sequence[Sequence[Sequence[Finding]]] | None = None,
                       spilled: EvidenceStore | None = None,
                       folded: tuple[Kept[PeriodSummary], Kept[InputFile]] | None
                       = None, layout: Sequence[Finding] | None = None) -> Collected:
    """The study's :class:`Collected` from its parts (one audit's, or every shard's merged):
    the periods in their order, the findings in the order collection reports them (the
    study's inputs, each period's record, each attempt's reading, integrity, the layout,
    the command line's inputs), the evidence rows and inputs sorted. ``pieces``: each
    unit's :func:`unit_findings`, in the units' order, when made already; ``spilled``: the
    periods' evidence rows, when kept there as they came (the periods then hold none);
    ``folded``: the periods' summaries, in order, and their records' inputs, when a
    :class:`Fold` kept them (``parts.units`` are then not read: the fold gives its
    timeline and tables); ``layout``: the layout's findings (:func:`layout_findings`),
    when made already (``parts.layout`` may then be without its listings)."""
    units = sorted(parts.units, key=lambda unit: unit.index) if folded is None else []
    if pieces is None:
        pieces = [unit_findings(unit) for unit in units]
    periods: Kept[PeriodSummary]
    record_inputs: Kept[InputFile]
    tables: dict[str, TableRows] = {}
    if folded is None:
        shared: dict[TraceDigest, TraceDigest] = {}
        periods = Kept(unit.evidence.summary(parts.protocol, shared) for unit in units)
        record_inputs = Kept(unit.record_input for unit in units
                             if unit.record_input is not None)
        tables = _tables()
        for unit in units:
            _, phases, devices, _ = unit_rows(unit)
            tables["phases"].extend(phases)
            tables["devices"].extend(devices)
    else:
        periods, record_inputs = folded
    findings: Kept[Finding] = Kept(parts.study_findings)
    for kind in range(len(PERIOD_RANKS)):
        findings.extend(item for piece in pieces for item in piece[kind])
    unlisted = unlisted_rows(outcome for _, outcome in sorted(
        parts.unlisted, key=lambda item: item[0]))
    rows: EvidenceRows
    if spilled is not None:
        spilled.extend(unlisted)
        rows = spilled
    else:
        evidence = [row for unit in units for attempt in unit.evidence.attempts
                    for row in attempt.files]
        evidence.extend(unlisted)
        rows = tuple(sorted(evidence, key=lambda e: e.path))
    findings.extend(integrity_findings(unlisted))
    findings.extend(layout_findings(parts.root, parts.layout,
                                    (period.record for period in periods))
                    if layout is None else layout)
    findings.extend(parts.input_findings)
    return Collected(
        root=parts.root,
        layout=parts.layout,
        protocol=parts.protocol,
        sacct=parts.sacct,
        sacct_display=parts.sacct_display,
        execution_commits=parts.execution_commits,
        periods=periods,
        evidence=rows,
        inputs=_sorted_inputs(parts.study_inputs, record_inputs),
        findings=findings,
        tables=tables,
        timeline=tuple(unit.evidence for unit in units[:TIMELINE_PERIODS]),
    )


def _tables() -> dict[str, TableRows]:
    """The tables whose rows are kept as each period is read (``phases``, ``devices``)."""
    from auditor.store.tables import KEPT_TABLES, TableRows  # (pyarrow: not in the workers)

    return {name: TableRows(name) for name in KEPT_TABLES}


def _sorted_inputs(study: Iterable[InputFile], records: Kept[InputFile]
                   ) -> Sequence[InputFile]:
    """The study's inputs and its period records', sorted (:func:`input_order`), kept by
    the store (a large study's: at a million files, 111,112 inputs of about 500 bytes each
    as objects, each with its path, absolute path and digest); ``records`` is emptied, each
    let go as it is read."""
    return kept_sorted(chain(study, records.drain()), input_order)


def _unread(record: PeriodRecord) -> PeriodSummary:
    return PeriodSummary(record, ())


def _before_reading(head: CollectedParts, records: Sequence[PeriodRecord]) -> Collected:
    """The study as the judge first sees it: its inputs, the scheduler's dump and each
    period's record, no attempt read yet (each made as it is read: a view of the
    records)."""
    return Collected(root=head.root, layout=head.layout, protocol=head.protocol,
                     sacct=head.sacct, sacct_display=head.sacct_display,
                     execution_commits=head.execution_commits,
                     periods=Mapped(records, _unread),
                     evidence=(), inputs=head.study_inputs, findings=head.study_findings)


NO_FINDINGS: tuple[Sequence[Finding], ...] = ((), (), ())
"""A period's collection findings when it has none (three empty lists were 230 bytes a
period)."""

class Fold:
    """A study's periods folded one at a time, in the study's order, as they are
    collected: each is validated and judged (:class:`StudyJudge`), its phase and device
    rows go to their tables, and once judged it is kept as its summary
    (:meth:`PeriodEvidence.summary`), in order (:attr:`periods`), and whole only among the
    first :data:`KEPT_WHOLE` (:attr:`timeline`). ``head``: the study's parts before any
    period (its inputs, layout, findings)."""

    def __init__(self, head: CollectedParts, records: Sequence[PeriodRecord],
                 options: AuditOptions) -> None:
        study = _before_reading(head, records)
        self.options = options
        self.protocol = head.protocol
        self.layout_findings = layout_findings(head.root, head.layout, records)
        """The layout's findings: made once, the layout's listings then let go (the
        judge's study is without them; so may be the parts :meth:`finish` is given)."""
        study = replace(study, layout=head.layout.without_listings())
        self.judge = StudyJudge(study, options, (
            list(head.study_findings), self.layout_findings,
            list(head.input_findings)))
        self.pieces: Kept[tuple[Sequence[Finding], ...]] = Kept()
        """Each period's collection findings (:func:`unit_findings`; one shared
        :data:`NO_FINDINGS` for the many periods without any): a study of damaged files
        has tens of thousands, each cited (at a million files, 130,000)."""
        self.tables = _tables()
        self.evidence = EvidenceStore()
        self.periods: Kept[PeriodSummary] = Kept()
        """The periods folded and judged, in order, summarised."""
        self.timeline: list[PeriodEvidence] = []
        """The first :data:`KEPT_WHOLE` periods, whole."""
        self.record_inputs: Kept[InputFile] = Kept()
        """The period records' inputs (hashed as read), in the periods' order."""
        self._held: dict[int, PeriodEvidence] = {}
        """The periods folded but not yet in :attr:`periods`, by slot."""
        self._judged: set[int] = set()
        """Of those, the judged."""
        self.digests: dict[TraceDigest, TraceDigest] = {}
        """One object for each alike trace digest (most traces reach the same phases)."""

    def add(self, unit: PeriodUnit) -> None:
        """Fold the study's next period, read but not judged (it is judged here)."""
        rows = unit_rows(unit)
        piece = self._add_rows(rows, unit.record_input)
        period = unit.evidence
        self._held[len(self.pieces) - 1] = period
        self._judged.update(self.judge.add(period, piece))
        self._keep(every=False)

    def add_folded(self, folded: FoldedPeriod) -> None:
        """Fold the study's next period, judged and summarised already
        (:func:`fold_batch`, in a worker); its traces' digests become this fold's one of
        each alike."""
        if self._held:
            raise RuntimeError("a period judged apart after one waiting to be judged here")
        self._add_rows((folded.piece, folded.phases, folded.devices, folded.files),
                       folded.record_input)
        self.judge.add_judged(folded.judged)
        if folded.whole is not None:
            self.timeline.append(folded.whole)
        self.periods.append(_shared(folded.period, self.digests))

    def _add_rows(self, rows: UnitRows, record_input: InputFile | None
                  ) -> tuple[Sequence[Finding], ...]:
        """Keep a period's rows and collection findings: the findings, as kept."""
        piece, phases, devices, files = rows
        piece = piece if any(piece) else NO_FINDINGS
        self.pieces.append(piece)
        self.tables["phases"].extend(phases)
        self.tables["devices"].extend(devices)
        self.evidence.extend(files)
        if record_input is not None:
            self.record_inputs.append(record_input)
        return piece

    def _keep(self, every: bool) -> None:
        """Move the held periods, in order, into :attr:`periods`: as far as every one is
        judged, or ``every`` one (at the end: the judge holds those it has not judged)."""
        done = len(self.periods)
        while done in self._held and (every or done in self._judged):
            period = self._held.pop(done)
            if done < KEPT_WHOLE:
                self.timeline.append(period)
            self.periods.append(period.summary(self.protocol, self.digests))
            self._judged.discard(done)
            done += 1

    def finish(self, parts: CollectedParts) -> Generator[Progress, None, AuditResult]:
        """The audit's result, once every period is folded (``parts``: the study's, its
        units those :meth:`add` gave back)."""
        yield Progress("validate", 0, 1)
        forget_judges()  # (read inline, this process judged: its study's context goes)
        self._keep(every=True)
        # (the judge keeps the study's dump: the parts of an audit may be without it)
        parts = replace(parts, layout=parts.layout.without_listings(), sacct=self.judge.sacct)
        collected = replace(assemble_collected(
            parts, self.pieces, self.evidence, (self.periods, self.record_inputs),
            self.layout_findings), tables=self.tables, timeline=tuple(self.timeline))
        yield Progress("reason", 0, 1)
        validation, reasoning = self.judge.finish(collected)
        findings, not_kept = apply_limits(
            lambda: chain(collected.findings, validation, reasoning.findings), self.options)
        # ...and those a collector counted as it read (a trace of a million bad lines)
        not_kept += sum(int(item.value("dropped", 0)) for item in collected.findings
                        if item.rule_id == "AUD013")
        return AuditResult(
            collected=collected,
            findings=findings,
            verdicts=reasoning.verdicts,
            reasoning=reasoning,
            options=self.options,
            partial=any(f.rule_id in CAP_SUMMARIES for f in findings),
            findings_not_kept=not_kept,
        )


def _shared(period: PeriodSummary, digests: dict[TraceDigest, TraceDigest]
            ) -> PeriodSummary:
    """``period`` with each of its traces' digests ``digests``' one alike (each kept there
    when it is the first of its kind)."""
    attempts = tuple(_shared_traces(attempt, digests) for attempt in period.attempts)
    changed = any(a is not b for a, b in zip(attempts, period.attempts, strict=True))
    return replace(period, attempts=attempts) if changed else period


def _shared_traces(attempt: AttemptSummary, digests: dict[TraceDigest, TraceDigest]
                   ) -> AttemptSummary:
    """``attempt`` with its traces' digests ``digests``' own (each trace looked up, or kept
    there, in turn: never stopping at the first already kept, which left those after it
    unkept and their lookup failing)."""
    shared = tuple(digests.setdefault(d, d) for d in attempt.traces)
    if all(a is b for a, b in zip(shared, attempt.traces, strict=True)):
        return attempt
    return replace(attempt, traces=shared)


def apply_limits(findings: Sequence[Finding] | Callable[[], Iterable[Finding]],
                 options: AuditOptions) -> tuple[tuple[Finding, ...], int]:
    """Cap findings per cited file and in all, clip quotes: (the findings kept, how many
    were counted but not kept). Each cap reached is summed up in an ``AUD013``: a file's
    among the warnings, the study's (at most ``max_findings`` kept before it) last.

    ``findings`` in the order they were made (or what gives them so, each time it is
    called: a large study's are kept packed); they are kept by severity, errors first, in
    that order within each, and are read once a severity: only the first
    ``max_findings`` of each are held."""
    given = findings if callable(findings) else lambda: findings
    cap = options.max_findings
    per_file: Counter[str] = Counter()
    dropped_per_file: Counter[str] = Counter()
    held: dict[Severity, list[Finding]] = {}
    counts: Counter[Severity] = Counter()
    for severity in Severity:  # (errors first)
        kept: list[Finding] = []
        held[severity] = kept
        for item in given():
            if item.severity is not severity:
                continue
            path = item.citations[0].path if item.citations else item.subject
            if item.rule_id not in CAP_SUMMARIES \
                    and per_file[path] >= options.max_findings_per_file:
                dropped_per_file[path] += 1
                continue
            per_file[path] += 1
            counts[severity] += 1
            if len(kept) >= cap:
                continue  # (counted: past the study's cap whatever comes before it)
            if any(len(c.quote) > options.max_quote for c in item.citations):
                item = replace(item, citations=tuple(
                    replace(c, quote=clip(c.quote, options.max_quote))
                    for c in item.citations))
            kept.append(item)
    # each file's cap summed up among the warnings (the study's cap may cut them too: one a
    # file, they could be thousands)
    for path, dropped in sorted(dropped_per_file.items()):
        summary = finding("AUD013", path, [Citation(path)], dropped=dropped,
                          cap=options.max_findings_per_file)
        counts[summary.severity] += 1
        if len(held[summary.severity]) < cap:
            held[summary.severity].append(summary)
    total = sum(counts.values())
    every = [item for severity in Severity for item in held[severity]][:cap]
    not_kept = sum(dropped_per_file.values())
    if total > cap:
        dropped = total - cap
        every.append(finding("AUD013", "study", [], path="all files", dropped=dropped,
                             cap=cap))
        not_kept += dropped
    return tuple(every), not_kept
