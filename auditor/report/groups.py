"""What a diagnosis group's periods share, beyond the verdict's own sentences: their
dispatch, their elements' scheduler states set against their exits, their allocator
records of the completion phases, and (when they did not get there) the phases their
traces reach. Each is one sentence for the report, from the result alone."""

from __future__ import annotations

import weakref
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from auditor.model import (
    AttemptOutcome,
    AttemptSummary,
    AuditResult,
    PeriodSummary,
    Reasoning,
    SacctJob,
    Verdict,
)
from auditor.report.mdformat import SPANNED, code_span, number, prose
from auditor.store import Kept, SortedRows, pickles_fast


def every(n: int, noun: str) -> str:
    """``The one X``, ``Both Xs``, ``All nine Xs``."""
    if n == 1:
        return f"The {noun}"
    return f"Both {noun}s" if n == 2 else f"All {number(n)} {noun}s"


@dataclass
class _Index:
    """A result's periods, attempt outcomes and sacct rows by key, made once per result
    (a report looks every period up: a scan per look-up would be quadratic)."""

    result: weakref.ref[AuditResult]
    periods: dict[str, int]
    """Each period's place in the study's by subject (of two records of one period, the
    later): a large study's periods are made anew as they are read."""
    outcomes: dict[str, int | list[int]]
    """Each period's attempt outcomes' places among the reasoning's, by subject (one
    place alone, as most periods have: a million periods' one-place lists were 7 MB)."""
    by_raw: dict[str, SacctJob]
    by_id: dict[str, SacctJob]
    arrays: frozenset[str]
    """The arrays the period records name."""
    views: Sequence[CountedView] = ()
    """Each period's :class:`CountedView`, by its place in the study's (kept by the store,
    as the periods are)."""
    counted: dict[str, tuple[PeriodSummary | None, AttemptSummary | None,
                             AttemptOutcome | None]] = field(default_factory=dict)
    """:func:`counted_attempt`'s answers, as they are asked for (the last
    :data:`COUNTED_KEPT`)."""


@pickles_fast
@dataclass(frozen=True, slots=True)
class CountedView:
    """What a diagnosis group's sentences read of a period's counted attempt (else its
    last), made for every period in one pass when the report starts: a group's sentences
    read each of its members several times, and a large study's periods are kept packed,
    so reading the period itself in each of them remade every block of the study's
    periods in every pass of every group (at a million files, most of the three minutes
    ``diagnostic.md`` took)."""

    record: str
    """The period record's path (``""`` without a period)."""
    attempt_dir: str
    """The attempt's directory (``""`` without an attempt, or one not named)."""
    pids: tuple[int, ...]
    """Its workers' pids, as the record lists them."""
    ranks: int
    """How many workers the record lists for it."""
    hosts: tuple[str, ...]
    """Its workers' hosts as the record names them (contract v1.2; empty for v1), longest
    first."""
    tried: bool
    """Whether it has a trial record."""
    dispatch: tuple[tuple[str, str], ...]
    """The trial's dispatch (empty without one)."""
    steps: int | None
    """The steps the trial dispatched (the protocol's ``steps_from``)."""
    clean: tuple[bool, ...]
    """Of each allocator trace, whether it holds the protocol's completion phases cleanly
    (:func:`~auditor.model.completes_cleanly`; empty when the protocol names fewer than
    two)."""
    reached: tuple[tuple[str, ...], ...]
    """Of each allocator trace, the phases it reaches (:func:`~auditor.model.phases_reached`)."""


