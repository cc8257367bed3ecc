"""Value parsing of a scheduler dump's columns: ids, states, exit codes, times, TRES GPU counts.

Each reader takes a column's text (None: the dump has no such column) and, for a value it
cannot read, appends the column and value to ``errors`` (one AUD008 per row says them all).
:data:`_CHECKS` are the shape checks of the typed columns, used to choose between readings
of a row (see :mod:`auditor.collect.sacct.framing`).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from functools import lru_cache

from auditor._text import clip

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
    "restarts": _CHECK_UINT,
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


def _state(value: str | None, errors: list[str]) -> tuple[str, str]:
    """``State`` normalised to its first word without ``+``, and the text it came from."""
    if value is None:
        return "UNKNOWN", ""
    word = _state_word(value)
    if word is None:
        if value.strip():
            errors.append(f"State {clip(value, 40)!r}")
        return "UNKNOWN", value
    return word, value


@lru_cache(maxsize=1024)
def _state_word(value: str) -> str | None:
    """The normalised state of a ``State`` text, None when it names none (a dump repeats a
    few dozen states: each read once)."""
    match = _RE_STATE.fullmatch(value.strip())
    return None if match is None else match.group("word").upper()


def _exit(value: str | None, errors: list[str]) -> tuple[int | None, int | None]:
    if value is None:
        return None, None
    pair = _exit_pair(value)
    if pair is None:
        errors.append(f"ExitCode {clip(value, 40)!r}")
        return None, None
    return pair


@lru_cache(maxsize=1024)
def _exit_pair(value: str) -> tuple[int | None, int | None] | None:
    """The exit code and signal of an ``ExitCode`` text (both None when empty), None when
    unreadable (a dump repeats a few dozen codes: each read once)."""
    if not value.strip():
        return None, None
    match = _RE_EXIT.fullmatch(value.strip())
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2))


def _count(value: str | None, column: str, errors: list[str]) -> int | None:
    """A count column (``Restarts``): None when absent or empty."""
    if value is None or not value.strip():
        return None
    if _RE_UINT.fullmatch(value.strip()):
        return int(value.strip())
    errors.append(f"{column} {clip(value, 40)!r}")
    return None


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
    if _RE_TIME.fullmatch(text) is None:
        return _UNREADABLE
    # The day once (a dump's times fall on a few hundred days), the time of day by
    # arithmetic: a datetime per row was a sixth of the read. Same ranges as datetime.
    midnight = _midnight(text[:10])
    hour, minute, second = int(text[11:13]), int(text[14:16]), int(text[17:19])
    if midnight is None or hour > 23 or minute > 59 or second > 59:
        return _UNREADABLE
    # (negated twice: a sum is allocated a digit longer than it needs, 48 bytes where a
    # copy takes 32, and each row keeps two of them)
    negative = -(midnight + hour * 3600 + minute * 60 + second)
    return -negative


@lru_cache(maxsize=4096)
def _midnight(day: str) -> int | None:
    """UTC epoch seconds of the midnight starting ``day`` (``YYYY-MM-DD``), None when no
    such day exists (``2023-02-30``, year 0)."""
    try:
        moment = datetime(int(day[:4]), int(day[5:7]), int(day[8:10]), tzinfo=UTC)
    except ValueError:
        return None
    return int(moment.timestamp())


def forget_values() -> None:
    """Empty the caches of the values one dump's rows repeat (times, AllocTRES): at the end
    of each dump, whose last few thousand values they would otherwise hold, scattered
    over the memory its parse took."""
    _epoch.cache_clear()
    _state_word.cache_clear()
    _exit_pair.cache_clear()
    _midnight.cache_clear()
    _gpu_count.cache_clear()


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
    total = sum(typed.values())
    return total if total < 1 << 63 else None  # (types summed past 64 bits: no count held)

