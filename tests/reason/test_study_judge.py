"""The study judged a period at a time (:class:`auditor.reason.engine.StudyJudge`): the same
verdicts as one pass over the whole study, periods sharing a job included."""

from __future__ import annotations

from dataclasses import replace

from auditor.model import AuditOptions, Collected, PeriodEvidence, Reason, VerdictKind
from auditor.reason.engine import StudyJudge
from tests.reason.values import attempt, collected, period, sacct, sacct_job, trial


def _judged(study: Collected) -> list[tuple[str, VerdictKind, Reason]]:
    before = replace(study, periods=tuple(PeriodEvidence(p.record, ()) for p in study.periods))
    judge = StudyJudge(before, AuditOptions(), ([], [], []))
    for one in study.periods:
        judge.add(one, ([], [], []))
    _, reasoning = judge.finish(study)
    return [(v.subject, v.verdict, v.reason) for v in reasoning.verdicts]


FLAG = "COSMOS_SHUTDOWN_ON_NO_POLICY_REPLICAS"


def _shutdown(number: int) -> PeriodEvidence:
    """A period whose one attempt, in job 7000001, ended in a coordinated shutdown (143)."""
    ended = trial(exit_code=143, processes=[("controller", 143), ("policy", 0)],
                  env=[(FLAG, "1")])
    return period(attempt(the_trial=replace(ended, period=number)), number=number)


def test_periods_sharing_a_job_wait_for_the_job_s_last_attempt() -> None:
    """Two periods ran in one job, which sacct says hit its time limit: the limit ended the
    attempt launched last (period 2's); period 1's coordinated shutdown stands. Judged
    each on its own, both would take the job's TIMEOUT as their end."""
    first, second = _shutdown(1), _shutdown(2)
    study = collected(first, second, dump=sacct(sacct_job("TIMEOUT")))
    assert _judged(study) == [
        (first.subject, VerdictKind.RESOLVED, Reason.COMPLETED),
        (second.subject, VerdictKind.UNRESOLVED, Reason.TIME_LIMIT),
    ]


def test_a_period_alone_in_its_job_is_judged_as_it_comes() -> None:
    """A job of its own: the period's attempt is its job's last, so the TIMEOUT is its end."""
    study = collected(_shutdown(1), dump=sacct(sacct_job("TIMEOUT")))
    assert [reason for _, _, reason in _judged(study)] == [Reason.TIME_LIMIT]


def test_an_attempt_no_record_names_the_job_of_waits_for_the_study() -> None:
    """Period 1's record names no job for its attempt (its trial record does: the same as
    period 2's): which attempt the job launched last is known only once every period is
    read, so period 1 waits for the end, and the TIMEOUT is period 2's."""
    first = _shutdown(1)
    spec = replace(first.attempts[0].spec, job_id=None)
    first = PeriodEvidence(replace(first.record, attempts=(spec,)),
                           (replace(first.attempts[0], spec=spec),))
    second = _shutdown(2)
    study = collected(first, second, dump=sacct(sacct_job("TIMEOUT")))
    assert [reason for _, _, reason in _judged(study)] == [Reason.COMPLETED,
                                                            Reason.TIME_LIMIT]