def _view(result: AuditResult, period: PeriodSummary | None, attempt: AttemptSummary | None,
          shared: dict[Any, Any]) -> CountedView:
    """``attempt``'s view (of ``period``), its repeated values made one (``shared``)."""
    if attempt is None:
        return CountedView(period.record.path if period is not None else "", "", (), 0, (),
                           False, (), None, (), ())
    protocol = result.collected.protocol
    trial = attempt.trial
    steps = trial.dispatched_int(protocol.steps_from) if trial is not None else None
    traces = attempt.traces
    clean = tuple(trace.completes for trace in traces) \
        if len(protocol.completion_phases) >= 2 else ()
    workers = attempt.spec.workers
    return CountedView(
        record=period.record.path if period is not None else "",
        attempt_dir=attempt.spec.attempt_dir or "",
        pids=tuple(w.pid for w in workers if w.pid is not None), ranks=len(workers),
        hosts=shared.setdefault(hosts := tuple(sorted(
            {w.host for w in workers if w.host}, key=lambda h: (-len(h), h))), hosts),
        tried=trial is not None,
        dispatch=trial.dispatch if trial is not None else (),
        steps=steps, clean=shared.setdefault(clean, clean),
        reached=shared.setdefault(reached := tuple(
            shared.setdefault(one.reached, one.reached) for one in traces), reached))


COUNTED_KEPT = 1024
"""How many of :func:`counted_attempt`'s answers are kept for the next ask (a group's
members are asked for several times in a row): each holds its period (about 3 KB: 4,096
of them were 12 MB of a large report's peak; a group larger than the cache is read
again, a packed block at a time, whatever its size)."""


_INDEX: dict[int, _Index] = {}


def _indexed(result: AuditResult) -> _Index:
    cached = _INDEX.get(id(result))
    if cached is not None and cached.result() is result:
        return cached
    outcomes: dict[str, int | list[int]] = {}
    for place, outcome in enumerate(result.reasoning.attempts):
        held = outcomes.setdefault(outcome.subject, place)
        if isinstance(held, list):
            held.append(place)
        elif held != place:
            outcomes[outcome.subject] = [held, place]
    by_raw: dict[str, SacctJob] = {}
    by_id: dict[str, SacctJob] = {}
    for job in result.collected.sacct.jobs if result.collected.sacct else ():
        if job.job_id_raw is not None:
            by_raw.setdefault(job.job_id_raw, job)
        else:
            by_id.setdefault(job.job_id, job)
    places: dict[str, int] = {}
    arrays: set[str] = set()
    periods = result.collected.periods
    views: Kept[CountedView] = Kept()
    shared: dict[Any, Any] = {}  # (equal phase lists: one object each, and few of them)
    index = _Index(weakref.ref(result), places, outcomes, by_raw, by_id, frozenset(), views)
    for at, period in enumerate(periods):  # (one pass: each period may be made anew)
        places[period.subject] = at
        if period.record.array_job_id:
            arrays.add(period.record.array_job_id)
        _, attempt, _ = _counted_of(result, index, period)
        views.append(_view(result, period, attempt, shared))
    index.arrays = frozenset(arrays)
    _INDEX.clear()  # (the last result's only, and only while it lives)
    _INDEX[id(result)] = index
    weakref.finalize(result, _INDEX.pop, id(result), None)
    return index


def named_arrays(result: AuditResult) -> frozenset[str]:
    """The arrays ``result``'s period records name (``array_job_id``)."""
    return _indexed(result).arrays


def outcomes_by_index(result: AuditResult, subject: str) -> dict[int, AttemptOutcome]:
    """How each attempt of ``subject`` was judged, by its index (of two of one index, the
    first): read once for all of a period's attempts (a look-up per attempt read them all
    each time, A² for A attempts)."""
    by_index: dict[int, AttemptOutcome] = {}
    for outcome in _outcomes(result, _indexed(result), subject):
        by_index.setdefault(outcome.index, outcome)
    return by_index


def _outcomes(result: AuditResult, indexed: _Index, subject: str) -> list[AttemptOutcome]:
    attempts = result.reasoning.attempts
    places = indexed.outcomes.get(subject, ())
    return [attempts[place] for place in ((places,) if isinstance(places, int) else places)]


def counted_attempt(result: AuditResult, subject: str
                    ) -> tuple[PeriodSummary | None, AttemptSummary | None,
                               AttemptOutcome | None]:
    """The period of ``subject``, the attempt its verdict rests on (else its last), and
    that attempt's outcome."""
    indexed = _indexed(result)
    known = indexed.counted.get(subject)
    if known is not None:
        return known
    at = indexed.periods.get(subject)
    period = result.collected.periods[at] if at is not None else None
    answer = _counted_of(result, indexed, period, subject)
    if len(indexed.counted) >= COUNTED_KEPT:
        indexed.counted.clear()
    indexed.counted[subject] = answer
    return answer


