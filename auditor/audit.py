"""The one place the stages meet: collect -> validate -> reason.

:meth:`Auditor.run` is a generator: it yields :class:`~auditor.model.Progress` events while
it works (the CLI turns them into a progress bar) and returns the
:class:`~auditor.model.AuditResult` (``result = yield from auditor.run()``, or use
:func:`run_audit`). Nothing here prints, and nothing is written anywhere: reporters are
pure functions of the result. Each step is a stage's function; this module only orders
them, and sends the reading to the pool (:mod:`auditor._pool`).
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections import Counter, deque
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from auditor._io import clip
from auditor._pool import make_pool
from auditor._spill import EvidenceSpill
from auditor.catalogue import finding
from auditor.collect.attempt import hash_only, read_attempt
from auditor.collect.discover import SACCT_PATH, discover, find_period_records
from auditor.collect.inputs import (
    load_period,
    read_commits,
    read_input,
    read_protocol_inputs,
    read_sacct,
)
from auditor.collect.plan import plan_reads, plan_unlisted
from auditor.collect.protocol import read_protocol
from auditor.errors import UsageError
from auditor.model import (
    DEFAULT_PROTOCOL,
    AttemptRead,
    AuditOptions,
    AuditResult,
    Citation,
    Collected,
    CollectedParts,
    EvidenceFile,
    EvidenceRows,
    FileOutcome,
    Finding,
    InputFile,
    PeriodEvidence,
    PeriodRecord,
    PeriodUnit,
    Progress,
    Protocol,
    StudyLayout,
    TraceDigest,
    completes_cleanly,
    phases_reached,
)
from auditor.reason.engine import PERIOD_RANKS, StudyJudge
from auditor.report.plots import MAX_TIMELINE_PERIODS
from auditor.report.tables import SpilledRows, device_rows, phase_rows
from auditor.validate.integrity import (
    assemble,
    integrity_findings,
    layout_findings,
    unlisted_rows,
)

CAP_SUMMARIES = frozenset({"AUD013", "AUD016"})
"""Findings that report a cap: never dropped by the per-file cap (the study's counts them)."""
R = TypeVar("R")


class Auditor:
    """Audits one study root."""

    def __init__(self, root: Path | str, options: AuditOptions | None = None) -> None:
        self.root_arg = Path(root)
        self.options = options or AuditOptions()
        self._pool = make_pool(self.options)

    def run(self) -> Generator[Progress, None, AuditResult]:
        """Collect, validate and reason; yields progress, returns the result.

        Drive it inside :func:`paused_gc` (:func:`run_audit` and the command line do):
        the generator itself leaves the collector alone, so one that is abandoned
        half-way can never leave it switched off."""
        try:
            parts, fold = yield from self._collect(None, fold=True)
        finally:
            self._pool.close()
        assert fold is not None
        return (yield from fold.finish(parts))

    def collect(self, shard: tuple[int, int] | None = None
                ) -> Generator[Progress, None, CollectedParts]:
        """Collect the study, or shard ``(I, N)`` of it (every N-th period from the I-th:
        a deterministic share), into parts :func:`assemble_collected` folds: every
        period's records whole, for a merge to judge."""
        try:
            parts, _ = yield from self._collect(shard, fold=False)
            return parts
        finally:
            self._pool.close()

    def _collect(self, shard: tuple[int, int] | None, fold: bool
                 ) -> Generator[Progress, None, tuple[CollectedParts, Fold | None]]:
        """Read the study's inputs and period records, then every attempt's evidence
        (with ``fold``, each period is judged as soon as it is read: :class:`Fold`)."""
        root = _resolve_root(self.root_arg)
        regular: set[str] = set()
        period_paths = find_period_records(root, regular)
        if not period_paths[0]:
            raise UsageError(
                f"{self.root_arg}: no period records (pairs/<pair>/period-<n>.json) found; "
                "is this a study root?"
            )
        # The scheduler's dump and the period records are sent to the pool first: it
        # parses and reads them while this process walks the attempt directories.
        period_tasks = [(str(root), rel, rel in regular) for rel in period_paths[0]]
        sacct_rel = SACCT_PATH if os.path.lexists(root / SACCT_PATH) else None
        sacct_read = self._pool.soon(read_sacct, (root, sacct_rel, self.options),
                                     len(period_tasks))
        loaded = self._pool.map(load_period, period_tasks, 0)
        layout = yield from discover(root, period_paths)
        findings: list[Finding] = []
        inputs: list[InputFile] = []
        protocol = DEFAULT_PROTOCOL
        if layout.protocol:
            given = read_input(root, layout.protocol, read_protocol, inputs, findings)
            if given is not None:
                protocol = given
                findings.extend(given.findings)
        commits = read_commits(root, layout.execution_commits, inputs, findings)
        sacct, sacct_display, sacct_inputs, sacct_findings = sacct_read()
        inputs.extend(sacct_inputs)
        findings.extend(sacct_findings)
        periods: list[tuple[PeriodRecord, InputFile | None, list[Finding]]] = []
        yield Progress("periods", 0, len(period_tasks))
        for item in loaded:
            periods.append(item)
            yield Progress("periods", len(periods), len(period_tasks))
        input_findings: list[Finding] = []
        read_protocol_inputs(self.options, inputs, input_findings)
        head = CollectedParts(
            root=root, layout=replace(layout, attempt_files={}, regular_files=frozenset()),
            protocol=protocol, sacct=sacct, sacct_display=sacct_display,
            execution_commits=commits, study_findings=tuple(findings),
            input_findings=tuple(input_findings), study_inputs=tuple(inputs),
            units=(), unlisted=(), periods_total=len(periods), shard=shard,
        )
        folding = Fold(head, [without_entries(record) for record, _, _ in periods],
                       self.options) if fold else None
        # (the inventory and the records go once planned and joined: the reads hold their
        # boxes' only references)
        box, records = [layout], [periods]
        del layout, periods
        units, unlisted = yield from self._read_evidence(root, box, records, protocol, shard,
                                                         folding)
        return replace(head, units=tuple(units), unlisted=tuple(unlisted)), folding

    def _read_evidence(
        self, root: Path, box: list[StudyLayout],
        records_box: list[list[tuple[PeriodRecord, InputFile | None, list[Finding]]]],
        protocol: Protocol, shard: tuple[int, int] | None, fold: Fold | None,
    ) -> Generator[Progress, None, tuple[list[PeriodUnit],
                                         list[tuple[tuple[int, int], FileOutcome]]]]:
        """Plan, read and hash the evidence of every period (of the shard's), and the
        files no period record lists (in the attempt directories the shard owns); join
        what was read with the manifests, a period as soon as its attempts are read (and
        hand it to ``fold``). ``box`` holds the layout and ``records_box`` the period
        records (taken out: the listings go once planned, each record once joined)."""
        layout = box.pop()
        periods = records_box.pop()
        records = [record for record, _, _ in periods]
        own = [index for index in range(len(periods))
               if shard is None or index % shard[1] == shard[0] - 1]
        mine = [records[index] for index in own]
        if shard is None:
            owned = layout
        else:
            owner = _owners(records, shard[1])
            owned = replace(layout, attempt_files={
                rel: files for rel, files in layout.attempt_files.items()
                if owner.get(rel, 1) == shard[0]})
        tasks, pre = plan_reads(root, mine, protocol, layout.regular_files)
        unlisted, unlisted_blocked = plan_unlisted(root, owned, records)
        wanted = {task.display for task in unlisted} | {o.display for o in unlisted_blocked}
        place = {rel: position for position, rel in enumerate(
            rel for files in layout.attempt_files.values() for rel in files)
            if rel in wanted} if wanted else {}
        total_files = sum(len(t.files) for t in tasks) + len(unlisted)
        total_bytes = sum(entry.size or 0 for record in mine for spec in record.attempts
                          for entry in spec.evidence)
        # The inventory served planning: it goes before the reads bring their results in
        # (with it, and each file's path sent once, the reading's peak on 144k files fell
        # from 541 to 447 MB).
        joining = _Joining(deque((index, *periods[index]) for index in own), pre, fold)
        del layout, owned, wanted, records, mine, periods
        reading = self._pool.map(read_attempt, tasks, total_bytes)
        del tasks  # (a pool holds each chunk's tasks until it is read)
        yield Progress("read", 0, total_files)
        done = 0
        read_bytes = 0
        for read in reading:
            joining.add(read)
            done += len(read.files)
            read_bytes += read.bytes_read
            yield Progress("read", done, total_files, read_bytes)
        outcomes = [((0, place.get(o.display, -1)), o) for o in unlisted_blocked]
        for outcome in self._pool.map(hash_only, unlisted, total_bytes):
            outcomes.append(((1, place.get(outcome.display, -1)), outcome))
            done += 1
            read_bytes += outcome.digest.size if outcome.digest else 0
            yield Progress("read", done, total_files, read_bytes)
        return joining.units(), outcomes


class _Joining:
    """Joins each period's manifest with its attempts' reads as they arrive (in the
    periods' order), a period as soon as the last of its attempts is in; each joined
    period goes to the fold, if any, which keeps what is left of it. ``queue``: the
    periods to join, (index, record, its input, the problems opening it), each let go
    once joined."""

    def __init__(self, queue: deque[tuple[int, PeriodRecord, InputFile | None, list[Finding]]],
                 pre: dict[str, list[EvidenceFile]], fold: Fold | None) -> None:
        self.queue, self.pre, self.fold = queue, pre, fold
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
            keys = [f"{record.pair}/period-{record.period}#{spec.index}"
                    for spec in record.attempts]
            if not all(key in self.reads for key in keys):
                return
            self.queue.popleft()
            (evidence,), _ = assemble([record], self.pre, self.reads)
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
        a fold, as it keeps them."""
        self._join_ready()
        if self.queue:
            raise RuntimeError("an attempt's evidence was never read")
        return self.fold.units if self.fold is not None else self.units_read


def _owners(records: list[PeriodRecord], shards: int) -> dict[str, int]:
    """The shard that hashes each attempt directory's unlisted files: that of the first
    period naming it (shard 1, by the caller, for a directory no period names). One pass
    over the records: a scan of them per directory made a shard of 144k files take 3.5x
    the whole audit."""
    owner: dict[str, int] = {}
    for index, record in enumerate(records):
        for spec in record.attempts:
            if spec.attempt_dir is not None:
                owner.setdefault(spec.attempt_dir, index % shards + 1)
    return owner


def assemble_collected(parts: CollectedParts,
                       pieces: Sequence[Sequence[list[Finding]]] | None = None,
                       spilled: EvidenceSpill | None = None) -> Collected:
    """The study's :class:`Collected` from its parts (one audit's, or every shard's merged):
    the periods in their order, the findings in the order collection reports them (the
    study's inputs, each period's record, each attempt's reading, integrity, the layout,
    the command line's inputs), the evidence rows and inputs sorted. ``pieces``: each
    unit's :func:`unit_findings`, in the units' order, when made already; ``spilled``: the
    periods' evidence rows, when kept there as they came (the periods then hold none)."""
    units = sorted(parts.units, key=lambda unit: unit.index)
    if pieces is None:
        pieces = [unit_findings(unit) for unit in units]
    periods = [unit.evidence for unit in units]
    findings = list(parts.study_findings)
    for kind in range(len(PERIOD_RANKS)):
        findings.extend(item for piece in pieces for item in piece[kind])
    unlisted = unlisted_rows(outcome for _, outcome in sorted(
        parts.unlisted, key=lambda item: item[0]))
    rows: EvidenceRows
    if spilled is not None:
        spilled.extend(unlisted)
        rows = spilled
    else:
        evidence = [row for period in periods for attempt in period.attempts
                    for row in attempt.files]
        evidence.extend(unlisted)
        rows = tuple(sorted(evidence, key=lambda e: e.path))
    findings.extend(integrity_findings(unlisted))
    findings.extend(layout_findings(parts.root, parts.layout, periods))
    findings.extend(parts.input_findings)
    inputs = [*parts.study_inputs, *(unit.record_input for unit in units
                                     if unit.record_input is not None)]
    return Collected(
        root=parts.root,
        layout=parts.layout,
        protocol=parts.protocol,
        sacct=parts.sacct,
        sacct_display=parts.sacct_display,
        execution_commits=parts.execution_commits,
        periods=tuple(periods),
        evidence=rows,
        inputs=tuple(sorted(inputs, key=_input_order)),
        findings=tuple(findings),
    )


def unit_findings(unit: PeriodUnit) -> tuple[list[Finding], list[Finding], list[Finding]]:
    """A period's collection findings (:data:`~auditor.reason.engine.PERIOD_RANKS`): its
    record's (opening it, then its own), its attempts' reading's, its files' integrity."""
    attempts = unit.evidence.attempts
    return ([*unit.problems, *unit.evidence.record.findings],
            [item for attempt in attempts for item in attempt.read.findings],
            integrity_findings(row for attempt in attempts for row in attempt.files))


def _before_reading(head: CollectedParts, records: Sequence[PeriodRecord]) -> Collected:
    """The study as the judge first sees it: its inputs, the scheduler's dump and each
    period's record, no evidence read."""
    return Collected(root=head.root, layout=head.layout, protocol=head.protocol,
                     sacct=head.sacct, sacct_display=head.sacct_display,
                     execution_commits=head.execution_commits,
                     periods=tuple(PeriodEvidence(record, ()) for record in records),
                     evidence=(), inputs=head.study_inputs, findings=head.study_findings)


KEPT_WHOLE = MAX_TIMELINE_PERIODS
"""Periods kept with every record they were read with (the timeline plot draws their
phases); every later one keeps only what the report says of it (:func:`let_go`)."""


class Fold:
    """A study's periods folded one at a time, in the study's order, as they are
    collected: each is validated and judged (:class:`StudyJudge`), its phase and device
    rows are spilled to their tables, and its records are let go (:func:`let_go`): kept
    whole only for the first :data:`KEPT_WHOLE` and for one that waits for the study.
    ``head``: the study's parts before any period (its inputs, layout, findings)."""

    def __init__(self, head: CollectedParts, records: Sequence[PeriodRecord],
                 options: AuditOptions) -> None:
        study = _before_reading(head, records)
        self.options = options
        self.protocol = head.protocol
        self.judge = StudyJudge(study, options, (
            list(head.study_findings), layout_findings(head.root, head.layout, study.periods),
            list(head.input_findings)))
        self.pieces: list[tuple[list[Finding], list[Finding], list[Finding]]] = []
        self.tables = {name: SpilledRows(name) for name in ("phases", "devices")}
        self.evidence = EvidenceSpill()
        self.units: list[PeriodUnit] = []
        """The periods folded, in order: each judged one as :func:`let_go` leaves it."""

    def add(self, unit: PeriodUnit) -> None:
        """Fold the study's next period."""
        self.pieces.append(unit_findings(unit))
        period = unit.evidence
        for attempt in period.attempts:
            self.tables["phases"].extend(phase_rows(period, attempt))
            self.tables["devices"].extend(device_rows(period, attempt))
            self.evidence.extend(attempt.files)
        self.units.append(unit)
        for slot in self.judge.add(period, self.pieces[-1]):
            if slot >= KEPT_WHOLE:  # (judged: what the report needs of it is kept)
                kept = self.units[slot]
                self.units[slot] = replace(kept, evidence=let_go(kept.evidence,
                                                                 self.protocol))

    def finish(self, parts: CollectedParts) -> Generator[Progress, None, AuditResult]:
        """The audit's result, once every period is folded (``parts``: the study's, its
        units those :meth:`add` gave back)."""
        yield Progress("validate", 0, 1)
        collected = replace(assemble_collected(replace(parts, units=tuple(self.units)),
                                               self.pieces, self.evidence), tables=self.tables)
        yield Progress("reason", 0, 1)
        validation, reasoning = self.judge.finish(collected)
        findings, not_kept = apply_limits(
            [*collected.findings, *validation, *reasoning.findings], self.options)
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


def let_go(period: PeriodEvidence, protocol: Protocol) -> PeriodEvidence:
    """What the report still needs of a judged period: its records but the manifest
    entries and evidence rows (the study's :class:`EvidenceSpill` keeps the rows), the
    log's events, the device files (rows of the ``devices`` table) and the traces' phase
    records (rows of the ``phases`` table) and identities (which judging checked): each
    trace keeps its digest."""
    phases = protocol.completion_phases
    first, last = (phases[0], phases[-1]) if len(phases) >= 2 else ("", "")
    attempts = []
    for attempt in period.attempts:
        read = attempt.read
        steps = read.trial.dispatched_int(protocol.steps_from) if read.trial else None
        traces = tuple(replace(trace, phases=(), pids=(), ranks=(), digest=_shared(TraceDigest(
            phases_reached(trace), completes_cleanly(trace, steps, first, last))))
            for trace in read.traces)
        log = replace(read.log, events=()) if read.log is not None else None
        attempts.append(replace(attempt, spec=replace(attempt.spec, evidence=()), files=(),
                                read=replace(read, traces=traces, log=log, devices=())))
    return PeriodEvidence(replace(period.record, attempts=tuple(a.spec for a in attempts)),
                          tuple(attempts))


def without_entries(record: PeriodRecord) -> PeriodRecord:
    """``record`` without its attempts' manifest entries (what judging the study needs of
    a period before its evidence is read)."""
    return replace(record, attempts=tuple(replace(spec, evidence=())
                                          for spec in record.attempts))


def _shared(digest: TraceDigest) -> TraceDigest:
    """One digest for each that is alike (most traces reach the same phases)."""
    return _DIGESTS.setdefault(digest, digest)


_DIGESTS: dict[TraceDigest, TraceDigest] = {}


def judge(parts: CollectedParts, options: AuditOptions
          ) -> Generator[Progress, None, AuditResult]:
    """Validate and reason over a collected study's parts (every shard's, merged), a
    period at a time: the audit's result."""
    units = sorted(parts.units, key=lambda unit: unit.index)
    fold = Fold(replace(parts, units=()), [unit.evidence.record for unit in units], options)
    for done, unit in enumerate(units, 1):
        fold.add(unit)
        if done % 1024 == 0:
            yield Progress("validate", done, len(units))
    return (yield from fold.finish(parts))


def merge_parts(parts: list[tuple[dict[str, Any], CollectedParts]]) -> CollectedParts:
    """One study's parts from its shards' (``part.json``, parts): refused (one line,
    :class:`UsageError`) unless they are every shard 1..N of one study, once each, collected
    with the same options from the same inputs."""
    if not parts:
        raise UsageError("merge: no parts given")
    first, base = parts[0]
    count = int(first["shard"][1])
    for meta, _ in parts[1:]:
        for key, what in (("root", "studies"), ("protocol_sha256", "protocols"),
                          ("inputs_sha256", "study inputs (protocol, commits, sacct dump)"),
                          ("collection", "collection options"),
                          ("periods_total", "period counts")):
            if meta.get(key) != first.get(key):
                raise UsageError(f"merge: the parts are of different {what}: "
                                 f"{first.get(key)!r} and {meta.get(key)!r}")
        if int(meta["shard"][1]) != count:
            raise UsageError(f"merge: the parts split the study in {count} and in "
                             f"{meta['shard'][1]} shards")
    seen = Counter(int(meta["shard"][0]) for meta, _ in parts)
    repeated = sorted(shard for shard, times in seen.items() if times > 1)
    missing = sorted(set(range(1, count + 1)) - set(seen))
    if repeated or missing:
        raise UsageError("merge: " + "; ".join(
            [f"shard {', '.join(map(str, repeated))} given more than once"] * bool(repeated)
            + [f"shard {', '.join(map(str, missing))} of {count} missing"] * bool(missing)))
    units = [unit for _, part in parts for unit in part.units]
    if sorted(unit.index for unit in units) != list(range(base.periods_total)):
        raise UsageError(f"merge: the parts do not hold each of the study's "
                         f"{base.periods_total} periods once")
    return replace(base, units=tuple(units),
                   unlisted=tuple(item for _, part in parts for item in part.unlisted),
                   shard=None)


def apply_limits(findings: list[Finding], options: AuditOptions) -> tuple[tuple[Finding, ...],
                                                                         int]:
    """Cap findings per cited file and in all, clip quotes: (the findings kept, how many
    were counted but not kept). Each cap reached is summed up in an ``AUD013``: a file's
    among the warnings, the study's (at most ``max_findings`` kept before it) last."""
    per_file: Counter[str] = Counter()
    dropped_per_file: Counter[str] = Counter()
    kept: list[Finding] = []
    order = {"error": 0, "warning": 1, "info": 2}
    for item in sorted(findings, key=lambda f: order[f.severity.value]):
        path = item.citations[0].path if item.citations else item.subject
        if item.rule_id not in CAP_SUMMARIES and per_file[path] >= options.max_findings_per_file:
            dropped_per_file[path] += 1
            continue
        per_file[path] += 1
        if any(len(c.quote) > options.max_quote for c in item.citations):
            item = replace(item, citations=tuple(
                replace(c, quote=clip(c.quote, options.max_quote)) for c in item.citations))
        kept.append(item)
    # each file's cap summed up among the warnings (the study's cap may cut them too: one a
    # file, they could be thousands)
    kept = sorted([*kept, *(finding("AUD013", path, [Citation(path)], dropped=dropped,
                                    cap=options.max_findings_per_file)
                            for path, dropped in sorted(dropped_per_file.items()))],
                  key=lambda f: order[f.severity.value])
    not_kept = sum(dropped_per_file.values())
    if len(kept) > options.max_findings:
        dropped = len(kept) - options.max_findings
        kept = kept[: options.max_findings]
        kept.append(finding("AUD013", "study", [], path="all files", dropped=dropped,
                            cap=options.max_findings))
        not_kept += dropped
    return tuple(kept), not_kept


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the block.

    An audit builds millions of small records that hold no reference cycles and
    live until the report is written; each collection re-scans them (about 10% of
    the time of a many-file study, measured with ``gc.callbacks``) yet can free
    nothing. Reference counting still frees everything as usual.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def run_audit(root: Path | str, options: AuditOptions | None = None) -> AuditResult:
    """Run an audit to completion, ignoring progress."""
    with paused_gc():
        return drive(Auditor(root, options).run(), lambda event: None)


def drive(generator: Generator[Progress, None, R], show: Callable[[Progress], None]) -> R:
    """Run ``generator`` (:meth:`Auditor.run`) to its end, passing each event it yields to
    ``show``; what it returns."""
    while True:
        try:
            event = next(generator)
        except StopIteration as stop:
            result: R = stop.value
            return result
        show(event)


def _input_order(item: InputFile) -> tuple[str, str]:
    return item.group, item.path


def _resolve_root(root: Path) -> Path:
    if not root.exists():
        raise UsageError(f"{root}: evidence root does not exist")
    if not root.is_dir():
        raise UsageError(f"{root}: evidence root is not a directory")
    if not os.access(root, os.R_OK | os.X_OK):
        raise UsageError(f"{root}: evidence root cannot be read")
    return root.resolve()
