"""Read a saved scheduler dump (``sacct -P`` output, ``sacct-raw.psv``) into a :class:`SacctDump`.

The contract's capture command is::

    TZ=UTC SLURM_TIME_FORMAT=standard sacct -n -P -j <array> \\
        --format=JobID,JobIDRaw,JobName,State,ExitCode,Start,End,ElapsedRaw,AllocTRES,NodeList,Reason

but real dumps come from many tools, so :func:`parse_sacct` reads, line by line and in
bounded memory, any ``sacct --parsable``/``--parsable2`` output:

* **Format.** A header line (``sacct`` without ``-n``; names are case-insensitive, so
  ``JobId``/``JobIdRaw`` work) overrides both :data:`DEFAULT_FORMAT` and a ``fields``
  argument, since it is what the file itself says. Without a header the columns are
  ``fields`` (``--format`` order; ``%NN`` width suffixes are ignored) or the default.
* **Delimiter.** ``delimiter`` when given. Otherwise it is read off the header (the
  separator between the first two names, so ``☃`` or ``^|^`` work), or sniffed from
  the first rows: among ``^|^``, ``|``, ``☃`` and tab, the one that splits the most
  rows into exactly the expected field count wins (ties in that order). A dump that
  fits none of them is refused, never guessed.
* **Trailing delimiters** (``--parsable``) give one extra empty field; the file's mode
  is taken from its first rows and that field is dropped.
* **Delimiter inside a value.** ``-P`` does not escape, so a ``JobName`` holding the
  delimiter gives too many fields. The extras are given back to one free-text column
  (JobName, SubmitLine, Comment, Reason, WorkDir, ...) when exactly one choice of
  column leaves every typed column (JobID, State, ExitCode, times, counts, TRES ...)
  well-formed; otherwise the row is an AUD008 finding.
* **Newline inside a value.** A row with too few fields is joined with the following
  physical line(s) (up to :data:`MAX_JOIN_LINES`) when the joined record has exactly
  the right field count and well-formed typed columns, and no joined line is a whole
  row by itself; otherwise its first line is an AUD008 finding and the following lines
  are read afresh. When the last column is one that holds newlines (SubmitLine,
  Comment, JobName ...), a following line without any delimiter, that is not a job id,
  continues it.
* ``#`` comment lines, blank lines and repeated header lines are skipped; a UTF-8 BOM
  is dropped. Lines are decoded as UTF-8 with replacement (AUD005); NUL bytes are
  removed (AUD006); a line longer than :data:`MAX_LINE` bytes is skipped (AUD007).
* **Values.** ``State`` is normalised to its first word without ``+``
  (``CANCELLED by 12`` and ``CANCELLED+`` both give ``CANCELLED``; ``state_raw``
  keeps the text); when the dump has no State column the state is ``UNKNOWN`` with
  ``state_raw`` ``""``. ``ExitCode`` ``exit:signal`` gives two signed
  ints. ``Start``/``End`` are UTC (the dump is captured with ``TZ=UTC``) epoch
  seconds; ``Unknown``/``None``/empty give None. ``ElapsedRaw`` is taken as seconds,
  else ``Elapsed`` (``[D-]HH:MM:SS`` or ``MM:SS.mmm``, fractions dropped) is
  converted. GPUs come from ``AllocTRES``: the untyped ``gres/gpu=N`` when present,
  else the sum over distinct types of ``gres/gpu:TYPE=N`` (MIG types included);
  ``gres/gpumem``/``gres/gpuutil`` never count; None without an AllocTRES column, 0
  when the column has no GPU.
* **Shape checks.** A row whose id, State, ExitCode, count or TRES columns are
  malformed is not used (AUD008): its columns are not what the format says. An
  unreadable time or duration only becomes None (AUD008); the row is kept. So a dump
  read with a wrong ``--format`` of the same field count is refused, not misread.
* **Rows.** A JobID without a ``.step`` is an allocation (:class:`SacctJob`); a
  pending range ``5055845_[4-8%2]`` is one job with ``array_task_id`` None and
  ``array_task_spec`` ``"4-8%2"``. Step rows attach to their allocation by the JobID
  before the dot, or by JobIDRaw (``5055846.batch``). A step that appears before its
  allocation waits for it; a step whose allocation never appears is reported
  (AUD008) and dropped: no allocation is invented for it, so the element counts as
  missing from the dump. When a JobID appears again (``sacct -D``: one ``REQUEUED``
  record per earlier attempt), the later record replaces the earlier one, whose
  state goes into ``history``; steps belong to the record they follow, so an earlier
  attempt's steps leave with it. A dump without JobID and JobIDRaw columns gives one
  job per row with ``job_id`` ``""``.
* **Refusals** (:class:`~auditor.errors.SacctFormatError`, one line saying what to
  do): fixed-width output (``sacct`` without ``-P``), and a dump none of whose first
  rows fits the format (wrong ``--format``/``--delimiter``). An empty dump is not
  refused: it gives an empty :class:`SacctDump` with an AUD009 finding. Occasional
  bad rows are AUD008 findings with their line numbers; at most
  :data:`MAX_FINDINGS` findings are kept per dump (then AUD013).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from typing import BinaryIO

from auditor import catalogue
from auditor._io import HashingReader, Line, clip, iter_lines
from auditor.errors import SacctFormatError
from auditor.model import Citation, Finding, SacctDump, SacctJob, SacctStep

__all__ = [
    "DEFAULT_FORMAT",
    "is_fixed_width",
    "job_for",
    "parse_sacct",
    "summary_json",
    "worst_step",
]

DEFAULT_FORMAT: tuple[str, ...] = (
    "JobID", "JobIDRaw", "JobName", "State", "ExitCode", "Start", "End", "ElapsedRaw",
    "AllocTRES", "NodeList", "Reason",
)
"""The contract's ``--format`` order, used when the dump has no header and no ``fields``."""

