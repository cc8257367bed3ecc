"""The report's diagnosis: one ``### `` group per (verdict, reason, cause), contract v1.2.

What every period of the study says is said once for the study (its dispatch, and any
sentence all its groups share); each group then says once what its periods share and lists
what sets a period apart; a sentence the report says elsewhere (a passed idle check, the
launcher's status where it disagrees, a rank-by-rank list of missed phases) is left out;
each limits text is written once, later groups naming the first that said it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from auditor.model import AuditResult, Citation, Reasoning, Verdict
from auditor.model.lines import launcher_status
from auditor.report.appendix import MAX_NAMED_PERIODS
from auditor.report.citations import group_pattern
from auditor.report.groups import (
    completion_sentence,
    diagnosis_groups,
    dispatch_sentence,
    dispatches_alike,
    names_unique,
    reached_sentence,
    scheduler_sentence,
    shared_sentences,
)
from auditor.report.mdformat import code_span, prose


def diagnosis_section(result: AuditResult, reasoning: Reasoning, linked: bool) -> str:
    """``## Diagnosis and limits``: the study's shared facts once, then a ``### `` group per
    (verdict, reason, cause), each naming its periods, what they share and what sets one
    apart, its limits and its evidence pattern (``linked``: ``evidence.md`` was written)."""
    lines = ["## Diagnosis and limits", ""]
    alike = len(reasoning.verdicts) > 1 and dispatches_alike(result, reasoning.verdicts)
    where = "[`evidence.md`](evidence.md)" if linked else "`findings.parquet`"
    redundant = _redundant(result, alike)
    groups = [(group, *shared_sentences(group.members, redundant))
              for group in diagnosis_groups(reasoning, MAX_NAMED_PERIODS)]
    # what every period of the study says, said once for the study (as its dispatch is)
    everywhere = [s for s in groups[0][1] if all(s in g[1] for g in groups[1:])] \
        if len(groups) > 1 else []
    lines.append(
        (dispatch_sentence(result, reasoning.verdicts) + " " if alike else "")
        + ("In every period of the study: " + " ".join(
            _capital(s.replace("In each period, ", "", 1)) for s in everywhere) + " "
           if everywhere
           else "")
        + "A group says once what its periods share, then what sets one apart. Paths: under "
        f"`ATTEMPT` or `BASE` (the evidence locator); each period's own citations: {where}.")
    unique = names_unique(reasoning)  # (else periods are named by subject alone)
    said_limits: dict[str, str] = {}  # (each limits text with the group that said it first)
    steps = result.collected.protocol.steps_from
    for group, shared, apart, others in groups:
        members = group.members
        lines += ["", f"### {group.title}", ""]
        named = ", ".join(code_span(v.subject, 300) + (f" (job {job})" if job and unique else "")
                          for job, v in zip(group.jobs, members[:MAX_NAMED_PERIODS],
                                            strict=True))
        rest = len(members) - MAX_NAMED_PERIODS
        lines.append(f"Applies to: {named}"
                     + (f", and {rest:,} more (see `periods.parquet`)." if rest > 0 else "."))
        said = [*(s for s in shared if s not in everywhere), scheduler_sentence(result, members),
                completion_sentence(result, members) if group.updated else
                reached_sentence(result, members) if group.kind == "unresolved" else ""]
        lines += ["", " ".join(s for s in said if s)]
        if apart:
            lines.append("")
            lines.extend(f"- {code_span(v.subject, 300)}: {' '.join(own)}" for v, own in apart)
            if others:
                lines.append(f"- and {others:,} more that differ: each period's diagnosis is "
                             "in `periods.parquet`")
        lines += ["", _limits(members, said_limits, group.title)]
        lines += ["", _evidence_pattern(result, members, lambda cite: _cited_elsewhere(
            cite, steps if alike else None))]
    return "\n".join(lines)


def _capital(sentence: str) -> str:
    return sentence[:1].upper() + sentence[1:]


def _redundant(result: AuditResult, alike: bool) -> Callable[[str], bool]:
    """Which of a verdict's sentences the report says elsewhere: the steps dispatched when
    the study's dispatch is stated once; a passed idle check (the cross-checks count them,
    and a failed one is a blocker's sentence); the launcher's status where it disagrees
    (its section says so); which ranks missed a completion phase, rank by rank (the
    phases the traces reach are said for the group)."""
    disagreeing = {launcher_status(status, error)
                   for _, status, error, _ in result.reasoning.disagreements}

    def said_elsewhere(sentence: str) -> bool:
        return (alike and sentence.startswith(("The dispatch specifies ",
                                               "The environment specifies "))) \
            or sentence == "The post-period idle check passed." \
            or sentence in disagreeing or _MISSED_PHASES.match(sentence) is not None
    return said_elsewhere


_MISSED_PHASES = re.compile(r"\d+ of \d+ ranks recorded every completion phase .*; rank ")
"""The completion sentence that lists, rank by rank, what each rank did not record."""


def _limits(members: Sequence[Verdict], said: dict[str, str], title: str) -> str:
    """The group's limits: one text for all (nearly always), else each with its periods; a
    text an earlier group said is named by that group (``said``: text -> its title)."""
    texts: dict[str, list[str]] = {}
    for verdict in members:
        held = texts.setdefault(verdict.limits, [])
        if len(held) < 3:
            held.append(verdict.subject)

    def shown(text: str) -> str:
        first = said.setdefault(text, title)
        return prose(text, limit=4000) if first == title else \
            f"The same as under “{prose(first, 200)}” above."
    if len(texts) == 1:
        return f"**Limits.** {shown(next(iter(texts)))}"
    return "**Limits.** " + " ".join(
        f"For {', '.join(code_span(s, 300) for s in subjects)}"
        f"{' and others' if len(subjects) == 3 else ''}: {shown(text)}"
        for text, subjects in texts.items())


def _cited_elsewhere(cite: Citation, steps: str | None) -> bool:
    """A citation of what the report says once elsewhere: a passed idle check (the
    cross-checks), the steps dispatched (``steps``: said for the study)."""
    pointer = cite.pointer or ""
    return pointer == "/idle_check/passed" and cite.quote == "true" or (
        steps is not None and pointer in (f"/dispatch/{steps}", f"/env/{steps}"))


def _evidence_pattern(result: AuditResult, members: Sequence[Verdict],
                      skip: Callable[[Citation], bool]) -> str:
    """The group's evidence, once, as the pattern its periods share (the others' in
    ``evidence.md``)."""
    pattern = group_pattern(result, members, skip)
    shared = ("" if len(members) == 1 else
              ", the same in every period" if not pattern.exceptions else
              f", the same in {len(members) - len(pattern.exceptions):,} of "
              f"{len(members):,} periods")
    named = ", ".join(code_span(v.subject, 300) for v in pattern.exceptions[:3]) \
        if len(pattern.exceptions) <= 3 else f"{len(pattern.exceptions):,} periods"
    others = (f" ({'the other' if len(pattern.exceptions) == 1 else 'the others'}, {named}: "
              "[`evidence.md`](evidence.md))") if pattern.exceptions else ""
    return f"Evidence{shared}{others}: {pattern.text}."
