"""``sacct --json`` output read as the ``-P`` dump of the same jobs.

Slurm 23.11 and later (data_parser v0.0.40 and after) dump the accounting records exactly:
the process's real exit status (143, where ``-P`` prints ``15:0``), ``-D`` honoured, and
from 24.11 ``restart_cnt``. :func:`json_rows` turns each record of the document's
``jobs`` list into the row ``sacct -P`` prints for it (JobID, JobIDRaw, JobName, State,
ExitCode, Start, End, ElapsedRaw, AllocTRES, NodeList, Reason, Restarts), then each of its
``steps`` into a step row, and gives them to the ``-P`` reader's job assembly in that order,
so a JSON dump and a ``-P`` dump of the same array read the same (attempts of ``-D``,
pending ranges, steps, findings). A row's ``line`` is its place in that order (a ``-P``
dump without header numbers its lines the same way), and its exit code is exact
(``exit_exact``: the model's ``exit_code_may_be`` is the code alone, and ``auditor sacct
--json`` shows no ``exit_code_may_be``).

The shapes, from Slurm's ``src/plugins/data_parser/v0.0.4x/parsers.c``: ``state.current``
a list of flags (``["PENDING", "REQUEUED"]`` prints ``REQUEUED``: Slurm's
``job_state_string`` gives a flag before the base state); ``exit_code`` ``{status: [...],
return_code: {set, infinite, number}, signal: {id: {...}, name}}``; ``array.task_id`` a
``{set, infinite, number}``; a pending range's ``array.task`` a hex bitmap (``0xC000``:
tasks 14 and 15) or a range list; ``time.start``/``end`` epoch seconds (0: not yet), a
step's a ``{set, number}``; ``tres.allocated`` ``[{type, name, id, count}]``; a step's
``step.id`` ``"16.batch"``.

Refused (:class:`~auditor.errors.SacctFormatError`, one line): bytes that are not a JSON
object (malformed, cut short, not UTF-8), one over :data:`MAX_JSON_BYTES`, a document
without a ``jobs`` list, and the JSON of Slurm 22.05 (openapi dbv0.0.38) and 23.02
(data_parser v0.0.39), which dump every normal exit as ``SUCCESS`` with return code 0 (and
ignore ``-D``): their exit codes cannot be known. A record that cannot be read is an
AUD008 naming its place (``jobs[3]``); when none can, the dump is refused.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from auditor._io import HashingReader
from auditor._text import clip
from auditor.collect.sacct.encoding import Transcoded
from auditor.collect.sacct.format import CAPTURE_HINT, DEFAULT_FORMAT
from auditor.collect.sacct.framing import plain_format
from auditor.errors import SacctFormatError

JSON_FIELDS: tuple[str, ...] = (*DEFAULT_FORMAT, "Restarts")
"""The ``-P`` fields each JSON record is turned into."""

MAX_JSON_BYTES = 512 << 20
"""Largest ``sacct --json`` document read (read as text, about twice its bytes at the peak)."""

_FLAG_ORDER: tuple[str, ...] = (
    "COMPLETING", "STAGE_OUT", "CONFIGURING", "RESIZING", "REQUEUED", "REQUEUE_FED",
    "REQUEUE_HOLD", "SPECIAL_EXIT", "STOPPED", "REVOKED", "RESV_DEL_HOLD", "SIGNALING",
)
"""The state flags ``job_state_string`` prints in a base state's place, in its order."""

_RE_RELEASE = re.compile(r"(\d{1,4})\.(\d{1,4})")
_RE_RUN = re.compile(r"1+")
_MAX_BITMAP_DIGITS = 1_000_003
"""Longest hex bitmap read (Slurm's MaxArraySize is at most 4,000,001 tasks)."""
_FIRST_EXACT = (23, 11)
"""The first Slurm whose ``sacct --json`` dumps real exit statuses (data_parser v0.0.40)."""


class _Bad(Exception):
    """A record that cannot be turned into a row (the message says what is wrong)."""


def looks_like_json(head: bytes) -> bool:
    """Whether a dump's first bytes open a JSON object (a ``-P`` dump never starts with ``{``)."""
    return head.removeprefix(b"\xef\xbb\xbf").lstrip()[:1] == b"{"


