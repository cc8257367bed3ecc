"""The report's first screen after the headline (contract v1.2, "The report, as people and
tools read it"): a table per configuration (its seeds, its periods' verdicts, whether it
enters the evaluation and why) and one line per unresolved period (its full pair id,
period, job, reason, cause, the line that decided it, and what it needs)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator

from auditor._text import clip, counted
from auditor.model import NEEDS, AuditResult, Citation, Verdict, VerdictKind
from auditor.report.citations import names_of
from auditor.report.mdformat import code_span, number, table
from auditor.rules import unprefixed

MAX_UNRESOLVED_LINES = 100
"""Unresolved periods the report names a line each (the rest: ``auditor rerun`` and
``periods.parquet``; a million-period study would otherwise print a million lines)."""


def seed_ranges(seeds: Iterable[int]) -> str:
    """``161-163, 165``: sorted seeds, runs of consecutive ones as ranges."""
    runs: list[list[int]] = []
    for seed in sorted(set(seeds)):
        if runs and seed == runs[-1][-1] + 1:
            runs[-1].append(seed)
        else:
            runs.append([seed])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def configurations_section(result: AuditResult) -> str:
    """``## Configurations``: one row per configuration, in the study's order."""
    reasoning = result.reasoning
    configs = reasoning.configurations
    if not configs:
        return ""
    tally: dict[str, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
    """By configuration, by verdict: how many periods, by their cause or reason word."""
    unplaced: list[str] = []
    """Periods of no configuration known (a record unread, or without workload or GPUs)."""
    for verdict, facts in zip(reasoning.verdicts, reasoning.facts, strict=True):
        if facts.workload is None or facts.gpus is None:
            unplaced.append(verdict.subject)
            continue
        word = "" if verdict.verdict is VerdictKind.RESOLVED else \
            str(verdict.cause.word) if verdict.verdict is VerdictKind.FAILED and verdict.cause \
            else "" if verdict.verdict is VerdictKind.FAILED else str(verdict.reason)
        tally[f"{facts.workload}@{facts.gpus}"][verdict.verdict.value][word] += 1
    partial = reasoning.gate_partial
    admitted = set(partial.included_configurations) if partial.passed else set()
    waived = set(partial.included_by_waiver)
    rows = []
    for config in configs:
        counts = tally.get(config.key, {})
        verdicts = "; ".join(_verdicts(kind, counts[kind]) for kind in _ORDER if kind in counts)
        unresolved = sum(counts.get("unresolved", Counter()).values())
        seeds = seed_ranges(config.seeds) or "—"
        # (a seed with no period of the configuration was not run, unless a period of no
        # known configuration may be it)
        missing = "no period read" if unplaced else "not run"
        if config.missing_seeds:
            seeds += f" ({missing}: {seed_ranges(config.missing_seeds)})"
        why = []  # (its own reasons first: a failing gate is said only where it has none)
        if unresolved:
            why.append(f"{number(unresolved)} unresolved")
        if config.missing_seeds:
            why.append(f"seed{'s' if len(config.missing_seeds) > 1 else ''} "
                       f"{seed_ranges(config.missing_seeds)} {missing}")
        if config.key in admitted:
            enters = "yes, by a waiver" if config.key in waived else "yes"
        elif why:
            enters = "no: " + ", ".join(why)
        else:
            enters = "no: the gate fails" if not partial.passed else \
                "no: not a configuration the protocol lists"
        rows.append([code_span(config.key), seeds, verdicts or "no period", enters])
    lines = ["## Configurations", "",
             table(["Configuration", "Seeds", "Periods", "Enters the evaluation"], rows)]
    if unplaced:
        shown = ", ".join(code_span(subject) for subject in unplaced[:MAX_UNPLACED])
        more = f" and {len(unplaced) - MAX_UNPLACED:,} more" \
            if len(unplaced) > MAX_UNPLACED else ""
        lines += ["", f"{counted(len(unplaced), 'period')} of no known configuration (a "
                  "record unreadable, or naming no workload or GPUs), "
                  f"{'unresolved' if len(unplaced) == 1 else 'each unresolved'}: "
                  f"{shown}{more}."]
    return "\n".join(lines)


MAX_UNPLACED = 12
"""The most periods of no known configuration the section names (all: the periods table)."""


_ORDER = ("resolved", "failed", "unresolved")


def _verdicts(kind: str, words: Counter[str]) -> str:
    """``2 unresolved (`killed`, 2 `time_limit`)``: a verdict's periods counted, with their
    causes (failed) or reasons (unresolved), each counted where more than one."""
    named = ", ".join(f"{n:,} `{word}`" if n > 1 else f"`{word}`"
                      for word, n in sorted(words.items()) if word)
    return f"{sum(words.values()):,} {kind}" + (f" ({named})" if named else "")


def unresolved_lines(result: AuditResult) -> Iterator[str]:
    """``## Unresolved periods``: one line per unresolved period, in the study's order, at
    most :data:`MAX_UNRESOLVED_LINES`."""
    reasoning = result.reasoning
    shown = total = 0
    waived: dict[str, list[str]] = {}  # (a period a waiver lifted a gate reason of)
    admitted_by_waiver = set(reasoning.gate_partial.included_by_waiver)
    for waiver in reasoning.waivers:
        if waiver.matched:
            waived.setdefault(waiver.subject, []).append(waiver.rule_id)
    for verdict, facts in zip(reasoning.verdicts, reasoning.facts, strict=True):
        if verdict.verdict is not VerdictKind.UNRESOLVED:
            continue
        total += 1
        if shown >= MAX_UNRESOLVED_LINES:
            continue
        if not shown:
            yield from ("## Unresolved periods", "")
        shown += 1
        job = f" (job {facts.job_id})" if facts.job_id else ""
        cause = f", cause `{verdict.cause.word}`" if verdict.cause is not None else ""
        decided = deciding_line(verdict, names_of(result, verdict).attempt_dir)
        rules = waived.get(verdict.subject)
        named = ", ".join(code_span(r) for r in rules or ())
        # (waived for the gate only where its configuration entered by the waivers: a
        # reason no waiver may lift, an altered file, still keeps it out)
        needs = (f"Waived for the gate ({named}: see Waivers)"
                 if rules and f"{facts.workload}@{facts.gpus}" in admitted_by_waiver else
                 f"Needs {NEEDS.get(verdict.reason, 'a rerun')}"
                 + (f" ({named} waived: see Waivers)" if rules else ""))
        yield (f"- {code_span(verdict.subject, 300)}{job}: `{verdict.reason}`{cause}"
               + (f"; {decided}" if decided else "") + f". {needs}.")
    if total > shown:
        yield (f"- and {total - shown:,} more: `auditor rerun` lists every one by array and "
               "cause; `periods.parquet` has each.")


INTEGRITY_RULES = frozenset({"AUD101", "AUD102", "AUD103", "AUD104"})
"""A listed file missing, altered, unsafe or unreadable: the deciding line says which."""


def deciding_line(verdict: Verdict, attempt_dir: str = "") -> str:
    """The citation the verdict's first deciding finding rests on, with what it says there
    (from the verdict's own citation of the same place when the finding quotes nothing);
    a path in the attempt's directory ``attempt_dir`` shown under ``ATTEMPT/``."""
    first, cite = next(((f, c) for f in verdict.findings for c in f.citations), (None, None))
    if cite is None and verdict.cause is not None:
        cite = verdict.cause.citation
    if cite is None:
        return ""
    if first is not None and first.rule_id in INTEGRITY_RULES:  # (what is wrong with the file
        quote = cite.quote or unprefixed(first)  # itself: no line of it says that)
    else:
        quote = cite.quote or next((c.quote for c in verdict.citations  # (of the same place
                                    if c.path == cite.path and c.line == cite.line  # only:
                                    and c.pointer == cite.pointer and c.quote), "")  # another
        # line says else)
    return code_span(_place(cite, attempt_dir), 200) + (f" ({code_span(clip(quote, 100), 110)})"
                                           if quote else "")


def _place(cite: Citation, attempt_dir: str) -> str:
    where = f":{cite.line}" if cite.line is not None else \
        f"#{cite.pointer}" if cite.pointer else ""
    folder = attempt_dir.rstrip("/") + "/"
    path = "ATTEMPT/" + cite.path[len(folder):] if attempt_dir and \
        cite.path.startswith(folder) else cite.path
    return f"{path}{where}"
