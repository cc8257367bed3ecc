"""The model layer: frozen types every stage shares. It imports no stage and does no I/O.

- :mod:`auditor.model.core` -- :class:`Finding` (with the values its message was rendered
  from), :class:`Citation`, :class:`Severity`, the verdict words :class:`Reason` and
  :class:`VerdictKind`, :class:`Progress`;
- :mod:`auditor.model.evidence` -- what the collectors read: period, trial, device, trace,
  log, protocol and sacct records;
- :mod:`auditor.model.kinds` -- every evidence kind of an attempt directory as data (its
  word, folder, file names, schema; :data:`~auditor.model.kinds.KINDS`);
- :mod:`auditor.model.study` -- :class:`AuditOptions`, the read tasks, :class:`Collected`;
- :mod:`auditor.model.results` -- verdicts, attempts, configurations, accounting, the gate,
  :class:`Reasoning` and :class:`AuditResult`, the only thing reporters see.

Every name is importable from ``auditor.model`` itself. Each frozen dataclass of these
modules is given a faster ``__init__`` as the package is imported
(:mod:`auditor.model.construct`): the same arguments, defaults and values.
"""

from __future__ import annotations

from auditor.model import core, evidence, kinds, presets, results, study
from auditor.model.construct import quick_init
from auditor.model.core import (
    CLOCK_SLACK_NS,
    ENDED_LIMITS,
    INT64_MAX,
    INT64_MIN,
    NEEDS,
    CauseWord,
    Citation,
    ExitKind,
    Finding,
    Outcome,
    Progress,
    Reason,
    Severity,
    VerdictKind,
)
from auditor.model.evidence import (
    DEFAULT_PROTOCOL,
    SLURM_STATE_FLAGS,
    SLURM_STATES,
    UNFINISHED_STATES,
    AllocatorTrace,
    AttemptSpec,
    Configuration,
    DeviceEvidence,
    EligibleFailure,
    EvidenceEntry,
    FileDigest,
    HostIdle,
    IdleCheck,
    LogEvent,
    PeriodRecord,
    PhaseRecord,
    ProcessExit,
    Protocol,
    SacctDump,
    SacctJob,
    SacctStep,
    TraceDigest,
    TrainingLogScan,
    TrialRecord,
    Worker,
    completes_cleanly,
    phases_reached,
)
from auditor.model.results import (
    TABLES,
    TIMELINE_PERIODS,
    Accounting,
    AttemptOutcome,
    AuditResult,
    Cause,
    ConfigurationResult,
    ElementCost,
    GateReason,
    GateResult,
    PeriodFacts,
    Reasoning,
    Verdict,
    WaiverUse,
)
from auditor.model.study import (
    HASHED_STATUSES,
    AttemptEvidence,
    AttemptRead,
    AttemptSummary,
    AttemptTask,
    AuditOptions,
    Collected,
    CollectedParts,
    EvidenceFile,
    EvidenceRows,
    FileOutcome,
    FileTask,
    InputFile,
    Listing,
    PeriodEvidence,
    PeriodSummary,
    PeriodUnit,
    StudyLayout,
    TableRows,
    Waiver,
    input_order,
)

__all__ = [
    "CLOCK_SLACK_NS", "DEFAULT_PROTOCOL", "ENDED_LIMITS", "HASHED_STATUSES", "INT64_MAX",
    "INT64_MIN", "NEEDS",
    "SLURM_STATE_FLAGS", "SLURM_STATES", "UNFINISHED_STATES",
    "Accounting", "AllocatorTrace",
    "AttemptEvidence", "AttemptOutcome", "AttemptRead", "AttemptSpec", "AttemptSummary",
    "AttemptTask",
    "AuditOptions", "AuditResult", "Cause", "CauseWord", "Citation", "Collected", "CollectedParts",
    "Configuration", "ConfigurationResult", "DeviceEvidence", "ElementCost",
    "EligibleFailure", "EvidenceEntry", "EvidenceFile", "EvidenceRows", "ExitKind", "FileDigest",
    "FileOutcome", "FileTask", "Finding", "GateReason", "GateResult", "HostIdle", "IdleCheck",
    "InputFile", "Listing", "LogEvent", "Outcome", "PeriodEvidence", "PeriodFacts", "PeriodRecord",
    "PeriodSummary", "PeriodUnit",
    "PhaseRecord", "ProcessExit", "Progress", "Protocol", "Reason", "Reasoning",
    "SacctDump", "SacctJob", "SacctStep", "Severity", "StudyLayout", "TABLES",
    "TIMELINE_PERIODS", "TableRows",
    "TraceDigest", "TrainingLogScan", "TrialRecord", "Verdict", "VerdictKind", "Waiver",
    "WaiverUse", "Worker", "completes_cleanly", "input_order",
    "phases_reached",
]


for _module in (core, evidence, kinds, presets, results, study):
    for _item in list(vars(_module).values()):
        if isinstance(_item, type) and _item.__module__ == _module.__name__:
            quick_init(_item)
del _module, _item
