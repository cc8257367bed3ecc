"""Completion and eligible failures on hand-built traces: every rank's completion phases
for the final step, in order and error-free; which ranks recorded a listed failure."""

from __future__ import annotations

from auditor.model import DEFAULT_PROTOCOL
from auditor.reason.completion import completion, eligible_failures
from tests.reason.values import (
    PIDS,
    STEPS,
    attempt,
    completed_phases,
    phase,
    trace,
    trace_path,
    with_protocol,
)


def test_both_ranks_complete_and_the_sequence_is_said() -> None:
    traces = [trace(pid, (*completed_phases(pid, rank), phase(pid, rank, "idle", 3, start=300)))
              for rank, pid in enumerate(PIDS)]
    done = completion(attempt(traces=traces), DEFAULT_PROTOCOL, STEPS)
    assert (done.complete, done.ranks, done.problems) == (True, 2, [])
    assert done.sentences == [
        "In this period both ranks recorded `actor_update` followed by a separate post-update "
        "`weight_sync` at step 20, each call returning without an exception, in that order.",
        "The recorded phase sequence reaches `actor_update`, `weight_sync`, then `idle`."]
    assert [(c.path, c.line) for c in done.citations] == [
        (trace_path(PIDS[0]), 1), (trace_path(PIDS[0]), 2),
        (trace_path(PIDS[1]), 1), (trace_path(PIDS[1]), 2)]


def test_a_rank_without_its_trace_is_incomplete() -> None:
    done = completion(attempt(traces=[trace(PIDS[0], completed_phases(PIDS[0], 0))]),
                      DEFAULT_PROTOCOL, STEPS)
    assert (done.complete, done.problems) == (False, ["rank 1: no allocator trace"])
    assert done.sentences[0].startswith("1 of 2 ranks recorded every completion phase")


def test_a_phase_at_another_step_does_not_count() -> None:
    traces = [trace(pid, (phase(pid, rank, "actor_update", 1, start=100),
                          phase(pid, rank, "weight_sync", 2, step=STEPS - 1, start=200)))
              for rank, pid in enumerate(PIDS)]
    done = completion(attempt(traces=traces), DEFAULT_PROTOCOL, STEPS)
    assert done.problems == ["rank 0: no error-free weight_sync at step 20",
                             "rank 1: no error-free weight_sync at step 20"]
    assert [gap.path for gap in done.gaps] == [trace_path(pid) for pid in PIDS]


def test_without_the_dispatched_steps_nothing_completes() -> None:
    done = completion(attempt(), DEFAULT_PROTOCOL, None)
    assert (done.complete, done.problems) == (
        False, ["the dispatch does not name TOTAL_TRAINING_STEPS"])


def test_the_protocols_completion_phases_are_the_ones_required() -> None:
    """A protocol requiring only ``actor_update``: a run without any weight sync completes."""
    traces = [trace(pid, (phase(pid, rank, "actor_update", 1, start=100),))
              for rank, pid in enumerate(PIDS)]
    assert not completion(attempt(traces=traces), DEFAULT_PROTOCOL, STEPS).complete
    only_update = with_protocol(completion_phases=("actor_update",))
    assert completion(attempt(traces=traces), only_update, STEPS).complete


def test_eligible_failures_are_the_listed_errors_of_the_listed_phase_by_rank() -> None:
    listed = "torch.OutOfMemoryError"
    traces = (trace(PIDS[1], (phase(PIDS[1], 1, "rollout_init", 4, step=None, error=listed),)),
              trace(PIDS[0], (phase(PIDS[0], 0, "rollout_init", 9, step=None, error=listed),
                              phase(PIDS[0], 0, "actor_update", 10, error=listed),
                              phase(PIDS[0], 0, "rollout_init", 11, step=None,
                                    error="ValueError"))))
    found = eligible_failures(traces, DEFAULT_PROTOCOL)
    assert [(rank, record.line) for rank, record in found] == [(0, 9), (1, 4)]
