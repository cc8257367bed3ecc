"""Read the study's own inputs, each hashed as it is parsed: period records, the protocol,
the commit pins, the scheduler's dump, and the protocol and source inputs named on the
command line.

Each reader opens only a path the path checks let through, records the input's digest for
the output manifest, and turns what is wrong with it into findings (a dump named by
``--sacct`` that cannot be read at all is the one usage error).
"""

from __future__ import annotations

import errno
import io
import os
import pickle
from collections.abc import Callable, Container, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO, TypeVar

from auditor._io import Beneath, Bounded, HashingReader, open_reason, sha256_file
from auditor.collect.discover import SACCT_PATH
from auditor.collect.paths import check_path
from auditor.collect.period import read_period
from auditor.collect.sacct import parse_sacct
from auditor.errors import InputError, SacctFormatError
from auditor.model import (
    AuditOptions,
    Citation,
    EvidenceEntry,
    Finding,
    InputFile,
    PeriodRecord,
    SacctDump,
)
from auditor.model.paths import join_text
from auditor.rules import finding
from auditor.store import pickles_fast

R = TypeVar("R")


def read_input(root: Path, rel: str, reader_fn: Callable[[HashingReader, str], R],
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
        with Beneath(str(root)) as beneath, _opened(beneath, check.resolved) as handle:
            reader = HashingReader(handle)
            record = reader_fn(reader, rel)
            reader.drain()
            problem = handle.problem()
    except OSError as error:
        problem = open_reason(error)
    if problem:
        findings.append(finding("AUD011" if rel.startswith("pairs/") else "AUD014",
                                rel, [Citation(rel)], error=problem))
        return None
    inputs.append(InputFile("raw_evidence", rel, check.resolved, reader.digest()))
    return record


def _opened(beneath: Beneath, resolved: str) -> Bounded:
    """The checked file at ``resolved`` opened below the root without following a link."""
    rel = beneath.relative(resolved)
    if rel is None:
        raise OSError(errno.EXDEV, "resolves outside the root")
    return beneath.open(rel)


@contextmanager
def _dump(root: Path, path: Path, group: str) -> Iterator[Bounded | BinaryIO]:
    """The scheduler's dump opened: the root's own below the root without following a
    link; one named on the command line as the user named it."""
    if group != "raw_evidence":
        with open(path, "rb") as handle:
            yield handle
        return
    with Beneath(str(root)) as beneath, _opened(beneath, str(path)) as bounded:
        yield bounded


def load_period(task: tuple[str, str, bool]
                 ) -> tuple[PeriodRecord, InputFile | None, list[Finding]]:
    """Read one period record (a pool task: root, path, whether the walk saw a regular
    file): the record (kept from its path when it cannot be read at all), its
    input-manifest entry, and findings about opening it."""
    root, rel, regular = task
    inputs: list[InputFile] = []
    problems: list[Finding] = []
    period = read_input(Path(root), rel, read_period, inputs, problems, regular)
    if period is None:  # unsafe or unreadable: kept from its path, with that reason only
        # (not the "file is empty" of the placeholder it is read from)
        period = replace(read_period(HashingReader(io.BytesIO(b"")), rel),
                         findings=tuple(problems))
        problems = []
    return period, (inputs[0] if inputs else None), problems


@pickles_fast
@dataclass(frozen=True, slots=True)
class LoadedPeriod:
    """A period record as a worker read it (:func:`load_period_packed`), for the process
    that plans the reading: the record without its manifest entries (what judging the
    study needs, and holds to the end), the entries packed in one ``bytes`` (unpacked by
    :func:`unpack_entries` only when the period's reads are planned), how many files and
    bytes they list, the root-relative paths they name (what tells the unlisted files),
    the record's input-manifest entry and the problems opening it; once the walk has
    struck off the paths named (:attr:`listed` emptied), :attr:`not_regular`: those of
    them the walk did not see as regular files, each checked on disk when planned.

    A million files' entries as records were about 0.6 GB in that process before a byte
    of evidence was read: its peak, through what the allocator keeps of them after."""

    record: PeriodRecord
    entries: bytes
    files: int
    size: int
    listed: tuple[str, ...]
    record_input: InputFile | None
    problems: tuple[Finding, ...]
    not_regular: frozenset[str] = frozenset()

    def known_regular(self) -> Container[str]:
        """The paths this record names that the walk saw as regular files reached through
        real directories only (what :func:`~auditor.collect.paths.check_path` need not
        stat): every one but :attr:`not_regular`."""
        return _AllBut(self.not_regular)


class _AllBut(Container[str]):
    """Every text but ``excluded`` (asked only of the paths one record names)."""

    __slots__ = ("excluded",)

    def __init__(self, excluded: frozenset[str]) -> None:
        self.excluded = excluded

    def __contains__(self, text: object) -> bool:
        return text not in self.excluded


def load_period_packed(task: tuple[str, str, bool]) -> LoadedPeriod:
    """:func:`load_period`, its manifest entries packed (:class:`LoadedPeriod`)."""
    record, record_input, problems = load_period(task)
    if record_input is not None and record_input.digest == record.digest:
        record_input = replace(record_input, digest=record.digest)  # (one object, not two)
    entries = tuple(spec.evidence for spec in record.attempts)
    listed = tuple(joined for spec in record.attempts for entry in spec.evidence
                   if (joined := join_text(spec.attempt_dir or "", entry.path)) is not None)
    files = sum(len(given) for given in entries)
    return LoadedPeriod(
        record.without_entries() if files else record,
        pickle.dumps(entries, pickle.HIGHEST_PROTOCOL) if files else b"", files,
        sum(entry.size or 0 for given in entries for entry in given), listed,
        record_input, tuple(problems))


def unpack_entries(loaded: LoadedPeriod) -> PeriodRecord:
    """The whole record of ``loaded``: its manifest entries back in its attempts."""
    if not loaded.entries:
        return loaded.record
    entries: tuple[tuple[EvidenceEntry, ...], ...] = pickle.loads(loaded.entries)  # noqa: S301
    return loaded.record.with_entries(entries)


def read_sacct(task: tuple[Path, str | None, AuditOptions]
                ) -> tuple[SacctDump | None, str | None, list[InputFile], list[Finding]]:
    """Parse the scheduler's dump (a pool task: the resolved root, the root's own dump if it
    has one, the options): the dump, how it is shown, its input-manifest entry and the
    findings about it. A dump named by ``--sacct`` that cannot be read raises."""
    root, rel, options = task
    inputs: list[InputFile] = []
    findings: list[Finding] = []
    named = options.sacct
    if named is not None and (inside := _below(root, named)) is not None:
        named, rel = None, inside  # (a file under the root is read as the root's own)
    if named is not None:
        path = named
        display = os.path.abspath(path)  # (however it was typed: one study, one name)
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
        with _dump(root, path, group) as handle:
            reader = HashingReader(handle)
            try:
                dump = parse_sacct(
                    reader, display, options.sacct_format, options.sacct_delimiter
                )
            except SacctFormatError as error:
                if named is not None:
                    raise
                reader.drain()
                findings.append(finding("AUD009", display, [Citation(display)],
                                        error=str(error).removeprefix(f"{display}: ")))
                inputs.append(InputFile(group, display, os.path.abspath(path), reader.digest()))
                return None, display, inputs, findings
            reader.drain()
            if isinstance(handle, Bounded) and (problem := handle.problem()):
                raise OSError(errno.EIO, problem)
    except OSError as error:
        if named is not None:
            raise InputError(f"{path}: cannot read sacct dump: {error.strerror}") from None
        findings.append(finding("AUD009", display, [Citation(display)],
                                error=f"cannot read: {open_reason(error)}"))
        return None, display, inputs, findings
    inputs.append(InputFile(group, display, os.path.abspath(path), reader.digest()))
    findings.extend(dump.findings)
    findings.extend(field_findings(dump, display))
    return dump, display, inputs, findings


def _below(root: Path, named: Path) -> str | None:
    """The root-relative path of a dump named on the command line that lies under the root
    (as typed, or through the links of the folders above it), else None."""
    typed = os.path.abspath(named)
    for place in (typed, os.path.join(os.path.realpath(os.path.dirname(typed)),
                                      os.path.basename(typed))):
        relative = os.path.relpath(place, root)
        if relative not in (".", "..") and not relative.startswith("../"):
            return Path(relative).as_posix()
    return None


def field_findings(dump: SacctDump, display: str) -> list[Finding]:
    """What the dump's captured fields leave unknown: ``AUD021`` without JobID or State
    (:data:`SACCT_STATES`), ``AUD019`` without another field the audit uses
    (:data:`SACCT_NEEDS`)."""
    findings = []
    captured = {field.lower() for field in dump.fields}
    if {"start", "end"} <= captured:
        captured.add("elapsed")  # (without ElapsedRaw, the reader takes End minus Start)
    for rule, needs in (("AUD021", SACCT_STATES), ("AUD019", SACCT_NEEDS)):
        lacking = [(name, why) for names, name, why in needs if not captured & names]
        if lacking:
            findings.append(finding(
                rule, display, [Citation(display)],
                fields=", ".join(name for name, _ in lacking),
                consequence="; ".join(dict.fromkeys(why for _, why in lacking))))
    if dump.gpus_untracked and "alloctres" in captured:
        findings.append(finding(
            "AUD019", display, [Citation(display)], fields="a GPU (gres/gpu) in AllocTRES",
            consequence="the GPUs each element held are unknown (no row names one: the "
            "site's AccountingStorageTRES may not track gres/gpu)"))
    return findings


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


def pair_link_hides_periods(root: Path, rel: str) -> bool:
    """Whether ``pairs/<name>``, a link, may stand for a pair directory the audit does not
    see: it leads out of the root, nowhere, or to a directory outside ``pairs/`` (a link to
    a file, or to a pair directory audited in its own place, hides nothing)."""
    target = os.path.realpath(root / rel)
    inside = target.startswith(f"{root}{os.sep}")
    if inside and os.path.isfile(target):
        return False
    return not (inside and os.path.isdir(target)
                and os.path.dirname(target) == os.path.join(root, "pairs"))


def read_commits(
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
        # (one object for each commit: a study pins most pairs to one, and a million
        # files' 55,556 pins held 55,556 copies of it, 5 MB through the audit)
        share: dict[str, str] = {}
        return {str(k): share.setdefault(v, v) for k, v in mapping.items()
                if isinstance(v, str)}

    result: dict[str, str] | None = read_input(root, rel, parse, inputs, findings)
    return result


def read_protocol_inputs(options: AuditOptions, inputs: list[InputFile],
                         findings: list[Finding]) -> None:
    """Hash the ``--protocol-input`` files (one that cannot be read raises) and the
    ``--source`` files under ``--source-root`` (one that cannot is an ``AUD122``)."""
    for name, path in options.protocol_inputs:
        try:
            digest = sha256_file(str(path))
        except OSError as error:
            raise InputError(
                f"--protocol-input {name}={path}: cannot read ({error.strerror})"
            ) from None
        inputs.append(InputFile("protocol_inputs", name, str(path.resolve()), digest))
    if options.source_root is not None:
        source_root = options.source_root.resolve()
        for rel in options.sources:
            check = check_path(source_root, rel)
            if check.status != "ok" or check.resolved is None:
                findings.append(finding("AUD122", rel, [Citation(rel)],
                                        problem=f"{check.status} {check.why}".strip()))
                continue
            inputs.append(InputFile("source_inputs", rel, check.resolved,
                                    sha256_file(check.resolved)))