def counted_view(result: AuditResult, subject: str
                 ) -> tuple[CountedView, AttemptOutcome | None]:
    """What the group sentences read of the attempt the verdict of ``subject`` rests on
    (else its last), and that attempt's outcome: :func:`counted_attempt` without reading
    the period."""
    indexed = _indexed(result)
    at = indexed.periods.get(subject)
    view = indexed.views[at] if at is not None else _view(result, None, None, {})
    return view, counted_outcome(result, subject)


def counted_outcome(result: AuditResult, subject: str) -> AttemptOutcome | None:
    """The outcome of the attempt the verdict of ``subject`` rests on (else its last)."""
    return _counted_among(_outcomes(result, _indexed(result), subject))


def _counted_among(outcomes: list[AttemptOutcome]) -> AttemptOutcome | None:
    return next((o for o in outcomes if o.counted), outcomes[-1] if outcomes else None)


def _counted_of(result: AuditResult, indexed: _Index, period: PeriodSummary | None,
                subject: str | None = None
                ) -> tuple[PeriodSummary | None, AttemptSummary | None,
                           AttemptOutcome | None]:
    outcome = _counted_among(_outcomes(
        result, indexed, subject if subject is not None else period.subject if period else ""))
    attempt = None
    if period is not None:
        attempt = next((a for a in period.attempts
                        if outcome is not None and a.spec.index == outcome.index),
                       period.attempts[-1] if period.attempts else None)
    return period, attempt, outcome


def dispatch_sentence(result: AuditResult, members: Sequence[Verdict]) -> str:
    """What every dispatch of the group specifies (the keys they share, in the trial's
    order), and which keys differ between them."""
    dispatches = []
    for verdict in members:
        view, _ = counted_view(result, verdict.subject)
        if view.dispatch:
            dispatches.append(view.dispatch)
    if not dispatches:
        return ""
    # (each other dispatch as a set: a membership test a scan would make quadratic, minutes
    # for a launcher that flattens a config of 20,000 keys into every dispatch)
    others = [set(d) for d in dispatches[1:]]
    shared = [item for item in dispatches[0] if all(item in d for d in others)]
    keys = {key for d in dispatches for key, _ in d}
    differing = sorted(keys - {key for key, _ in shared})
    text = ""
    if shared:
        listed = [code_span(f"{k}={v}", 120) for k, v in shared[:8]]
        joined = listed[0] if len(listed) == 1 else ", ".join(listed[:-1]) + " and " + listed[-1]
        noun = every(len(dispatches), "dispatch").replace("dispatchs", "dispatches")
        text = f"{noun} {'specifies' if len(dispatches) == 1 else 'specify'} {joined}"
        if len(shared) > 8:
            text += f" and {len(shared) - 8:,} more keys"
    if differing:
        text += ("; " if text else "The dispatches differ in ") + \
            (f"{', '.join(code_span(k) for k in differing[:8])} differ between them"
             if text else ", ".join(code_span(k) for k in differing[:8]))
    return text + "." if text else ""


def dispatches_alike(result: AuditResult, members: Sequence[Verdict]) -> bool:
    """Whether every period of ``members`` with a trial record was dispatched with the same
    keys and values (the report then says it once, for the study)."""
    seen = set()
    for verdict in members:  # (a period without a trial record dispatched nothing known)
        view, _ = counted_view(result, verdict.subject)
        if view.dispatch:
            seen.add(tuple(sorted(view.dispatch)))
        if len(seen) > 1:
            return False
    return bool(seen)


def _element(result: AuditResult, outcome: AttemptOutcome | None) -> SacctJob | None:
    """The sacct allocation row of the attempt's actual job (by ``JobIDRaw``, else
    ``JobID``), as the reasoning looked it up."""
    job_id = outcome.job_id if outcome is not None else None
    if not job_id:
        return None
    indexed = _indexed(result)
    return indexed.by_raw.get(job_id) or indexed.by_id.get(job_id)


