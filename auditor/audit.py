"""The one place the stages meet: collect -> validate -> reason.

:meth:`Auditor.run` is a generator: it yields :class:`Progress` events while it
works (the CLI turns them into a progress bar) and returns the
:class:`AuditResult` (``result = yield from auditor.run()``, or use
:func:`run_audit`). Nothing here prints, and nothing is written anywhere:
reporters are pure functions of the result.
"""

from __future__ import annotations

import contextlib
import gc
import heapq
import io
import math
import os
import re
from collections import Counter, deque
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TypeVar

from auditor._io import HashingReader, sha256_file
from auditor._process import helper_args, helper_context, helper_signals, signals_deferred
from auditor.catalogue import finding
from auditor.collect.attempt import (
    PARSED_KINDS,
    AttemptRead,
    AttemptTask,
    FileOutcome,
    FileTask,
    hash_only,
    read_attempt,
)
from auditor.collect.discover import SACCT_PATH, StudyLayout, discover, find_period_records
from auditor.collect.period import read_period
from auditor.collect.protocol import default_protocol, read_protocol
from auditor.collect.sacct import parse_sacct
from auditor.errors import InputError, SacctFormatError, UsageError
from auditor.model import (
    AttemptSpec,
    Citation,
    EvidenceEntry,
    FileDigest,
    Finding,
    PeriodRecord,
    Progress,
    Protocol,
    SacctDump,
    Verdict,
    fast_pickle,
)
from auditor.validate.paths import PathCheck, check_path, join_text

_HEX64 = re.compile(r"[0-9a-f]{64}")
"""A SHA-256 as a manifest must give it (lower-cased when read)."""
_COUNTED_NOT_KEPT = re.compile(r"(\d+) further findings not kept \(cap \d+\)$")
"""The count in an ``AUD013``'s message (the catalogue's template)."""
CAP_SUMMARIES = frozenset({"AUD013", "AUD016"})
"""Findings that report a cap: never dropped by the per-file cap (the study's counts them)."""
T = TypeVar("T")
R = TypeVar("R")

SMALL_STUDY_TASKS = 1000
"""...and below this many attempts (many small files pay for a pool too)."""
SMALL_STUDY_BYTES = 64 << 20
"""Below this many listed bytes the audit reads in-process: starting a pool costs more
(about 0.3 s) than a second core saves."""
CHUNK_BYTES = 16 << 20
"""About the most listed bytes of tasks sent to a worker at once (see :meth:`Auditor._map`)."""


def usable_cpus(cgroup: str = "/sys/fs/cgroup", own: str = "/proc/self/cgroup") -> int:
    """How many CPUs this process may use: the default number of workers.

    Not :func:`os.cpu_count`, which counts the machine's: inside a SLURM job (its cgroup
    cpuset), under ``taskset`` or in a container pinned to some cores, the process may run
    on only a few of a node's many; under a CPU quota (``docker --cpus``, a Kubernetes
    limit, a systemd slice's ``CPUQuota``), on as many as the tightest quota over it allows,
    rounded up. ``cgroup`` is where the cgroup file system is mounted, ``own`` the file
    naming the process's group. A worker per CPU of the node would crowd them, and hold
    tens of MB each."""
    try:
        cpus = len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # (no affinity on this platform)
        cpus = os.cpu_count() or 1
    return min([cpus, *_cpu_quotas(cgroup, own)])


