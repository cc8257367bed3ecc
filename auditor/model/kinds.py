"""Every evidence kind of an attempt directory, declared once, as data.

A kind is the word a period record's ``evidence[].kind`` holds (``allocator_trace``), where
its files live under the attempt directory and how they are named (each name form a pattern
with named parts, and a template that makes the name), the JSON Schema its content is checked
against, and what the period record must say of it (one file per attempt, or one per
worker named for its pid). Discovery, collection, validation, ``auditor seal`` and the study
generator read this table; none of them spells a kind's name or file name otherwise. Each
kind's reader is registered against its entry in :mod:`auditor.collect.kinds`; the producer
kit, which may not import the stages, reads the same table from here.

Adding a kind is one entry in :data:`KINDS`, one reader registered in
:mod:`auditor.collect.kinds`, and one test (``CONTRIBUTING.md`` has the recipe).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class FileName:
    """One form of a kind's file names, relative to the attempt directory."""

    template: str
    """How the kit names a file (``str.format`` fields), e.g.
    ``allocator-traces/allocator-{pid}.jsonl``."""
    pattern: str
    """What a name of this form is: a regular expression over the file's own name (its
    folder is the kind's), whose named groups are the template's fields (``pid``, ``rank``,
    ``role``, ``job``). A number of more than 20 digits (past 64 bits: no worker's, which
    a JSON number gives) makes no such name: a manifest naming a file for a pid of
    thousands of digits once crashed the audit turning it into a number."""
    shown: str
    """The form as the report and messages show it, e.g. ``allocator-<pid>.jsonl``."""
    compiled: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "compiled", re.compile(self.pattern))

    def parts(self, name: str) -> dict[str, str] | None:
        """The named parts of ``name`` (a file's own name) when it is a name of this form,
        else None."""
        match = self.compiled.fullmatch(name)
        return match.groupdict() if match is not None else None


@dataclass(frozen=True, slots=True)
class EvidenceKind:
    """One kind of evidence file an attempt directory holds."""

    name: str
    """The period record's ``evidence[].kind`` word, e.g. ``allocator_trace``."""
    title: str
    """What messages call a file of it, e.g. ``allocator trace``."""
    directory: str
    """The folder below the attempt directory its files live in (``""``: the attempt
    directory itself)."""
    names: tuple[FileName, ...]
    """Its name forms, the contract's first (the one the kit writes)."""
    loose: str
    """A looser pattern over a file's own name: what ``auditor seal`` lists as this kind
    (in :attr:`directory`) and ``auditor validate`` checks against :attr:`schema` even when
    the name is not one of :attr:`names` exactly (the audit then says what is wrong with the
    name, rather than calling the file no kind)."""
    schema: str | None
    """The JSON Schema its content is checked against (``<schema>.schema.json``); None for
    plain text."""
    per_worker: bool
    """True: one file per worker, named for its pid (the period record's ``workers`` each
    need one); False: one per attempt."""
    read_order: int
    """Where it is read among an attempt's files (lower first): the trial record first,
    since it names the dispatched step count the log's terminal event is matched against."""
    loose_compiled: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "loose_compiled", re.compile(self.loose))

    @property
    def shown(self) -> str:
        """The contract's name form with its folder: ``allocator-traces/allocator-<pid>.jsonl``."""
        return self.names[0].shown if not self.directory else \
            f"{self.directory}/{self.names[0].shown}"

    def path_for(self, **values: object) -> str:
        """The path below the attempt directory the kit writes a file of this kind to."""
        return self.names[0].template.format(**values)

    def parts(self, path: str) -> dict[str, str] | None:
        """The named parts of the file name of ``path`` (whatever its folder) in the first
        of the kind's name forms it matches, or None."""
        name = path.rsplit("/", 1)[-1]
        for form in self.names:
            found = form.parts(name)
            if found is not None:
                return found
        return None

    def pid_of(self, path: str) -> int | None:
        """The worker pid a per-worker file's name gives, or None. (Run for every listed
        file of a per-worker kind, twice: no dict of the other parts is made.)"""
        name = path[path.rfind("/") + 1:]
        for form in self.names:
            match = form.compiled.fullmatch(name)
            if match is not None:
                pid = match.group("pid") if "pid" in form.compiled.groupindex else None
                return int(pid) if pid else None
        return None

    def names_loosely(self, relative: str) -> bool:
        """Whether ``relative`` (below the attempt directory) is in the kind's folder under a
        name it loosely has (see :attr:`loose`)."""
        folder, _, name = relative.rpartition("/")
        return folder == self.directory and self.loose_compiled.fullmatch(name) is not None


_NUMBER = r"\d{1,20}"

TRIAL = EvidenceKind(
    name="trial", title="trial record", directory="",
    names=(FileName("trial-{job}.json", r"trial-(?P<job>[^/]+)\.json", "trial-<job>.json"),),
    loose=r"trial-[^/]*\.json", schema="trial", per_worker=False, read_order=0,
)
TRAINING_LOG = EvidenceKind(
    name="training_log", title="training log", directory="",
    names=(FileName("training-{job}.log", r"training-(?P<job>[^/]+)\.log",
                    "training-<job>.log"),),
    loose=r"training-[^/]*\.log", schema=None, per_worker=False, read_order=3,
)
ALLOCATOR_TRACE = EvidenceKind(
    name="allocator_trace", title="allocator trace", directory="allocator-traces",
    names=(FileName("allocator-traces/allocator-{pid}.jsonl",
                    rf"allocator-(?P<pid>{_NUMBER})\.jsonl", "allocator-<pid>.jsonl"),),
    loose=r"allocator-[^/]*\.jsonl", schema="allocator-record",
    per_worker=True, read_order=2,
)
DEVICE_EVIDENCE = EvidenceKind(
    name="device_evidence", title="device evidence", directory="device-evidence",
    names=(FileName("device-evidence/worker-{role}-{rank}-{pid}.json",
                    rf"worker-(?P<role>.+)-(?P<rank>{_NUMBER})-(?P<pid>{_NUMBER})\.json",
                    "worker-<role>-<rank>-<pid>.json"),),
    loose=r"worker-[^/]*\.json", schema="device", per_worker=True,
    read_order=1,
)

KINDS: Mapping[str, EvidenceKind] = {
    kind.name: kind for kind in (TRIAL, TRAINING_LOG, ALLOCATOR_TRACE, DEVICE_EVIDENCE)
}
"""Every evidence kind the contract names, by its period-record word, in the contract's
order. A listed file of another kind is hash-checked only (``AUD018``)."""

OTHER = "other"
"""The kind of a file whose name says none (``auditor seal``), or of one no reader parses."""


def kind_of(relative: str) -> str:
    """The kind a file's path below the attempt directory names (``other`` when none):
    what ``auditor seal`` lists it as."""
    return next((kind.name for kind in KINDS.values() if kind.names_loosely(relative)), OTHER)


PER_WORKER: tuple[EvidenceKind, ...] = tuple(sorted(
    (kind for kind in KINDS.values() if kind.per_worker), key=lambda kind: kind.read_order))
"""The kinds with one file per worker, named for its pid, in their read order (device
evidence, then the allocator trace: the order a worker's missing files are reported)."""
