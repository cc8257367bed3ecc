"""Hand-built model values for the reason stage's unit tests: a study, a period and its
attempt, as the collectors would hand them on, with no study on disk.

Each builder takes the few knobs a test varies (exit code, signal, log events, phases)
and fills the rest with a consistent, clean attempt: two ranks whose allocator traces
hold ``actor_update`` then ``weight_sync`` at the final step, a training log with the
terminal event, a trial that exited 0, and verified evidence rows.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path

from auditor.model import (
    DEFAULT_PROTOCOL,
    TIMELINE_PERIODS,
    AllocatorTrace,
    AttemptEvidence,
    AttemptOutcome,
    AttemptRead,
    AttemptSpec,
    Collected,
    DeviceEvidence,
    EvidenceEntry,
    EvidenceFile,
    ExitKind,
    Finding,
    IdleCheck,
    LogEvent,
    Outcome,
    PeriodEvidence,
    PeriodRecord,
    PhaseRecord,
    ProcessExit,
    Protocol,
    Reason,
    SacctDump,
    SacctJob,
    StudyLayout,
    TrainingLogScan,
    TrialRecord,
    Verdict,
    VerdictKind,
    Worker,
)
from auditor.reason.verdict import Context

PAIR = "host-m-gsm8k-c2-s161"
SUBJECT = f"{PAIR}/period-1"
RECORD = f"pairs/{PAIR}/period-1.json"
ATTEMPT_DIR = f"{PAIR}/attempt-7000001"
JOB = "7000001"
STEPS = 20
PIDS = (4101, 4102)
TRIAL = f"{ATTEMPT_DIR}/trial-{JOB}.json"
LOG = f"{ATTEMPT_DIR}/training-{JOB}.log"
SACCT = "accounting/sacct-raw.psv"
T0 = 1_700_000_000 * 10**9
"""When the invocation started (it ran 600 s; the allocation 700 s from the same second)."""


def trace_path(pid: int) -> str:
    """Where the allocator trace of worker ``pid`` sits."""
    return f"{ATTEMPT_DIR}/allocator-traces/allocator-{pid}.jsonl"


def device_path(rank: int, pid: int) -> str:
    """Where the device file of worker ``rank``/``pid`` sits."""
    return f"{ATTEMPT_DIR}/device-evidence/worker-policy-{rank}-{pid}.json"


def phase(pid: int, rank: int, name: str, line: int, *, step: int | None = STEPS,
          start: int = 0, error: str = "") -> PhaseRecord:
    """One phase record of rank ``rank``'s trace, ``start`` ns into the invocation."""
    return PhaseRecord(trace_path(pid), line, pid, rank, "policy", line, name, step,
                       T0 + start, T0 + start + 10, error, "out of memory" if error else "",
                       None, None)


def completed_phases(pid: int, rank: int) -> tuple[PhaseRecord, ...]:
    """``actor_update`` then ``weight_sync`` at the final step, without error."""
    return (phase(pid, rank, "actor_update", 1, start=100),
            phase(pid, rank, "weight_sync", 2, start=200))


def trace(pid: int, phases: Sequence[PhaseRecord] = (), findings: Iterable[Finding] = (),
          samples: int = 1) -> AllocatorTrace:
    """An allocator trace holding ``phases``."""
    return AllocatorTrace(trace_path(pid), len(phases) + samples, tuple(phases), samples,
                          None, None, ((pid, 1),), (), T0, T0 + 1_000, tuple(findings))


def event(kind: str, line: int, detail: str = "") -> LogEvent:
    """A training-log event."""
    return LogEvent(kind, line, f"{kind} at line {line}", detail)


def log(*, terminal: bool = True, events: Sequence[LogEvent] = (),
        findings: Iterable[Finding] = ()) -> TrainingLogScan:
    """A training log scan: the terminal event for :data:`STEPS` unless ``terminal`` is
    False, and ``events`` in line order."""
    end = event("terminal_event", 90, str(STEPS)) if terminal else None
    return TrainingLogScan(LOG, 100, STEPS, end, STEPS if terminal else STEPS - 1,
                           tuple(events), 0, tuple(findings))