def _cpu_quotas(cgroup: str, own: str) -> list[int]:
    """The CPUs each CPU bandwidth limit over this process allows, rounded up: cgroup v2's
    ``cpu.max`` of its own group and of each group above it (up to the mount's root: in a
    container's namespace, the container's), cgroup v1's CFS quota at the root."""
    try:
        with open(own) as handle:  # ("0::/path": the process's group in cgroup v2)
            path = next((line[3:].strip() for line in handle if line.startswith("0::")), "/")
    except (OSError, ValueError):
        path = "/"
    parts = [part for part in path.split("/") if part]
    if ".." in parts:  # (a group outside the namespace: only the root can be seen)
        parts = []
    files: list[tuple[str, str | None]] = [
        (f"{cgroup}/{'/'.join(parts[:depth])}/cpu.max".replace("//", "/"), None)
        for depth in range(len(parts), -1, -1)]
    files.append((f"{cgroup}/cpu/cpu.cfs_quota_us", f"{cgroup}/cpu/cpu.cfs_period_us"))
    allowed = []
    for quota_file, period_file in files:
        try:
            with open(quota_file) as handle:
                quota, _, period = handle.read().strip().partition(" ")
            if period_file is not None:
                with open(period_file) as handle:
                    period = handle.read().strip()
            cpus = math.ceil(int(quota) / int(period))
        except (OSError, ValueError, ZeroDivisionError):  # ("max" or -1: no quota)
            continue
        if cpus > 0:
            allowed.append(cpus)
    return allowed


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
    (:func:`usable_cpus`)."""
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


@dataclass(frozen=True, slots=True)
class PeriodEvidence:
    """One period record with its attempts."""

    record: PeriodRecord
    attempts: tuple[AttemptEvidence, ...]

    @property
    def subject(self) -> str:
        """``pair/period-N``."""
        return f"{self.record.pair}/period-{self.record.period}"


@fast_pickle
@dataclass(frozen=True, slots=True)
class InputFile:
    """An input read by the audit, for the output manifest."""

    group: str
    """``raw_evidence``, ``source_inputs`` or ``protocol_inputs``."""
    path: str
    """Root-relative for raw evidence; as given otherwise."""
    absolute: str
    digest: FileDigest


@dataclass(frozen=True, slots=True)
class Collected:
    """The output of collection and integrity checks, before reasoning."""

    root: Path
    layout: StudyLayout
    """The study's inventory, without its per-file listings (``attempt_files`` and
    ``regular_files`` are emptied once planned: every file is a row of ``evidence``)."""
    protocol: Protocol
    sacct: SacctDump | None
    sacct_display: str | None
    execution_commits: dict[str, str] | None
    periods: tuple[PeriodEvidence, ...]
    evidence: tuple[EvidenceFile, ...]
    inputs: tuple[InputFile, ...]
    """Inputs read besides the evidence files the period records list (those are in
    ``evidence``); :meth:`all_inputs` gives both."""
    findings: tuple[Finding, ...]

    def all_inputs(self) -> Iterator[InputFile]:
        """Every input the audit read and hashed, sorted by group and path: ``inputs``,
        and a raw-evidence input per evidence file read (made on demand, so a study of
        many files keeps no second copy of their paths and digests)."""
        root = str(self.root)
        hashed = (
            InputFile("raw_evidence", ef.path, f"{root}/{ef.path}",
                      FileDigest(ef.actual_sha256 or "", ef.actual_size or 0))
            for ef in self._hashed_evidence()
        )
        return heapq.merge(self.inputs, hashed, key=_input_order)

    def input_counts(self) -> Counter[str]:
        """How many inputs :meth:`all_inputs` gives per group (without making them)."""
        counts = Counter(item.group for item in self.inputs)
        counts["raw_evidence"] += sum(1 for _ in self._hashed_evidence())
        return counts

    def _hashed_evidence(self) -> Iterator[EvidenceFile]:
        """The evidence rows of files that were read and hashed: listed ones, and those
        no period record lists (read too, so ``auditor verify`` re-checks them)."""
        return (ef for ef in self.evidence if ef.actual_sha256 is not None
                and ef.status in ("verified", "mismatched", "unlisted"))


@dataclass(frozen=True)
class AuditResult:
    """Everything reporters may see."""

    collected: Collected
    findings: tuple[Finding, ...]
    verdicts: tuple[Verdict, ...]
    reasoning: object
    """The :class:`auditor.reason.engine.Reasoning` (typed loosely to keep layers apart)."""
    options: AuditOptions = field(default_factory=AuditOptions)
    partial: bool = False
    """A cap was reached (``AUD013``, ``AUD016``): some findings or phase records were
    counted, not kept."""
    findings_not_kept: int = 0
    """Findings counted but not kept: by the audit's limits (``--max-findings``,
    ``--max-findings-per-file``) and by the collectors' own, as they read (each cap reached
    is an ``AUD013``)."""


class Auditor:
    """Audits one study root."""

    def __init__(self, root: Path | str, options: AuditOptions | None = None) -> None:
        self.root_arg = Path(root)
        self.options = options or AuditOptions()
        self._pool: ProcessPoolExecutor | None = None
        self._jobs = self.options.jobs or usable_cpus()
        """Readers (the CPUs this process may use unless ``--jobs`` says): settled once."""

    def run(self) -> Generator[Progress, None, AuditResult]:
        """Collect, validate and reason; yields progress, returns the result.

        Drive it inside :func:`paused_gc` (:func:`run_audit` and the command line do):
        the generator itself leaves the collector alone, so one that is abandoned
        half-way can never leave it switched off."""
        from auditor.reason.engine import reason
        from auditor.validate.checks import validate

        try:
            collected = yield from self._collect()
        finally:
            if self._pool is not None:
                pool, self._pool = self._pool, None
                # never cut short by a signal: a pool half shut down at exit makes
                # Python's own exit hook fail on a closed pipe (and print a traceback)
                with signals_deferred():
                    pool.shutdown(cancel_futures=True)
        yield Progress("validate", 0, 1)
        validation = validate(collected, self.options)
        yield Progress("reason", 0, 1)
        reasoning = reason(collected, validation, self.options)
        findings, not_kept = apply_limits(
            [*collected.findings, *validation, *reasoning.findings], self.options)
        # ...and those a collector counted as it read (a trace of a million bad lines)
        not_kept += sum(int(found.group(1)) for item in collected.findings
                        if item.rule_id == "AUD013"
                        and (found := _COUNTED_NOT_KEPT.search(item.message)))
        return AuditResult(
            collected=collected,
            findings=findings,
            verdicts=reasoning.verdicts,
            reasoning=reasoning,
            options=self.options,
            partial=any(f.rule_id in CAP_SUMMARIES for f in findings),
            findings_not_kept=not_kept,
        )

    # ------------------------------------------------------------------ collect

    def _collect(self) -> Generator[Progress, None, Collected]:
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
        sacct_read = self._soon(_read_sacct, (root, sacct_rel, self.options), len(period_tasks))
        loaded = self._map(_load_period, period_tasks, 0)
        layout = yield from discover(root, period_paths)
        findings: list[Finding] = []
        inputs: list[InputFile] = []
        protocol = default_protocol()
        if layout.protocol:
            given = _read_input(root, layout.protocol, read_protocol, inputs, findings)
            if given is not None:
                protocol = given
                findings.extend(given.findings)
        commits = _read_commits(root, layout.execution_commits, inputs, findings)
        sacct, sacct_display, sacct_inputs, sacct_findings = sacct_read()
        inputs.extend(sacct_inputs)
        findings.extend(sacct_findings)
        periods: list[PeriodRecord] = []
        yield Progress("periods", 0, len(period_tasks))
        for period, loaded_input, problems in loaded:
            periods.append(period)
            findings.extend(problems)
            findings.extend(period.findings)
            if loaded_input is not None:
                inputs.append(loaded_input)
            yield Progress("periods", len(periods), len(period_tasks))

        tasks, pre = _plan(root, periods, protocol, layout.regular_files)
        listed = {
            joined
            for record in periods
            for spec in record.attempts
            for entry in spec.evidence
            if (joined := join_text(spec.attempt_dir or "", entry.path)) is not None
        }
        unlisted: list[FileTask] = []
        unlisted_blocked: list[FileOutcome] = []
        for files in layout.attempt_files.values():
            for rel in files:
                if rel in listed:
                    continue
                if rel in layout.regular_files:  # (its name as it is: never re-read as a
                    # manifest path, whose backslashes would be separators)
                    unlisted.append(FileTask(rel, "other", f"{root}/{rel}"))
                    continue
                check = check_path(root, rel)  # (a link, or what lies behind one)
                if check.status == "ok" and check.resolved is not None:
                    unlisted.append(FileTask(rel, "other", check.resolved))
                else:  # never open a link that leads out of the root
                    unlisted_blocked.append(
                        FileOutcome(rel, "other", None, f"{check.status} {check.why}".strip())
                    )
        total_files = sum(len(t.files) for t in tasks) + len(unlisted)
        total_bytes = sum(entry.size or 0 for record in periods for spec in record.attempts
                          for entry in spec.evidence)
        # The inventory served planning: it goes before the reads bring their results in
        # (with it, and each file's path sent once, the reading's peak on 144k files fell
        # from 541 to 447 MB).
        del listed
        layout = replace(layout, attempt_files={}, regular_files=frozenset())
        reading = self._map(read_attempt, tasks, total_bytes)
        del tasks  # (a pool holds each chunk's tasks until it is read)
        yield Progress("read", 0, total_files)
        reads: dict[str, AttemptRead] = {}
        done = 0
        read_bytes = 0
        for read in reading:
            reads[read.key] = read
            done += len(read.files)
            read_bytes += read.bytes_read
            yield Progress("read", done, total_files, read_bytes)
        unlisted_outcomes: list[FileOutcome] = list(unlisted_blocked)
        for outcome in self._map(hash_only, unlisted, total_bytes):
            unlisted_outcomes.append(outcome)
            done += 1
            read_bytes += outcome.digest.size if outcome.digest else 0
            yield Progress("read", done, total_files, read_bytes)

        period_evidence, evidence = _assemble(periods, pre, reads)
        for outcome in unlisted_outcomes:
            pair = outcome.display.split("/", 1)[0]
            evidence.append(EvidenceFile(
                outcome.display, "other", pair, None, None, None, "", None, None,
                outcome.digest.sha256 if outcome.digest else None,
                outcome.digest.size if outcome.digest else None, "unlisted", outcome.error,
            ))
        for pe in period_evidence:
            for attempt in pe.attempts:
                findings.extend(attempt.read.findings)
        findings.extend(_integrity_findings(evidence))
        for rel in layout.stray_pair_files:
            if rel.count("/") == 1 and os.path.islink(root / rel) \
                    and _pair_link_hides_periods(root, rel):
                findings.append(finding("AUD022", rel, [Citation(rel)]))
                continue
            findings.append(finding(
                "AUD105", rel, [Citation(rel)],
                detail="under pairs/ but not named pairs/<pair>/period-<n>.json, so not read "
                       "as a period record (were it one, its period is missing from this "
                       "audit)"))
        referenced = {a.spec.attempt_dir for pe in period_evidence for a in pe.attempts}
        for rel_dir in layout.attempt_dirs:
            if rel_dir not in referenced:
                findings.append(finding("AUD106", rel_dir, [Citation(rel_dir)]))
        self._read_protocol_inputs(inputs, findings)
        return Collected(
            root=root,
            layout=layout,
            protocol=protocol,
            sacct=sacct,
            sacct_display=sacct_display,
            execution_commits=commits,
            periods=tuple(period_evidence),
            evidence=tuple(sorted(evidence, key=lambda e: e.path)),
            inputs=tuple(sorted(inputs, key=_input_order)),
            findings=tuple(findings),
        )

    def _soon(self, function: Callable[[T], R], item: T, tasks: int) -> Callable[[], R]:
        """Start ``function(item)`` in the pool when the ``tasks`` that follow it go to one
        (it runs beside them and beside this process); the returned call gives its result
        (or raises its error). Without a pool, ``function`` runs at that call."""
        if not self._pooled(tasks, 0):
            return partial(function, item)
        pool = self._open_pool()
        with signals_deferred():  # (see _map)
            return pool.submit(function, item).result

    def _pooled(self, tasks: int, total_bytes: int) -> bool:
        """Whether ``tasks`` tasks over ``total_bytes`` listed bytes go to a pool."""
        small = self.options.jobs == 0 and total_bytes < SMALL_STUDY_BYTES \
            and tasks < SMALL_STUDY_TASKS
        return self._jobs > 1 and not small and tasks >= 2

    def _open_pool(self) -> ProcessPoolExecutor:
        """The pool (one serves every stage of the collection), started on first use."""
        if self._pool is None:
            # kept before its workers start: a signal held meanwhile is raised as the
            # block ends, and the pool must then be there for run() to shut down
            context = helper_context()
            self._pool = ProcessPoolExecutor(max_workers=self._jobs,
                                             mp_context=context, initializer=helper_signals,
                                             initargs=helper_args(context))
            with signals_deferred():  # (forked at the first task: born with signals held)
                self._pool.submit(int)
        return self._pool

    def _map(self, function: Callable[[T], R], items: Iterable[T],
             total_bytes: int) -> Iterator[R]:
        """Run ``function`` over ``items`` inline or in a process pool, in order. In a
        pool, every task is sent at once (the results wait for the caller); inline, each
        runs as its result is taken."""
        items = list(items)
        if not self._pooled(len(items), total_bytes):
            pending = deque(items)  # each task is let go once done
            del items
            return (function(pending.popleft()) for _ in range(len(pending)))
        jobs = self._jobs
        # Tasks go to the workers in chunks (fewer messages), but a chunk holds about
        # CHUNK_BYTES of files (by the average task): the last chunk a worker takes is
        # then short work, not seconds of it while the other core idles.
        per_item = total_bytes // len(items)
        chunksize = max(1, min(64, len(items) // (jobs * 8), CHUNK_BYTES // max(per_item, 1)))
        pool = self._open_pool()
        # submitting is not cut short by a signal either (like starting and shutting the
        # pool down): the pool's bookkeeping is not built to be interrupted half-way
        with signals_deferred():
            return pool.map(function, items, chunksize=chunksize)

    def _read_protocol_inputs(self, inputs: list[InputFile], findings: list[Finding]) -> None:
        for name, path in self.options.protocol_inputs:
            try:
                digest = sha256_file(str(path))
            except OSError as error:
                raise InputError(
                    f"--protocol-input {name}={path}: cannot read ({error.strerror})"
                ) from None
            inputs.append(InputFile("protocol_inputs", name, str(path.resolve()), digest))
        if self.options.source_root is not None:
            source_root = self.options.source_root.resolve()
            for rel in self.options.sources:
                check = check_path(source_root, rel)
                if check.status != "ok" or check.resolved is None:
                    findings.append(finding("AUD122", rel, [Citation(rel)],
                                            detail=f"{check.status} {check.why}".strip()))
                    continue
                inputs.append(InputFile("source_inputs", rel, check.resolved,
                                        sha256_file(check.resolved)))


def apply_limits(findings: list[Finding], options: AuditOptions) -> tuple[tuple[Finding, ...],
                                                                         int]:
    """Cap findings per cited file and in all, clip quotes: (the findings kept, how many
    were counted but not kept). Each cap reached is summed up in an ``AUD013``: a file's
    among the warnings, the study's (at most ``max_findings`` kept before it) last."""
    from collections import Counter

    from auditor._io import clip

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


