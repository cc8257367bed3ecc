"""The study as the stages pass it on: options, read tasks, collected evidence.

:class:`Collected` is what collection and the integrity checks hand to validation and
reasoning; :class:`AttemptTask` and :class:`AttemptRead` are the unit of parallel reading.
Nothing here imports a stage or does I/O.
"""

from __future__ import annotations

import heapq
import typing
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from auditor.model.core import Finding
from auditor.model.evidence import (
    AllocatorTrace,
    AttemptSpec,
    DeviceEvidence,
    FileDigest,
    HostIdle,
    PeriodRecord,
    ProcessExit,
    Protocol,
    SacctDump,
    TraceDigest,
    TrainingLogScan,
    TrialRecord,
    completes_cleanly,
    phases_reached,
)
from auditor.model.kinds import TERMINAL_SOURCES
from auditor.model.presets import TerminalSpec


@dataclass(frozen=True, slots=True)
class Waiver:
    """``--waive RULE_ID:SUBJECT --reason TEXT``."""

    rule_id: str
    subject: str
    reason: str


@dataclass(frozen=True, slots=True)
class AuditOptions:
    """Everything the command line can set for an audit."""

    sacct: Path | None = None
    """A sacct dump outside the root (default: ``<root>/accounting/sacct-raw.psv``)."""
    sacct_format: tuple[str, ...] | None = None
    sacct_delimiter: str | None = None
    jobs: int = 0
    """Worker processes; 0 means as many as the CPUs this process may use
    (:func:`auditor.pipeline.pool.usable_cpus`)."""
    anchors: tuple[tuple[str, str], ...] = ()
    """Expected SHA-256 per protocol input name (in addition to protocol.json's)."""
    protocol_inputs: tuple[tuple[str, Path], ...] = ()
    source_root: Path | None = None
    sources: tuple[str, ...] = ()
    waivers: tuple[Waiver, ...] = ()
    max_findings: int = 10_000
    """Findings kept in all (the rest are counted; the audit is then ``partial``)."""
    max_findings_per_file: int = 200
    """Findings kept per cited file (the rest are counted in one AUD013)."""
    max_quote: int = 300
    """Characters of evidence text kept in a citation's quote."""
    executor: str | None = None
    """Where the reading runs: None for this machine (``jobs``), ``dask://HOST:PORT`` for
    the Dask cluster whose scheduler is there (every task goes to it)."""


NUL = "\0"
"""What a :class:`Listing` joins a directory's files with: no path holds it."""


class Listing(Mapping[str, tuple[str, ...]]):
    """Every file (or link) below each attempt directory, in the walk's order, as a mapping
    of each directory (root-relative) to its files' root-relative paths, kept compact: a
    directory's files are one string, their paths below it joined by NUL, made into paths
    only when asked. At a million files, a tuple of strings per directory and a set of the
    regular ones took about 190 MB of the audit's process, and what they freed stayed in
    its heap through the reading; joined, about 60 MB. :attr:`irregular`: the files that
    are not regular files (links, pipes), usually none; the walk enters real directories
    only, so every other file is a regular file inside the root."""

    __slots__ = ("_joined", "irregular")

    def __init__(self, joined: dict[str, str] | None = None,
                 irregular: frozenset[str] = frozenset()) -> None:
        self._joined: dict[str, str] = joined if joined is not None else {}
        """Each directory's files below it, joined by :data:`NUL` ("" for none)."""
        self.irregular = irregular

    def __getitem__(self, directory: str) -> tuple[str, ...]:
        return tuple(self.paths_in(directory, self._joined[directory]))

    @staticmethod
    def paths_in(directory: str, joined: str) -> Iterator[str]:
        """The root-relative paths of ``directory``'s files ``joined`` (by :data:`NUL`, as
        this listing keeps them and :meth:`strike` leaves them)."""
        return (f"{directory}/{name}" for name in joined.split(NUL)) if joined else iter(())

    def __iter__(self) -> Iterator[str]:
        return iter(self._joined)

    def __len__(self) -> int:
        return len(self._joined)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Listing, (self._joined, self.irregular))

    def joined(self) -> dict[str, str]:
        """A new dict of each directory's files below it, NUL-joined (the strings shared)."""
        return dict(self._joined)

    def paths(self) -> Iterator[str]:
        """Every file's root-relative path, in the walk's order."""
        for directory in self._joined:
            yield from self[directory]

    def only(self, keep: typing.Callable[[str], bool]) -> Listing:
        """The directories ``keep`` keeps, with their files."""
        joined = {directory: names for directory, names in self._joined.items()
                  if keep(directory)}
        kept = frozenset(rel for rel in self.irregular if keep(split_below(rel)[0]))
        return Listing(joined, kept)

    def strike(self, left: dict[str, str], listed: Iterable[str]) -> frozenset[str]:
        """Take the paths ``listed`` (a record's) out of ``left`` (:meth:`joined`, what no
        record has named so far: each directory's left in the walk's order), and return
        those of them that are no regular file the walk found (a link, a missing file, a
        path in an odd form: each string is compared as it is)."""
        named: dict[str, set[str]] = {}
        missed: list[str] = []
        for rel in listed:
            directory, name = split_below(rel)
            if directory in self._joined:
                named.setdefault(directory, set()).add(name)
                if rel in self.irregular:
                    missed.append(rel)
            else:
                missed.append(rel)
        for directory, names in named.items():
            walked = self._joined[directory]
            found = set(walked.split(NUL)) if walked else set()
            missed.extend(f"{directory}/{name}" for name in names - found)
            rest = left.get(directory)
            if rest:
                left[directory] = NUL.join(name for name in rest.split(NUL)
                                           if name not in names)
        return frozenset(missed) if missed else _NO_PATHS


