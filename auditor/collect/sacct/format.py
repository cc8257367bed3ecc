"""The dump's format: field names, the delimiter, a header line, fixed-width output.

:func:`_split_header` reads a header line, :func:`_sniff_delimiter` settles the delimiter of
a dump without one, :func:`is_fixed_width` recognises ``sacct`` output without ``-P``; a
:class:`_Format` is what the first rows settled, used to split every row after them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from auditor.errors import SacctFormatError

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
    "ResvCPURAW", "Restarts", "SLUID", "Start", "State", "StdErr", "StdIn", "StdOut", "Submit",
    "SubmitLine", "Suspended", "SystemComment", "SystemCPU", "Timelimit", "TimelimitRaw",
    "TotalCPU", *_TRES_USAGE, "UID", "User", "UserCPU", "WCKey", "WCKeyID", "WorkDir",
)
_KNOWN: frozenset[str] = frozenset(name.lower() for name in _KNOWN_FIELDS)

_FREE_TEXT: frozenset[str] = frozenset({
    "jobname", "submitline", "comment", "admincomment", "systemcomment", "reason", "workdir",
    "stdout", "stderr", "stdin", "constraints", "extra", "container", "wckey",
})
"""Columns a user can fill with arbitrary text, so the only ones that may hold the delimiter."""

_RE_UNDERLINE = re.compile(r"\s*-{3,}(?:\s+-{3,})*\s*")
_RE_IDENT = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
_RE_SEPARATOR = re.compile(r"[^A-Za-z0-9_]+")
_RE_ALIGNED_ROW = re.compile(r"\s*\d+[\w.+\[\]\-%,]*\s{2,}\S.*\s{2,}\S.*", re.DOTALL)

_LENIENT: frozenset[str] = frozenset({
    "start", "end", "submit", "eligible", "elapsed", "timelimit", "totalcpu", "cputime",
    "usercpu", "systemcpu", "suspended",
})
"""Checked columns whose bad value only costs that value (None and AUD008), not the row."""

_MULTILINE: frozenset[str] = frozenset({
    "jobname", "submitline", "comment", "admincomment", "systemcomment", "extra",
})
"""Free-text columns that really hold newlines (scripts, ``--wrap`` commands, JSON)."""


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


def is_fixed_width(first_lines: Sequence[str], delimiter: str | None = None) -> bool:
    """True when the lines look like ``sacct`` output without ``-P``.

    That is: an underline row of dash groups (``------------ ----------``) above rows
    most of which hold no delimiter, or, when no line holds the delimiter (or any usual
    one), rows starting with a job id whose columns are aligned by runs of spaces.
    """
    lines = [line for line in first_lines if line.strip()]
    delimiters = (delimiter,) if delimiter else _CANDIDATE_DELIMITERS
    rows = [line for line in lines if not _RE_UNDERLINE.fullmatch(line)]
    delimited = sum(1 for line in rows if any(d in line for d in delimiters))
    if len(rows) < len(lines):
        # A dashed line frames a parsable dump too (``-p`` output pasted under one): it is
        # fixed width only when its rows are not, for the most part, delimited.
        return 2 * delimited < len(rows) or not rows
    if not lines or delimited:
        return False
    return all(_RE_ALIGNED_ROW.fullmatch(line) for line in lines)


def is_frame_line(stripped: str) -> bool:
    """Whether a stripped line is a dashed frame line (``-----  ----``), never a record."""
    return stripped[:1] == "-" and _RE_UNDERLINE.fullmatch(stripped) is not None



def check_options(fields: Sequence[str] | str | None, delimiter: str | None,
                  given: str) -> None:
    """Refuse (``SacctFormatError``, naming ``given``) a ``--format`` naming no field or a
    ``--delimiter`` no dump can be split on, before any dump is read."""
    _normalise_fields(fields, given)
    _check_delimiter(delimiter, given)


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