MAX_LINE = 1 << 20
"""Longest physical line (bytes) parsed; longer ones are skipped with AUD007."""
MAX_JOIN_LINES = 64
"""Most physical lines one record may span (a newline inside a value)."""
MAX_RECORD_CHARS = 1 << 20
"""Longest joined record (characters)."""
MAX_FINDINGS = 200
"""Findings kept per dump; later ones are counted in one AUD013 finding."""
SNIFF_LINES = 32
"""Rows looked at to settle the delimiter and the trailing-delimiter mode."""
SNIFF_CHARS = 4 << 20
"""Characters buffered at most while sniffing."""
REFUSE_AFTER = 32
"""Unreadable rows, with none readable before them, after which the dump is refused."""

CAPTURE_HINT = (
    "TZ=UTC SLURM_TIME_FORMAT=standard sacct -P -n --format=" + ",".join(DEFAULT_FORMAT)
    + " -j <job>"
)

_CANDIDATE_DELIMITERS: tuple[str, ...] = ("^|^", "|", "\u2603", "\t")

_TRES_USAGE = tuple(
    f"TRESUsage{way}{stat}"
    for way in ("In", "Out")
    for stat in ("Ave", "Max", "MaxNode", "MaxTask", "Min", "MinNode", "MinTask", "Tot")
)
_KNOWN_FIELDS: tuple[str, ...] = (
    "Account", "AdminComment", "AllocCPUS", "AllocGRES", "AllocNodes", "AllocTRES", "AssocID",
    "AveCPU", "AveCPUFreq", "AveDiskRead", "AveDiskWrite", "AvePages", "AveRSS", "AveVMSize",
    "BlockID", "Cluster", "Comment", "Constraints", "ConsumedEnergy", "ConsumedEnergyRaw",
    "Container", "CPUTime", "CPUTimeRAW", "DBIndex", "DerivedExitCode", "Elapsed",
    "ElapsedRaw", "Eligible", "End", "ExitCode", "Extra", "FailedNode", "Flags", "GID",
    "Group", "HetJobID", "HetJobOffset", "JobID", "JobIDRaw", "JobName", "Layout", "Licenses",
    "MaxDiskRead", "MaxDiskReadNode", "MaxDiskReadTask", "MaxDiskWrite", "MaxDiskWriteNode",
    "MaxDiskWriteTask", "MaxPages", "MaxPagesNode", "MaxPagesTask", "MaxRSS", "MaxRSSNode",
    "MaxRSSTask", "MaxVMSize", "MaxVMSizeNode", "MaxVMSizeTask", "McsLabel", "MinCPU",
    "MinCPUNode", "MinCPUTask", "NCPUS", "NNodes", "NodeList", "NTasks", "Partition",
    "Planned", "PlannedCPU", "PlannedCPURAW", "Priority", "QOS", "QOSRAW", "QOSREQ", "Reason",
    "ReqCPUFreq", "ReqCPUFreqGov", "ReqCPUFreqMax", "ReqCPUFreqMin", "ReqCPUS", "ReqGRES",
    "ReqMem", "ReqNodes", "ReqTRES", "Reservation", "ReservationId", "Reserved", "ResvCPU",
    "ResvCPURAW", "SLUID", "Start", "State", "StdErr", "StdIn", "StdOut", "Submit",
    "SubmitLine", "Suspended", "SystemComment", "SystemCPU", "Timelimit", "TimelimitRaw",
    "TotalCPU", *_TRES_USAGE, "UID", "User", "UserCPU", "WCKey", "WCKeyID", "WorkDir",
)
_KNOWN: frozenset[str] = frozenset(name.lower() for name in _KNOWN_FIELDS)

_FREE_TEXT: frozenset[str] = frozenset({
    "jobname", "submitline", "comment", "admincomment", "systemcomment", "reason", "workdir",
    "stdout", "stderr", "stdin", "constraints", "extra", "container", "wckey",
})
"""Columns a user can fill with arbitrary text, so the only ones that may hold the delimiter."""

_RE_JOBID = re.compile(
    r"(?P<alloc>(?P<base>\d{1,18})"
    r"(?:_(?:(?P<task>\d{1,18})|\[(?P<spec>[0-9,%:\-]{1,4096})\]))?"
    r"(?:\+\d{1,18})?)"
    r"(?:\.(?P<step>[\w+\-]{1,256}))?"
)
_RE_JOBIDRAW = re.compile(r"(?P<alloc>\d{1,18}(?:\+\d{1,18})?)(?:\.(?P<step>[\w+\-]{1,256}))?")
_CHECK_JOBIDRAW = re.compile(r"(?:\d{1,18}(?:\+\d{1,18})?(?:\.[\w+\-]{1,256})?)?")
_RE_STATE = re.compile(r"(?P<word>[A-Za-z_]+)\+?(?:\s.*)?", re.DOTALL)
_RE_STATE_STRICT = re.compile(r"[A-Z][A-Z_]*\+?(?: by -?\d+)?")
_RE_EXIT = re.compile(r"(-?\d{1,18}):(-?\d{1,18})")
_RE_TIME = re.compile(r"(\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2}):(\d{2})")
_RE_EPOCH = re.compile(r"\d{9,11}")
_RE_UINT = re.compile(r"\d{1,18}")
_RE_DURATION = re.compile(
    r"(?:(?P<d>\d{1,9})-)?(?:(?P<h>\d{1,9}):)?(?P<m>\d{1,9}):(?P<s>\d{1,9})(?:\.\d{1,9})?"
)
_RE_GPU = re.compile(r"gres/gpu(?::(?P<type>[^=,]+))?=(?P<count>\d{1,18})")
_RE_UNDERLINE = re.compile(r"\s*-{3,}(?:\s+-{3,})*\s*")
_RE_IDENT = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
_RE_SEPARATOR = re.compile(r"[^A-Za-z0-9_]+")
_RE_ALIGNED_ROW = re.compile(r"\s*\d+[\w.+\[\]\-%,]*\s{2,}\S.*\s{2,}\S.*", re.DOTALL)

_TIME_WORDS: frozenset[str] = frozenset({"", "unknown", "none"})