# ---------------------------------------------------------------------- helpers


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


def _read_input(root: Path, rel: str, reader_fn: Callable[[HashingReader, str], R],
                inputs: list[InputFile], findings: list[Finding], regular: bool = False
                ) -> R | None:
    """Open a root-relative input (not evidence-listed), parse it and record its digest;
    ``regular``: the discovery walk saw it as a regular file reached through real
    directories only (it is then inside the root without resolving)."""
    check = check_path(root, rel, known_regular=frozenset((rel,)) if regular else frozenset())
    if check.status != "ok" or check.resolved is None:
        findings.append(finding("AUD011" if rel.startswith("pairs/") else "AUD014",
                                rel, [Citation(rel)],
                                error=f"{check.status} {check.why}".strip()))
        return None
    try:
        with open(check.resolved, "rb") as handle:
            reader = HashingReader(handle)
            record = reader_fn(reader, rel)
            reader.drain()
    except OSError as error:
        findings.append(finding("AUD011" if rel.startswith("pairs/") else "AUD014",
                                rel, [Citation(rel)], error=error.strerror or "cannot read"))
        return None
    inputs.append(InputFile("raw_evidence", rel, check.resolved, reader.digest()))
    return record


def _load_period(task: tuple[str, str, bool]
                 ) -> tuple[PeriodRecord, InputFile | None, list[Finding]]:
    """Read one period record (a pool task: root, path, whether the walk saw a regular
    file): the record (kept from its path when it cannot be read at all), its
    input-manifest entry, and findings about opening it."""
    root, rel, regular = task
    inputs: list[InputFile] = []
    problems: list[Finding] = []
    period = _read_input(Path(root), rel, read_period, inputs, problems, regular)
    if period is None:  # unsafe or unreadable: kept from its path, with that reason only
        # (not the "file is empty" of the placeholder it is read from)
        period = replace(read_period(HashingReader(io.BytesIO(b"")), rel),
                         findings=tuple(problems))
        problems = []
    return period, (inputs[0] if inputs else None), problems