@dataclass(frozen=True, slots=True)
class BadRecord:
    """A record of the ``jobs`` list that gives no row (where it is, and why)."""

    where: str
    why: str


JSON_FORMAT = plain_format(JSON_FIELDS, "|")
"""The format each JSON record's rows are read with (``|`` between the fields)."""


def json_rows(reader: HashingReader | Transcoded, head: bytes, path: str
              ) -> Iterator[list[str] | BadRecord]:
    """Read the rest of ``reader`` (``head`` was read already) as ``sacct --json``: each
    record's rows as ``-P`` prints them (:data:`JSON_FIELDS`' values), in the dump's order,
    or a :class:`BadRecord` for one that cannot be read. Raises
    :class:`~auditor.errors.SacctFormatError` (before the first row) for a document that
    is no sacct --json output, or one of a Slurm before 23.11.

    The document is parsed a record of ``jobs`` at a time (:func:`_walk`), each made into
    its rows and let go: parsed whole, a dump's objects took ten times its bytes (5 GB for
    one of 500 MB); now about twice its bytes, while it is read."""
    text = _text_of(reader, head, path)
    found: list[list[str] | BadRecord] = []
    first: list[Any] = []  # (the first record that is an object: its shape dates a dump)

    def take(index: int, record: Any) -> None:
        if index < 0:  # (a "jobs" member begins: a later one stands alone, as orjson's did)
            found.clear()
            first.clear()
            return
        if not first and isinstance(record, dict):
            first.append(record)
        try:
            found.extend(_rows(record))
        except _Bad as error:
            found.append(BadRecord(f"jobs[{index}]", f"jobs[{index}]: {error}; record not used"))

    depth = sys.getrecursionlimit()
    try:  # (the stdlib's scanner stops at the interpreter's depth; orjson's limit is 1,024)
        sys.setrecursionlimit(max(depth, 4_000))
        document = _walk(text, take)
    except (ValueError, RecursionError) as error:  # (JSON's errors; an integer of 4,300+
        # digits the stdlib will not convert)
        raise SacctFormatError(f"{path}: not readable JSON ({clip(str(error), 160)}): cut "
                               "short, altered or not UTF-8; capture it again") from None
    except _NoObject:
        raise SacctFormatError(f"{path}: JSON that is no object is no sacct --json output"
                               ) from None
    finally:
        sys.setrecursionlimit(depth)
    del text
    if document.get("jobs") is not _LISTED:  # (absent, or no list)
        raise SacctFormatError(f"{path}: JSON without a 'jobs' list is no sacct --json output; "
                               f"capture with sacct --json, or a -P dump with: {CAPTURE_HINT}")
    _refuse_old(document, first, path)
    yield from found


class _NoObject(Exception):
    """The document is JSON, but no object."""


_SPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()
_LISTED = object()
"""What :func:`_walk` keeps for a ``jobs`` member that is a list (its records were taken)."""


def _skip(text: str, at: int) -> int:
    """Where the white space from ``at`` ends."""
    found = _SPACE.match(text, at)
    return found.end() if found is not None else at


def _value(text: str, at: int) -> tuple[Any, int]:
    """The JSON value at ``at`` and where it ends, as orjson reads it (the stdlib's scanner
    finds its end; orjson parses it, so what it refuses, a lone surrogate, ``NaN``, a
    number past a double's range, is refused here too)."""
    _, end = _DECODER.raw_decode(text, at)
    try:
        return orjson.loads(text[at:end]), end
    except orjson.JSONDecodeError as error:  # (its place in the document, not the slice)
        raise json.JSONDecodeError(error.msg, text, at + error.pos) from None