# Shape checks used to choose between readings of a row (which column absorbs extra
# delimiters, whether a join is right). Only columns with a fixed syntax are listed.
_CHECK_TIME = re.compile(
    r"|Unknown|None|\d{9,11}|\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}", re.IGNORECASE
)
_CHECK_UINT = re.compile(r"\d{0,18}")
_CHECK_DURATION = re.compile(
    r"|UNLIMITED|Partition_Limit|INVALID|(?:\d{1,9}-)?(?:\d{1,9}:)?\d{1,9}:\d{1,9}(?:\.\d{1,9})?"
)
_CHECK_EXIT = re.compile(r"|-?\d{1,18}:-?\d{1,18}")
_CHECK_TRES = re.compile(r"(?:[^=,]+=[^,]*(?:,[^=,]+=[^,]*)*)?")
_CHECKS: dict[str, re.Pattern[str]] = {
    "jobid": _RE_JOBID,
    "jobidraw": _CHECK_JOBIDRAW,
    "state": _RE_STATE_STRICT,
    "exitcode": _CHECK_EXIT,
    "derivedexitcode": _CHECK_EXIT,
    "start": _CHECK_TIME,
    "end": _CHECK_TIME,
    "submit": _CHECK_TIME,
    "eligible": _CHECK_TIME,
    "elapsedraw": _CHECK_UINT,
    "cputimeraw": _CHECK_UINT,
    "alloccpus": _CHECK_UINT,
    "ncpus": _CHECK_UINT,
    "nnodes": _CHECK_UINT,
    "reqcpus": _CHECK_UINT,
    "allocnodes": _CHECK_UINT,
    "ntasks": _CHECK_UINT,
    "uid": _CHECK_UINT,
    "gid": _CHECK_UINT,
    "elapsed": _CHECK_DURATION,
    "timelimit": _CHECK_DURATION,
    "totalcpu": _CHECK_DURATION,
    "cputime": _CHECK_DURATION,
    "usercpu": _CHECK_DURATION,
    "systemcpu": _CHECK_DURATION,
    "suspended": _CHECK_DURATION,
    "alloctres": _CHECK_TRES,
    "reqtres": _CHECK_TRES,
}

_LENIENT: frozenset[str] = frozenset({
    "start", "end", "submit", "eligible", "elapsed", "timelimit", "totalcpu", "cputime",
    "usercpu", "systemcpu", "suspended",
})
"""Checked columns whose bad value only costs that value (None and AUD008), not the row."""

_MULTILINE: frozenset[str] = frozenset({
    "jobname", "submitline", "comment", "admincomment", "systemcomment", "extra",
})
"""Free-text columns that really hold newlines (scripts, ``--wrap`` commands, JSON)."""

_SEVERITY: dict[str, int] = {
    "OUT_OF_MEMORY": 7,
    "NODE_FAIL": 6,
    "BOOT_FAIL": 6,
    "FAILED": 5,
    "TIMEOUT": 4,
    "DEADLINE": 4,
    "PREEMPTED": 4,
    "CANCELLED": 3,
    "REVOKED": 3,
    "COMPLETED": 0,
}
"""How much a step state says about a failure (unlisted non-COMPLETED states count 1)."""


# ------------------------------------------------------------------------ records


@dataclass(slots=True)
class _Phys:
    """One physical line after decoding."""

    number: int
    text: str
    skip: bool
    """Blank or ``#`` comment: ignored unless it continues a split record."""
    clipped: bool
    count: int = -1
    """Fields when split on the delimiter (-1 until the delimiter is known)."""


@dataclass(slots=True)
class _Alloc:
    """A mutable allocation row while the dump is read."""

    job: SacctJob
    steps: list[SacctStep] = field(default_factory=list)
    history: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _StepRow:
    """A step row and the keys of the allocation it belongs to."""

    step: SacctStep
    job_key: str | None
    raw_key: str | None
    text: str


@dataclass(frozen=True, slots=True)
class _Format:
    fields: tuple[str, ...]
    delimiter: str
    header: bool
    header_key: tuple[str, ...] | None
    trailing: bool
    index: dict[str, int]
    free: tuple[int, ...]
    checks: tuple[tuple[int, re.Pattern[str]], ...]
    """Shape checks of every typed column (used to choose between readings)."""
    core: tuple[tuple[int, re.Pattern[str]], ...]
    """Shape checks a plain row must pass to be used at all (ids, state, codes, counts)."""
    open_last: bool
    """The last column may hold a newline: a following one-field line may continue it."""


_OK, _SHORT, _MANY, _AMBIGUOUS, _VALUES = "ok", "short", "many", "ambiguous", "values"


# ------------------------------------------------------------------------ public API


def parse_sacct(
    stream: BinaryIO | HashingReader,
    path: str,
    fields: Sequence[str] | None = None,
    delimiter: str | None = None,
) -> SacctDump:
    """Parse a saved ``sacct -P`` dump, streaming, into a :class:`SacctDump`.

    ``path`` is the display path used in citations and findings; ``fields`` is the
    ``--format`` order of a dump without header (a comma-separated string also works);
    ``delimiter`` is its ``--delimiter``. Raises :class:`SacctFormatError` (and nothing
    else, whatever the bytes) for a fixed-width dump, a dump whose rows never fit the
    format, or unusable ``fields``/``delimiter`` arguments. The returned dump's
    ``digest`` covers every byte of ``stream``.
    """
    reader = stream if isinstance(stream, HashingReader) else HashingReader(stream)
    parser = _Parser(path, _normalise_fields(fields, path), _check_delimiter(delimiter, path))
    return parser.run(reader)


def summary_json(dump: SacctDump) -> dict[str, object]:
    """The ``auditor sacct --json`` document: one entry per allocation row, and totals.

    Entries are sorted by array job (a plain job is its own group), task id (a pending
    range by its first task) and job id, numerically where the ids are numbers.
    ``totals.gpu_seconds`` sums the jobs whose ElapsedRaw and GPUs are both known.
    """
    jobs = sorted(dump.jobs, key=_sort_key)
    entries: list[dict[str, object]] = [
        {
            "job_id": job.job_id,
            "job_id_raw": job.job_id_raw,
            "array_job_id": job.array_job_id,
            "array_task_id": job.array_task_id,
            "state": job.state,
            "exit_code": job.exit_code,
            "signal": job.signal,
            "elapsed_s": job.elapsed_s,
            "gpus": job.gpus,
            "gpu_seconds": job.gpu_seconds,
            "steps": [
                {
                    "step": step.step,
                    "state": step.state,
                    "exit_code": step.exit_code,
                    "signal": step.signal,
                }
                for step in job.steps
            ],
        }
        for job in jobs
    ]
    states = Counter(job.state for job in jobs)
    gpu_seconds = sum(value for job in jobs if (value := job.gpu_seconds) is not None)
    return {
        "jobs": entries,
        "totals": {
            "jobs": len(entries),
            "gpu_seconds": gpu_seconds,
            "states": dict(sorted(states.items())),
        },
    }


