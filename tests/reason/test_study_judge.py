"""The study judged a period at a time (:class:`auditor.reason.engine.StudyJudge`): the same
verdicts as one pass over the whole study, periods sharing a job included."""

from __future__ import annotations

import pickle
from dataclasses import replace

from auditor.model import (
    AuditOptions,
    Collected,
    PeriodEvidence,
    PeriodSummary,
    Reason,
    VerdictKind,
)
from auditor.reason.engine import PeriodJudge, StudyJudge, batch_ends, judge_together
from tests.helpers import CountedStr
from tests.reason.values import attempt, collected, period, sacct, sacct_job, trial


def _judged(study: Collected) -> list[tuple[str, VerdictKind, Reason]]:
    before = replace(study, periods=tuple(PeriodSummary(p.record, ()) for p in study.periods))
    judge = StudyJudge(before, AuditOptions(), ([], [], []))
    for one in study.timeline:
        judge.add(one, ([], [], []))
    _, reasoning = judge.finish(study)
    return [(v.subject, v.verdict, v.reason) for v in reasoning.verdicts]


FLAG = "COSMOS_SHUTDOWN_ON_NO_POLICY_REPLICAS"


def _shutdown(number: int) -> PeriodEvidence:
    """A period whose one attempt, in job 7000001 (its own directory: one attempt is one
    period's), ended in a coordinated shutdown (143)."""
    ended = trial(exit_code=143, processes=[("controller", 143), ("policy", 0)],
                  env=[(FLAG, "1")])
    one = period(attempt(the_trial=replace(ended, period=number)), number=number)
    spec = replace(one.attempts[0].spec, attempt_dir=f"arm-{number}/attempt-7000001")
    return PeriodEvidence(replace(one.record, attempts=(spec,)),
                          (replace(one.attempts[0], spec=spec),))


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


def _records(study: Collected) -> Collected:
    return replace(study, periods=tuple(PeriodSummary(p.record, ()) for p in study.periods))


def test_batches_end_only_where_no_later_period_names_an_earlier_job() -> None:
    """Jobs A, B, A, C: periods 1-3 go together (period 3 names period 1's job), period 4
    stands alone; a period whose record names no job leaves nothing to cut."""
    jobs = ["7000001", "7000002", "7000001", "7000003"]
    periods = [period(attempt(job_id=job), number=n) for n, job in enumerate(jobs, 1)]
    assert list(batch_ends(_records(collected(*periods))) or ()) == [3, 4]
    assert list(batch_ends(_records(collected(*periods[1:2], *periods[3:]))) or ()) == [1, 2]
    first = periods[0]
    spec = replace(first.attempts[0].spec, job_id=None)
    nameless = PeriodEvidence(replace(first.record, attempts=(spec,)),
                              (replace(first.attempts[0], spec=spec),))
    assert batch_ends(_records(collected(nameless, *periods[1:]))) is None


def test_a_batch_judged_apart_gives_the_study_judge_s_verdicts() -> None:
    """The periods sharing a job, judged together on the study's context alone (as a
    worker does): the verdicts of the study's own fold. Cut between them, the first would
    take the job's TIMEOUT for its end."""
    first, second = _shutdown(1), _shutdown(2)
    study = collected(first, second, dump=sacct(sacct_job("TIMEOUT")))
    judge = StudyJudge(_records(study), AuditOptions(), ([], [], []))
    assert list(judge.ends or ()) == [2]
    alone = PeriodJudge(pickle.loads(pickle.dumps(judge.context)))  # (as a worker gets it)
    together = judge_together(alone, [first, second], [([], [], [])] * 2)
    assert [(one.verdict.verdict, one.verdict.reason) for one in together] == [
        (verdict, reason) for _, verdict, reason in _judged(study)]
    cut = judge_together(alone, [first], [([], [], [])])
    assert cut[0].verdict.reason == Reason.TIME_LIMIT


def test_rows_set_aside_come_back_to_judge_a_period_here() -> None:
    """The study's dump rows set aside (packed while the workers judge): the judge holds
    none, yet a period it then judges itself is judged with them (the job's TIMEOUT), and
    the dump it gives back is the one it was given."""
    study = collected(_shutdown(1), dump=sacct(sacct_job("TIMEOUT")))
    judge = StudyJudge(_records(study), AuditOptions(), ([], [], []))
    assert study.sacct is not None and len(study.sacct.jobs) == 1
    judge.set_rows_aside()
    assert judge.study.sacct is not None and judge.study.sacct.jobs == ()
    assert judge.context.study.sacct == judge.study.sacct
    judge.add(study.timeline[0], ([], [], []))
    _, reasoning = judge.finish(study)
    assert [v.reason for v in reasoning.verdicts] == [Reason.TIME_LIMIT]
    assert judge.sacct == study.sacct and judge.study.sacct == study.sacct


class _Pid(int):
    """A pid that counts how often it is hashed (how the work per attempt scales with the
    attempts of its period, measured without a clock)."""

    hashed = 0

    def __hash__(self) -> int:
        _Pid.hashed += 1
        return int.__hash__(self)

    def __eq__(self, other: object) -> bool:
        return int.__eq__(self, other)


def test_a_period_retried_many_times_reads_each_attempts_workers_once() -> None:
    """A period of A attempts (the job requeued, ``attempt-<job>-r<n>``): what the other
    attempts' workers are is made once for the period, not once per attempt from every
    other attempt's (A² work: 40 of the audit's 48 s at 4,096 attempts)."""
    many = 200
    attempts = []
    for index in range(many):
        one = attempt(index=index)
        workers = tuple(replace(worker, pid=_Pid(worker.pid or 0)) for worker in one.spec.workers)
        restart = f"{one.spec.attempt_dir}-r{index}" if index else one.spec.attempt_dir
        attempts.append(replace(one, spec=replace(one.spec, workers=workers,
                                                  attempt_dir=restart)))
    study = collected(period(*attempts))
    _Pid.hashed = 0
    assert [(kind, reason) for _, kind, reason in _judged(study)] == [
        (VerdictKind.RESOLVED, Reason.COMPLETED)]
    assert _Pid.hashed <= 20 * 2 * many, _Pid.hashed


def test_a_job_requeued_many_times_finds_each_runs_record_without_a_scan() -> None:
    """A period of A runs of one job (``attempt-<job>-r<n>``), with the scheduler's dump: each
    run's own record is sought among its job's runs, made once for the period, not by a
    scan of every attempt per check of each (A² tests: 6 of the audit's 48 s at 4,096)."""
    many = 200
    attempts = []
    for index in range(many):
        one = attempt(index=index)
        restart = f"{one.spec.attempt_dir}-r{index}" if index else one.spec.attempt_dir
        attempts.append(replace(one, spec=replace(
            one.spec, job_id=CountedStr(one.spec.job_id or ""), attempt_dir=restart)))
    study = collected(period(*attempts), dump=sacct(sacct_job()))
    CountedStr.compared = 0
    assert len(_judged(study)) == 1
    assert CountedStr.compared <= 50 * many, CountedStr.compared  # (about 20 a run: other look-ups)