def trial(*, exit_code: int | None = 0, signal: str | None = None,
          processes: Sequence[tuple[str, int]] = (("controller", 0),),
          env: Sequence[tuple[str, str]] = ()) -> TrialRecord:
    """A trial record dispatching :data:`STEPS` steps."""
    return TrialRecord(
        TRIAL, job_id=JOB, pair=PAIR, period=1, gpus=2, attempt=1,
        dispatch=(("TOTAL_TRAINING_STEPS", str(STEPS)),), env=tuple(env),
        started_ns=T0, finished_ns=T0 + 600 * 10**9,
        exit_code=exit_code, received_signal=signal,
        processes=tuple(ProcessExit(role, 5000 + i, code, f"/processes/{i}")
                        for i, (role, code) in enumerate(processes)),
    )


def row(path: str, kind: str, status: str = "verified") -> EvidenceFile:
    """The evidence row of ``path``."""
    sha = "0" * 64
    return EvidenceFile(path, kind, PAIR, 1, 0, JOB, RECORD, sha, 10,
                        None if status in ("missing", "unsafe", "unreadable") else sha,
                        None if status in ("missing", "unsafe", "unreadable") else 10, status)


def device(of_rank: int, of_pid: int, **changes: object) -> DeviceEvidence:
    """The device file of worker ``of_rank``/``of_pid`` (its own GPU, the attempt's job),
    with ``changes``."""
    clean = DeviceEvidence(device_path(of_rank, of_pid), "policy", of_rank, of_pid, JOB,
                           gpu_uuid=f"GPU-0000-{of_rank}")
    return replace(clean, **changes)  # type: ignore[arg-type]


def attempt(*, the_trial: TrialRecord | None = None, the_log: TrainingLogScan | None = None,
            traces: Sequence[AllocatorTrace] | None = None,
            statuses: dict[str, str] | None = None, index: int = 0,
            job_id: str = JOB) -> AttemptEvidence:
    """An attempt of two ranks (pids :data:`PIDS`); what is not given is clean."""
    statuses = statuses or {}
    if traces is None:
        traces = [trace(pid, completed_phases(pid, rank)) for rank, pid in enumerate(PIDS)]
    files = [(TRIAL, "trial"), (LOG, "training_log")]
    files += [(trace_path(pid), "allocator_trace") for pid in PIDS]
    files += [(device_path(rank, pid), "device_evidence") for rank, pid in enumerate(PIDS)]
    spec = AttemptSpec(
        index, job_id, ATTEMPT_DIR,
        tuple(Worker("policy", rank, pid, f"/workers/{rank}") for rank, pid in enumerate(PIDS)),
        tuple(EvidenceEntry(path.removeprefix(ATTEMPT_DIR + "/"), kind, "0" * 64, 10,
                            f"/evidence/{i}") for i, (path, kind) in enumerate(files)),
        "")
    devices = tuple(device(rank, pid) for rank, pid in enumerate(PIDS))
    read = AttemptRead(f"{SUBJECT}#{index}", (), the_trial or trial(), the_log or log(),
                       tuple(traces), devices, ())
    return AttemptEvidence(SUBJECT, spec, read,
                           tuple(row(path, kind, statuses.get(path, "verified"))
                                 for path, kind in files))


PASSED = IdleCheck(True, T0 + 700 * 10**9, (0, 0), 0)


def period(*attempts: AttemptEvidence, findings: Iterable[Finding] = (), pair: str = PAIR,
           number: int = 1, workload: str = "gsm8k", gpus: int = 2, seed: int = 161,
           idle: IdleCheck | None = PASSED) -> PeriodEvidence:
    """A readable period record (array task 0 of 7000000, commit ``c``) with ``attempts``,
    its idle check passed."""
    record = PeriodRecord(f"pairs/{pair}/period-{number}.json", pair, number, True,
                          study="s", workload=workload, seed=seed, model="m", gpus=gpus,
                          array_job_id="7000000", array_task_id=0, commit="c",
                          attempts=tuple(a.spec for a in attempts), idle_check=idle,
                          findings=tuple(findings))
    return PeriodEvidence(record, tuple(attempts))