def _walk(text: str, take: Callable[[int, Any], None]) -> dict[str, Any]:
    """The top-level object of ``text``: its members other than ``jobs``, parsed; each
    element of its ``jobs`` list given to ``take`` (its index, its value) as it is parsed,
    and ``jobs`` itself kept as :data:`_LISTED` (a ``jobs`` that is no list: as it is, and
    then no sacct --json output). ``take(-1, None)`` says a ``jobs`` member begins."""
    at = _skip(text, 0)
    if text[at:at + 1] != "{":
        _value(text, at)  # (malformed: the scanner says where; else JSON of another kind)
        raise _NoObject
    members: dict[str, Any] = {}
    at = _skip(text, at + 1)
    if text[at:at + 1] == "}":
        return _ended(text, at + 1, members)
    while True:
        key, at = _value(text, at)
        at = _skip(text, at)
        if not isinstance(key, str) or text[at:at + 1] != ":":
            raise json.JSONDecodeError("Expecting a string key and ':'", text, at)
        at = _skip(text, at + 1)
        if key == "jobs":
            take(-1, None)
        if key == "jobs" and text[at:at + 1] == "[":
            at = _jobs(text, at + 1, take)
            members[key] = _LISTED
        else:
            members[key], at = _value(text, at)
        at = _skip(text, at)
        mark = text[at:at + 1]
        at = _skip(text, at + 1)
        if mark == "}":
            return _ended(text, at, members)
        if mark != ",":
            raise json.JSONDecodeError("Expecting ',' delimiter", text, at)


def _jobs(text: str, at: int, take: Callable[[int, Any], None]) -> int:
    """Give each element of the list whose ``[`` was just before ``at`` to ``take``; where
    the list ends."""
    at = _skip(text, at)
    if text[at:at + 1] == "]":
        return at + 1
    index = 0
    while True:
        record, at = _value(text, at)
        take(index, record)
        index += 1
        at = _skip(text, at)
        mark = text[at:at + 1]
        at = _skip(text, at + 1) if mark == "," else at + 1
        if mark == "]":
            return at
        if mark != ",":
            raise json.JSONDecodeError("Expecting ',' delimiter", text, at - 1)


def _ended(text: str, at: int, members: dict[str, Any]) -> dict[str, Any]:
    """``members``, where nothing but white space follows the object."""
    if _skip(text, at) != len(text):
        raise json.JSONDecodeError("Extra data", text, at)
    return members


def _text_of(reader: HashingReader | Transcoded, head: bytes, path: str) -> str:
    """The document as text (refused over :data:`MAX_JSON_BYTES`, or not UTF-8)."""
    data = _load(reader, head, path)
    try:
        return data.removeprefix(b"\xef\xbb\xbf").decode("utf-8")
    except UnicodeDecodeError as error:
        raise SacctFormatError(f"{path}: not readable JSON ({clip(str(error), 160)}): cut "
                               "short, altered or not UTF-8; capture it again") from None


def _load(reader: HashingReader | Transcoded, head: bytes, path: str) -> bytes:
    parts: list[bytes] = []
    size = 0
    chunk = head
    while chunk:
        size += len(chunk)
        if size > MAX_JSON_BYTES:
            reader.drain()
            raise SacctFormatError(
                f"{path}: sacct --json output over {MAX_JSON_BYTES:,} bytes is not read; "
                f"capture a -P dump with: {CAPTURE_HINT}")
        parts.append(chunk)
        chunk = reader.read()
    return b"".join(parts)


def _refuse_old(document: dict[str, Any], jobs: Sequence[Any], path: str) -> None:
    """Refuse the JSON of a Slurm before 23.11, by its version or, without one, by its
    shape (``state.current`` a string, not a list of flags)."""
    release, parser = _version(document)
    numbers = _RE_RELEASE.match(release or "")
    old = False
    if numbers is not None:
        old = (int(numbers.group(1)), int(numbers.group(2))) < _FIRST_EXACT
    elif parser:
        old = any(name in parser for name in ("v0.0.38", "v0.0.39", "v0.0.37", "v0.0.36"))
    else:
        first = next((job for job in jobs if isinstance(job, dict)), {})
        state = first.get("state")
        old = isinstance(state, dict) and isinstance(state.get("current"), str)
    if old:
        named = f"Slurm {release}" if release else "a Slurm before 23.11"
        plugin = f" ({parser})" if parser else ""
        raise SacctFormatError(
            f"{path}: sacct --json of {named}{plugin} is refused: before 23.11 it dumps every "
            "normal exit as SUCCESS with return code 0 (and ignores -D), so no exit code can "
            f"be known; capture a -P dump with: {CAPTURE_HINT}")


