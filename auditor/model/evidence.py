"""The records the collectors read from evidence files, each keeping where it came from.

Paths in records are POSIX strings relative to the evidence root, so a report is the same
whichever directory the root was mounted on. Nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from sys import intern

from auditor.model.core import Finding
from auditor.model.kinds import TERMINAL_SOURCES
from auditor.model.presets import TerminalSpec


@dataclass(frozen=True, slots=True)
class FileDigest:
    """SHA-256 and size of a file's bytes, computed while it was parsed."""

    sha256: str
    size: int


@dataclass(frozen=True, slots=True)
class EvidenceEntry:
    """One ``evidence[]`` item of a period record (a manifest line)."""

    path: str
    """As written in the manifest: relative to the attempt directory."""
    kind: str
    """``trial``, ``training_log``, ``allocator_trace``, ``device_evidence`` or other."""
    sha256: str | None
    size: int | None
    pointer: str
    """JSON pointer of this entry inside the period record."""


@dataclass(frozen=True, slots=True)
class Worker:
    """One ``workers[]`` item: the identity a worker process is expected to have."""

    role: str | None
    rank: int | None
    pid: int | None
    pointer: str
    host: str | None = None
    """The node it ran on (contract v1.2; None in a v1 record): pids are unique on one node
    only, so a worker is (host, pid)."""

    @property
    def key(self) -> tuple[str | None, int | None]:
        """(host, pid): who the worker is."""
        return self.host, self.pid


@dataclass(frozen=True, slots=True)
class AttemptSpec:
    """One attempt of a period, as its period record lists it."""

    index: int
    """0-based position in launch order."""
    job_id: str | None
    attempt_dir: str | None
    """Relative to the root, as written (unsafe values are kept and flagged)."""
    workers: tuple[Worker, ...]
    evidence: tuple[EvidenceEntry, ...]
    pointer: str
    """JSON pointer of this attempt in the period record (``""`` for single-attempt form)."""
    restart_count: int | None = None
    """The attempt's ``SLURM_RESTART_COUNT`` when the record gives it (a requeued job keeps
    its id: attempts are told apart by it, contract v1.1)."""
    array_task_id: int | None = None
    """The array element the attempt ran in, when the record gives it (a retried period's
    attempts may each have run in another element)."""
    idle_check: IdleCheck | None = None
    """The attempt's own post-run idle check, where its entry keeps one: the record's
    ``idle_check`` is the period's end (its last attempt's), and ``auditor seal`` moves an
    earlier run's there as it seals a requeue."""


@dataclass(frozen=True, slots=True)
class IdleCheck:
    """The post-period check that the GPUs were left idle."""

    passed: bool | None
    checked_ns: int | None
    gpu_memory_used_mib: tuple[int, ...]
    gpu_processes: int | None
    unavailable: str | None = None
    """Why no check could be made (``passed`` is then None: unknown, never passed)."""
    hosts: tuple[HostIdle, ...] = ()
    """Each node's own result, by host (contract v1.2: ``idle_check.hosts``); empty in the
    one-node form."""


@dataclass(frozen=True, slots=True)
class HostIdle:
    """One node's idle check: an entry of the period record's ``idle_check.hosts.<host>``,
    or the node's own file ``ATTEMPT/idle/<host>.json`` (``path``; contract v1.2)."""

    host: str
    passed: bool | None
    unavailable: str | None = None
    checked_ns: int | None = None
    path: str | None = None
    """The node's own file, for one read from it (None for the record's entry)."""