def job_for(dump: SacctDump, job_id_raw: str) -> SacctJob | None:
    """The allocation whose JobIDRaw is ``job_id_raw`` (the contract's ``<job>``).

    When the dump has no JobIDRaw column, a job whose printed JobID equals
    ``job_id_raw`` (a plain job) is returned instead. A linear scan: index
    ``dump.jobs`` yourself for many look-ups.
    """
    wanted = job_id_raw.strip()
    for job in dump.jobs:
        if job.job_id_raw == wanted:
            return job
    for job in dump.jobs:
        if job.job_id_raw is None and job.job_id == wanted:
            return job
    return None


def worst_step(job: SacctJob) -> SacctStep | None:
    """The step that best explains a failure, possibly hidden under the job's state.

    E.g. ``.0 OUT_OF_MEMORY 0:125`` under ``FAILED 90:0``, ``.batch CANCELLED 0:15``
    under ``TIMEOUT``, ``.0 CANCELLED 0:10`` under ``COMPLETED``. Steps are ranked by
    state (OUT_OF_MEMORY, NODE_FAIL/BOOT_FAIL, FAILED, TIMEOUT/DEADLINE/PREEMPTED,
    CANCELLED, any other unfinished state, then a COMPLETED step with a non-zero exit
    or signal); ties prefer numbered ``srun`` steps over ``batch``/``interactive`` over
    ``extern``, then a signal, then the earliest line. None when every step is
    COMPLETED ``0:0`` (or there are no steps).
    """
    best: SacctStep | None = None
    best_key: tuple[int, int, int, int] | None = None
    for step in job.steps:
        score = 0 if step.state == "UNKNOWN" else _SEVERITY.get(step.state, 1)
        if score == 0 and (step.exit_code or step.signal):
            score = 1
        if score == 0:
            continue
        if step.step.isdigit():
            kind = 3
        elif step.step in ("batch", "interactive"):
            kind = 2
        elif step.step == "extern":
            kind = 0
        else:
            kind = 1
        key = (score, kind, 1 if step.signal else 0, -step.line)
        if best_key is None or key > best_key:
            best, best_key = step, key
    return best


def is_fixed_width(first_lines: Sequence[str], delimiter: str | None = None) -> bool:
    """True when the lines look like ``sacct`` output without ``-P``.

    That is: an underline row of dash groups (``------------ ----------``), or, when
    no line holds the delimiter (or any usual one), rows starting with a job id whose
    columns are aligned by runs of spaces.
    """
    lines = [line for line in first_lines if line.strip()]
    if any(_RE_UNDERLINE.fullmatch(line) for line in lines):
        return True
    delimiters = (delimiter,) if delimiter else _CANDIDATE_DELIMITERS
    if not lines or any(d in line for line in lines for d in delimiters):
        return False
    return all(_RE_ALIGNED_ROW.fullmatch(line) for line in lines)


# ------------------------------------------------------------------------ the parser


