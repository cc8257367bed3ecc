"""The types every finding, citation and verdict word is made of.

Nothing here imports a stage or does I/O. :class:`Finding` carries the values its message
was rendered from, so no code ever parses a message back into data; :class:`Reason` is the
closed set of verdict reasons the contract names.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

_R = TypeVar("_R")


INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
"""The range of every integer the evidence may hold (a signed 64-bit integer: what the tables
hold); a value past it is a finding, never a crash where the tables are written."""
CLOCK_SLACK_NS = 60 * 1_000_000_000
"""How far two nodes' clocks may disagree (and a step the scheduler ended outlive the batch
by its KillWait): an idle check timed before the end, a process record or a trace on
another node outside the invocation, a kill on another node after the controller's end,
each is judged within it."""


class Severity(StrEnum):
    """How much a finding matters to the verdict of its subject."""

    ERROR = "error"
    """The subject cannot be trusted as it stands (it blocks ``resolved``)."""
    WARNING = "warning"
    """Worth a reviewer's attention; does not block a verdict by itself."""
    INFO = "info"
    """A fact the diagnosis relies on (e.g. a coordinated shutdown was seen)."""


@dataclass(frozen=True, slots=True)
class Citation:
    """Where a claim comes from: a file, and a place inside it."""

    path: str
    """File path relative to the evidence root (POSIX), or the path as given for inputs
    outside it (``--sacct``, ``--protocol-input``)."""
    line: int | None = None
    """1-based line number in a text or JSONL file."""
    pointer: str | None = None
    """JSON pointer (RFC 6901) inside a JSON document, e.g. ``/invocation/exit_code``."""
    quote: str = ""
    """A short verbatim excerpt (clipped) of what is cited."""

    def locator(self) -> str:
        """``path:line`` or ``path#pointer`` (or the bare path)."""
        if self.line is not None:
            return f"{self.path}:{self.line}"
        if self.pointer:
            return f"{self.path}#{self.pointer}"
        return self.path


@dataclass(frozen=True, slots=True)
class Finding:
    """One observation produced by a rule, with the evidence it rests on."""

    rule_id: str
    """Stable id from the rule table (:mod:`auditor.rules`), e.g. ``AUD201``."""
    symbol: str
    """Stable kebab-case name of the rule, e.g. ``terminal-event-missing``."""
    severity: Severity
    """Taken from the rule."""
    subject: str
    """What the finding is about: ``pair/period-N``, a file path, ``study`` or a config."""
    message: str
    """The rule's template rendered with the finding's values."""
    citations: tuple[Citation, ...] = ()
    """The evidence; empty only for findings about absent things (cited by their
    expected location instead, see ``Citation.path``)."""
    values: tuple[tuple[str, Any], ...] = ()
    """The values the message was rendered from (``name``, value), in the order given:
    what code reads instead of parsing ``message`` (see :meth:`value`)."""

    def value(self, name: str, default: Any = None) -> Any:
        """The value ``name`` the message was rendered from, or ``default``."""
        return next((value for key, value in self.values if key == name), default)


class Reason(StrEnum):
    """The one stable word a verdict gives as its reason (the contract's, plus
    ``completed`` and ``eligible_failure`` for the verdicts that resolve)."""

    COMPLETED = "completed"
    ELIGIBLE_FAILURE = "eligible_failure"
    TERMINAL_EVENT_MISSING = "terminal_event_missing"
    COMPLETION_PHASE_MISSING = "completion_phase_missing"
    EVIDENCE_MISSING = "evidence_missing"
    EVIDENCE_MISMATCH = "evidence_mismatch"
    EVIDENCE_UNSAFE = "evidence_unsafe"
    EVIDENCE_UNREADABLE = "evidence_unreadable"
    EVIDENCE_INVALID = "evidence_invalid"
    PERIOD_RECORD_UNREADABLE = "period_record_unreadable"
    IDENTITY_MISMATCH = "identity_mismatch"
    TIMELINE_INCONSISTENT = "timeline_inconsistent"
    IDLE_CHECK_FAILED = "idle_check_failed"
    COMMIT_MISMATCH = "commit_mismatch"
    ARRAY_PARTIAL = "array_partial"
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"
    TIME_LIMIT = "time_limit"
    KILLED = "killed"
    UNCLEAN_EXIT = "unclean_exit"
    INFRASTRUCTURE_FAILURE = "infrastructure_failure"


