"""Plan the reading: path-check every listed file and build one read task per attempt.

Files that cannot be opened safely (unsafe, missing, unreadable) get their evidence row
here, before any byte is read; the rest become :class:`~auditor.model.FileTask` items of an
:class:`~auditor.model.AttemptTask`. Files on disk that no period record lists are read
too (hashed only), so ``auditor verify`` re-checks them.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Iterator
from pathlib import Path

from auditor.collect.kinds import READERS
from auditor.collect.paths import PathCheck, check_path
from auditor.model import (
    AttemptSpec,
    AttemptTask,
    EvidenceEntry,
    EvidenceFile,
    FileDigest,
    FileOutcome,
    FileTask,
    PeriodRecord,
    Protocol,
    StudyLayout,
)
from auditor.model.kinds import OTHER


def plan_reads(
    root: Path, periods: Iterable[tuple[int, PeriodRecord, Container[str]]],
    protocol: Protocol, pre: dict[str, list[EvidenceFile]],
) -> Iterator[AttemptTask]:
    """Path-check every listed file; one read task per attempt of the ``periods`` (each
    with its place among the study's records, and which of the paths it names the walk
    saw as regular files: those are not looked at again), made as it is wanted (a study's
    tasks need not all exist at once).

    The evidence rows decided before reading (unsafe, missing, unreadable) go to ``pre``,
    by the attempt's key (:meth:`~auditor.model.PeriodRecord.attempt_key`, with the
    record's place), as its task is made; readable files get their row after."""
    for position, record, regular_files in periods:
        for spec in record.attempts:
            key = record.attempt_key(spec.index, position)
            rows: list[EvidenceFile] = []
            files: list[FileTask] = []
            for entry in spec.evidence:
                check: PathCheck = check_path(root, spec.attempt_dir or "", entry.path,
                                              known_regular=regular_files)
                if check.status != "ok" or check.resolved is None:
                    rows.append(evidence_row(record, spec, entry, check.display, check.status,
                                             check.why))
                else:
                    kind = entry.kind if entry.kind in READERS else OTHER
                    # (the usual path, the root's and the display's, is made by the reader)
                    resolved = None if check.resolved == f"{root}/{check.display}" \
                        else check.resolved
                    files.append(FileTask(check.display, kind, resolved, entry.size))
            pre[key] = rows
            yield AttemptTask(key, str(root), tuple(files), protocol.steps_from,
                              protocol.terminal_pattern, protocol.terminal_sources,
                              protocol.terminal, (protocol.coordinated_shutdown_flag,
                                                  protocol.steps_from))


def evidence_row(record: PeriodRecord, spec: AttemptSpec, entry: EvidenceEntry, display: str,
         status: str, detail: str = "", digest: FileDigest | None = None) -> EvidenceFile:
    """The evidence row of one listed file (``digest``: what reading it gave)."""
    actual = None if digest is None else digest.sha256
    if actual is not None and actual == entry.sha256:
        actual = entry.sha256  # one copy of the digest text kept, not two
    return EvidenceFile(
        display, entry.kind, record.pair, record.period, spec.index, spec.job_id, record.path,
        entry.sha256, entry.size, actual, digest.size if digest else None, status, detail,
    )


def plan_unlisted(root: Path, layout: StudyLayout, unnamed: dict[str, str]
                  ) -> tuple[list[FileTask], list[FileOutcome]]:
    """The files below the layout's attempt directories that no period record lists
    (``unnamed``: each directory's files below it that no record names, NUL-joined in the
    walk's order: :meth:`~auditor.model.Listing.strike`), in the layout's order: those to
    hash, and those that may not be opened (a link out of the root), with why."""
    unlisted: list[FileTask] = []
    blocked: list[FileOutcome] = []
    listing = layout.attempt_files
    for directory in listing:
        for rel in listing.paths_in(directory, unnamed.get(directory, "")):
            if rel not in listing.irregular:  # (its name as it is: never re-read as a
                # manifest path, whose backslashes would be separators)
                unlisted.append(FileTask(rel, "other", f"{root}/{rel}"))
                continue
            check = check_path(root, rel)  # (a link, or what lies behind one)
            if check.status == "ok" and check.resolved is not None:
                unlisted.append(FileTask(rel, "other", check.resolved))
            else:  # never open a link that leads out of the root
                blocked.append(FileOutcome(rel, "other", None,
                                           f"{check.status} {check.why}".strip()))
    return unlisted, blocked