_NO_PATHS: frozenset[str] = frozenset()


def split_below(rel: str) -> tuple[str, str]:
    """A root-relative path as (its attempt directory: the first two parts, the rest); ("",
    rel) when it has fewer than three parts."""
    second = rel.find("/", rel.find("/") + 1) if "/" in rel else -1
    return (rel[:second], rel[second + 1:]) if second > 0 else ("", rel)


@dataclass(frozen=True, slots=True)
class StudyLayout:
    """The inventory of a study root (root-relative POSIX paths)."""

    root: Path
    period_records: tuple[str, ...]
    attempt_dirs: tuple[str, ...]
    attempt_files: Listing = field(default_factory=Listing)
    """Every file (or link) below each attempt directory."""
    protocol: str | None = None
    execution_commits: str | None = None
    sacct: str | None = None
    stray_pair_files: tuple[str, ...] = ()
    """Files under ``pairs/`` that are not ``period-<n>.json``."""
    linked_dirs: tuple[str, ...] = ()
    """Links in an arm directory's place (at the top, named ``<pair>-<gpus>gpu``, leading to
    a directory) or an attempt directory's (named ``attempt-<job>``): never followed, so
    never walked, and named."""

    def without_listings(self) -> StudyLayout:
        """This layout without its listings (every period record's and attempt directory's
        path, the files below them, the stray files): what is left once the layout's
        findings are made (:func:`~auditor.validate.integrity.layout_findings`). At a
        million files the listings were about 24 MB, held to the report's end."""
        return StudyLayout(self.root, (), (), Listing(), self.protocol,
                           self.execution_commits, self.sacct)


@dataclass(frozen=True, slots=True)
class FileTask:
    """One file to read: where it is shown, what it is, where to open it."""

    display: str
    kind: str
    """An evidence kind, or ``other`` (hashed only: unknown kinds, unlisted files)."""
    resolved: str | None
    """The path to open; None for the root's path joined with ``display`` (the usual
    case, not sent to a worker twice)."""
    size: int | None = None
    """Its size as listed (a manifest's): it is read no further than this plus one block."""


@dataclass(frozen=True, slots=True)
class AttemptTask:
    """All files of one attempt that passed the path checks."""

    key: str
    """``pair/period-N#attempt`` (opaque to the worker)."""
    root: str
    """The evidence root, resolved."""
    files: tuple[FileTask, ...]
    steps_from: str
    terminal_pattern: str | None
    terminal_sources: tuple[str, ...] = TERMINAL_SOURCES
    """Where the protocol lets the terminal event come from (worker logs are scanned only
    when they may hold it)."""
    terminal: TerminalSpec | None = None
    """The protocol's terminal-event matcher (None: verl's built-in one)."""
    env_keys: tuple[str, ...] | None = None
    """The trial record's ``env`` entries the audit reads (the coordinated-shutdown flag, the
    step count's key), the only ones kept; None: all of them."""


@dataclass(frozen=True, slots=True)
class FileOutcome:
    """The bytes of one file: digest when read, else why not."""

    display: str
    kind: str
    digest: FileDigest | None
    error: str = ""