NEEDS: dict[Reason, str] = {
    Reason.TERMINAL_EVENT_MISSING: "a rerun or a waiver",
    Reason.COMPLETION_PHASE_MISSING: "a rerun or a waiver",
    Reason.EVIDENCE_MISSING: "an evidence fix",
    Reason.EVIDENCE_MISMATCH: "an evidence fix",
    Reason.EVIDENCE_UNSAFE: "an evidence fix",
    Reason.EVIDENCE_UNREADABLE: "an evidence fix",
    Reason.EVIDENCE_INVALID: "an evidence fix",
    Reason.PERIOD_RECORD_UNREADABLE: "an evidence fix",
    Reason.IDENTITY_MISMATCH: "an evidence fix",
    Reason.TIMELINE_INCONSISTENT: "an evidence fix",
    Reason.IDLE_CHECK_FAILED: "a rerun",
    Reason.COMMIT_MISMATCH: "a rerun at the pinned commit",
    Reason.ARRAY_PARTIAL: "the scheduler to finish it",
    Reason.CANCELLED: "a rerun",
    Reason.PREEMPTED: "a rerun",
    Reason.TIME_LIMIT: "a rerun with more time",
    Reason.KILLED: "a rerun",
    Reason.UNCLEAN_EXIT: "a rerun",
    Reason.INFRASTRUCTURE_FAILURE: "a rerun",
}
"""What an unresolved period needs before it can resolve, by its reason (the report's
line per unresolved period): a rerun, an evidence fix, a waiver, or waiting."""

ENDED_LIMITS: dict[Reason | None, str] = {
    None: "An infrastructure failure ends the attempt before it can measure anything; the "
          "period needs a new run to resolve.",
    Reason.CANCELLED: "A cancelled attempt ends before it can measure anything; it is neither "
                      "a completion nor an eligible failure, and the period needs a new run to "
                      "resolve.",
    Reason.TIME_LIMIT: "An attempt its time limit ended says nothing about whether the "
                       "configuration fits; it is neither a completion nor an eligible "
                       "failure, and the period needs a new run, with more time, to resolve.",
    Reason.PREEMPTED: "A preempted or requeued attempt ends before it can measure anything; "
                      "the period needs a new run to resolve.",
}
"""What an attempt the scheduler or the machine ended does not prove, by the reason its end
gives (None: a node, memory, a GPU, storage, the network...); the words the report's limits
say."""


class VerdictKind(StrEnum):
    """The three verdicts of the contract."""

    RESOLVED = "resolved"
    FAILED = "failed"
    UNRESOLVED = "unresolved"


class Outcome(StrEnum):
    """How one attempt was judged: it ``completed`` (a resolved period's), ``failed`` (a
    measured, eligible failure) or stays ``unresolved``."""

    COMPLETED = "completed"
    FAILED = "failed"
    UNRESOLVED = "unresolved"


class ExitKind(StrEnum):
    """How an attempt's invocation ended, from its trial record (:mod:`auditor.reason.exits`)."""

    CLEAN = "clean"
    """Exit 0, every recorded process too."""
    COORDINATED_SHUTDOWN = "coordinated_shutdown"
    """Seed 000's excused 143: the controller's own, under its flag, no signal received."""
    SIGNALLED = "signalled"
    """The batch script received a signal: never a success."""
    SIGKILL = "sigkill"
    SIGTERM = "sigterm"
    """Exit 143 not excused."""
    KILLED = "killed"
    """Killed by another signal."""
    FAILURE = "failure"
    """A non-zero exit."""
    PROCESS_FAILURE = "process_failure"
    """Invocation exit 0, but a recorded process failed."""
    UNKNOWN = "unknown"
    """No exit code recorded."""


class CauseWord(StrEnum):
    """What ended a period that did not complete (contract v1.1, "Causes"): one stable word;
    renaming one is a contract change."""

    NODE_FAILURE = "node_failure"
    PREEMPTED = "preempted"
    TIME_LIMIT = "time_limit"
    CANCELLED = "cancelled"
    HOST_OOM = "host_oom"
    GPU_OOM = "gpu_oom"
    SEGFAULT = "segfault"
    SIGNAL = "signal"
    ACTOR_DIED = "actor_died"
    PYTHON_EXCEPTION = "python_exception"
    NCCL = "nccl"
    CHILD_FAILED = "child_failed"
    ABORTED = "aborted"
    """The trainer recorded its own abort (contract v1.2: an MLPerf ``run_stop`` with status
    ``aborted``)."""
    GPU_ERROR = "gpu_error"
    """A GPU or driver fault other than out-of-memory (illegal memory access, unspecified
    launch failure, uncorrectable ECC, an Xid)."""
    RENDEZVOUS = "rendezvous"
    """The distributed job never formed (elastic rendezvous, TCP-store timeouts)."""
    RAY_SYSTEM = "ray_system"
    """Ray's control plane failed (GCS unreachable or lost)."""
    STORAGE = "storage"
    """The run could not write its files (no space, quota, a truncated checkpoint write)."""
    NAN_LOSS = "nan_loss"
    """The trainer aborted on numerical divergence."""
    ENGINE_DEAD = "engine_dead"
    """The rollout or inference engine died under the trainer (its output holds the root
    cause)."""
    NETWORK = "network"
    """A remote service refused at start (HTTP 429, a connection that never opened)."""
    UNKNOWN = "unknown"
    """Nothing in the evidence says what ended the attempt."""


@dataclass(frozen=True, slots=True)
class Progress:
    """A progress event: ``done`` of ``total`` units of ``stage``, ``bytes`` read so far.

    The stages, in order: ``list`` (the walk of the study: top-level directories listed),
    ``periods`` (period records read), ``read`` (evidence files read and hashed, with their
    bytes), ``validate`` and ``reason`` (one event each, as they start)."""

    stage: str
    done: int
    total: int
    bytes: int = 0