def sacct_job(state: str = "COMPLETED", *, job_id: str = "7000000_0", raw: str = JOB,
              end: int | None = 1_700_000_700, gpus: int | None = 2,
              elapsed: int | None = 700, line: int = 2, array: str | None = "7000000"
              ) -> SacctJob:
    """One allocation row of array ``array`` (None: a job of its own)."""
    task = int(job_id.rsplit("_", 1)[1]) if "_" in job_id and "[" not in job_id else None
    return SacctJob(job_id, raw, array, task, None, "train", state, state, 0, 0,
                    1_700_000_000, end, elapsed, gpus, "gpu-node-01", None, line)


def sacct(*jobs: SacctJob, fields: Sequence[str] = ("JobID", "JobIDRaw", "State",
                                                    "ElapsedRaw", "AllocTRES")) -> SacctDump:
    """A scheduler dump holding ``jobs``."""
    return SacctDump(SACCT, tuple(fields), "|", True, tuple(jobs))


def collected(*periods: PeriodEvidence, dump: SacctDump | None = None,
              protocol: Protocol = DEFAULT_PROTOCOL, findings: Iterable[Finding] = (),
              commits: dict[str, str] | None = None) -> Collected:
    """The study as collection hands it on (``commits``: execution_commits.json's pins)."""
    root = Path("/nonexistent/study")
    layout = StudyLayout(root, tuple(p.record.path for p in periods), (),
                         execution_commits="execution_commits.json" if commits else None)
    evidence = tuple(f for p in periods for a in p.attempts for f in a.files)
    return Collected(root, layout, protocol, dump, SACCT if dump else None, commits,
                     tuple(p.summary(protocol) for p in periods), evidence, (),
                     tuple(findings), timeline=periods[:TIMELINE_PERIODS])


def context(study: Collected, findings: Iterable[Finding] = ()) -> Context:
    """The judging context, indexed as one pass over the whole study indexes it."""
    by_subject: dict[str, list[Finding]] = defaultdict(list)
    by_path: dict[str, list[Finding]] = defaultdict(list)
    for item in (*study.findings, *findings):
        by_subject[item.subject].append(item)
        for cite in item.citations:
            by_path[cite.path].append(item)
    last = {a.spec.job_id: f"{p.subject}#{a.spec.index}" for p in study.periods
            for a in p.attempts if a.spec.job_id}
    return Context(study, study.protocol, by_subject, by_path, last)


def with_protocol(**changes: object) -> Protocol:
    """The built-in protocol with ``changes``."""
    return replace(DEFAULT_PROTOCOL, **changes)  # type: ignore[arg-type]


def cell(workload: str, gpus: int, seed: int, job: str) -> PeriodEvidence:
    """A period of (``workload``, ``gpus``) at ``seed``, its one attempt in job ``job``."""
    pair = f"host-m-{workload}-c2-s{seed}-{gpus}gpu"
    return period(attempt(job_id=job), pair=pair, workload=workload, gpus=gpus, seed=seed)


def verdict(one: PeriodEvidence, kind: VerdictKind = VerdictKind.RESOLVED) -> Verdict:
    """The verdict ``kind`` of period ``one`` (with the reason such a verdict has)."""
    reason = {VerdictKind.RESOLVED: Reason.COMPLETED, VerdictKind.FAILED:
              Reason.ELIGIBLE_FAILURE}.get(kind, Reason.UNCLEAN_EXIT)
    return Verdict(one.subject, one.record.pair, one.record.period, kind, reason, "", "")


def outcome(one: PeriodEvidence, seconds: int, *, job: str | None = None, index: int = 0,
            counted: bool = True, wasted: bool = False, allocation_gpus: int | None = None
            ) -> AttemptOutcome:
    """How an attempt of ``one`` ran: ``seconds`` of invocation, counted or wasted."""
    gpus = one.record.gpus
    return AttemptOutcome(one.subject, index, job or one.attempts[0].spec.job_id, None,
                          Outcome.COMPLETED, Reason.COMPLETED, ExitKind.CLEAN, 0, None, 0,
                          seconds * 10**9,
                          gpus, allocation_gpus or gpus, counted, wasted, None)
