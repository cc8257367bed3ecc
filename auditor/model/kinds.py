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
    required: bool = False
    """Whether every attempt must list a file of it (``AUD107``): the four v1 kinds; the
    v1.2 kinds (process records, worker logs, idle results) are kept when there are any."""
    loose_compiled: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "loose_compiled", re.compile(self.loose))

    @property
    def shown(self) -> str:
        """The contract's name form with its folder:
        ``allocator-traces/allocator-<host>-<pid>.jsonl``."""
        return self.shown_form(host=True)

    def shown_form(self, *, host: bool) -> str:
        """The name form with its folder, with a host (v1.2) or without (v1) where the kind
        has both."""
        form = next((form for form in self.names
                     if ("host" in form.compiled.groupindex) == host), self.names[0])
        return form.shown if not self.directory else f"{self.directory}/{form.shown}"

    def path_for(self, **values: object) -> str:
        """The path below the attempt directory of a file of this kind: the first name form
        whose fields are all given (``host`` and ``pid``: the v1.2 name the kit writes;
        ``pid`` alone: the v1 one)."""
        given = set(values)
        for form in self.names:
            if set(form.compiled.groupindex) <= given:
                return form.template.format(**values)
        raise KeyError(f"{self.name}: no file name form takes {sorted(given)}")

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
        """The worker pid a per-worker file's name gives, or None."""
        worker = self.worker_of(path)
        return worker[1] if worker is not None else None

    def worker_of(self, path: str) -> tuple[str | None, int] | None:
        """(host, pid) of the worker a per-worker file's name gives (host None in a v1 name,
        which has none), or None. (Run for every listed file of a per-worker kind, twice:
        no dict of the other parts is made.)"""
        name = path[path.rfind("/") + 1:]
        for form in self.names:
            match = form.compiled.fullmatch(name)
            if match is not None:
                groups = form.compiled.groupindex
                pid = match.group("pid") if "pid" in groups else None
                if not pid:
                    return None
                return (match.group("host") if "host" in groups else None), int(pid)
        return None

    def names_loosely(self, relative: str) -> bool:
        """Whether ``relative`` (below the attempt directory) is in the kind's folder under a
        name it loosely has (see :attr:`loose`)."""
        folder, _, name = relative.rpartition("/")
        return folder == self.directory and self.loose_compiled.fullmatch(name) is not None


_NUMBER = r"\d{1,20}"
_HOST = r"(?![.-])[A-Za-z0-9_.-]*[A-Za-z_][A-Za-z0-9_.-]*?"
"""A host's name in a file name (contract v1.2): letters, digits, ``.``, ``_`` and ``-``,
not starting with ``.`` or ``-``, with at least one letter or ``_``, so a v1 name
(``allocator-42.jsonl``, ``worker-policy-0-42.json``) never reads as one with a host."""
_ROLE = r"[A-Za-z0-9_.]+"
"""A role in a name that also holds a host (``<host>-<role>-<pid>``): no ``-``, so a host's
own dashes (``gpu-node-17``) stay the host's."""