class _Parser:
    """One pass over one dump."""

    def __init__(self, path: str, fields: tuple[str, ...] | None, delimiter: str | None) -> None:
        self.path = path
        self.fields_arg = fields
        self.delimiter_arg = delimiter
        self.fmt: _Format | None = None
        self.findings: list[Finding] = []
        self.dropped = 0
        self.pending: list[_Phys] = []
        """Physical lines of a record cut by a newline inside a value, so far."""
        self.pending_count = 0
        self.pending_chars = 0
        self.jobs: dict[str, _Alloc] = {}
        self.by_raw: dict[str, str] = {}
        self.waiting: list[_StepRow] = []
        """Step rows read before (or without) their allocation row."""
        self.ok_rows = 0
        self.bad_rows = 0
        self.bad_counts: Counter[int] = Counter()
        self.bad_values = 0
        self.value_sample = ""
        self.held: tuple[int, str, list[str]] | None = None
        self.any_bytes = False
        self.any_rows = False

    # ---------------------------------------------------------------- driving

    def run(self, reader: HashingReader) -> SacctDump:
        lines = iter_lines(reader, MAX_LINE)
        window: list[_Phys] = []
        meaningful = 0
        chars = 0
        for line in lines:
            phys = self._decode(line)
            window.append(phys)
            if not phys.skip and not phys.clipped:
                meaningful += 1
                chars += len(phys.text)
                if meaningful >= SNIFF_LINES or chars >= SNIFF_CHARS:
                    break
        self.fmt = self._configure(window)
        for phys in window:
            self._process(phys)
        for line in lines:
            self._process(self._decode(line))
        self._flush()
        reader.drain()
        if self.ok_rows == 0 and self.bad_rows:
            self._refuse()
        jobs = self._finish_jobs()
        if not self.any_rows:
            self._add_empty_finding()
        if self.dropped:
            self.findings.append(catalogue.finding(
                "AUD013", self.path, (Citation(self.path),),
                dropped=self.dropped, cap=MAX_FINDINGS,
            ))
        return SacctDump(
            path=self.path,
            fields=self.fmt.fields,
            delimiter=self.fmt.delimiter,
            header=self.fmt.header,
            jobs=jobs,
            digest=reader.digest(),
            findings=tuple(self.findings),
        )

    def _decode(self, line: Line) -> _Phys:
        self.any_bytes = True
        data = line.data
        if line.clipped:
            self._find("AUD007", line.number, "", length=line.length, limit=MAX_LINE)
            return _Phys(line.number, "", skip=False, clipped=True)
        if b"\x00" in data:
            self._find("AUD006", line.number, "")
            data = data.replace(b"\x00", b"")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = data.decode("utf-8", errors="replace")
            self._find("AUD005", line.number, text)
        if line.number == 1 and text.startswith("\ufeff"):
            text = text[1:]
        stripped = text.strip()
        skip = not stripped or stripped.startswith("#")
        return _Phys(line.number, text, skip=skip, clipped=False)

    # ---------------------------------------------------------------- format

    def _configure(self, window: list[_Phys]) -> _Format:
        texts = [p.text for p in window if not p.skip and not p.clipped]
        if is_fixed_width(texts, self.delimiter_arg):
            raise SacctFormatError(
                f"{self.path}: fixed-width sacct output (no -P) cannot be read safely, values "
                f"may be cut to the column width; capture a parsable dump with: {CAPTURE_HINT}"
            )
        header = _split_header(texts[0], self.delimiter_arg) if texts else None
        if header is not None:
            names, delimiter = header
            fields: tuple[str, ...] = tuple(names)
        else:
            fields = self.fields_arg or DEFAULT_FORMAT
            delimiter = self.delimiter_arg or _sniff_delimiter(texts, len(fields))
        n = len(fields)
        counts = [text.split(delimiter) for text in texts]
        with_trailing = sum(1 for parts in counts if len(parts) == n + 1 and parts[-1] == "")
        exact = sum(1 for parts in counts if len(parts) == n)
        index: dict[str, int] = {}
        for position, name in enumerate(fields):
            index.setdefault(name.lower(), position)
        free = tuple(
            position for position, name in enumerate(fields)
            if name.lower() in _FREE_TEXT and index[name.lower()] == position
        )
        checks = tuple(
            (position, _CHECKS[name.lower()]) for position, name in enumerate(fields)
            if name.lower() in _CHECKS and index[name.lower()] == position
        )
        core = tuple(
            (position, check) for position, check in checks
            if fields[position].lower() not in _LENIENT
        )
        return _Format(
            fields=fields,
            delimiter=delimiter,
            header=header is not None,
            header_key=tuple(name.lower() for name in fields) if header is not None else None,
            trailing=with_trailing > exact,
            index=index,
            free=free,
            checks=checks,
            core=core,
            open_last=fields[-1].lower() in _MULTILINE and index[fields[-1].lower()] == n - 1,
        )

    def _is_header_again(self, text: str) -> bool:
        fmt = self.fmt
        assert fmt is not None
        first = text.lstrip()[:1]
        if not first.isalpha():
            return False
        parts = [part.strip().lower() for part in text.split(fmt.delimiter)]
        if parts and parts[-1] == "" and len(parts) > 1:
            parts.pop()
        if fmt.header_key is not None and tuple(parts) == fmt.header_key:
            return True
        return len(parts) > 1 and all(part in _KNOWN for part in parts)

    # ---------------------------------------------------------------- records

    def _fit(self, text: str, strict: bool, absorb: bool = True
             ) -> tuple[str, list[str] | None]:
        """Split one (possibly joined) record into exactly one value per field; ``absorb``:
        extra fields may be given back to a free-text column that holds the delimiter."""
        fmt = self.fmt
        assert fmt is not None
        n = len(fmt.fields)
        parts = text.split(fmt.delimiter)
        count = len(parts)
        if count < n:
            return _SHORT, None
        normal: list[str] | None = None
        if count == n:
            normal = parts
        elif fmt.trailing and count == n + 1 and parts[-1] == "":
            normal = parts[:-1]
        if normal is not None:
            if not self._plausible(normal, strict):
                return (_MANY, None) if strict else (_VALUES, normal)
            return _OK, normal
        if not absorb:
            return _MANY, None
        # Too many fields: a free-text value holds the delimiter (and maybe the
        # line has a trailing one). Keep the readings whose typed columns are sane.
        plain = [self._absorb(parts, k) for k in fmt.free]
        trimmed: list[list[str]] = []
        if parts[-1] == "":
            rest = parts[:-1]
            if len(rest) == n:
                trimmed.append(rest)
            else:
                trimmed.extend(self._absorb(rest, k) for k in fmt.free)
        groups = (trimmed, plain) if fmt.trailing else (plain, trimmed)
        for group in groups:
            good = [values for values in group if self._plausible(values, True)]
            if len(good) == 1:
                return _OK, good[0]
            if len(good) > 1:
                return _AMBIGUOUS, None
        return _MANY, None

    def _absorb(self, parts: list[str], column: int) -> list[str]:
        fmt = self.fmt
        assert fmt is not None
        extra = len(parts) - len(fmt.fields)
        joined = fmt.delimiter.join(parts[column:column + extra + 1])
        return [*parts[:column], joined, *parts[column + extra + 1:]]

    def _plausible(self, values: list[str], strict: bool) -> bool:
        fmt = self.fmt
        assert fmt is not None
        checks = fmt.checks if strict else fmt.core
        return all(check.fullmatch(values[position].strip()) for position, check in checks)

    def _unfit_columns(self, values: list[str]) -> str:
        fmt = self.fmt
        assert fmt is not None
        return ", ".join(
            f"{fmt.fields[position]} {clip(values[position], 40)!r}"
            for position, check in fmt.core
            if not check.fullmatch(values[position].strip())
        )

    def _process(self, phys: _Phys) -> None:
        fmt = self.fmt
        assert fmt is not None
        if self.held is not None:
            if self._continues_held(phys):
                return
            self._commit_held()
        if self.pending:
            if phys.clipped:
                self._flush()
                return
            n = len(fmt.fields)
            count = self._count(phys)
            if (
                not phys.skip
                and count >= n
                and self._fit(phys.text, strict=False)[0] in (_OK, _VALUES)
            ):
                # A line that is a whole row on its own never continues a cut one.
                self._flush()
                self._process(phys)
                return
            total = self.pending_count + count - 1
            chars = self.pending_chars + 1 + len(phys.text)
            if total < n:
                if len(self.pending) + 1 < MAX_JOIN_LINES and chars <= MAX_RECORD_CHARS:
                    self.pending.append(phys)
                    self.pending_count, self.pending_chars = total, chars
                    return
                # Too long a join: every piece is short, and so is any run of them.
                pieces, self.pending = self.pending, []
                for piece in pieces:
                    if not piece.skip:
                        self._bad_count(piece.number, piece.text, _SHORT)
                self._process(phys)
                return
            joined = "\n".join(piece.text for piece in (*self.pending, phys))
            # A newline inside a value adds no delimiter: a join must give exactly the
            # format's fields. (Given back to a free-text column, the extra fields of two
            # rows each a field short would read as one row: the second one misread.)
            status, values = self._fit(joined, strict=True, absorb=False)
            if status == _OK and values is not None:
                first = self.pending[0].number
                self.pending = []
                self._accept(first, joined, values)
                return
            self._flush_first()
            self._process(phys)
            return
        if phys.skip or phys.clipped:
            return
        if self._is_header_again(phys.text):
            return
        status, values = self._fit(phys.text, strict=False)
        if status == _OK and values is not None:
            self._accept(phys.number, phys.text, values)
        elif status == _SHORT:
            self.pending = [phys]
            self.pending_count, self.pending_chars = self._count(phys), len(phys.text)
        elif status == _VALUES and values is not None:
            self._bad_values(phys.number, phys.text, values)
        else:
            self._bad_count(phys.number, phys.text, status)

    def _count(self, phys: _Phys) -> int:
        if phys.count < 0:
            fmt = self.fmt
            assert fmt is not None
            phys.count = phys.text.count(fmt.delimiter) + 1
        return phys.count

    def _accept(self, number: int, text: str, values: list[str]) -> None:
        """Use a fitted record, holding it back one line when its last column may go on."""
        fmt = self.fmt
        assert fmt is not None
        if fmt.open_last:
            self.held = (number, text, values)
        else:
            self._row(number, values, text)

    def _continues_held(self, phys: _Phys) -> bool:
        """Append ``phys`` to the held record when it is the rest of its last value."""
        fmt = self.fmt
        assert fmt is not None
        if self.held is None or phys.skip or phys.clipped or fmt.delimiter in phys.text:
            return False
        first = fmt.checks[0] if fmt.checks and fmt.checks[0][0] == 0 else None
        if first is not None and first[1].fullmatch(phys.text.strip()):
            return False  # a record of its own, cut after its first field
        number, text, _ = self.held
        joined = text + "\n" + phys.text
        if len(joined) > MAX_RECORD_CHARS:
            return False
        status, values = self._fit(joined, strict=True)
        if status != _OK or values is None:
            return False
        self.held = (number, joined, values)
        return True

    def _flush_first(self) -> None:
        """Give up joining: the first pending line is malformed, the others are re-read."""
        first, rest = self.pending[0], self.pending[1:]
        self.pending = []
        self._bad_count(first.number, first.text, _SHORT)
        for phys in rest:
            self._process(phys)

    def _flush(self) -> None:
        while self.pending:
            self._flush_first()
        self._commit_held()

    def _commit_held(self) -> None:
        if self.held is not None:
            number, text, values = self.held
            self.held = None
            self._row(number, values, text)

    def _bad_count(self, number: int, text: str, status: str) -> None:
        fmt = self.fmt
        assert fmt is not None
        n = len(fmt.fields)
        found = len(text.split(fmt.delimiter))
        self.bad_counts[found] += 1
        if status == _SHORT:
            error = f"{found} fields where the format has {n} (row cut short?)"
        elif status == _AMBIGUOUS:
            error = (
                f"{found} fields where the format has {n}; the extra delimiters could belong "
                "to more than one free-text column"
            )
        else:
            error = f"{found} fields where the format has {n}"
        self._bad(number, text, error)

    def _bad_values(self, number: int, text: str, values: list[str]) -> None:
        columns = self._unfit_columns(values)
        self.bad_values += 1
        if not self.value_sample:
            self.value_sample = f"line {number}: {columns}"
        self._bad(number, text, f"values do not fit their columns: {columns}; row not used")

    def _bad(self, number: int, text: str, error: str) -> None:
        self.bad_rows += 1
        self.any_rows = True
        self._find("AUD008", number, text, error=error)
        if self.ok_rows == 0 and self.bad_rows >= REFUSE_AFTER:
            self._refuse()

    def _refuse(self) -> None:
        fmt = self.fmt
        assert fmt is not None
        n = len(fmt.fields)
        shape = f"{n} fields ({','.join(fmt.fields)}) split on {fmt.delimiter!r}"
        advice = "pass the --format (and --delimiter) the dump was captured with"
        counted = sum(self.bad_counts.values())
        if counted and counted >= self.bad_values:
            found = ", ".join(str(count) for count, _ in self.bad_counts.most_common(3))
            raise SacctFormatError(
                f"{self.path}: expected {shape}, found rows of {found} fields; {advice}"
            )
        raise SacctFormatError(
            f"{self.path}: rows have the {shape} but their values do not fit them "
            f"({self.value_sample}); {advice}"
        )

    # ---------------------------------------------------------------- values

    def _row(self, number: int, values: list[str], text: str) -> None:
        fmt = self.fmt
        assert fmt is not None
        self.any_rows = True

        def get(name: str) -> str | None:
            position = fmt.index.get(name)
            return None if position is None else values[position]

        errors: list[str] = []
        job_id_text = get("jobid")
        raw_text = get("jobidraw")
        raw_match = None
        if raw_text is not None and raw_text.strip():
            raw_match = _RE_JOBIDRAW.fullmatch(raw_text.strip())
            if raw_match is None:
                errors.append(f"JobIDRaw {clip(raw_text, 40)!r}")
        id_match = None
        if job_id_text is not None:
            id_match = _RE_JOBID.fullmatch(job_id_text.strip())
            if id_match is None:
                self._bad_id(number, text, "JobID", job_id_text)
                return
        elif raw_text is not None and raw_match is None:
            self._bad_id(number, text, "JobIDRaw", raw_text)
            return

        state, state_raw = self._state(get("state"), errors)
        exit_code, signal = _exit(get("exitcode"), errors)

        step_name = None
        if id_match is not None:
            step_name = id_match.group("step")
        elif raw_match is not None:
            step_name = raw_match.group("step")
        self.ok_rows += 1

        if step_name is not None:
            step = SacctStep(step_name, state, state_raw, exit_code, signal, number)
            job_key = id_match.group("alloc") if id_match is not None else None
            raw_key = raw_match.group("alloc") if raw_match is not None else None
            self._report_values(number, text, errors)
            self._attach(_StepRow(step, job_key, raw_key, text))
            return

        start = _time(get("start"), "Start", errors)
        end = _time(get("end"), "End", errors)
        elapsed = _elapsed(get("elapsedraw"), get("elapsed"), errors)
        gpus = _gpus(get("alloctres"), errors)
        self._report_values(number, text, errors)

        job_id_raw = raw_match.group(0) if raw_match is not None else None
        if id_match is not None:
            job_id = id_match.group(0)
            task = id_match.group("task")
            spec = id_match.group("spec")
            is_array = task is not None or spec is not None
            array_job_id = id_match.group("base") if is_array else None
            array_task_id = int(task) if task is not None else None
            key = job_id
        else:
            job_id = job_id_raw or ""
            spec = None
            array_job_id = None
            array_task_id = None
            key = job_id_raw if job_id_raw is not None else f"#{number}"
        job = SacctJob(
            job_id=job_id,
            job_id_raw=job_id_raw,
            array_job_id=array_job_id,
            array_task_id=array_task_id,
            array_task_spec=spec,
            job_name=get("jobname"),
            state=state,
            state_raw=state_raw,
            exit_code=exit_code,
            signal=signal,
            start=start,
            end=end,
            elapsed_s=elapsed,
            gpus=gpus,
            node_list=get("nodelist"),
            reason=get("reason"),
            line=number,
        )
        earlier = self.jobs.get(key)
        alloc = _Alloc(job)
        if earlier is not None:
            alloc.history = [*earlier.history, earlier.job.state]
        self.jobs[key] = alloc
        if job_id_raw is not None:
            self.by_raw[job_id_raw] = key

    def _bad_id(self, number: int, text: str, column: str, value: str) -> None:
        self.bad_values += 1
        if not self.value_sample:
            self.value_sample = f"line {number}: {column} {clip(value, 40)!r}"
        self._bad(number, text, f"unreadable {column} {clip(value, 40)!r}; row not used")

    def _state(self, value: str | None, errors: list[str]) -> tuple[str, str]:
        if value is None:
            return "UNKNOWN", ""
        match = _RE_STATE.fullmatch(value.strip())
        if match is None:
            if value.strip():
                errors.append(f"State {clip(value, 40)!r}")
            return "UNKNOWN", value
        return match.group("word").upper(), value

    def _report_values(self, number: int, text: str, errors: list[str]) -> None:
        if errors:
            self._find("AUD008", number, text, error="unreadable " + ", ".join(errors))

    def _attach(self, step_row: _StepRow) -> None:
        alloc = self._parent(step_row)
        if alloc is not None:
            alloc.steps.append(step_row.step)
        else:
            self.waiting.append(step_row)

    def _parent(self, step_row: _StepRow) -> _Alloc | None:
        if step_row.job_key is not None and step_row.job_key in self.jobs:
            return self.jobs[step_row.job_key]
        if step_row.raw_key is not None:
            key = self.by_raw.get(step_row.raw_key)
            if key is not None:
                return self.jobs.get(key)
            if step_row.job_key is None:
                return self.jobs.get(step_row.raw_key)
        return None

    def _finish_jobs(self) -> tuple[SacctJob, ...]:
        for step_row in self.waiting:
            alloc = self._parent(step_row)
            if alloc is not None:
                alloc.steps.append(step_row.step)
                continue
            step = step_row.step
            parent = step_row.job_key or step_row.raw_key or "?"
            exit_text = "" if step.exit_code is None else f" {step.exit_code}:{step.signal}"
            self._find(
                "AUD008", step.line, step_row.text,
                error=(
                    f"step {parent}.{step.step} ({step.state_raw or step.state}{exit_text}) has "
                    "no allocation row in the dump; not attached"
                ),
            )
        jobs: list[SacctJob] = []
        for alloc in self.jobs.values():
            job = alloc.job
            steps = tuple(sorted(alloc.steps, key=lambda step: step.line))
            jobs.append(SacctJob(
                job_id=job.job_id,
                job_id_raw=job.job_id_raw,
                array_job_id=job.array_job_id,
                array_task_id=job.array_task_id,
                array_task_spec=job.array_task_spec,
                job_name=job.job_name,
                state=job.state,
                state_raw=job.state_raw,
                exit_code=job.exit_code,
                signal=job.signal,
                start=job.start,
                end=job.end,
                elapsed_s=job.elapsed_s,
                gpus=job.gpus,
                node_list=job.node_list,
                reason=job.reason,
                line=job.line,
                steps=steps,
                history=tuple(alloc.history),
            ))
        return tuple(jobs)

    # ---------------------------------------------------------------- findings

    def _find(self, rule_id: str, number: int, text: str, **values: object) -> None:
        if len(self.findings) >= MAX_FINDINGS:
            self.dropped += 1
            return
        quote = clip(text.replace("\n", "\\n"), 120)
        citation = Citation(self.path, line=number, quote=quote)
        self.findings.append(catalogue.finding(rule_id, self.path, (citation,), **values))

    def _add_empty_finding(self) -> None:
        fmt = self.fmt
        if not self.any_bytes:
            error = "the dump is empty (no bytes); no scheduler records to use"
        elif fmt is not None and fmt.header:
            error = "the dump holds a header but no job rows"
        else:
            error = "the dump holds no job rows (only blank, comment or unreadable lines)"
        self.findings.insert(0, catalogue.finding(
            "AUD009", self.path, (Citation(self.path),), error=error,
        ))


