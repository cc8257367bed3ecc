"""Completion: does every rank hold the protocol's completion phases for the final step,
in order and without error; which ranks recorded an eligible failure.

Pure functions of an attempt's allocator traces and the protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from auditor._text import clip
from auditor.model import AllocatorTrace, AttemptEvidence, Citation, PhaseRecord, Protocol, Worker
from auditor.model.kinds import ALLOCATOR_TRACE


@dataclass
class Completion:
    """What the completion records of an attempt show."""

    complete: bool
    ranks: int
    sentences: list[str]
    problems: list[str]
    citations: list[Citation]
    gaps: list[Citation] = field(default_factory=list)
    """Where each incomplete rank falls short: the record that raised, or its trace."""


def completion(attempt: AttemptEvidence, protocol: Protocol, steps: int | None) -> Completion:
    """Does every rank hold the completion phases for the final step, in order, error-free?"""
    traces_by_pid: dict[tuple[str | None, int], AllocatorTrace] = {}
    for trace in attempt.read.traces:
        who = ALLOCATOR_TRACE.worker_of(trace.path)
        if who is not None:
            traces_by_pid[who] = trace
    workers = sorted(attempt.spec.workers,
                     key=lambda w: (w.role or "", w.rank is None, w.rank or 0)
                     if protocol.completion_phases_by_role else (w.rank is None, w.rank or 0))
    problems: list[str] = []
    citations: list[Citation] = []
    gaps: list[Citation] = []
    if steps is None:
        return Completion(False, len(workers), [],
                           [f"the dispatch does not name {protocol.steps_from}"], [])
    complete_ranks = 0
    by_role = bool(protocol.completion_phases_by_role)
    for worker in workers:
        worker_trace = _trace_of(traces_by_pid, worker)
        name = f"{worker.role} rank {worker.rank}" if by_role else f"rank {worker.rank}"
        if worker_trace is None:
            problems.append(f"{name}: no allocator trace")
            continue  # (its absence is a finding of its own, citing where it should be)
        phases = protocol.phases_for(worker.role)
        if not phases:  # (never excused: a role the protocol names no phases for)
            problems.append(f"{name}: the protocol names no completion phases for role "
                            f"{worker.role!r}")
            gaps.append(Citation(protocol.path or "protocol.json", pointer="/completion_phases"))
            continue
        cursor: int | None = None
        ok = True
        for phase in phases:
            found = _find_phase(worker_trace.phases, phase, steps, cursor)
            if found is None:
                failed = [r for r in worker_trace.phases if r.phase == phase and r.step == steps
                          and r.error_type]
                if failed:
                    message = f": {clip(failed[0].error_message, 160)}" \
                        if failed[0].error_message else ""
                    problems.append(f"{name}: {phase} step {steps} raised "
                                    f"{failed[0].error_type}{message}")
                    gap = Citation(worker_trace.path, line=failed[0].line,
                                   quote=failed[0].error_type)
                    citations.append(gap)
                    gaps.append(gap)
                else:
                    problems.append(f"{name}: no error-free {phase} at step {steps}")
                    gaps.append(Citation(worker_trace.path,
                                         quote=f"{len(worker_trace.phases)} phase records"))
                ok = False
                break
            citations.append(Citation(worker_trace.path, line=found.line,
                                      quote=f"{found.phase} step {found.step}"))
            cursor = found.finished_ns
        if ok:
            complete_ranks += 1
    sentences: list[str] = []
    n = len(workers)
    everyone = f"all {n} ranks" if n > 2 else "both ranks" if n == 2 else "the one rank"
    if n and complete_ranks == n and by_role:
        described = "; ".join(f"{role}: " + ", ".join(f"`{p}`" for p in phases)
                              for role, phases in protocol.completion_phases_by_role
                              if any(w.role == role for w in workers))
        sentences.append(
            f"In this period {everyone} recorded their role's completion phases ({described}) "
            f"at step {steps}, each call returning without an exception, in that order.")
    elif n and complete_ranks == n:
        phases = protocol.completion_phases
        described = " followed by a separate post-update ".join(f"`{p}`" for p in phases)
        sentences.append(
            f"In this period {everyone} recorded {described} at step {steps}, "
            "each call returning without an exception, in that order."
        )
        tail = _phase_sequence(traces_by_pid, workers)
        if tail:
            sentences.append(f"The recorded phase sequence reaches {tail}.")
    elif n:
        listed = "its role's" if by_role else ", ".join(protocol.completion_phases)
        sentences.append(f"{complete_ranks} of {n} ranks recorded every completion phase "
                         f"({listed}) at step {steps} without error"
                         + (f"; {'; '.join(problems)}" if problems else "") + ".")
    return Completion(bool(n) and complete_ranks == n, n, sentences, problems, citations,
                       gaps)


def _find_phase(records: tuple[PhaseRecord, ...], phase: str, step: int,
                after_ns: int | None) -> PhaseRecord | None:
    for record in records:
        if record.phase != phase or record.step != step or record.error_type:
            continue
        if after_ns is not None and record.started_ns is not None and record.started_ns < after_ns:
            continue
        return record
    return None


def _trace_of(traces: dict[tuple[str | None, int], AllocatorTrace], worker: Worker
              ) -> AllocatorTrace | None:
    """The worker's trace: by (host, pid), or by pid where one side names no host (v1)."""
    if worker.pid is None:
        return None
    found = traces.get((worker.host, worker.pid))
    if found is None and worker.host is not None:
        found = traces.get((None, worker.pid))
    if found is None and worker.host is None:
        same = [trace for (_, pid), trace in traces.items() if pid == worker.pid]
        found = same[0] if len(same) == 1 else None
    return found


def _phase_sequence(traces_by_pid: dict[tuple[str | None, int], AllocatorTrace],
                    workers: list[Worker]) -> str:
    """The common tail of phases after the final update (e.g. ``actor_update, weight_sync,
    then idle``) when every rank agrees."""
    tails = set()
    for worker in workers:
        trace = _trace_of(traces_by_pid, worker)
        if trace is None:
            return ""
        names = [r.phase for r in trace.phases]
        if "actor_update" not in names:
            return ""
        start = len(names) - 1 - names[::-1].index("actor_update")
        tails.add(tuple(names[start:]))
    if len(tails) != 1:
        return ""
    tail = list(next(iter(tails)))
    if len(tail) < 2:
        return ""
    return ", ".join(f"`{p}`" for p in tail[:-1]) + f", then `{tail[-1]}`"


def eligible_failures(
    traces: tuple[AllocatorTrace, ...], protocol: Protocol
) -> list[tuple[int | None, PhaseRecord]]:
    """(rank, record) of every phase record that ended in an error type the protocol
    lists for that phase, by rank and line."""
    rules = {rule.phase: set(rule.error_types) for rule in protocol.eligible_failures}
    found = []
    for trace in traces:
        for record in trace.phases:
            if record.error_type and record.error_type in rules.get(record.phase, ()):
                found.append((record.rank, record))
    return sorted(found, key=lambda item: (item[0] is None, item[0] or 0, item[1].line))