@dataclass(frozen=True, slots=True)
class PeriodRecord:
    """``pairs/<pair>/period-<n>.json``: one period and the manifest of its evidence."""

    path: str
    pair: str
    """From the file when readable, else from the path."""
    period: int
    """From the file when readable, else from the path (``period-<n>.json``)."""
    readable: bool
    """False when the file could not be read or parsed; the period is then unresolved."""
    study: str | None = None
    workload: str | None = None
    seed: int | None = None
    model: str | None = None
    gpus: int | None = None
    array_job_id: str | None = None
    array_task_id: int | None = None
    commit: str | None = None
    attempts: tuple[AttemptSpec, ...] = ()
    idle_check: IdleCheck | None = None
    digest: FileDigest | None = None
    findings: tuple[Finding, ...] = ()
    sealed_ns: int | None = None
    """When ``auditor seal`` wrote the record (None: not sealed by it)."""
    sealed_by: str | None = None
    """``tool version`` of the sealer."""

    @property
    def subject(self) -> str:
        """``pair/period-N`` (one string for each period, however often it is asked: a
        study's verdicts, outcomes, findings and attempts each name their period)."""
        return intern(f"{self.pair}/period-{self.period}")

    def attempt_key(self, index: int, position: int | None = None) -> str:
        """``pair/period-N#index``: the key of attempt ``index``'s read; ``position``: the
        record's place among the study's (``position:pair/period-N#index``), when reads
        are planned ahead of their joining (two records may name one period)."""
        key = f"{self.subject}#{index}"
        return key if position is None else f"{position}:{key}"

    def without_entries(self) -> PeriodRecord:
        """This record without its attempts' manifest entries (what judging the study
        needs of a period before its evidence is read)."""
        return replace(self, attempts=tuple(replace(spec, evidence=())
                                            for spec in self.attempts))

    def with_entries(self, entries: tuple[tuple[EvidenceEntry, ...], ...]) -> PeriodRecord:
        """This record (without entries) with each attempt's manifest ``entries`` back."""
        return replace(self, attempts=tuple(replace(spec, evidence=given) for spec, given
                                            in zip(self.attempts, entries, strict=True)))


@dataclass(frozen=True, slots=True)
class ProcessExit:
    """One ``processes[]`` item of a trial record."""

    role: str | None
    pid: int | None
    exit_code: int | None
    pointer: str
    """Where its exit code is: ``/processes/<i>`` of the trial record, or ``""`` of its own
    process record (:attr:`path`)."""
    path: str | None = None
    """Its process record, ``processes/<host>-<role>-<pid>.json`` (contract v1.2); None for
    an item of the trial record's ``processes``."""
    host: str | None = None
    rank: int | None = None
    started_ns: int | None = None
    ended_ns: int | None = None
    signal: str | None = None
    """The signal that ended it (``SIGTERM``), when one did."""
    received_signal: str | None = None
    """A signal its wrapper received (``auditor run --step``), when one did."""

    @property
    def failed(self) -> bool:
        """Whether it ended other than with exit 0 (unknown counts as not failed)."""
        return (self.exit_code not in (0, None)) or bool(self.signal)


@dataclass(frozen=True, slots=True)
class TrialRecord:
    """``trial-<job>.json``: the launcher's own record of one attempt."""

    path: str
    job_id: str | None = None
    pair: str | None = None
    period: int | None = None
    gpus: int | None = None
    attempt: int | None = None
    dispatch: tuple[tuple[str, str], ...] = ()
    """``dispatch`` as (key, value-as-string) pairs, in file order."""
    env: tuple[tuple[str, str], ...] = ()
    started_ns: int | None = None
    finished_ns: int | None = None
    exit_code: int | None = None
    received_signal: str | None = None
    processes: tuple[ProcessExit, ...] = ()
    status: str | None = None
    validation_error: str | None = None
    peak_mib: int | None = None
    findings: tuple[Finding, ...] = ()
    restart_count: int | None = None
    """The job's ``SLURM_RESTART_COUNT`` (0 for its first run; contract v1.1)."""
    array_job_id: str | None = None
    array_task_id: int | None = None
    kept_worker_logs: tuple[str, ...] | None = None
    """The worker logs the run says it kept itself (``worker_logs.kept``: Ray's, torchrun's,
    never a ``--step``'s output); None where the record does not say."""

    def dispatch_value(self, key: str) -> str | None:
        """The dispatched value of ``key``, or None."""
        return next((v for k, v in self.dispatch if k == key), None)

    def env_value(self, key: str) -> str | None:
        """The environment value of ``key``, or None."""
        return next((v for k, v in self.env if k == key), None)

    def dispatched_int(self, key: str) -> int | None:
        """``key`` (e.g. ``TOTAL_TRAINING_STEPS``) from the dispatch, else the environment,
        as an integer; None when absent or not an integer."""
        value = self.dispatch_value(key) or self.env_value(key)
        if value is None:
            return None
        try:
            return int(value.strip().strip('"'))
        except ValueError:
            return None


@dataclass(frozen=True, slots=True)
class DeviceEvidence:
    """``device-evidence/worker-<role>-<rank>-<pid>.json``."""

    path: str
    role: str | None = None
    rank: int | None = None
    pid: int | None = None
    job_id: str | None = None
    hostname: str | None = None
    cuda_visible_devices: str | None = None
    local_device: int | None = None
    gpu_uuid: str | None = None
    gpu_name: str | None = None
    gpu_pci_bus_id: str | None = None
    memory_total_mib: int | None = None
    peak_allocated_mib: int | None = None
    peak_reserved_mib: int | None = None
    captured_ns: int | None = None
    findings: tuple[Finding, ...] = ()
    gpu_unavailable: str | None = None
    """Why no GPU was visible (``gpu`` null in the file: the GPU fields are None)."""