@dataclass(frozen=True, slots=True)
class AttemptRead:
    """What reading one attempt produced."""

    key: str
    files: tuple[FileOutcome, ...]
    trial: TrialRecord | None
    log: TrainingLogScan | None
    traces: tuple[AllocatorTrace, ...]
    devices: tuple[DeviceEvidence, ...]
    findings: tuple[Finding, ...]
    processes: tuple[ProcessExit, ...] = ()
    """Its process records (contract v1.2), by path."""
    worker_logs: tuple[TrainingLogScan, ...] = ()
    """Its worker logs (contract v1.2), each scanned as a training log is, by path."""
    metrics: tuple[TrainingLogScan, ...] = ()
    """Its metrics files (contract v1.2), each with the JSON record that meets the
    protocol's predicates as its terminal event, when one does."""
    idle: tuple[HostIdle, ...] = ()
    """Each node's own idle check file (contract v1.2: ``idle/<host>.json``), by path."""

    @property
    def bytes_read(self) -> int:
        """Bytes hashed for this attempt."""
        return sum(f.digest.size for f in self.files if f.digest is not None)


@dataclass(frozen=True, slots=True)
class EvidenceFile:
    """One row of ``evidence.parquet``: a listed (or unlisted) file and its status."""

    path: str
    kind: str
    pair: str
    period: int | None
    attempt: int | None
    job_id: str | None
    manifest: str
    """The period record that lists it (``""`` for unlisted files)."""
    expected_sha256: str | None
    expected_size: int | None
    actual_sha256: str | None
    actual_size: int | None
    status: str
    """``verified``, ``mismatched``, ``missing``, ``unsafe``, ``unreadable`` or ``unlisted``."""
    detail: str = ""


@dataclass(frozen=True, slots=True)
class AttemptEvidence:
    """One attempt of a period: its manifest entry and what reading its files gave."""

    subject: str
    spec: AttemptSpec
    read: AttemptRead
    """What parsing its files gave (``read.files`` is emptied: each file's outcome is
    one of ``files``)."""
    files: tuple[EvidenceFile, ...]

    def hosts(self) -> set[str]:
        """The nodes the attempt's own files name: its workers' (the record's), its device
        files', its traces' records' (empty for a v1 attempt that names none)."""
        return ({w.host for w in self.spec.workers if w.host}
                | {d.hostname for d in self.read.devices if d.hostname}
                | {host for trace in self.read.traces for host, _ in trace.hosts})


@dataclass(frozen=True, slots=True)
class PeriodEvidence:
    """One period record with its attempts."""

    record: PeriodRecord
    attempts: tuple[AttemptEvidence, ...]

    @property
    def subject(self) -> str:
        """``pair/period-N`` (:attr:`PeriodRecord.subject`)."""
        return self.record.subject

    def seal_delay_ns(self) -> int | None:
        """How long after its last attempt's invocation ended the period was sealed (None:
        not sealed by ``auditor seal``, or no end known)."""
        return _seal_delay(self.record, (a.read.trial for a in self.attempts))

    def summary(self, protocol: Protocol,
                shared: dict[TraceDigest, TraceDigest] | None = None) -> PeriodSummary:
        """What the study keeps of this period once it is judged (``protocol``: the
        completion phases and where the step count comes from; ``shared``: one object for
        each alike digest, kept there, when given: most traces reach the same phases)."""
        attempts = []
        for attempt in self.attempts:
            trial = attempt.read.trial
            steps = trial.dispatched_int(protocol.steps_from) if trial else None
            digests = []
            for trace in attempt.read.traces:
                role = trace.phases[0].role if trace.phases else None
                phases = protocol.phases_for(role)
                first, last = (phases[0], phases[-1]) if len(phases) >= 2 else ("", "")
                digest = TraceDigest(phases_reached(trace),
                                     completes_cleanly(trace, steps, first, last))
                digests.append(digest if shared is None else shared.setdefault(digest, digest))
            attempts.append(AttemptSummary(attempt.subject, attempt.spec, trial,
                                           tuple(digests)))
        return PeriodSummary(self.record, tuple(attempts))


@dataclass(frozen=True, slots=True)
class AttemptSummary:
    """What a study keeps of one attempt once its period is judged, all the reporters read
    of it: its manifest entry, its trial record, and of each allocator trace what the
    report says of its phases (its phase records are rows of the ``phases`` table, its
    device files of ``devices``, its files of ``evidence``; its log was read in judging)."""

    subject: str
    spec: AttemptSpec
    trial: TrialRecord | None
    traces: tuple[TraceDigest, ...]
    """Each allocator trace's digest, in the order the traces were read."""