def _read_sacct(task: tuple[Path, str | None, AuditOptions]
                ) -> tuple[SacctDump | None, str | None, list[InputFile], list[Finding]]:
    """Parse the scheduler's dump (a pool task: the resolved root, the root's own dump if it
    has one, the options): the dump, how it is shown, its input-manifest entry and the
    findings about it. A dump named by ``--sacct`` that cannot be read raises."""
    root, rel, options = task
    inputs: list[InputFile] = []
    findings: list[Finding] = []
    if options.sacct is not None:
        path = options.sacct
        display = str(path)
        group = "source_inputs"
    elif rel is not None:
        check = check_path(root, rel)
        if check.status != "ok":
            findings.append(finding(
                "AUD009", rel, [Citation(rel)],
                error=f"scheduler dump {check.status}: {check.why}",
            ))
            return None, rel, inputs, findings
        path = Path(check.resolved or "")
        display = rel
        group = "raw_evidence"
    else:
        findings.append(finding("AUD123", SACCT_PATH, [Citation(SACCT_PATH)]))
        return None, None, inputs, findings
    try:
        with open(path, "rb") as handle:
            reader = HashingReader(handle)
            try:
                dump = parse_sacct(
                    reader, display, options.sacct_format, options.sacct_delimiter
                )
            except SacctFormatError as error:
                if options.sacct is not None:
                    raise
                reader.drain()
                findings.append(finding("AUD009", display, [Citation(display)],
                                        error=str(error).removeprefix(f"{display}: ")))
                inputs.append(InputFile(group, display, os.path.abspath(path), reader.digest()))
                return None, display, inputs, findings
            reader.drain()
    except OSError as error:
        if options.sacct is not None:
            raise InputError(f"{path}: cannot read sacct dump: {error.strerror}") from None
        findings.append(finding("AUD009", display, [Citation(display)],
                                error=f"cannot read: {error.strerror}"))
        return None, display, inputs, findings
    inputs.append(InputFile(group, display, os.path.abspath(path), reader.digest()))
    findings.extend(dump.findings)
    captured = {field.lower() for field in dump.fields}
    for rule, needs in (("AUD021", SACCT_STATES), ("AUD019", SACCT_NEEDS)):
        lacking = [(name, why) for names, name, why in needs if not captured & names]
        if lacking:
            findings.append(finding(
                rule, display, [Citation(display)],
                fields=", ".join(name for name, _ in lacking),
                consequence="; ".join(why for _, why in lacking)))
    return dump, display, inputs, findings