@dataclass(frozen=True, slots=True)
class PhaseRecord:
    """One phase line of an allocator trace (a call that returned or raised)."""

    path: str
    line: int
    pid: int | None
    rank: int | None
    role: str | None
    seq: int | None
    phase: str
    step: int | None
    started_ns: int | None
    finished_ns: int | None
    error_type: str
    """``""`` when the call returned normally."""
    error_message: str
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None


@dataclass(frozen=True, slots=True)
class AllocatorTrace:
    """``allocator-traces/allocator-<pid>.jsonl``, reduced to what reasoning needs.

    Phase records are kept whole (there are few); memory samples are folded
    into counts and peaks so a trace of any size costs bounded memory.
    """

    path: str
    lines: int
    phases: tuple[PhaseRecord, ...]
    samples: int
    sample_peak_allocated_bytes: int | None
    sample_peak_reserved_bytes: int | None
    pids: tuple[tuple[int, int], ...]
    """Each distinct ``pid`` seen, with the first line it was seen on."""
    ranks: tuple[tuple[int, int], ...]
    """Each distinct ``rank`` seen, with the first line it was seen on."""
    first_ns: int | None
    """Earliest ``started_ns``/``sample_ns`` of any record."""
    last_ns: int | None
    """Latest ``finished_ns``/``sample_ns`` of any record."""
    findings: tuple[Finding, ...] = ()
    hosts: tuple[tuple[str, int], ...] = ()
    """Each distinct ``host`` its phase records name (contract v1.2), with its first line:
    two are two processes writing one file."""
    terminals: tuple[tuple[int, int], ...] = ()
    """(step, line) of each terminal record (contract v1.2, ``Trace.terminal``)."""
    params: tuple[tuple[int, str, str, int], ...] = ()
    """(step, ``before``/``after``, digest, line) of each parameter digest (contract v1.2)."""


@dataclass(frozen=True, slots=True)
class TraceDigest:
    """What a diagnosis group's sentences say of one trace's phase records (what a judged
    period keeps of each trace: :class:`~auditor.model.AttemptSummary`)."""

    reached: tuple[str, ...]
    """:func:`phases_reached`."""
    completes: bool
    """:func:`completes_cleanly` at the attempt's final step."""


def phases_reached(trace: AllocatorTrace) -> tuple[str, ...]:
    """The phases a trace's records reach, in time order, each with its error if any
    (``rollout_init (OOM)``), a repeat folded into one."""
    names: list[str] = []
    for record in sorted(trace.phases, key=lambda r: (r.started_ns or 0, r.line)):
        label = record.phase + (f" ({record.error_type})" if record.error_type else "")
        if not names or names[-1] != label:
            names.append(label)
    return tuple(names)


def completes_cleanly(trace: AllocatorTrace, steps: int | None, first: str, last: str
                      ) -> bool:
    """Whether a trace holds exactly one error-free ``first`` record at step ``steps`` and
    one ``last`` record after it, with ordered timestamps (the completion phases)."""
    updates = [r for r in trace.phases if r.phase == first and r.step == steps]
    if len(updates) != 1 or updates[0].error_type or updates[0].finished_ns is None:
        return False
    update = updates[0]
    syncs = [r for r in trace.phases if r.phase == last and r.step == steps
             and (r.started_ns or 0) >= (update.finished_ns or 0)]
    ordered = all(r.started_ns is not None and r.finished_ns is not None
                  and r.started_ns <= r.finished_ns for r in (update, *syncs))
    return len(syncs) == 1 and not syncs[0].error_type and ordered


@dataclass(frozen=True, slots=True)
class LogEvent:
    """Something a training log shows, at a line."""

    kind: str
    """``terminal_event``, ``step_line``, ``coordinated_shutdown``, ``slurm_cancelled``,
    ``slurm_time_limit``, ``traceback``, ``exception``, ``gpu_oom``, ``host_oom``,
    ``kv_cache_init_failure``, ``nccl_timeout``, ``nccl_error``."""
    line: int
    text: str
    """The line, ANSI-stripped and clipped."""
    detail: str = ""
    """Kind-specific: the step number, the exception type, the job id..."""