def _version(document: dict[str, Any]) -> tuple[str | None, str | None]:
    """The Slurm release (``24.11.5``) and the parser (``data_parser/v0.0.42``,
    ``openapi/dbv0.0.38``) the document's ``meta`` names, each None when absent."""
    meta = document.get("meta")
    if not isinstance(meta, dict):
        return None, None
    plugin = _obj(meta.get("plugin"))
    parser = plugin.get("data_parser") or plugin.get("type")
    slurm = meta.get("slurm") or meta.get("Slurm")
    release = None
    if isinstance(slurm, dict):
        release = slurm.get("release")
        version = slurm.get("version")
        if not release and isinstance(version, dict):
            release = f"{version.get('major')}.{version.get('minor')}.{version.get('micro')}"
    return (str(release) if release else None), (str(parser) if parser else None)


# ------------------------------------------------------------------------ records

def _rows(record: Any) -> list[list[str]]:
    """The ``-P`` rows of one JSON job record: its own, then each step's."""
    if not isinstance(record, dict):
        raise _Bad(f"a {type(record).__name__}, not an object")
    raw = _int(record.get("job_id"), "job_id")
    job_id = _job_id(record, raw)
    state = record.get("state")
    if not isinstance(state, dict):
        raise _Bad("no state object")
    times = _obj(record.get("time"))
    restarts = record.get("restart_cnt")
    row = [
        job_id, str(raw), _text(record.get("name")),
        _state(state.get("current"), record.get("kill_request_user")),
        _exit(record.get("exit_code")),
        _epoch(times.get("start")), _epoch(times.get("end")), _count(times.get("elapsed")),
        _tres(record.get("tres")), _text(record.get("nodes")), _text(state.get("reason")),
        str(restarts) if isinstance(restarts, int) and not isinstance(restarts, bool) else "",
    ]
    rows = [row]
    steps = record.get("steps") or []
    if not isinstance(steps, list):
        raise _Bad("steps is no list")
    for step in steps:
        rows.append(_step_row(step, job_id, raw))
    return rows


def _step_row(step: Any, job_id: str, raw: int) -> list[str]:
    if not isinstance(step, dict):
        raise _Bad("a step that is no object")
    ident = _obj(step.get("step"))
    name = _step_name(ident.get("id"), raw)
    times = _obj(step.get("time"))
    nodes = _obj(step.get("nodes"))
    return [
        f"{job_id}.{name}", f"{raw}.{name}", _text(ident.get("name")),
        _state(step.get("state"), step.get("kill_request_user")), _exit(step.get("exit_code")),
        _epoch(times.get("start")), _epoch(times.get("end")), _count(times.get("elapsed")),
        _tres(step.get("tres")), _text(nodes.get("range")), "", "",
    ]


def _step_name(value: Any, raw: int) -> str:
    """``batch`` of ``"16.batch"`` (v0.0.40 on); ``step_id`` of an object (v0.0.39)."""
    if isinstance(value, dict):
        value = value.get("step_id")
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str) or not value:
        raise _Bad(f"step of job {raw} without a step id")
    name = value.split(".", 1)[1] if "." in value else value
    if not name:
        raise _Bad(f"step id {clip(value, 40)!r}")
    return name


def _job_id(record: dict[str, Any], raw: int) -> str:
    """The JobID ``-P`` prints: ``1_3`` for an element, ``1_[14-15%12]`` for a pending
    range, ``7+1`` for a het job's component, else the job id itself."""
    array = _obj(record.get("array"))
    base = array.get("job_id")
    if isinstance(base, int) and base > 0:
        task = _no_val(array.get("task_id"))
        if task is not None:
            return f"{base}_{task}"
        spec = _tasks(array.get("task"))
        if spec:
            limits = array.get("limits")
            most = _dig(limits, "max", "running", "tasks")
            return f"{base}_[{spec}{f'%{most}' if isinstance(most, int) and most else ''}]"
    het = _obj(record.get("het"))
    het_id, offset = het.get("job_id"), _no_val(het.get("job_offset"))
    if isinstance(het_id, int) and het_id > 0 and offset is not None:
        return f"{het_id}+{offset}"
    return str(raw)