def scheduler_sentence(result: AuditResult, members: Sequence[Verdict]) -> str:
    """The group's elements' sacct states and exit codes, set against its attempts' exits:
    what explains them, and what they cannot say."""
    sacct = result.collected.sacct
    if sacct is None or not sacct.jobs:
        return ""
    rows: dict[str, tuple[SacctJob, list[AttemptOutcome]]] = {}
    unseen = 0
    for verdict in members:
        outcome = counted_outcome(result, verdict.subject)
        job = _element(result, outcome)
        if job is None or outcome is None:
            unseen += 1
            continue
        rows.setdefault(job.job_id, (job, []))[1].append(outcome)
    if not rows:  # (a record unread names no job: no row can be said to be its)
        return "No job of these periods is known, so no row of the scheduler's dump is " \
            "theirs." if all(counted_outcome(result, v.subject) is None for v in members) \
            else "The scheduler's dump has no row for these periods' jobs."
    states = Counter(_state(job) for job, _ in rows.values())
    if len(states) == 1:
        state = next(iter(states))
        text = (f"Scheduler: {code_span(state)} for "
                + ("the one element" if len(rows) == 1 else
                   "both elements" if len(rows) == 2 else f"all {number(len(rows))} elements"))
    else:
        text = "Scheduler: " + ", ".join(f"{code_span(s)} for {number(n)}"
                                         for s, n in sorted(states.items()))
    if unseen:
        text += f" ({number(unseen)} without a row)"
    notes = _explain(result, list(rows.values()))
    return text + (": " + "; ".join(notes) if notes else "") + "."


def _state(job: SacctJob) -> str:
    exit_code = job.exit_code if job.exit_code is not None else "?"
    signal = job.signal if job.signal is not None else 0
    return f"{job.state} {exit_code}:{signal}"


def _explain(result: AuditResult, rows: list[tuple[SacctJob, list[AttemptOutcome]]]
             ) -> list[str]:
    """What the rows' states and exits mean beside the attempts' own exits."""
    notes = []
    periods_per_job = Counter(o.job_id for o in result.reasoning.attempts if o.job_id)
    exits = [(job, o) for job, outcomes in rows for o in outcomes]
    clean = bool(exits) and all(o.exit_code == 0 for _, o in exits)
    shared = max((periods_per_job[j.job_id_raw or j.job_id] for j, _ in exits), default=1)
    shifted = [o for job, o in exits if o.exit_code is not None and o.exit_code > 128
               and job.exit_code == o.exit_code - 128]
    if exits and all(job.exit_code == o.exit_code for job, o in exits):
        notes.append("the attempts' own exit codes")
    elif shifted:
        codes = sorted({o.exit_code or 0 for o in shifted})
        notes.append(", ".join(f"`{code - 128}:0` may be the attempt's {code} less 128"
                               for code in codes) + " (sacct drops the 128)")
    elif shared > 1:
        notes.append(("these attempts exited 0, and " if clean else "")
                     + "an element's state and exit are its job's, after every attempt it "
                     f"ran ({number(shared)} here), not one period's")
    elif clean:
        notes.append("these attempts exited 0: the element's exit is the job script's, "
                     "after them")
    sacct_path = result.collected.sacct.path if result.collected.sacct else ""
    cancelled = [job for job, _ in rows if job.state == "CANCELLED"]
    if cancelled:
        lines = ",".join(str(job.line) for job in cancelled[:6])
        notes.append(f"the `CANCELLED` row{'s' if len(cancelled) > 1 else ''} at "
                     f"{code_span(f'{sacct_path}:{lines}')}")
    return notes


