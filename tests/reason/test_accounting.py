"""Accounting on hand-built model values: the GPU-time scopes (allocation, task,
reservation) counted apart, never added together, unknown rather than guessed."""

from __future__ import annotations

from auditor.model import VerdictKind
from auditor.reason.accounting import accounting
from tests.reason.values import cell, collected, outcome, sacct, sacct_job, verdict


def test_the_scopes_are_counted_apart() -> None:
    """Allocation from sacct's rows of the study's array; task and reservation from the
    invocations; the wasted retry and the unresolved period's time apart."""
    a, b = cell("gsm8k", 2, 161, "11"), cell("gsm8k", 2, 162, "12")
    dump = sacct(sacct_job(job_id="7000000_0", raw="11", elapsed=100, gpus=4),
                 sacct_job(job_id="7000000_1", raw="12", elapsed=50, gpus=2),
                 sacct_job(job_id="9999999", raw="9999999", elapsed=10**6, gpus=8,
                           array=None))
    runs = [outcome(a, 10, allocation_gpus=4), outcome(a, 5, index=1, counted=False,
                                                        wasted=True, allocation_gpus=4),
            outcome(b, 20), outcome(b, 1, job="77", index=1, counted=False)]
    result = accounting(collected(a, b, dump=dump), runs,
                        [verdict(a), verdict(b, VerdictKind.UNRESOLVED)])
    assert [e.job_id for e in result.elements] == ["7000000_0", "7000000_1"]
    assert result.allocation_gpu_seconds == 100 * 4 + 50 * 2
    assert result.task_gpu_seconds == (10 + 5 + 20 + 1) * 2
    assert result.reservation_gpu_seconds == (10 + 5) * 4 + (20 + 1) * 2
    assert (result.wasted_gpu_seconds, result.wasted_attempts) == (10.0, 1)
    assert result.unresolved_gpu_seconds == 40.0  # (b's counted attempt only)
    assert result.jobs_without_element == ("77",)


def test_without_a_usable_dump_the_scheduler_scopes_are_unknown() -> None:
    a = cell("gsm8k", 2, 161, "11")
    result = accounting(collected(a), [outcome(a, 10)], [verdict(a)])
    assert (result.allocation_gpu_seconds, result.reservation_gpu_seconds) == (None, None)
    assert result.task_gpu_seconds == 20.0
    assert result.jobs_without_element == ()  # (nothing to be without: no dump)