# ------------------------------------------------------------------------ helpers


def _normalise_fields(fields: Sequence[str] | str | None, path: str) -> tuple[str, ...] | None:
    if fields is None:
        return None
    items = fields.split(",") if isinstance(fields, str) else list(fields)
    names: list[str] = []
    for item in items:
        for part in str(item).split(","):
            name = part.strip().split("%", 1)[0].strip()
            if name:
                names.append(name)
    if not names:
        raise SacctFormatError(f"{path}: --format names no field; pass e.g. --format=JobID,State")
    return tuple(names)


def _check_delimiter(delimiter: str | None, path: str) -> str | None:
    if delimiter is None:
        return None
    if not delimiter or "\n" in delimiter or "\r" in delimiter:
        raise SacctFormatError(
            f"{path}: --delimiter {delimiter!r} is unusable; pass the string given to sacct "
            "--delimiter (default '|')"
        )
    return delimiter


def _split_header(text: str, delimiter: str | None) -> tuple[list[str], str] | None:
    """Field names and delimiter when ``text`` is a header line, else None."""
    stripped = text.strip()
    if delimiter is None:
        first = _RE_IDENT.match(stripped)
        if first is None:
            return None
        rest = stripped[first.end():]
        if not rest:
            return ([first.group()], "|") if first.group().lower() in _KNOWN else None
        separator = _RE_SEPARATOR.match(rest)
        if separator is None or separator.group().isspace():
            return None
        delimiter = separator.group()
    parts = [part.strip() for part in stripped.split(delimiter)]
    if len(parts) > 1 and parts[-1] == "":
        parts.pop()
    if not parts or not all(_RE_IDENT.fullmatch(part) for part in parts):
        return None
    known = sum(1 for part in parts if part.lower() in _KNOWN)
    if known == len(parts) or (len(parts) > 1 and 2 * known >= len(parts)):
        return parts, delimiter
    return None


