"""The one place the stages meet: collect -> (each period) validate, reason -> the study.

:meth:`Auditor.run` is a generator: it yields :class:`~auditor.model.Progress` events while
it works (the CLI turns them into a progress bar) and returns the
:class:`~auditor.model.AuditResult` (``result = yield from auditor.run()``, or use
:func:`run_audit`). Nothing here prints, and nothing is written anywhere: reporters are
pure functions of the result. This module plans and orders the reading, sends it to the
pool (:mod:`auditor.pipeline.pool`) a batch of whole periods a task, which the workers read and
judge (:func:`auditor.pipeline.worker.fold_batch`), and folds what comes back
(:mod:`auditor.pipeline.study`),
keeping what the report needs.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter, deque
from collections.abc import Callable, Container, Generator, Iterator, Sequence
from dataclasses import replace
from functools import partial
from itertools import chain
from pathlib import Path
from typing import Any, TypeVar

from auditor.collect.attempt import hash_only, read_attempt
from auditor.collect.discover import (
    discover,
    find_period_records,
    sacct_path,
    unlistable_reason,
)
from auditor.collect.inputs import (
    LoadedPeriod,
    load_period_packed,
    read_commits,
    read_input,
    read_protocol_inputs,
    read_sacct,
    unpack_entries,
)
from auditor.collect.plan import plan_reads, plan_unlisted
from auditor.collect.protocol import read_protocol
from auditor.errors import UsageError
from auditor.model import (
    DEFAULT_PROTOCOL,
    AuditOptions,
    AuditResult,
    CollectedParts,
    EvidenceFile,
    FileOutcome,
    FileTask,
    Finding,
    InputFile,
    Listing,
    PeriodRecord,
    PeriodUnit,
    Progress,
    Protocol,
    StudyLayout,
)
from auditor.pipeline.pool import chunk_size, make_pool
from auditor.pipeline.study import Fold, Joining, apply_limits, assemble_collected
from auditor.pipeline.worker import PeriodBatch, PeriodTask, fold_batch, unit_findings
from auditor.store import Held, Kept, Mapped, check_outside
from auditor.store.heap import paused_gc
from auditor.validate.checks import SchedulerRows

__all__ = ["AuditOptions", "AuditResult", "Auditor", "Progress", "apply_limits",
           "assemble_collected", "drive", "judge", "merge_parts", "paused_gc", "run_audit",
           "unit_findings"]

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
        check_outside(root)  # (the store's temporary files: never under the evidence root)
        regular: set[str] = set()
        period_paths = find_period_records(root, regular)
        if not period_paths[0]:
            hidden = _hidden_pairs(root, period_paths[1])
            raise UsageError(
                f"{self.root_arg}: no period records (pairs/<pair>/period-<n>.json) found"
                + (f" ({hidden})" if hidden else "; is this a study root?")
            )
        # The scheduler's dump and the period records are sent to the pool first: it
        # parses and reads them while this process walks the attempt directories.
        period_tasks = [(str(root), rel, rel in regular) for rel in period_paths[0]]
        sacct_rel = sacct_path(root)
        sacct_read = self._pool.soon(read_sacct, (root, sacct_rel, self.options),
                                     len(period_tasks))
        loaded = self._pool.map(load_period_packed, period_tasks, 0)
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
        if protocol.scheduler == "none":  # (contract v1.2: no dump expected; none missing)
            sacct_findings = [f for f in sacct_findings if f.rule_id != "AUD123"]
        findings.extend(sacct_findings)
        # (kept by the store until they go to the workers: as objects, 3 KB a period, 340
        # MB of a million files' before any evidence was read)
        periods: Kept[LoadedPeriod] = Kept()
        # the walked files below each attempt directory that no record read so far names,
        # NUL-joined (Listing.strike): the paths the records name are never held, and of
        # them each record keeps only those the walk did not see as regular files (checked
        # on disk when its reads are planned; usually none). A set of every path, and one
        # of the regular ones, were about 250 MB of this process at a million files, and
        # what they freed the heap kept through the reading.
        unnamed = layout.attempt_files.joined()
        seen = _Seen(unnamed) if shard is not None else None
        yield Progress("periods", 0, len(period_tasks))
        for item in loaded:
            if seen is not None:
                seen.record(item)
            periods.append(replace(item, listed=(), not_regular=layout.attempt_files.strike(
                unnamed, item.listed)))
            yield Progress("periods", len(periods), len(period_tasks))
        del item  # (the last one's listed paths and entries: not held through the reading)
        input_findings: list[Finding] = []
        read_protocol_inputs(self.options, inputs, input_findings)
        head = CollectedParts(
            root=root, layout=replace(layout, attempt_files=Listing()),
            protocol=protocol, sacct=sacct, sacct_display=sacct_display,
            execution_commits=commits, study_findings=tuple(findings),
            input_findings=tuple(input_findings), study_inputs=tuple(inputs),
            units=(), unlisted=(), periods_total=len(periods), shard=shard,
            seen_sha256=seen.hexdigest() if seen is not None else None,
        )
        del sacct  # (the head holds it, then the fold's judge: not this frame too)
        folding = Fold(head, Mapped(periods, _record), self.options) \
            if fold else None
        if folding is not None:
            # (the fold has made the layout's findings and keeps the scheduler's dump, which
            # it gives back to the parts when it finishes: neither is held here)
            head = replace(head, layout=head.layout.without_listings(), sacct=None)
        # (the inventory and the records go once planned and joined: the reads hold their
        # boxes' only references)
        box = [layout]
        records: list[Kept[LoadedPeriod]] = [periods]
        del layout, periods
        if folding is not None and folding.judge.ends is not None:
            # (the workers judge: each batch of periods is closed under its jobs)
            units, unlisted = yield from self._read_periods(root, box, records, unnamed,
                                                            folding)
        else:
            units, unlisted = yield from self._read_evidence(root, box, records, unnamed,
                                                             protocol, shard, folding)
        return replace(head, units=tuple(units), unlisted=tuple(unlisted)), folding

    def _read_periods(
        self, root: Path, box: list[StudyLayout], records_box: list[Kept[LoadedPeriod]],
        unnamed: dict[str, str], fold: Fold,
    ) -> Generator[Progress, None, tuple[list[PeriodUnit],
                                         list[tuple[tuple[int, int], FileOutcome]]]]:
        """Read, validate and judge every period in the workers, a batch of whole periods a
        task (:func:`~auditor.pipeline.worker.fold_batch`: consecutive periods, cut only where no
        later period names an earlier one's job, so each batch is judged on its own), and
        fold what comes back; then hash the files no period record lists. The arguments
        are :meth:`_read_evidence`'s (but the protocol: the workers' context has it); each
        period goes to its worker as loaded (its entries packed), and its reads are planned
        there."""
        assert fold.judge.ends is not None
        layout = box.pop()
        periods = records_box.pop()
        unlisted, unlisted_blocked = plan_unlisted(root, layout, unnamed)
        unnamed.clear()
        place = _places(layout, unlisted, unlisted_blocked)
        counts: list[int] = []
        total_files = len(unlisted)
        total_bytes = 0
        # (each batch brings the scheduler's rows it may look up: a worker holding the
        # whole dump held 80 MB of its 55,556 jobs at a million files; the batches' rows
        # are chosen here, packed, and the dump's own are set aside through the reading)
        sacct = fold.judge.context.study.sacct
        scheduler = SchedulerRows(sacct) if sacct is not None else None
        wanted: list[tuple[int, ...]] = []
        for item in periods:  # (one pass: each may be made anew)
            counts.append(len(item.record.attempts))
            total_files += item.files
            total_bytes += item.size
            if scheduler is not None:
                wanted.append(scheduler.places(item.record))
        attempts = sum(counts)
        size = chunk_size(attempts, total_bytes, self._pool.width(attempts, total_bytes))
        ranges = _batch_ranges(fold.judge.ends, counts, size)
        rows = None if scheduler is None else deque(
            Held(scheduler.at(chain.from_iterable(wanted[start:end])).jobs)
            for start, end in ranges)
        del layout, sacct, scheduler, wanted
        fold.judge.set_rows_aside()
        pins = fold.judge.study.execution_commits
        # (each goes as it is sent: the batches are in order)
        records = periods.drain()
        del periods

        def batches() -> Iterator[PeriodBatch]:
            for start, end in ranges:
                batch = []
                for index in range(start, end):
                    batch.append(PeriodTask(index, next(records)))
                yield PeriodBatch(tuple(batch), rows.popleft() if rows is not None else None,
                                  None if pins is None else _pins_of(batch, pins))

        yield Progress("read", 0, total_files)
        done = 0
        read_bytes = 0
        for folded in self._pool.map_shared(fold_batch, fold.judge.context.for_workers(),
                                            batches(), attempts, total_bytes):
            for one in folded:
                fold.add_folded(one)
                done += one.files_read
                read_bytes += one.bytes_read
            yield Progress("read", done, total_files, read_bytes)
        outcomes = yield from self._hash_unlisted(str(root), unlisted, unlisted_blocked,
                                                  place, total_bytes, done, total_files,
                                                  read_bytes)
        return [], outcomes

    def _read_evidence(
        self, root: Path, box: list[StudyLayout], records_box: list[Kept[LoadedPeriod]],
        unnamed: dict[str, str], protocol: Protocol, shard: tuple[int, int] | None,
        fold: Fold | None,
    ) -> Generator[Progress, None, tuple[list[PeriodUnit],
                                         list[tuple[tuple[int, int], FileOutcome]]]]:
        """Plan, read and hash the evidence of every period (of the shard's), and the
        files no period record lists (in the attempt directories the shard owns); join
        what was read with the manifests, a period as soon as its attempts are read (and
        hand it to ``fold``). ``box`` holds the layout and ``records_box`` the period
        records (taken out: the listings go once planned, each record once joined; a
        record's manifest entries are unpacked as its reads are planned, and go once it is
        joined); ``unnamed``: the walked files below each attempt directory that no record
        names (:meth:`~auditor.model.Listing.strike`)."""
        layout = box.pop()
        periods = records_box.pop()
        records = [item.record for item in periods]
        own = [index for index in range(len(periods))
               if shard is None or index % shard[1] == shard[0] - 1]
        mine = [records[index] for index in own]
        if shard is None:
            owned = layout
        else:
            owner = _owners(records, shard[1])
            owned = replace(layout, attempt_files=layout.attempt_files.only(
                lambda rel: owner.get(rel, 1) == shard[0]))
        unlisted, unlisted_blocked = plan_unlisted(root, owned, unnamed)
        unnamed.clear()
        place = _places(layout, unlisted, unlisted_blocked)
        attempts = sum(len(record.attempts) for record in mine)
        total_files = sum(periods[index].files for index in own) + len(unlisted)
        total_bytes = sum(periods[index].size for index in own)
        # Each attempt's task is made as the pool sends it (the tasks of a million files
        # took 0.3 GB), with the rows decided before reading put in ``pre``; of the
        # inventory, only the regular files' names stay for it (with it, and each file's
        # path sent once, the reading's peak on 144k files fell from 541 to 447 MB).
        pre: dict[str, list[EvidenceFile]] = {}
        whole: dict[int, PeriodRecord] = {}
        tasks = plan_reads(root, _unpacked(deque((index, periods[index]) for index in own),
                                           whole), protocol, pre)
        joining = Joining(deque((index, periods[index].record, periods[index].record_input,
                                 list(periods[index].problems)) for index in own),
                          pre, fold, whole)
        del layout, owned, records, mine, periods
        reading = self._pool.map(read_attempt, tasks, total_bytes, attempts)
        del tasks
        yield Progress("read", 0, total_files)
        done = 0
        read_bytes = 0
        for read in reading:
            done += len(read.files) + len(pre.get(read.key, ()))  # (read, or known unread)
            joining.add(read)
            read_bytes += read.bytes_read
            yield Progress("read", done, total_files, read_bytes)
        outcomes = yield from self._hash_unlisted(str(root), unlisted, unlisted_blocked,
                                                  place, total_bytes, done, total_files,
                                                  read_bytes)
        return joining.units(), outcomes

    def _hash_unlisted(self, root: str, unlisted: list[FileTask], blocked: list[FileOutcome],
                       place: dict[str, int], total_bytes: int, done: int, total_files: int,
                       read_bytes: int
                       ) -> Generator[Progress, None, list[tuple[tuple[int, int], FileOutcome]]]:
        """Hash the files no period record lists below ``root`` (``blocked``: those not to
        be opened),
        each with its place in the walk's order (``place``), counting on from the reading's
        progress (``done`` of ``total_files``, ``read_bytes``)."""
        outcomes = [((0, place.get(o.display, -1)), o) for o in blocked]
        for outcome in self._pool.map(partial(hash_only, root), unlisted, total_bytes):
            outcomes.append(((1, place.get(outcome.display, -1)), outcome))
            done += 1
            read_bytes += outcome.digest.size if outcome.digest else 0
            yield Progress("read", done, total_files, read_bytes)
        return outcomes


def _pins_of(batch: list[PeriodTask], pins: dict[str, str]) -> dict[str, str]:
    """The pinned commits of the pairs of a batch's periods."""
    pairs = {task.loaded.record.pair for task in batch}
    return {pair: pins[pair] for pair in sorted(pairs) if pair in pins}


def _record(loaded: LoadedPeriod) -> PeriodRecord:
    return loaded.record


def _unpacked(pending: deque[tuple[int, LoadedPeriod]], whole: dict[int, PeriodRecord]
              ) -> Iterator[tuple[int, PeriodRecord, Container[str]]]:
    """The records of the ``pending`` periods (index, as loaded), in order, each with its
    manifest entries unpacked as the reading's planner comes to it (and kept in ``whole``,
    by its index, for the joining, which lets it go), and the paths it names that the
    walk saw as regular files; each packed one goes as it is."""
    while pending:
        index, loaded = pending.popleft()
        record = unpack_entries(loaded)
        if record.attempts:  # (a period without any is joined as loaded, maybe before)
            whole[index] = record
        yield index, record, loaded.known_regular()


def _hidden_pairs(root: Path, stray: Sequence[str]) -> str | None:
    """Why ``pairs/`` (or a pair folder in it) shows no period record, where the walk could
    not go in: a link, never followed, or a folder that cannot be listed; None otherwise."""
    if os.path.islink(root / "pairs"):  # (never walked: it is in no listing)
        return "pairs is a link, never followed"
    for rel in stray:
        if rel.count("/") > 1:  # (below a pair folder no period record can be)
            continue
        if os.path.islink(root / rel):
            return f"{rel} is a link, never followed"
        why = unlistable_reason(root / rel)
        if why is not None:
            return f"{rel} cannot be listed: {why}"
    return None


class _Seen:
    """What a shard saw of the whole study, as one digest: every period record (its path
    and bytes' digest) and the files walked below the attempt directories. The shards of
    one study read it at different times; one that saw a record rewritten (a requeued
    attempt sealed in between) or a file come would judge and assign the unlisted files
    by another study than the others (a merge then counted a listed file as unlisted,
    and one twice), so :func:`merge_parts` refuses parts that saw it differently."""

    def __init__(self, walked: dict[str, str]) -> None:
        self._hash = hashlib.sha256()
        for directory in sorted(walked):
            self._update(f"walked\0{directory}\0{walked[directory]}\n")

    def record(self, item: LoadedPeriod) -> None:
        digest = item.record_input.digest if item.record_input is not None else None
        self._update(f"record\0{item.record.path}\0{digest.sha256 if digest else '-'}\n")

    def _update(self, text: str) -> None:
        self._hash.update(text.encode("utf-8", "surrogatepass"))

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def _places(layout: StudyLayout, unlisted: list[FileTask], blocked: list[FileOutcome]
            ) -> dict[str, int]:
    """Each unlisted file's place in the walk's order (what the unlisted rows are sorted
    by), of the files ``unlisted`` (to hash) and ``blocked`` (not to open) name."""
    wanted = {task.display for task in unlisted} | {o.display for o in blocked}
    if not wanted:
        return {}
    return {rel: position for position, rel in enumerate(layout.attempt_files.paths())
            if rel in wanted}


def _batch_ranges(ends: Sequence[int], attempts: list[int], size: int) -> list[tuple[int, int]]:
    """The periods cut into batches of about ``size`` attempts each (``attempts``: each
    period's; a period without any counts as one), each cut at one of ``ends``
    (:func:`~auditor.reason.engine.batch_ends`): (first, past the last) of each."""
    ranges: list[tuple[int, int]] = []
    cuts = set(ends)
    start = 0
    held = 0
    for slot, count in enumerate(attempts):
        held += max(count, 1)
        if held >= size and slot + 1 in cuts:
            ranges.append((start, slot + 1))
            start, held = slot + 1, 0
    if start < len(attempts):
        ranges.append((start, len(attempts)))
    return ranges


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


def judge(parts: CollectedParts, options: AuditOptions
          ) -> Generator[Progress, None, AuditResult]:
    """Validate and reason over a collected study's parts (every shard's, merged), a
    period at a time: the audit's result."""
    units = sorted(parts.units, key=lambda unit: unit.index)
    fold = Fold(replace(parts, units=()),
                [unit.evidence.record.without_entries() for unit in units], options)
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
        if meta.get("seen_sha256") != first.get("seen_sha256"):
            raise UsageError("merge: the shards saw the study differently (a period record "
                             "or the files of an attempt directory changed between their "
                             f"audits: shards {first['shard'][0]} and {meta['shard'][0]}); "
                             "audit every shard again")
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
    for _, part in parts[1:]:  # (shards start apart: each must have listed the same files)
        if part.layout != base.layout:
            raise UsageError("merge: the parts listed the study's files differently (they "
                             "changed between the shards' audits): audit every shard again")
    units = [unit for _, part in parts for unit in part.units]
    if sorted(unit.index for unit in units) != list(range(base.periods_total)):
        raise UsageError(f"merge: the parts do not hold each of the study's "
                         f"{base.periods_total} periods once")
    records = base.layout.period_records
    for unit in units:  # (a unit's place is a period of the listing: its record, no other)
        if len(records) != base.periods_total \
                or unit.evidence.record.path != records[unit.index]:
            raise UsageError(f"merge: a part's period {unit.index} is "
                             f"{unit.evidence.record.path!r}, not the study's record at that "
                             "place: audit every shard again")
    return replace(base, units=tuple(units),
                   unlisted=tuple(item for _, part in parts for item in part.unlisted),
                   shard=None, seen_sha256=None)


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


def _resolve_root(root: Path) -> Path:
    if not root.exists():
        raise UsageError(f"{root}: evidence root does not exist")
    if not root.is_dir():
        raise UsageError(f"{root}: evidence root is not a directory")
    if not os.access(root, os.R_OK | os.X_OK):
        raise UsageError(f"{root}: evidence root cannot be read")
    return root.resolve()