@dataclass(frozen=True, slots=True)
class PeriodSummary:
    """What a study keeps of one period once it is judged (:meth:`PeriodEvidence.summary`):
    its record, whole, and each attempt's :class:`AttemptSummary`."""

    record: PeriodRecord
    attempts: tuple[AttemptSummary, ...]

    @property
    def subject(self) -> str:
        """``pair/period-N`` (:attr:`PeriodRecord.subject`)."""
        return self.record.subject

    def seal_delay_ns(self) -> int | None:
        """How long after its last attempt's invocation ended the period was sealed (None:
        not sealed by ``auditor seal``, or no end known)."""
        return _seal_delay(self.record, (a.trial for a in self.attempts))


def _seal_delay(record: PeriodRecord, trials: Iterable[TrialRecord | None]) -> int | None:
    ends = [trial.finished_ns for trial in trials
            if trial is not None and trial.finished_ns is not None]
    if record.sealed_ns is None or not ends:
        return None
    return record.sealed_ns - max(ends)


@dataclass(frozen=True, slots=True)
class InputFile:
    """An input read by the audit, for the output manifest."""

    group: str
    """``raw_evidence``, ``source_inputs`` or ``protocol_inputs``."""
    path: str
    """Root-relative for raw evidence; as given otherwise."""
    absolute: str
    digest: FileDigest


HASHED_STATUSES = frozenset({"verified", "mismatched", "unlisted"})
"""The statuses of evidence rows whose files were read and hashed (``auditor verify``
re-checks them: they are inputs of the output manifest)."""


class EvidenceRows(typing.Protocol):
    """A study's evidence rows, sorted by path: a tuple, or rows kept out of memory
    (:class:`auditor.store.EvidenceStore`, which also knows :meth:`Collected.evidence_statuses`
    and :meth:`Collected.unusual_evidence` without a pass over them)."""

    def __iter__(self) -> Iterator[EvidenceFile]: ...

    def __len__(self) -> int: ...


class TableRows(typing.Protocol):
    """Rows of an output table kept out of the records (spilled as the audit went):
    :func:`auditor.report.tables.write_table` reads them back a batch at a time
    (:class:`auditor.store.tables.TableRows`)."""

    rows: int
    """How many rows there are."""

    def batches(self) -> Iterator[Any]:
        """The rows as Arrow record batches, in order."""
        ...

    def finish(self) -> None:
        """No more rows: reading them from here on never writes."""
        ...