def _sniff_delimiter(texts: list[str], n: int) -> str:
    """The usual delimiter that splits the most sniffed rows into ``n`` fields."""
    if n == 1 or not texts:
        return "|"
    best, best_score = "", 0
    for candidate in _CANDIDATE_DELIMITERS:
        score = 0
        for text in texts:
            parts = text.split(candidate)
            if len(parts) == n or (len(parts) == n + 1 and parts[-1] == ""):
                score += 1
        if score > best_score:
            best, best_score = candidate, score
    if best:
        return best
    for candidate in _CANDIDATE_DELIMITERS:
        if any(candidate in text for text in texts):
            return candidate
    return "|"


def _exit(value: str | None, errors: list[str]) -> tuple[int | None, int | None]:
    if value is None or not value.strip():
        return None, None
    match = _RE_EXIT.fullmatch(value.strip())
    if match is None:
        errors.append(f"ExitCode {clip(value, 40)!r}")
        return None, None
    return int(match.group(1)), int(match.group(2))


def _time(value: str | None, column: str, errors: list[str]) -> int | None:
    if value is None:
        return None
    seconds = _epoch(value.strip())
    if seconds is _UNREADABLE:
        errors.append(f"{column} {clip(value, 40)!r}")
        return None
    return seconds


_UNREADABLE = -(1 << 62)
"""Marks a time that cannot be read (no real epoch is that far in the past)."""