def completion_sentence(result: AuditResult, members: Sequence[Verdict]) -> str:
    """How many of the group's allocator traces hold exactly one error-free record of the
    first completion phase at the final step and one of the last after it (with ordered
    timestamps): the records the table's times come from."""
    phases = result.collected.protocol.completion_phases
    if len(phases) < 2:
        return ""
    first, last = phases[0], phases[-1]
    total = good = 0
    steps_seen: set[int] = set()
    for verdict in members:
        view, _ = counted_view(result, verdict.subject)
        if not view.tried:
            return ""
        for clean in view.clean:
            total += 1
            if clean:
                good += 1
                steps_seen.add(view.steps or 0)
    if not good:
        return ""
    step = f" at step {next(iter(steps_seen))}" if len(steps_seen) == 1 else ""
    head = f"Each of the {total:,} allocator traces" if good == total \
        else f"{good:,} of the {total:,} allocator traces"
    where = "this period" if len(members) == 1 else "these periods"
    return (f"{head} of {where} holds exactly one `{first}` record{step} and one "
            f"subsequent `{last}` record, with ordered timestamps and empty errors.")


def reached_sentence(result: AuditResult, members: Sequence[Verdict]) -> str:
    """The phases the traces reach, for periods whose ranks did not record the completion
    phases (a cancel, a kill): what they do show."""
    sequences: Counter[tuple[str, ...]] = Counter()
    ranks = 0
    for verdict in members:
        view, _ = counted_view(result, verdict.subject)
        for reached in view.reached:
            if reached:
                sequences[reached] += 1
                ranks += 1
    if not sequences:
        return ""
    if len(sequences) == 1:
        reached = next(iter(sequences))
        who = "every rank" if ranks > 1 else "the one rank traced"
        return (f"The traces show the phases reached ({who}): "
                + ", ".join(code_span(n) for n in reached) + ".")
    furthest = max(sequences, key=len)
    return (f"The traces show the phases reached; the ranks differ "
            f"({number(len(sequences))} sequences), the longest: "
            + ", ".join(code_span(n) for n in furthest) + ".")


@dataclass(frozen=True)
class DiagnosisGroup:
    """A diagnosis group: periods with the same verdict, reason and cause (contract v1.2:
    one ``### `` section each, what its periods share said once, then the exceptions)."""

    title: str
    members: Sequence[Verdict]
    """Its verdicts, in the study's order."""
    kind: str
    jobs: list[str | None]
    """The actual job of each of its first members the report names."""
    updated: bool
    """Whether its first member's final actor update has a time."""


def diagnosis_groups(reasoning: Reasoning, named: int) -> list[DiagnosisGroup]:
    """The diagnosis groups, by (verdict, reason, cause), unresolved first (of each, the
    jobs of its first ``named`` members). A group's members are its own verdicts,
    made in this one pass over the study's (with their facts, which are in the same order)
    and kept by the store (read by place from the study's packed ones, every pass over a
    group remade every block of its verdicts: at a million files, three groups read six
    times each); of their facts, only what the section names."""
    groups: dict[tuple[str, str, str], Kept[Verdict]] = defaultdict(Kept)
    jobs: dict[tuple[str, str, str], list[str | None]] = defaultdict(list)
    first: dict[tuple[str, str, str], tuple[str, bool]] = {}
    gpus: dict[tuple[str, str, str], set[int]] = defaultdict(set)
    for verdict, facts in zip(reasoning.verdicts, reasoning.facts, strict=True):
        key = (verdict.verdict.value, str(verdict.reason),
               str(verdict.cause.word) if verdict.cause is not None else "")
        groups[key].append(verdict)
        if len(kept := jobs[key]) < named:
            kept.append(facts.job_id)
        first.setdefault(key, (verdict.subject, bool(facts.actor_update_finished_ns)))
        if facts.gpus is not None:
            gpus[key].add(facts.gpus)
    order = {"unresolved": 0, "failed": 1, "resolved": 2}
    out: list[DiagnosisGroup] = []
    for group, members in sorted(groups.items(),
                                 key=lambda item: (order[item[0][0]], item[0][1:])):
        kind, reason_word, cause = group
        gpu_text = "/".join(f"{g}-GPU" for g in sorted(gpus[group]))
        title = f"{number(len(members)).capitalize()} {gpu_text} {kind} period" \
                f"{'s' if len(members) != 1 else ''}"
        if kind == "unresolved":
            title += f": `{reason_word}`"
        elif kind == "failed":
            title += ": eligible failure"
        if cause:
            title += f", cause `{cause}`"
        out.append(DiagnosisGroup(title.replace("  ", " "), members, kind, jobs[group],
                                  first[group][1]))
    return out


