"""How a period record lists its attempts: each once, in no other record, in launch order.
``AUD127`` when one attempt is listed twice, in one record or by two; ``AUD112``
(``out_of_order``) when a listed attempt started before the one listed before it."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator

from auditor.model import (
    AttemptEvidence,
    AttemptSpec,
    Citation,
    Collected,
    Finding,
    PeriodEvidence,
)
from auditor.rules import finding


def attempts_twice(period: PeriodEvidence) -> Iterator[Finding]:
    """An ``AUD127`` for each attempt the period record lists again: by its directory
    (``./`` and a trailing ``/`` aside), else by its job and restart; or one run (its job
    and the restart its trial, else its record, gives) under a second directory (a copy of
    the first: its GPU time counted twice, the copy a 'wasted' rerun)."""
    first: dict[tuple[str, ...], str] = {}
    for attempt in period.attempts:
        spec = attempt.spec
        keys = [key for key in (_attempt_key(spec), _run_key(attempt)) if key is not None]
        shown = spec.attempt_dir or f"job {spec.job_id} restart {spec.restart_count or 0}"
        seen = next((first[key] for key in keys if key in first), None)
        if seen is not None:
            yield finding("AUD127", period.subject,
                          [Citation(period.record.path, pointer=spec.pointer or "/",
                                    quote=shown),
                           Citation(period.record.path, pointer=seen or "/")],
                          pointer=spec.pointer or "/", attempt=shown, first=seen or "/")
            continue
        for key in keys:
            first[key] = spec.pointer


def steps_differ(period: PeriodEvidence, steps_from: str) -> Iterator[Finding]:
    """An ``AUD128`` where an attempt was dispatched another step count than the first
    attempt that says one (``steps_from``: the protocol's key): the period's training is
    one count of steps, whichever run completes it."""
    said = [(attempt, attempt.read.trial.dispatched_int(steps_from))
            for attempt in period.attempts if attempt.read.trial is not None]
    known = [(attempt, steps) for attempt, steps in said if steps is not None]
    if not known:
        return
    first, count = known[0]
    for attempt, steps in known[1:]:
        if steps != count:
            trial, reference = attempt.read.trial, first.read.trial
            assert trial is not None and reference is not None
            yield finding("AUD128", period.subject,
                          [Citation(trial.path, pointer="/dispatch", quote=str(steps)),
                           Citation(reference.path, pointer="/dispatch", quote=str(count))],
                          key=steps_from, first=count, first_attempt=first.spec.index + 1,
                          other=steps, other_attempt=attempt.spec.index + 1)
            return


def _run_key(attempt: AttemptEvidence) -> tuple[str, ...] | None:
    """The run an attempt is, where its records say: its job and restart count (the
    trial's, else the period record's); None when either is unknown."""
    trial = attempt.read.trial
    job = attempt.spec.job_id or (trial.job_id if trial is not None else None)
    restart = trial.restart_count if trial is not None and trial.restart_count is not None \
        else attempt.spec.restart_count
    return None if not job or restart is None else ("job", job, str(restart))


def _attempt_key(spec: AttemptSpec) -> tuple[str, ...] | None:
    """What one attempt is known by: its directory (``./`` and a trailing ``/`` aside), else
    its job and restart; None when the record gives neither."""
    if spec.attempt_dir:
        return ("dir", "/".join(
            part for part in spec.attempt_dir.split("/") if part not in ("", ".")))
    if spec.job_id:
        return ("job", spec.job_id, str(spec.restart_count or 0))
    return None


def claimed_twice(collected: Collected) -> Iterator[Finding]:
    """An ``AUD127`` (``other_record``) for each period record listing an attempt directory
    another record lists too, citing them: each is unresolved, whichever is the copy (a
    job alone is no attempt of its own: the arms of a pair may share their element)."""
    claims: dict[tuple[str, ...], list[int]] = defaultdict(list)
    for place, period in enumerate(collected.periods):
        for key in dict.fromkeys(_attempt_key(spec) for spec in period.record.attempts
                                 if spec.attempt_dir):  # (a job may run several periods)
            if key is not None:
                claims[key].append(place)
    shared = {key: places for key, places in claims.items() if len(places) > 1}
    del claims
    for key, places in sorted(shared.items(), key=lambda item: item[1]):
        records = [collected.periods[place].record for place in places]
        for record in records:
            spec = next(s for s in record.attempts if _attempt_key(s) == key)
            others = [other.path for other in records if other is not record]
            yield finding("AUD127", record.subject,
                          [Citation(record.path, pointer=f"{spec.pointer}/attempt_dir",
                                    quote=spec.attempt_dir or ""),
                           *(Citation(path) for path in others)],
                          form="other_record", where=spec.pointer or "its record",
                          attempt=spec.attempt_dir,
                          others=", ".join(others), s="" if len(others) > 1 else "s")


SCHEDULER_SLACK_NS = 1_000_000_000
"""How much earlier an attempt must have started, where a start is the scheduler's (whole
seconds, the job's rather than the command's), to be out of order."""


def out_of_order(period: PeriodEvidence,
                 scheduled: Callable[[AttemptEvidence], tuple[int, Citation] | None]
                 = lambda attempt: None) -> Iterator[Finding]:
    """An ``AUD112`` (``out_of_order``) for each attempt that started before the one listed
    before it: the record's order is not the launch order, and its last attempt (the one a
    period's verdict may rest on) need not be the last run. An attempt's start is its
    trial's, else its run's by the scheduler (``scheduled``: the ns and the dump's row): a
    run cancelled before its command started has none of its own, and was still launched
    when it was."""
    started: list[tuple[AttemptEvidence, int, Citation, bool]] = []
    for attempt in period.attempts:
        trial = attempt.read.trial
        if trial is not None and trial.started_ns is not None:
            started.append((attempt, trial.started_ns, Citation(
                trial.path, pointer="/invocation/started_ns", quote=str(trial.started_ns)),
                False))
        elif (by_scheduler := scheduled(attempt)) is not None:
            started.append((attempt, *by_scheduler, True))
    for (before, earlier, cite_earlier, rough_earlier), (after, later, cite_later, rough) \
            in zip(started, started[1:], strict=False):
        slack = SCHEDULER_SLACK_NS if rough or rough_earlier else 0
        if later < earlier - slack:
            yield finding("AUD112", period.subject, [cite_later, cite_earlier],
                          form="out_of_order", pointer=after.spec.pointer or "/",
                          earlier=before.spec.pointer or "/")