@lru_cache(maxsize=8192)
def _epoch(text: str) -> int | None:
    """UTC epoch seconds of a ``standard`` sacct time, None when unknown, else _UNREADABLE."""
    if text.lower() in _TIME_WORDS:
        return None
    if _RE_EPOCH.fullmatch(text):
        return int(text)
    match = _RE_TIME.fullmatch(text)
    if match is None:
        return _UNREADABLE
    try:
        year, month, day, hour, minute, second = (int(group) for group in match.groups())
        moment = datetime(year, month, day, hour, minute, second, tzinfo=UTC)
    except ValueError:
        return _UNREADABLE
    return int(moment.timestamp())


def _elapsed(raw: str | None, elapsed: str | None, errors: list[str]) -> int | None:
    if raw is not None:
        text = raw.strip()
        if not text:
            return None
        if _RE_UINT.fullmatch(text):
            return int(text)
        errors.append(f"ElapsedRaw {clip(raw, 40)!r}")
        return None
    if elapsed is None:
        return None
    seconds = _duration(elapsed)
    if seconds is None and elapsed.strip() and elapsed.strip().upper() not in (
        "INVALID", "UNLIMITED"
    ):
        errors.append(f"Elapsed {clip(elapsed, 40)!r}")
    return seconds


def _duration(value: str) -> int | None:
    """``[D-]HH:MM:SS``, ``MM:SS`` or ``MM:SS.mmm`` in whole seconds, else None."""
    match = _RE_DURATION.fullmatch(value.strip())
    if match is None:
        return None
    days = int(match.group("d") or 0)
    hours = int(match.group("h") or 0)
    return ((days * 24 + hours) * 60 + int(match.group("m"))) * 60 + int(match.group("s"))


def _gpus(value: str | None, errors: list[str]) -> int | None:
    """GPUs in an AllocTRES value: untyped when present, else the distinct typed summed."""
    if value is None:
        return None
    count = _gpu_count(value.strip())
    if count is None:
        errors.append(f"AllocTRES {clip(value, 40)!r}")
    return count


@lru_cache(maxsize=4096)
def _gpu_count(text: str) -> int | None:
    if not text:
        return 0
    if _CHECK_TRES.fullmatch(text) is None:
        return None
    untyped: int | None = None
    typed: dict[str, int] = {}
    for item in text.split(","):
        match = _RE_GPU.fullmatch(item.strip())
        if match is None:
            continue
        count = int(match.group("count"))
        kind = match.group("type")
        if kind is None:
            untyped = count
        else:
            typed[kind] = max(count, typed.get(kind, 0))
    if untyped is not None:
        return untyped
    return sum(typed.values())


def _number_key(text: str) -> tuple[int, int, str]:
    return (0, int(text), "") if _RE_UINT.fullmatch(text) else (1, 0, text)


def _sort_key(job: SacctJob) -> tuple[tuple[int, int, str], tuple[int, int], tuple[int, int, str]]:
    if job.array_job_id is not None:
        group = job.array_job_id
    else:
        match = _RE_JOBID.fullmatch(job.job_id)
        group = match.group("base") if match is not None else job.job_id
    if job.array_task_id is not None:
        task = (job.array_task_id, 0)
    elif job.array_task_spec is not None:
        first = re.match(r"\d{1,18}", job.array_task_spec)
        task = (int(first.group()) if first else 0, 1)
    else:
        task = (-1, 0)
    return _number_key(group), task, _number_key(job.job_id)

