"""Terminal-event matchers compiled (contract v1.2, "Terminal-event matchers").

A :class:`~auditor.model.presets.TerminalSpec` (a preset's or a protocol's) made into what a
log's scanner asks of each line it examines: the steps the line states (with their totals),
whether it vetoes the file's events, whether it is a step-less end line (a marker), and
whether a JSON record on it (``:::MLLOG {...}``) meets the spec's predicates. Patterns are
compiled once per spec and process. A protocol's own patterns run under ``regex``'s time
limit (a pattern that backtracks without end is given up, never hangs the audit); a preset's
are ours, and run under ``re``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

import orjson

from auditor.model.presets import PRESETS, JsonTest, TerminalSpec

MLLOG = ":::MLLOG "
PATTERN_TIMEOUT = 1.0
"""Seconds a protocol's pattern may search one line (as ``log_events``'s)."""


class SpecError(ValueError):
    """A ``terminal_event`` that cannot work; ``str()`` says why in one line."""


@dataclass(frozen=True, slots=True)
class Step:
    """A step a line states: the step (offset applied) and its total when the line gives it."""

    step: int
    total: int | None
    at: int = 0
    """Where the match starts in the line (a message quoting the line is told by what
    precedes it)."""


class Matcher:
    """A compiled :class:`TerminalSpec`."""

    def __init__(self, spec: TerminalSpec) -> None:
        self.spec = spec
        own = not spec.triggers  # (a protocol's pattern: under regex's time limit)
        self.patterns = [_compile(text, "pattern", own, step=True) for text in spec.patterns]
        self.veto = [_compile(text, "veto", own) for text in spec.veto]
        self.marker = [_compile(text, "marker", own) for text in spec.marker]
        self.restart = [_compile(text, "restart", own) for text in spec.restart]
        self.timed = own
        self.triggers = tuple(word.encode() for word in spec.triggers)

    def steps(self, content: str) -> Iterator[Step]:
        """The steps ``content`` states (``TimeoutError`` when a protocol's pattern ran past
        :data:`PATTERN_TIMEOUT`)."""
        offset = self.spec.offset
        for pattern in self.patterns:
            found = (list(pattern.finditer(content, timeout=PATTERN_TIMEOUT)) if self.timed
                     else pattern.finditer(content))
            for match in found:
                step = _number(match.group("step"))
                if step is None:
                    continue
                total = _number(match.groupdict().get("total"))
                yield Step(step + offset, None if total is None else total + offset,
                           match.start())

    def vetoes(self, content: str) -> bool:
        return any(_search(pattern, content, self.timed) for pattern in self.veto)

    def marks(self, content: str) -> bool:
        return any(_search(pattern, content, self.timed) for pattern in self.marker)

    def restarts(self, content: str) -> bool:
        return any(_search(pattern, content, self.timed) for pattern in self.restart)



def record_of(content: str) -> dict[str, Any] | None:
    """The ``:::MLLOG`` record on ``content`` (None when there is none, or it is not a JSON
    object)."""
    at = content.find(MLLOG)
    if at < 0:
        return None
    try:
        record = orjson.loads(content[at + len(MLLOG):])
    except orjson.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None


def holds(tests: tuple[JsonTest, ...], record: object, steps: int | None = None) -> bool:
    """Whether ``record`` meets every predicate (none: never). Two fields compared must hold
    equal values, neither null nor a flag, and where the dispatch gives ``steps``, two counts
    (:func:`_count`) must also equal it (a trainer's ``global_step == max_steps`` of another
    step count is not this run's end)."""
    if not tests or not isinstance(record, dict):
        return False
    for path, how, value in tests:
        found, have = field(record, path)
        if not found:
            return False
        if how == "field":
            other_found, other = field(record, str(value))
            # (two flags, or two nulls, equal say nothing of a run's end)
            if not other_found or have is None or isinstance(have, bool) \
                    or not _same(have, other):
                return False
            count = _count(have)
            if steps is not None and count is not None and count != steps:
                return False
        elif not _same(have, value):
            return False
    return True


def short_of(tests: tuple[JsonTest, ...], record: object, steps: int | None = None
             ) -> str | None:
    """What a record that fails ``tests`` says of the run's end, where its own counts show it
    stopped short (two compared fields both counts and unequal: ``global_step`` 300 of
    ``max_steps`` 1000; or equal to another count than the dispatched ``steps``), as a
    phrase; None when it shows nothing of the kind."""
    if not isinstance(record, dict) or holds(tests, record, steps):
        return None
    for path, how, value in tests:
        if how != "field":
            continue
        have, other = _count(field(record, path)[1]), _count(field(record, str(value))[1])
        if have is None or other is None or (have == other and steps in (None, have)):
            continue
        return f"{path} {have} of {value} {other}" + (
            f" (the dispatch gives {steps})" if have == other else "")
    return None


def step_count(tests: tuple[JsonTest, ...], record: object) -> int | None:
    """The count of steps ``record`` holds in the first field the predicates compare with
    another (``current_steps`` of ``current_steps == total_steps``); None where the
    predicates compare no fields, or the record holds no count there."""
    if not isinstance(record, dict):
        return None
    for path, how, _ in tests:
        if how == "field":
            return _count(field(record, path)[1])
    return None


def field(record: dict[str, Any], path: str) -> tuple[bool, object]:
    """(found, value) of a dotted path (a key holding a dot is tried whole first)."""
    if path in record:
        return True, record[path]
    node: object = record
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def aborted(record: dict[str, Any]) -> bool:
    """An MLPerf ``run_stop`` whose status is ``aborted``: the trainer's own abort."""
    metadata = record.get("metadata")
    return record.get("key") == "run_stop" and isinstance(metadata, dict) \
        and metadata.get("status") == "aborted"


@cache
def matcher(spec: TerminalSpec) -> Matcher:
    """``spec`` compiled (once per process)."""
    return Matcher(spec)


def resolve(preset: str | None, patterns: tuple[str, ...] = (), offset: int | None = None,
            veto: tuple[str, ...] = (), marker: tuple[str, ...] | bool = False,
            json: tuple[JsonTest, ...] = ()) -> TerminalSpec:
    """The spec a protocol's ``terminal_event`` gives: its preset (``verl`` when it names
    none and gives no pattern nor predicate) with what it adds; :class:`SpecError` for an
    unknown preset or a pattern that cannot work. ``marker``: patterns, or True for the
    preset's own."""
    if preset is not None and preset not in PRESETS:
        raise SpecError(f"terminal_event.preset {preset!r} is not one of "
                        f"{', '.join(sorted(PRESETS))}")
    base = PRESETS[preset].spec if preset is not None else (
        TerminalSpec() if patterns or json else PRESETS["verl"].spec)
    own_markers = marker if isinstance(marker, tuple) else ()
    spec = TerminalSpec(
        preset=base.preset,
        patterns=base.patterns + patterns,
        offset=base.offset if offset is None else offset,
        veto=base.veto + veto,
        marker=base.marker + own_markers,
        restart=base.restart,
        markers_count=bool(marker),
        json=json or base.json,
        triggers=() if patterns or veto or own_markers else base.triggers,
    )
    Matcher(spec)  # (refused now, with one line, rather than while a log is read)
    return spec


def from_document(event: dict[str, Any]) -> TerminalSpec:
    """The spec a ``terminal_event`` object gives (its ``preset``, ``pattern``/``patterns``,
    ``offset``, ``veto``, ``marker``, ``json``; values of another type than the schema's are
    left out, as the schema's reader leaves them); :class:`SpecError` for one that cannot
    work. The audit's protocol reader and the launcher's own check both read it so."""
    def texts(value: object) -> tuple[str, ...]:
        if isinstance(value, str):
            return (value,)
        return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()

    preset, offset, marker = event.get("preset"), event.get("offset"), event.get("marker", False)
    tests = event.get("json")
    return resolve(
        preset if isinstance(preset, str) else None,
        patterns=texts(event.get("pattern")) + texts(event.get("patterns")),
        offset=offset if type(offset) is int else None, veto=texts(event.get("veto")),
        marker=marker if isinstance(marker, bool) else texts(marker),
        json=tuple((field, "field", test["field"]) if isinstance(test, dict)
                   and isinstance(test.get("field"), str) else (field, "equals", test)
                   for field, test in sorted((tests if isinstance(tests, dict) else {})
                                             .items())))


def _compile(text: str, what: str, own: bool, step: bool = False) -> Any:
    if own:
        import regex

        try:
            compiled = regex.compile(text)
        except (regex.error, RecursionError, OverflowError, ValueError, TypeError) as error:
            raise SpecError(f"terminal_event's {what} {text!r} does not compile: "
                            f"{error}") from None
    else:
        compiled = re.compile(text)
    if step and "step" not in compiled.groupindex:
        raise SpecError(f"terminal_event's {what} {text!r} has no named group 'step' "
                        "(write it as (?P<step>...))")
    return compiled


def _search(pattern: Any, content: str, timed: bool) -> bool:
    if timed:
        return pattern.search(content, timeout=PATTERN_TIMEOUT) is not None
    return pattern.search(content) is not None


STEP_VALUE = re.compile(
    r"\s*(?:np\.[a-z]+[0-9]*\(\s*)?([+-]?[0-9]{1,18})(?:\.([0-9]*))?\s*\)?\s*")
"""A step as loggers print it: ``12``, ``12.000``, ``np.int64(12)``, ``np.float64(12.0)``; in
ASCII digits only (a pattern's ``\\d`` also takes a full-width or an Arabic-Indic digit,
which ``int()`` reads as one)."""


def _number(text: str | None) -> int | None:
    """A step's value as :data:`STEP_VALUE` reads it (12 for ``np.float64(12.0)``); None for
    anything else, a fraction included."""
    value = STEP_VALUE.fullmatch(text) if text is not None else None
    if value is None or (value.group(2) and value.group(2).strip("0")):
        return None
    return int(value.group(1))


def _count(value: object) -> int | None:
    """``value`` as a count of steps: an integer, or a text of ASCII digits (``"3"``); None
    otherwise (a float is an epoch's kind of number: the contract's predicates need no
    step)."""
    if type(value) is int:
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) < 20:
        return int(value)
    return None


def _same(have: object, want: object) -> bool:
    """JSON equality, a bool never equal to a number (``True == 1`` in Python)."""
    if isinstance(have, bool) or isinstance(want, bool):
        return type(have) is type(want) and have == want
    return have == want