@dataclass(frozen=True, slots=True)
class Collected:
    """The output of collection and integrity checks, before reasoning."""

    root: Path
    layout: StudyLayout
    """The study's inventory, without its listings (:meth:`StudyLayout.without_listings`:
    every file is a row of ``evidence``, and what the period records' and attempt
    directories' paths show is among the findings)."""
    protocol: Protocol
    sacct: SacctDump | None
    sacct_display: str | None
    execution_commits: dict[str, str] | None
    periods: Sequence[PeriodSummary]
    """Each period as the study keeps it (:meth:`PeriodEvidence.summary`), in the study's
    order: kept by the store, which may make each anew as it is read (look one up by its
    place, never hold them all)."""
    evidence: EvidenceRows
    inputs: Sequence[InputFile]
    """Inputs read besides the evidence files the period records list (those are in
    ``evidence``), sorted (:func:`input_order`): a tuple, or for a large study a sequence
    kept packed (its period records' inputs, one a period); :meth:`all_inputs` gives
    both."""
    findings: Sequence[Finding]
    """Collection's findings, in the order collection reports them (a large study's may be
    made anew as they are read: a study of damaged files has one or more a file)."""
    tables: Mapping[str, TableRows] = field(default_factory=dict)
    """The ``phases`` and ``devices`` tables' rows, made as each period was judged (a
    period's summary keeps no phase record nor device file)."""
    timeline: tuple[PeriodEvidence, ...] = ()
    """The first :data:`~auditor.model.TIMELINE_PERIODS` periods, whole: what the phase
    timeline draws."""

    def scheduler_usable(self) -> bool:
        """Whether a scheduler dump was read with records in it (not missing, ``AUD123``,
        nor refused or empty, ``AUD009``): what the allocation scope and the cross-checks
        against sacct need."""
        return self.sacct is not None \
            and not any(item.rule_id == "AUD009" for item in self.sacct.findings)

    def scopes_known(self) -> tuple[bool, bool]:
        """Whether the allocation and the reservation scope can be counted: a usable dump
        that holds the GPUs each allocation held (AllocTRES) and, for the allocation scope,
        how long it ran (ElapsedRaw or Elapsed, or Start and End); else they are unknown,
        never a fallback's figure."""
        if self.sacct is None or not self.scheduler_usable():
            return False, False
        names = {name.lower() for name in self.sacct.fields}
        gpus = "alloctres" in names and not self.sacct.gpus_untracked
        timed = bool(names & {"elapsedraw", "elapsed"}) or {"start", "end"} <= names
        return gpus and timed, gpus

    def all_inputs(self) -> Iterator[InputFile]:
        """Every input the audit read and hashed, sorted by group and path: ``inputs``,
        and a raw-evidence input per evidence file read (made on demand, so a study of
        many files keeps no second copy of their paths and digests)."""
        return heapq.merge(self.inputs, self.hashed_inputs(), key=input_order)

    def hashed_inputs(self) -> Iterator[InputFile]:
        """The raw-evidence inputs of the evidence files read and hashed, by path (those of
        :meth:`all_inputs` not held in ``inputs``), made as they are given."""
        root = str(self.root)
        return (
            InputFile("raw_evidence", ef.path, f"{root}/{ef.path}",
                      FileDigest(ef.actual_sha256 or "", ef.actual_size or 0))
            for ef in self._hashed_evidence()
        )

    def input_counts(self) -> Counter[str]:
        """How many inputs :meth:`all_inputs` gives per group (without making them)."""
        counts = Counter(item.group for item in self.inputs)
        hashed = getattr(self.evidence, "hashed", None)
        counts["raw_evidence"] += hashed if hashed is not None \
            else sum(1 for _ in self._hashed_evidence())
        return counts

    def evidence_statuses(self) -> Counter[str]:
        """How many evidence rows have each status."""
        known = getattr(self.evidence, "statuses", None)
        return Counter(known) if known is not None \
            else Counter(row.status for row in self.evidence)

    def unusual_evidence(self) -> list[EvidenceFile]:
        """The evidence rows that are not verified, by path (the few the report names)."""
        known = getattr(self.evidence, "unusual", None)
        return list(known) if known is not None \
            else [row for row in self.evidence if row.status != "verified"]

    def _hashed_evidence(self) -> Iterator[EvidenceFile]:
        """The evidence rows of files that were read and hashed: listed ones, and those
        no period record lists (read too, so ``auditor verify`` re-checks them)."""
        return (ef for ef in self.evidence if ef.actual_sha256 is not None
                and ef.status in HASHED_STATUSES)


def input_order(item: InputFile) -> tuple[str, str]:
    """How inputs are sorted (in :attr:`Collected.inputs` and the output manifest): by
    group, then path."""
    return item.group, item.path


@dataclass(frozen=True, slots=True)
class PeriodUnit:
    """One period as collected: the unit a shard of an audit reads, and the study's
    assembly folds in period order."""

    index: int
    """Its position among the study's period records (their natural order)."""
    evidence: PeriodEvidence
    problems: tuple[Finding, ...]
    """Findings about opening its record (the record's own are ``evidence.record.findings``)."""
    record_input: InputFile | None
    """The record's input-manifest entry (None when it could not be read)."""


@dataclass(frozen=True, slots=True)
class CollectedParts:
    """What collection gathered, before the study's assembly into :class:`Collected`: the
    study-wide inputs, and the period units (every one, or one shard's)."""

    root: Path
    layout: StudyLayout
    """The study's inventory, its per-file listings let go."""
    protocol: Protocol
    sacct: SacctDump | None
    sacct_display: str | None
    execution_commits: dict[str, str] | None
    study_findings: tuple[Finding, ...]
    """Findings about the protocol, the commit pins and the scheduler's dump."""
    input_findings: tuple[Finding, ...]
    """Findings about the source inputs named on the command line."""
    study_inputs: tuple[InputFile, ...]
    """Inputs read besides the period records and the evidence they list."""
    units: tuple[PeriodUnit, ...]
    unlisted: tuple[tuple[tuple[int, int], FileOutcome], ...]
    """Files no period record lists, each with its place in the single audit's order (an
    unopenable one first, then by the walk)."""
    periods_total: int
    """How many period records the study holds (all shards together)."""
    shard: tuple[int, int] | None = None
    """(I, N) for shard I of N; None for the whole study."""
    seen_sha256: str | None = None
    """In a shard: what it saw of the whole study (every period record's digest, the files
    walked below the attempt directories), as one SHA-256; the shards of one study must
    have seen the same."""

