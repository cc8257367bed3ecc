"""Configurations: (workload, gpus) cells across seeds, and whether each resolves."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import NamedTuple

from auditor._text import counted
from auditor.model import (
    AttemptOutcome,
    Citation,
    Collected,
    ConfigurationResult,
    Finding,
    Verdict,
    VerdictKind,
)
from auditor.rules import finding


class _Member(NamedTuple):
    """What a configuration's results read of one of its periods."""

    subject: str
    path: str
    seed: int | None


def configurations(
    collected: Collected, verdicts: Sequence[Verdict], outcomes: Sequence[AttemptOutcome]
) -> tuple[list[ConfigurationResult], list[Finding]]:
    """Every configuration the periods ran or the protocol lists, with what it costs, and
    the findings of missing seeds (``AUD213``) and unlisted configurations (``AUD217``)."""
    findings: list[Finding] = []
    # (of each period only what is asked of it here: a large study's verdicts and periods
    # are kept packed, and all held at once were most of its memory)
    cells: dict[tuple[str, int], list[tuple[_Member, VerdictKind]]] = defaultdict(list)
    for period, verdict in zip(collected.periods, verdicts, strict=True):
        record = period.record
        if record.workload is None or record.gpus is None:
            continue
        cells[(record.workload, record.gpus)].append(
            (_Member(period.subject, record.path, record.seed), verdict.verdict))
    expected = {(c.workload, c.gpus): c.seeds for c in collected.protocol.configurations}
    cost: dict[str, tuple[float, float]] = defaultdict(lambda: (0.0, 0.0))
    for attempt in outcomes:
        task, reservation = cost[attempt.subject]
        cost[attempt.subject] = (task + attempt.task_gpu_seconds,
                                 reservation + attempt.reservation_gpu_seconds)
    results = []
    for key in sorted(set(cells) | set(expected), key=lambda k: (k[1], k[0])):
        members = cells.get(key, [])
        run = {p.seed for p, _ in members if p.seed is not None}
        seeds = tuple(sorted(run))
        # (each expected seed looked up in the set: a scan of the tuple per seed was N²/2
        # comparisons for a configuration of N seeds, 2 s at 18,500, a million-file study's)
        missing = tuple(s for s in expected.get(key, ()) if s not in run)
        subject = f"{key[0]}@{key[1]}"
        unexpected = bool(expected) and key not in expected \
            and collected.protocol.path is not None  # (a protocol.json says what is run)
        if unexpected:  # (a renamed or mistyped workload: never in the inclusion list)
            findings.append(finding(
                "AUD217", subject, [Citation(members[0][0].path, pointer="/workload",
                                             quote=key[0])],
                periods=counted(len(members), "period"), workload=key[0], gpus=key[1],
                protocol=collected.protocol.path))
        if missing or not members:
            findings.append(finding(
                "AUD213", subject, [Citation(collected.protocol.path or "protocol.json",
                                             pointer="/configurations")],
                **({"seeds": ", ".join(map(str, missing))} if missing
                   else {"form": "uncovered"}),
            ))
        kinds = {kind for _, kind in members}
        resolved = bool(members) and not missing and not unexpected \
            and VerdictKind.UNRESOLVED not in kinds
        outcome: str | None = None
        if resolved:
            outcome = ("completed" if kinds == {VerdictKind.RESOLVED} else
                       "failed" if kinds == {VerdictKind.FAILED} else "mixed")
        results.append(ConfigurationResult(
            key[0], key[1], "resolved" if resolved else "unresolved", outcome,
            tuple(p.subject for p, _ in members), seeds, missing,
            round(sum(cost[p.subject][0] for p, _ in members), 6),
            round(sum(cost[p.subject][1] for p, _ in members), 6)
            if collected.scopes_known()[1] else None,
        ))
    return results, findings
