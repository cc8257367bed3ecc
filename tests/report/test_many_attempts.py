"""A period retried many times: the evidence report lists every attempt with how it was
judged, reading each attempt's outcome a few times, not once per other attempt."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import overload

from auditor import AuditOptions, run_audit
from auditor.model import AttemptOutcome
from auditor.report.markdown import render_evidence_md
from fixtures.generate import (
    MODEL,
    SEED_COMMIT,
    AttemptSpec,
    ElementSpec,
    PeriodSpec,
    StudySpec,
    default_protocol,
    write_study,
)

ATTEMPTS = 300


class _Counted(Sequence[AttemptOutcome]):
    """The study's attempt outcomes, counting each one read."""

    def __init__(self, outcomes: Sequence[AttemptOutcome]) -> None:
        self.outcomes = outcomes
        self.reads = 0

    def __len__(self) -> int:
        return len(self.outcomes)

    @overload
    def __getitem__(self, place: int) -> AttemptOutcome: ...

    @overload
    def __getitem__(self, place: slice) -> Sequence[AttemptOutcome]: ...

    def __getitem__(self, place: int | slice) -> AttemptOutcome | Sequence[AttemptOutcome]:
        if isinstance(place, slice):
            return [self[i] for i in range(*place.indices(len(self)))]
        self.reads += 1
        return self.outcomes[place]

    def __iter__(self) -> Iterator[AttemptOutcome]:
        return (self[i] for i in range(len(self)))


def test_every_attempt_of_a_period_retried_many_times_is_read_a_few_times(tmp_path: Path
                                                                           ) -> None:
    """Each attempt's row says how it was judged; the outcomes were looked up once for the
    period (each attempt's by a scan of the period's outcomes read them A²/2 times: 6 of the
    audit's 48 s at 4,096 attempts)."""
    jobs = [str(7000001 + i) for i in range(ATTEMPTS)]
    retried = PeriodSpec(pair=f"host-{MODEL}-gsm8k-c2-s161", workload="gsm8k", seed=161,
                         model=MODEL, period=1, gpus=2, outcome="retried",
                         attempts=[AttemptSpec(outcome="completed", job_id=job) for job in jobs])
    root = tmp_path / "study"
    write_study(StudySpec(
        study="test_study", array_job_id="7000000",
        elements=[ElementSpec(array_task_id=task, job_id=job, periods=[retried],
                              node=f"gpu-node-{task:03d}") for task, job in enumerate(jobs)],
        protocol=default_protocol([retried]),
        execution_commits={retried.pair: SEED_COMMIT}), root)
    result = run_audit(root, AuditOptions(jobs=1))
    counted = _Counted(result.reasoning.attempts)
    text = render_evidence_md(replace(result, reasoning=replace(result.reasoning,
                                                                attempts=counted)))
    assert text.count("completed, wasted") == ATTEMPTS - 1
    assert counted.reads <= 10 * ATTEMPTS, counted.reads