@dataclass(frozen=True, slots=True)
class TrainingLogScan:
    """What one streaming pass over ``training-<job>.log`` found."""

    path: str
    lines: int
    expected_steps: int | None
    """The dispatched ``TOTAL_TRAINING_STEPS`` the terminal event was matched against."""
    terminal_event: LogEvent | None
    """The first line holding ``step:N`` then ``training/global_step:N`` for N expected."""
    last_step: int | None
    """The highest training step seen on a ``step:..training/global_step:..`` line."""
    events: tuple[LogEvent, ...]
    """Other events, in line order (capped; see ``events_dropped``)."""
    events_dropped: int = 0
    findings: tuple[Finding, ...] = ()
    step_ends: tuple[LogEvent, ...] = ()
    """The first ``controller_ended`` event and each node's first ``slurm_step_cancelled``
    one, in line order, whatever the cap on :attr:`events` dropped (up to
    ``STEP_NODES_KEPT`` nodes): the log's order of these says whether Slurm reaped a step
    after the controller ended (:func:`~auditor.reason.exits.steps_cancelled`)."""
    quoted_terminal: LogEvent | None = None
    """The first copy of the terminal line quoted inside another line (a launcher's message
    naming the line it lacks, a repr): never the event, yet a reader who greps the log finds
    it, so the report says where it is and that it does not count."""


@dataclass(frozen=True, slots=True)
class EligibleFailure:
    """A protocol rule: an error of one of ``error_types`` in ``phase`` is a measurement."""

    phase: str
    error_types: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Configuration:
    """A (workload, gpus) cell the protocol expects, with its seeds."""

    workload: str
    gpus: int
    seeds: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Protocol:
    """``protocol.json``: the frozen rules (built-in defaults where absent)."""

    path: str | None
    name: str = "default"
    steps_from: str = "TOTAL_TRAINING_STEPS"
    terminal_pattern: str | None = None
    terminal_sources: tuple[str, ...] = TERMINAL_SOURCES
    """Where the terminal event may come from (contract v1.2, ``terminal_event.sources``):
    the driver's log, a worker's own output, a metrics file, a rank's terminal record."""
    terminal: TerminalSpec | None = None
    """The terminal-event matcher ``terminal_event`` gives (contract v1.2: a preset, patterns,
    offset, veto, marker, JSON predicates; its ``pattern`` among the patterns); None: verl's
    built-in one."""
    completion_phases: tuple[str, ...] = ("actor_update", "weight_sync")
    completion_phases_by_role: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """``completion_phases`` given as a mapping from role to phases (contract v1.2): when
    not empty, a role it does not name has no completion phases (its ranks cannot be shown
    complete)."""
    eligible_failures: tuple[EligibleFailure, ...] = (
        EligibleFailure(
            "rollout_init", ("torch.OutOfMemoryError", "torch.cuda.OutOfMemoryError")
        ),
    )
    coordinated_shutdown_flag: str = "COSMOS_SHUTDOWN_ON_NO_POLICY_REPLICAS"
    configurations: tuple[Configuration, ...] = ()
    anchors: tuple[tuple[str, str], ...] = ()
    digest: FileDigest | None = None
    findings: tuple[Finding, ...] = ()
    scheduler: str = "slurm"
    """``slurm``, or ``none`` (contract v1.2: plain torchrun, Ray on Kubernetes, a
    workstation): no scheduler dump is expected, its absence fails nothing, and the
    allocation scope is not measured."""
    idle_check: str = "required"
    """``required``: a period without a passed idle check is unresolved; ``optional``: a
    missing or impossible one is said in the report and decides nothing (contract v1.1)."""


    def phases_for(self, role: str | None) -> tuple[str, ...]:
        """The completion phases of a rank in ``role`` (empty: the protocol names none)."""
        if not self.completion_phases_by_role:
            return self.completion_phases
        return next((phases for name, phases in self.completion_phases_by_role
                     if name == role), ())


DEFAULT_PROTOCOL = Protocol(path=None)
"""The built-in rules (no ``protocol.json``)."""