TRIAL = EvidenceKind(
    name="trial", title="trial record", directory="",
    names=(FileName("trial-{job}.json", r"trial-(?P<job>[^/]+)\.json", "trial-<job>.json"),),
    loose=r"trial-[^/]*\.json", schema="trial", per_worker=False, read_order=0, required=True,
)
TRAINING_LOG = EvidenceKind(
    name="training_log", title="training log", directory="",
    names=(FileName("training-{job}.log", r"training-(?P<job>[^/]+)\.log",
                    "training-<job>.log"),),
    loose=r"training-[^/]*\.log", schema=None, per_worker=False, read_order=4, required=True,
)
ALLOCATOR_TRACE = EvidenceKind(
    name="allocator_trace", title="allocator trace", directory="allocator-traces",
    names=(FileName("allocator-traces/allocator-{host}-{pid}.jsonl",
                    rf"allocator-(?P<host>{_HOST})-(?P<pid>{_NUMBER})\.jsonl",
                    "allocator-<host>-<pid>.jsonl"),
           FileName("allocator-traces/allocator-{pid}.jsonl",
                    rf"allocator-(?P<pid>{_NUMBER})\.jsonl", "allocator-<pid>.jsonl")),
    loose=r"allocator-[^/]*\.jsonl", schema="allocator-record",
    per_worker=True, read_order=3, required=True,
)
DEVICE_EVIDENCE = EvidenceKind(
    name="device_evidence", title="device evidence", directory="device-evidence",
    names=(FileName("device-evidence/worker-{role}-{rank}-{host}-{pid}.json",
                    rf"worker-(?P<role>.+?)-(?P<rank>{_NUMBER})-(?P<host>{_HOST})"
                    rf"-(?P<pid>{_NUMBER})\.json",
                    "worker-<role>-<rank>-<host>-<pid>.json"),
           FileName("device-evidence/worker-{role}-{rank}-{pid}.json",
                    rf"worker-(?P<role>.+)-(?P<rank>{_NUMBER})-(?P<pid>{_NUMBER})\.json",
                    "worker-<role>-<rank>-<pid>.json")),
    loose=r"worker-[^/]*\.json", schema="device", per_worker=True,
    read_order=2, required=True,
)
PROCESS_RECORD = EvidenceKind(
    name="process_record", title="process record", directory="processes",
    names=(FileName("processes/{host}-{role}-{pid}.json",
                    rf"(?P<host>{_HOST})-(?P<role>{_ROLE})-(?P<pid>{_NUMBER})\.json",
                    "<host>-<role>-<pid>.json"),),
    loose=r"[^/]*\.json", schema="process", per_worker=False, read_order=1,
)
"""One process of the attempt, written when it ended (contract v1.2: ``auditor run --step``,
or a launcher's own call): its role, host, pid, exit and signals."""
WORKER_LOG = EvidenceKind(
    name="worker_log", title="worker log", directory="worker-logs",
    names=(FileName("worker-logs/{host}-{role}-{pid}.out",
                    rf"(?P<host>{_HOST})-(?P<role>{_ROLE})-(?P<pid>{_NUMBER})\.(?:out|err)",
                    "<host>-<role>-<pid>.out"),
           FileName("worker-logs/{host}-{pid}.out",
                    rf"(?P<host>{_HOST})-(?P<pid>{_NUMBER})\.(?:out|err)", "<host>-<pid>.out"),
           FileName("worker-logs/{host}-rank{rank}.out",
                    rf"(?P<host>{_HOST})-rank(?P<rank>{_NUMBER})\.(?:out|err)",
                    "<host>-rank<r>.out")),
    loose=r"[^/]*\.(?:out|err)", schema=None, per_worker=False, read_order=6,
)
"""A worker's own output, kept apart from the driver's log (contract v1.2)."""
METRICS_LOG = EvidenceKind(
    name="metrics_log", title="metrics file", directory="metrics",
    names=(FileName("metrics/{name}", r"(?P<name>[^/]+)", "<name>"),),
    loose=r"[^/]+", schema=None, per_worker=False, read_order=7,
)
"""A file a trainer writes under ``metrics/`` (contract v1.2): a framework's JSON or JSON-lines
records (``trainer_state.json``, verl's file logger, ``trainer_log.jsonl``, an MLPerf log);
read for the record the protocol's JSON predicates describe (``collect/metrics.py``)."""
IDLE_CHECK = EvidenceKind(
    name="idle_check", title="idle check", directory="idle",
    names=(FileName("idle/{host}.json", rf"(?P<host>{_HOST}|{_NUMBER})\.json", "<host>.json"),),
    loose=r"[^/]*\.json", schema="idle-check", per_worker=False, read_order=5,
)
"""One node's post-period idle check (contract v1.2: ``auditor seal --idle-check-only``)."""

KINDS: Mapping[str, EvidenceKind] = {
    kind.name: kind for kind in (TRIAL, TRAINING_LOG, ALLOCATOR_TRACE, DEVICE_EVIDENCE,
                                 PROCESS_RECORD, WORKER_LOG, METRICS_LOG, IDLE_CHECK)
}
"""Every evidence kind the contract names, by its period-record word, in the contract's
order. A listed file of another kind is hash-checked only (``AUD018``)."""

TRACE_SOURCE = "trace"
"""The terminal-event source that is no file kind of its own: a rank's terminal record in its
allocator trace (``Trace.terminal``)."""
TERMINAL_SOURCES: tuple[str, ...] = (TRAINING_LOG.name, WORKER_LOG.name, METRICS_LOG.name,
                                     TRACE_SOURCE)
"""Where the terminal event may come from (contract v1.2, ``terminal_event.sources``), in
the order the audit looks."""

REQUIRED: tuple[EvidenceKind, ...] = tuple(kind for kind in KINDS.values() if kind.required)
"""The kinds every attempt must list a file of."""

DOCUMENT_LIMIT = 16 << 20
"""The largest JSON evidence document the audit parses (bytes): a period record, a trial
record, a device file, a process record, an idle check; ``auditor seal`` refuses to write a
period record the audit would refuse."""

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
