"""What a worker does with a batch of the study's periods: read, join, validate and judge them.

:func:`fold_batch` runs in a worker (or, for a study judged in the audit's own process, its
parts run there: :func:`unit_rows`): each period of a :class:`PeriodBatch` is read
(:func:`~auditor.collect.attempt.read_attempt`), joined with its manifest, validated and
judged, and what the study's fold keeps of it comes back (:class:`FoldedPeriod`): its verdict,
its collection findings, its table rows, its summary (:meth:`PeriodEvidence.summary`), and
the period whole when the timeline draws it.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from auditor.collect.attempt import read_attempt
from auditor.collect.inputs import LoadedPeriod, unpack_entries
from auditor.collect.plan import plan_reads
from auditor.model import (
    TIMELINE_PERIODS,
    EvidenceFile,
    Finding,
    InputFile,
    PeriodEvidence,
    PeriodSummary,
    PeriodUnit,
    SacctJob,
    TraceDigest,
)
from auditor.reason.engine import (
    JudgeContext,
    Judged,
    PeriodJudge,
    judge_together,
)
from auditor.store import Held, pickles_fast
from auditor.store.rows import device_rows, phase_rows
from auditor.validate.integrity import (
    assemble,
    integrity_findings,
)


def unit_findings(unit: PeriodUnit) -> tuple[list[Finding], list[Finding], list[Finding]]:
    """A period's collection findings (:data:`~auditor.reason.engine.PERIOD_RANKS`): its
    record's (opening it, then its own), its attempts' reading's, its files' integrity."""
    attempts = unit.evidence.attempts
    return ([*unit.problems, *unit.evidence.record.findings],
            [item for attempt in attempts for item in attempt.read.findings],
            integrity_findings(row for attempt in attempts for row in attempt.files))


KEPT_WHOLE = TIMELINE_PERIODS
"""Periods kept whole besides their summaries (the timeline plot draws their phases)."""
UnitRows = tuple[tuple[Sequence[Finding], ...], list[tuple[Any, ...]], list[tuple[Any, ...]],
                 list[EvidenceFile]]
"""A period's collection findings (:func:`unit_findings`), its rows of the ``phases`` and
``devices`` tables, and its evidence rows."""


def unit_rows(unit: PeriodUnit) -> UnitRows:
    """What a study's fold keeps of a collected period besides its verdict: its collection
    findings and its table rows (:data:`UnitRows`)."""
    period = unit.evidence
    phases: list[tuple[Any, ...]] = []
    devices: list[tuple[Any, ...]] = []
    files: list[EvidenceFile] = []
    for attempt in period.attempts:
        phases.extend(phase_rows(period, attempt))
        devices.extend(device_rows(period, attempt))
        files.extend(attempt.files)
    return unit_findings(unit), phases, devices, files


@pickles_fast
@dataclass(frozen=True, slots=True)
class PeriodTask:
    """One period for a worker to plan, read and judge (:func:`fold_batch`): its place
    among the study's records (``index``: a whole study's, so its place in the fold too)
    and its record as loaded (the manifest entries packed: they are unpacked once, where
    the reads are planned and made, and the tasks planned never cross between
    processes)."""

    index: int
    loaded: LoadedPeriod


@pickles_fast
@dataclass(frozen=True, slots=True)
class PeriodBatch:
    """A batch of consecutive periods for a worker (:func:`fold_batch`), closed under their
    jobs, with the scheduler dump's rows their judging may look up (``sacct``: the dump
    rows, :class:`~auditor.validate.checks.SchedulerRows`, packed until the worker judges:
    the context it was given has the rest of the dump) and their pairs' pinned commits
    (``pins``); each None when the study has none."""

    tasks: tuple[PeriodTask, ...]
    rows: Held[tuple[SacctJob, ...]] | None
    pins: dict[str, str] | None


@dataclass(frozen=True, slots=True)
class FoldedPeriod:
    """A period read, validated and judged in a worker: all a study's fold keeps of it
    (:meth:`Fold.add_folded`): its summary, and ``whole`` the period itself when among the
    first :data:`KEPT_WHOLE` (else None); ``files_read`` and ``bytes_read`` are for the
    progress."""

    judged: Judged
    piece: tuple[Sequence[Finding], ...]
    phases: list[tuple[Any, ...]]
    devices: list[tuple[Any, ...]]
    files: list[EvidenceFile]
    record_input: InputFile | None
    period: PeriodSummary
    whole: PeriodEvidence | None
    files_read: int
    bytes_read: int


_JUDGES: list[tuple[weakref.ref[JudgeContext], PeriodJudge]] = []
"""The judge of the context last given to :func:`fold_batch` in this process (a worker is
given one per audit: built once, not once a batch)."""
_DIGESTS: dict[TraceDigest, TraceDigest] = {}
"""This process's one object for each alike trace digest (most traces reach the same
phases)."""


def _judge_of(context: JudgeContext) -> PeriodJudge:
    if _JUDGES and _JUDGES[0][0]() is context:
        return _JUDGES[0][1]
    judge = PeriodJudge(context)
    _JUDGES[:] = [(weakref.ref(context), judge)]
    return judge


def fold_batch(context: JudgeContext, batch: PeriodBatch) -> list[FoldedPeriod]:
    """Read, join, validate and judge a batch of the study's periods, consecutive and
    closed under their jobs (:func:`~auditor.reason.engine.batch_ends`), in a worker, with
    the context the workers are given (:meth:`JudgeContext.for_workers`) and the batch's
    rows of the scheduler's dump: what the study's fold keeps of each (the same as
    folding them one by one in the audit's own process would keep)."""
    judge = _judge_of(context).narrowed(
        batch.rows.load() if batch.rows is not None else None, batch.pins)
    protocol, root = context.study.protocol, context.study.root
    units: list[PeriodUnit] = []
    sizes: list[tuple[int, int]] = []
    for task in batch.tasks:
        record = unpack_entries(task.loaded)
        pre: dict[str, list[EvidenceFile]] = {}
        reads = {read.key: read for read in map(read_attempt, plan_reads(
            root, [(task.index, record, task.loaded.known_regular())], protocol, pre))}
        (evidence,), _ = assemble([record], pre, reads, task.index)
        units.append(PeriodUnit(task.index, evidence, task.loaded.problems,
                                task.loaded.record_input))
        sizes.append((sum(len(read.files) for read in reads.values())
                       + sum(len(rows) for rows in pre.values()),
                       sum(read.bytes_read for read in reads.values())))
    rows = [unit_rows(unit) for unit in units]
    judged = judge_together(judge, [unit.evidence for unit in units],
                            [piece for piece, *_ in rows])
    folded = []
    for task, unit, (piece, phases, devices, files), one, (count, size) in zip(
            batch.tasks, units, rows, judged, sizes, strict=True):
        whole = unit.evidence if task.index < KEPT_WHOLE else None
        folded.append(FoldedPeriod(one, piece, phases, devices, files, unit.record_input,
                                   unit.evidence.summary(protocol, _DIGESTS), whole, count,
                                   size))
    return folded


def forget_judges() -> None:
    """Let go of this process's judge (and with it the study's context it was made for):
    an audit read in its own process is done with it once its periods are folded."""
    _JUDGES.clear()