SACCT_STATES: tuple[tuple[frozenset[str], str, str], ...] = (
    (frozenset({"jobid"}), "JobID", "no row is known as an element of an array, nor a pending "
     "range"),
    (frozenset({"state"}), "State", "no element's state is known (pending, running, failed)"),
)
"""The dump's fields without which no element's state is known (``AUD021``: as a missing
dump, ``AUD123``, the gate fails)."""
SACCT_NEEDS: tuple[tuple[frozenset[str], str, str], ...] = (
    (frozenset({"jobidraw"}), "JobIDRaw", "an attempt's actual job id is matched only to a "
     "row whose JobID is that id (a plain job, not an array element)"),
    (frozenset({"exitcode"}), "ExitCode", "elements' exit codes are unknown"),
    (frozenset({"elapsedraw", "elapsed"}), "ElapsedRaw", "the allocation scope is unknown"),
    (frozenset({"alloctres"}), "AllocTRES", "the GPUs each element held are unknown"),
    (frozenset({"start"}), "Start", "invocations are not placed inside their allocation"),
    (frozenset({"end"}), "End", "invocations are not placed inside their allocation"),
)
"""The dump's other fields the audit uses (any of the names), and what is lost without them
(``AUD019``)."""


def _pair_link_hides_periods(root: Path, rel: str) -> bool:
    """Whether ``pairs/<name>``, a link, may stand for a pair directory the audit does not
    see: it leads out of the root, nowhere, or to a directory outside ``pairs/`` (a link to
    a file, or to a pair directory audited in its own place, hides nothing)."""
    target = os.path.realpath(root / rel)
    inside = target.startswith(f"{root}{os.sep}")
    if inside and os.path.isfile(target):
        return False
    return not (inside and os.path.isdir(target)
                and os.path.dirname(target) == os.path.join(root, "pairs"))