def _tasks(value: Any) -> str:
    """A pending range's tasks as sacct prints them: ``0xC000`` (a hex bitmap, bit n set for
    task n) gives ``14-15``; a range list (``4-8,10``) is kept."""
    if not isinstance(value, str) or not value:
        return ""
    if not value.lower().startswith("0x"):
        return value
    if len(value) > _MAX_BITMAP_DIGITS:
        raise _Bad(f"array task bitmap of {len(value):,} characters")
    try:
        bits = int(value, 16)
    except ValueError:
        raise _Bad(f"array task bitmap {clip(value, 40)!r}") from None
    low_first = f"{bits:b}"[::-1]  # (character n is task n)
    return ",".join(
        str(run.start()) if run.end() - run.start() == 1 else f"{run.start()}-{run.end() - 1}"
        for run in _RE_RUN.finditer(low_first))


def _state(value: Any, requester: Any) -> str:
    """The state as sacct prints it: a flag in the base state's place, ``CANCELLED by N``."""
    if isinstance(value, str):
        flags = [value]
    elif isinstance(value, list) and all(isinstance(flag, str) for flag in value):
        flags = value
    else:
        raise _Bad(f"state {clip(repr(value), 40)}")
    if not flags:
        raise _Bad("an empty state")
    shown = next((flag for flag in _FLAG_ORDER if flag in flags), flags[0])
    if shown == "CANCELLED" and isinstance(requester, str | int) and str(requester):
        return f"CANCELLED by {requester}"
    return shown


def _exit(value: Any) -> str:
    """``code:signal`` with the exact code: ``143:0`` for an exit 143, ``0:9`` for SIGKILL;
    empty when the process has not ended (``PENDING``) or the status is unreadable."""
    if value is None:
        return ""
    if not isinstance(value, dict):
        raise _Bad(f"exit_code {clip(repr(value), 40)}")
    status = value.get("status")
    statuses = {word for word in (status if isinstance(status, list) else [status])
                if isinstance(word, str)}
    signal = _no_val(_dig(value, "signal", "id"))
    code = _no_val(value.get("return_code"))
    if "SIGNALED" in statuses or "CORE_DUMPED" in statuses:
        return f"0:{signal or 0}"
    if statuses & {"SUCCESS", "ERROR"} and code is not None:
        return f"{code}:0"
    return ""


def _tres(value: Any) -> str:
    """``tres.allocated`` as AllocTRES prints it (``gres/gpu:a100=2,gres/gpu=2``)."""
    items = _dig(value, "allocated")
    if items is None:
        return ""
    if not isinstance(items, list):
        raise _Bad("tres.allocated is no list")
    parts = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("type"), str):
            raise _Bad(f"tres item {clip(repr(item), 40)}")
        name = item.get("name")
        key = f"{item['type']}/{name}" if name else item["type"]
        count = item.get("count")  # (energy may be -2: not measured)
        if not isinstance(count, int) or isinstance(count, bool):
            raise _Bad(f"tres count {clip(repr(count), 40)}")
        parts.append(f"{key}={count}")
    return ",".join(parts)


def _epoch(value: Any) -> str:
    number = _no_val(value)
    return str(number) if number else "Unknown"


def _count(value: Any) -> str:
    number = _no_val(value)
    return "" if number is None else str(number)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _int(value: Any, what: str) -> int:
    number = _no_val(value)
    if number is None:
        raise _Bad(f"{what} {clip(repr(value), 40)}")
    return number


def _no_val(value: Any) -> int | None:
    """An integer, or a ``{set, infinite, number}`` that is set and finite; else None."""
    if isinstance(value, dict):
        if not value.get("set") or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def _obj(value: Any) -> dict[str, Any]:
    """``value`` when it is an object, else an empty one."""
    return value if isinstance(value, dict) else {}


def _dig(value: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value