def names_unique(reasoning: Reasoning) -> bool:
    """Whether every period's (actual job, period) is its own: else the report names the
    periods by subject (sorted on disk: a million periods' pairs held were about 20 MB)."""
    pairs = SortedRows(0)
    pairs.extend(((f.job_id is None, f.job_id or "", f.period),) for f in reasoning.facts)
    last = None
    for (pair,) in pairs:
        if pair == last:
            return False
        last = pair
    return True


def cause_word(verdict: Verdict) -> str:
    """What ended the period, as the table and titles name it (``gpu_oom``, with its
    knock-ons), ``""`` when it exited cleanly."""
    cause = verdict.cause
    if cause is None:
        return ""
    knock = f" (then {', '.join(f'`{k}`' for k in cause.knock_on)})" if cause.knock_on else ""
    return f"`{cause.word}`{knock}"


_SPLIT_KEPT = 4096
"""Split diagnoses kept for the next member (a group's periods share a few texts; a text of
one period's own, with its quote and time, is split again if asked again)."""


def sentences(text: str) -> tuple[str, ...]:
    """A diagnosis's sentences: split after ``.``, ``!`` or ``?`` and a space, before a
    capital letter or a digit, never inside a code span (``trial-<job>.json`` stays
    whole)."""
    out: list[str] = []
    start = 0
    # (a span fenced by several backticks may hold one: a launcher's status, quoted whole;
    # a backtick no span closes is a character, never the start of one to the end)
    spans = [match.span() for match in SPANNED.finditer(text)] if "`" in text else []
    for at, char in enumerate(text):
        if (char == " " and at > 0 and text[at - 1] in ".!?"
                and at + 1 < len(text) and (text[at + 1].isupper() or text[at + 1].isdigit())
                and not any(begin < at < end for begin, end in spans)):
            out.append(text[start:at])
            start = at + 1
    if text[start:].strip():
        out.append(text[start:])
    return tuple(out)


def cause_sentence(verdict: Verdict) -> str:
    """What ended the period, with its detail and the knock-ons named apart."""
    cause = verdict.cause
    if cause is None or not cause.detail or (
            cause.citation is not None and (cause.citation.pointer or "").startswith(
                "/invocation/")):
        return ""  # (none, or the exit's own: the exit's sentence says it)
    if not cause.knock_on and cause.detail.rstrip(".") in verdict.diagnosis.replace("`", ""):
        return ""  # (the diagnosis says it already: the scheduler's word for the job's end)
    return f"Cause: {cause_word(verdict)}, {cause.detail.rstrip('.')}."


def shared_sentences(members: Sequence[Verdict], redundant: Callable[[str], bool],
                     listed: int = 10
                     ) -> tuple[list[str], list[tuple[Verdict, list[str]]], int]:
    """What a group's periods all say (their diagnosis's sentences and their cause's, in the
    first period's order), the sentences of each period that sets it apart (its first
    ``listed``), and how many more do. Two passes over the members; none held."""
    split: dict[str, tuple[str, ...]] = {}

    def said(verdict: Verdict) -> tuple[str, ...]:
        known = split.get(verdict.diagnosis)
        if known is None:
            if len(split) >= _SPLIT_KEPT:
                split.clear()
            known = split[verdict.diagnosis] = tuple(
                s for s in sentences(verdict.diagnosis) if not redundant(s))
        cause = cause_sentence(verdict)
        return known + (cause,) if cause else known

    shared: list[str] | None = None
    for verdict in members:
        own = said(verdict)
        shared = list(own) if shared is None else [s for s in shared if s in own]
    common = set(shared or ())
    apart: list[tuple[Verdict, list[str]]] = []
    others = 0
    for verdict in members:
        differs = [s for s in said(verdict) if s not in common]
        if not differs:
            continue
        if len(apart) < listed:
            apart.append((verdict, [prose(s, limit=1000) for s in differs]))
        else:
            others += 1
    # (a sentence every period says is said of each)
    return [prose(s.replace("In this period ", "In each period, ", 1), limit=1000)
            for s in shared or ()], apart, others