def _read_commits(
    root: Path, rel: str | None, inputs: list[InputFile], findings: list[Finding]
) -> dict[str, str] | None:
    """``execution_commits.json``: ``{pair: commit}`` (or ``{"pairs": {...}}``)."""
    if rel is None:
        return None
    from auditor.collect.jsondoc import load_json
    from auditor.schema import pointer_of

    def parse(reader: HashingReader, display: str) -> dict[str, str] | None:
        doc, problems = load_json(reader, display, 16 << 20)
        findings.extend(problems)
        if doc is None:
            return None
        mapping = doc.get("pairs", doc) if isinstance(doc, dict) else doc
        pointer = "/pairs" if isinstance(doc, dict) and "pairs" in doc else ""
        if not isinstance(mapping, dict):  # (never read as "no pins": the check would be off)
            findings.append(finding(
                "AUD002", display, [Citation(display, pointer=pointer)], where=f"#{pointer}",
                error="expected an object of pair -> pinned commit (or {\"pairs\": {...}}); "
                      "no commit was checked"))
            return None
        bad = [key for key, value in mapping.items() if not isinstance(value, str)]
        if bad:
            at = pointer + pointer_of((bad[0],))
            findings.append(finding(
                "AUD002", display, [Citation(display, pointer=at)], where=f"#{at}",
                error=f"a pinned commit is a string; {len(bad)} pair(s) not checked"))
        return {str(k): str(v) for k, v in mapping.items() if isinstance(v, str)}

    result: dict[str, str] | None = _read_input(root, rel, parse, inputs, findings)
    return result