SLURM_STATE_FLAGS = frozenset({
    "COMPLETING", "CONFIGURING", "EXPEDITING", "LAUNCH_FAILED", "POWER_UP_NODE",
    "RECONFIG_FAIL", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "RESV_DEL_HOLD",
    "REVOKED", "SIGNALING", "SPECIAL_EXIT", "STAGE_OUT", "STOPPED", "UPDATE_DB",
})
"""The state flags sacct may show in a base state's place: each says the job is between
states (completing, staging out, held, requeued, stopped, being signalled, powering up,
revoked to another cluster ...), none says how it ended."""
SLURM_STATES = frozenset({
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
    "PENDING", "PREEMPTED", "RUNNING", "SUSPENDED", "TIMEOUT",
}) | SLURM_STATE_FLAGS
"""Every job state and state flag Slurm names (its ``job_state_codes`` page): a ``State``
outside them is a typo, a site's patch or a newer Slurm, and the audit says so (``AUD124``)
rather than treat it as finished."""
UNFINISHED_STATES = frozenset({"PENDING", "RUNNING", "SUSPENDED"}) | SLURM_STATE_FLAGS
"""The states of an element that has not ended (contract: ``PENDING``, ``RUNNING``,
``REQUEUED``, ``SUSPENDED``; and every flag shown in a base state's place, which says the
job is between states, not how it ended): its periods are unresolved, never passed."""


@dataclass(frozen=True, slots=True)
class SacctStep:
    """A step row (``.batch``, ``.extern``, ``.0`` ...) of one allocation."""

    step: str
    state: str
    """Normalised: first word, upper case (``CANCELLED by 12`` -> ``CANCELLED``)."""
    state_raw: str
    exit_code: int | None
    signal: int | None
    line: int
    exit_exact: bool = False
    """The exit code is the process's own (``sacct --json`` of 23.11 on), not printed less 128."""

    @property
    def exit_code_may_be(self) -> tuple[int, ...] | None:
        """The exit codes the printed one may stand for (see :func:`exit_code_may_be`)."""
        return exit_code_may_be(self.exit_code, self.signal, self.exit_exact)


def exit_code_may_be(exit_code: int | None, signal: int | None, exact: bool = False
                     ) -> tuple[int, ...] | None:
    """What a printed ``ExitCode`` ``c:s`` may stand for: sacct prints an exit code of 128
    or more minus 128 (``src/sacct/print.c``), so ``15:0`` is 15 or 143, ``127:0`` 127 or
    255 (contract v1.1); a code of 0, a signal part, a code of 128 or more, or an ``exact``
    one (``sacct --json`` of 23.11 on) is itself. None when the code is unknown."""
    if exit_code is None:
        return None
    if 1 <= exit_code <= 127 and not signal and not exact:
        return (exit_code, exit_code + 128)
    return (exit_code,)


MAX_PENDING_TASKS = 1 << 20
"""Most tasks a pending range is expanded into (Slurm's own ``MaxArraySize`` is at most
4,000,001); a larger range lists none (``pending_tasks`` None)."""