def _plan(
    root: Path, periods: Iterable[PeriodRecord], protocol: Protocol,
    regular_files: frozenset[str],
) -> tuple[list[AttemptTask], dict[str, list[EvidenceFile]]]:
    """Path-check every listed file; build one read task per attempt.

    Returns the tasks and, per attempt key, the evidence rows decided before
    reading (unsafe, missing, unreadable); readable files get their row after.
    """
    tasks: list[AttemptTask] = []
    pre: dict[str, list[EvidenceFile]] = {}
    for record in periods:
        for spec in record.attempts:
            key = f"{record.pair}/period-{record.period}#{spec.index}"
            rows: list[EvidenceFile] = []
            files: list[FileTask] = []
            for entry in spec.evidence:
                check: PathCheck = check_path(root, spec.attempt_dir or "", entry.path,
                                              known_regular=regular_files)
                if check.status != "ok" or check.resolved is None:
                    rows.append(_row(record, spec, entry, check.display, check.status, check.why))
                else:
                    kind = entry.kind if entry.kind in PARSED_KINDS else "other"
                    # (the usual path, the root's and the display's, is made by the reader)
                    resolved = None if check.resolved == f"{root}/{check.display}" \
                        else check.resolved
                    files.append(FileTask(check.display, kind, resolved))
            pre[key] = rows
            tasks.append(AttemptTask(key, str(root), tuple(files), protocol.steps_from,
                                     protocol.terminal_pattern))
    return tasks, pre