@dataclass(frozen=True, slots=True)
class SacctJob:
    """One allocation row (array element or plain job) with its steps."""

    job_id: str
    """As printed: ``5055845_3``, ``123``, ``5055845_[4-8%2]``."""
    job_id_raw: str | None
    array_job_id: str | None
    array_task_id: int | None
    """None for plain jobs and pending ranges."""
    array_task_spec: str | None
    """For a pending range, the bracket contents, e.g. ``4-8%2``."""
    job_name: str | None
    state: str
    state_raw: str
    exit_code: int | None
    signal: int | None
    start: int | None
    """UTC epoch seconds; None for ``Unknown``/``None``."""
    end: int | None
    elapsed_s: int | None
    gpus: int | None
    """GPUs in AllocTRES (typed and untyped counted once); None when the column is absent."""
    node_list: str | None
    reason: str | None
    line: int
    steps: tuple[SacctStep, ...] = ()
    history: tuple[str, ...] = ()
    """States of earlier records of the same job id (``sacct -D`` requeues), oldest first."""
    attempts: tuple[SacctJob, ...] = ()
    """The earlier records of the same job id (``sacct -D``: one per requeue or preemption,
    each with its own steps), oldest first: the attempt ledger. This row is the latest."""
    restarts: int | None = None
    """sacct's ``Restarts`` (Slurm 24.11 and later); None without that column."""
    own_rows: frozenset[int] = frozenset()
    """For a pending range: the tasks of its array that have rows of their own (a range
    printed after one of its tasks started covers only the others, contract v1.1)."""
    exit_exact: bool = False
    """The exit code is the process's own (``sacct --json`` of 23.11 on), not printed less 128."""

    @property
    def gpu_seconds(self) -> int | None:
        """ElapsedRaw x allocated GPUs of this record, when both are known."""
        if self.elapsed_s is None or self.gpus is None:
            return None
        return self.elapsed_s * self.gpus

    @property
    def exit_code_may_be(self) -> tuple[int, ...] | None:
        """The exit codes the printed one may stand for: ``(15, 143)`` for ``15:0``."""
        return exit_code_may_be(self.exit_code, self.signal, self.exit_exact)

    def exit_shown(self, code: int | None) -> int | None:
        """Which of :attr:`exit_code_may_be` a launcher's exit ``code`` (a trial record's) is:
        ``code`` when the printed code may stand for it (143 against ``15:0``), else None
        (the two disagree, or either is unknown). Never a contradiction by itself."""
        possible = self.exit_code_may_be
        return code if possible is not None and code in possible else None

    @property
    def records(self) -> tuple[SacctJob, ...]:
        """Every record of this job id, oldest first (the attempts, then this one)."""
        return (*self.attempts, self)

    @property
    def total_gpu_seconds(self) -> int | None:
        """GPU-seconds of every record (each earlier attempt held the GPUs too); None when
        any record's is unknown."""
        values = [record.gpu_seconds for record in self.records]
        return None if any(v is None for v in values) else sum(v for v in values if v)

    @property
    def lost_records(self) -> tuple[SacctJob, ...]:
        """The records lost to requeue or preemption: every earlier one, and this one when
        it is ``PREEMPTED``."""
        return (*self.attempts, *((self,) if self.state == "PREEMPTED" else ()))

    @property
    def requeued_gpu_seconds(self) -> int | None:
        """The share of :attr:`total_gpu_seconds` lost to requeue or preemption (the
        :attr:`lost_records`'); None when any of theirs is unknown."""
        values = [record.gpu_seconds for record in self.lost_records]
        return None if any(v is None for v in values) else sum(v for v in values if v)

    @property
    def history_missing(self) -> bool:
        """Whether sacct's ``Restarts`` says the job ran more times than the records present
        (the dump was captured without ``-D``)."""
        return self.restarts is not None and self.restarts > len(self.attempts)

    def record_for_restart(self, restart: int, latest: int | None = None) -> SacctJob | None:
        """The record of run ``restart`` (``SLURM_RESTART_COUNT``) of this job: this row for
        the latest run (``latest``, by default ``Restarts`` or the records present), an
        earlier record when the dump holds every one (``-D``), else None: the dump has no
        record of that run of its own."""
        if latest is None:
            latest = self.restarts if self.restarts is not None else len(self.attempts)
        latest = max(latest, len(self.attempts))
        if restart == latest:
            return self
        if 0 <= restart < latest and len(self.attempts) == latest:
            return self.attempts[restart]
        return None

    def _spans(self) -> list[tuple[int, int, int]]:
        spans: list[tuple[int, int, int]] = []
        if self.array_task_spec is None:
            return spans
        for part in self.array_task_spec.split("%", 1)[0].split(","):
            span, _, step_text = part.partition(":")
            first, _, last = span.partition("-")
            try:
                low, high = int(first), int(last or first)
                step = int(step_text or 1)
            except ValueError:
                continue
            if step > 0 and low <= high:
                spans.append((low, high, step))
        return spans

    def covers(self, task: int) -> bool:
        """Whether this pending range (``array_task_spec`` ``2-3``, ``4-8%2``, ``1,5-7:2``)
        still holds array task ``task``: in its spec and without a row of its own; False for
        any other row."""
        if task in self.own_rows:
            return False
        return any(low <= task <= high and (task - low) % step == 0
                   for low, high, step in self._spans())

    @property
    def pending_tasks(self) -> tuple[int, ...] | None:
        """The tasks this pending range still holds, ascending (its spec minus the tasks
        with rows of their own); None for any other row, or a range of over
        :data:`MAX_PENDING_TASKS` tasks."""
        if self.array_task_spec is None:
            return None
        spans = self._spans()
        if sum((high - low) // step + 1 for low, high, step in spans) > MAX_PENDING_TASKS:
            return None
        tasks = {task for low, high, step in spans for task in range(low, high + 1, step)}
        return tuple(sorted(tasks - self.own_rows))


@dataclass(frozen=True, slots=True)
class SacctDump:
    """A parsed ``sacct -P`` dump."""

    path: str
    fields: tuple[str, ...]
    delimiter: str
    header: bool
    jobs: tuple[SacctJob, ...]
    digest: FileDigest | None = None
    findings: tuple[Finding, ...] = ()
    gpus_untracked: bool = False
    """AllocTRES names no GPU in any row that holds something (the site's
    AccountingStorageTRES does not track ``gres/gpu``): every GPU count is unknown."""