def _row(record: PeriodRecord, spec: AttemptSpec, entry: EvidenceEntry, display: str,
         status: str, detail: str = "", digest: FileDigest | None = None) -> EvidenceFile:
    actual = None if digest is None else digest.sha256
    if actual is not None and actual == entry.sha256:
        actual = entry.sha256  # one copy of the digest text kept, not two
    return EvidenceFile(
        display, entry.kind, record.pair, record.period, spec.index, spec.job_id, record.path,
        entry.sha256, entry.size, actual, digest.size if digest else None, status, detail,
    )


def _assemble(
    periods: list[PeriodRecord],
    pre: dict[str, list[EvidenceFile]],
    reads: dict[str, AttemptRead],
) -> tuple[list[PeriodEvidence], list[EvidenceFile]]:
    evidence: list[EvidenceFile] = []
    period_evidence: list[PeriodEvidence] = []
    for record in periods:
        attempts = []
        for spec in record.attempts:
            key = f"{record.pair}/period-{record.period}#{spec.index}"
            read = reads[key]
            outcomes = {o.display: o for o in read.files}
            rows = list(pre[key])
            decided = {r.path for r in rows}
            for entry in spec.evidence:
                display = join_text(spec.attempt_dir or "", entry.path)
                if display is None or display in decided:
                    continue
                outcome = outcomes.get(display)
                if outcome is None:
                    continue
                if outcome.digest is None:
                    rows.append(_row(record, spec, entry, outcome.display, "unreadable",
                                     outcome.error))
                    continue
                status, detail = _compare(entry.sha256, entry.size, outcome.digest)
                # the outcome's own string: one copy of each path kept, not two
                rows.append(_row(record, spec, entry, outcome.display, status, detail,
                                 outcome.digest))
            evidence.extend(rows)
            # the file outcomes now live in the rows: keep them once
            attempts.append(AttemptEvidence(
                f"{record.pair}/period-{record.period}", spec, replace(read, files=()),
                tuple(rows),
            ))
        period_evidence.append(PeriodEvidence(record, tuple(attempts)))
    return period_evidence, evidence


def _compare(sha256: str | None, size: int | None, digest: FileDigest) -> tuple[str, str]:
    problems = []
    if size is not None and size != digest.size:
        problems.append(f"size {size} != {digest.size}")
    if sha256 is None or sha256.lower() != digest.sha256:
        problems.append("sha256")
    if size is None:
        problems.append("size not listed")
    return ("verified", "") if not problems else ("mismatched", ", ".join(problems))


def _integrity_findings(evidence: Iterable[EvidenceFile]) -> list[Finding]:
    out = []
    for ef in evidence:
        cite = [Citation(ef.path)]
        if ef.status == "missing":
            out.append(finding("AUD101", ef.path, cite, manifest=ef.manifest))
        elif ef.status == "mismatched":
            what = "size" if "size" in ef.detail and "sha256" not in ef.detail else "SHA-256"
            if "size" in ef.detail and "sha256" in ef.detail:
                what = "SHA-256 and size"
            expected = f"{(ef.expected_sha256 or '-')[:12]}…/{ef.expected_size}"
            if ef.expected_sha256 is not None and not _HEX64.fullmatch(ef.expected_sha256):
                expected += ", which is not 64 hex digits"  # (a "sha256:" prefix, a typo)
            out.append(finding(
                "AUD102", ef.path, cite, what=what, manifest=ef.manifest, expected=expected,
                actual=f"{(ef.actual_sha256 or '-')[:12]}…/{ef.actual_size}",
            ))
        elif ef.status == "unsafe":
            out.append(finding("AUD103", ef.path, [Citation(ef.manifest)], why=ef.detail,
                               manifest=ef.manifest, path=ef.path))
        elif ef.status == "unreadable":
            out.append(finding("AUD104", ef.path, cite, why=ef.detail))
        elif ef.status == "unlisted":
            out.append(finding("AUD105", ef.path, cite,
                               detail="present but listed in no period record"))
    return out
