"""The gate: every reason the study may not enter the benchmark as it stands, and the
decision in both modes (plain, and ``--allow-partial``).

Which findings fail the gate, how, and in which order is each rule's policy
(:attr:`auditor.rules.Rule.gate`); the configurations' reasons (an unresolved period,
a missing seed) come from the configurations themselves.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from itertools import chain

from auditor.model import (
    Collected,
    ConfigurationResult,
    Finding,
    GateReason,
    GateResult,
    Reason,
    Severity,
    Verdict,
    VerdictKind,
    Waiver,
    WaiverUse,
)
from auditor.rules import FROZEN_GATE, FROZEN_INPUTS, RULES, GatePolicy, finding


def gate_reasons(collected: Collected, verdicts: Sequence[Verdict], findings: Iterable[Finding],
                 configurations: list[ConfigurationResult]) -> list[GateReason]:
    """Every gate reason: the rules' own (integrity ones first), then each unresolved
    configuration's, then the other rules'. ``findings``: those of validation and
    reasoning (collection's are ``collected.findings``)."""
    periods = {v.subject for v in verdicts}
    ruled: list[tuple[GatePolicy, GateReason]] = []
    seen: set[tuple[str, str]] = set()
    for item in chain(collected.findings, findings):
        policy = RULES[item.rule_id].gate
        if policy is None or (item.rule_id, item.subject) in seen:
            continue
        if not policy.integrity and item.subject in periods:
            continue  # (its period's configuration carries it: one reason, not two)
        seen.add((item.rule_id, item.subject))
        ruled.append((policy, _reason(policy, item)))
    ruled.extend((FROZEN_GATE, _reason(FROZEN_GATE, item)) for item in _frozen(collected))
    ruled.sort(key=lambda pair: pair[0].order)  # (stable: in the findings' order within)
    reasons = [reason for policy, reason in ruled if policy.integrity]
    reasons.extend(_configuration_reasons(
        verdicts, configurations, collected.sacct.path if collected.sacct else None))
    reasons.extend(reason for policy, reason in ruled if not policy.integrity)
    return reasons


def _reason(policy: GatePolicy, item: Finding) -> GateReason:
    return GateReason(item.rule_id, item.subject,
                      policy.text.format(subject=item.subject, message=item.message),
                      policy.integrity)


def _frozen(collected: Collected) -> list[Finding]:
    """One error finding for each of the study's frozen inputs that has one (a protocol's
    ``AUD014`` before any other), in the inputs' name order: the verdicts were reached
    under other rules, or without the commit check."""
    frozen: dict[str, Finding] = {}
    for item in sorted((f for f in collected.findings
                        if f.subject in FROZEN_INPUTS and f.severity is Severity.ERROR),
                       key=lambda f: f.rule_id != "AUD014"):
        frozen.setdefault(item.subject, item)
    return [item for _, item in sorted(frozen.items())]


def _configuration_reasons(verdicts: Sequence[Verdict],
                           configurations: list[ConfigurationResult],
                           sacct_path: str | None = None) -> list[GateReason]:
    """An unresolved configuration's reasons: each unresolved period (named by its
    verdict's first finding), and its missing seeds."""
    at = {v.subject: place for place, v in enumerate(verdicts)}  # (kept packed, when many)
    reasons = []
    for config in configurations:
        if config.status == "resolved":
            continue
        for subject in config.periods:
            verdict = verdicts[at[subject]]
            if verdict.verdict is VerdictKind.UNRESOLVED:
                rules = _unresolved_by(verdict, sacct_path)
                reasons.append(GateReason(
                    rules[0], subject,
                    f"configuration {config.key} unresolved: {subject} is unresolved "
                    f"({verdict.reason})", False))
                # (each other rule that would leave it unresolved is a reason of its own: a
                # waiver of one lifts that one, never the period)
                reasons.extend(GateReason(
                    rule, subject, f"configuration {config.key} unresolved: {subject} is "
                    f"unresolved by {rule} ({RULES[rule].symbol}) too", False)
                    for rule in rules[1:])
        if config.missing_seeds or not config.periods:
            reasons.append(GateReason("AUD213", config.key,
                                      f"configuration {config.key} unresolved: missing seed(s) "
                                      f"{', '.join(map(str, config.missing_seeds))}", False))
    return reasons


def _unresolved_by(verdict: Verdict, sacct_path: str | None) -> list[str]:
    """The rules that leave an unresolved period so, the decisive one (its verdict's first
    finding) first, then each other one among its findings that blocks a verdict or is an
    error, once each; ``AUD214`` for a verdict with no finding. Where the decisive one is
    the scheduler's end of the job (it cites the dump: :data:`ENDINGS`), the evidence that
    end left missing (no trial record, no idle check made: :func:`_left_missing`) is its
    consequence, no reason of its own."""
    if not verdict.findings:
        return ["AUD214"]
    first = verdict.findings[0]
    ended = bool(sacct_path) and bool(first.citations) \
        and first.citations[0].path == sacct_path and RULES[first.rule_id].blocks in ENDINGS
    rules = [first.rule_id]
    for item in verdict.findings[1:]:
        rule = RULES[item.rule_id]
        if item.rule_id in rules or (ended and _left_missing(item)):
            continue
        if item.severity is Severity.ERROR or rule.blocks is not None:
            rules.append(item.rule_id)
    return rules


ENDINGS = frozenset({Reason.TIME_LIMIT, Reason.CANCELLED, Reason.PREEMPTED,
                     Reason.INFRASTRUCTURE_FAILURE})
"""The reasons of the scheduler's end of a job (its dump cites it) whose consequence is
evidence left missing."""
NOT_MADE = frozenset({"absent", "unavailable", "host_absent", "host_unavailable"})
"""The forms of ``AUD118`` that say an idle check was not made (a failed one is no absence)."""


def _left_missing(item: Finding) -> bool:
    """Whether ``item`` says evidence is missing (a file, a kind, an idle check not made),
    as a job the scheduler ended leaves it."""
    if item.rule_id == "AUD118":
        return item.value("form") in NOT_MADE
    return RULES[item.rule_id].blocks is Reason.EVIDENCE_MISSING


def apply_waivers(reasons: list[GateReason], waivers: Iterable[Waiver]
                  ) -> tuple[set[int], list[WaiverUse], list[Finding]]:
    """Which reasons the waivers lift (their positions), how many each lifted, and an
    ``AUD215`` for each waiver that lifted any."""
    uses = []
    lifted: set[int] = set()
    findings = []
    for waiver in waivers:
        matched = [i for i, r in enumerate(reasons)
                   if r.rule_id == waiver.rule_id and r.subject == waiver.subject]
        lifted.update(matched)
        uses.append(WaiverUse(waiver.rule_id, waiver.subject, waiver.reason, len(matched)))
        if matched:
            findings.append(finding("AUD215", waiver.subject, [],
                                    waived_rule=waiver.rule_id, reason=waiver.reason))
    return lifted, uses, findings


def decide_gate(configurations: list[ConfigurationResult], reasons: list[GateReason],
                lifted: set[int], verdicts: Sequence[Verdict], *, allow_partial: bool
                ) -> GateResult:
    """The gate's decision in one mode, the ``lifted`` reasons set aside."""
    active = [r for i, r in enumerate(reasons) if i not in lifted]
    waived = [r.text for i, r in enumerate(reasons) if i in lifted]
    blocked_subjects = {r.subject for r in active if not r.integrity}
    included = []
    for config in configurations:
        if config.status == "resolved" or (
            not config.missing_seeds and config.periods
            and not any(s in blocked_subjects for s in config.periods)
            and config.key not in blocked_subjects
        ):
            included.append(config.key)
    if allow_partial:
        failing = [r.text for r in active if r.integrity]
        if not included:
            failing.append("no configuration resolved")
    else:
        failing = [r.text for r in active]
        if not configurations:
            failing.append("no configuration found")
        elif not included:  # (never laxer than --allow-partial: waivers lift reasons, but a
            # configuration with missing seeds is never included)
            failing.append("no configuration resolved")
    resolved = {config.key for config in configurations if config.status == "resolved"}
    return GateResult(allow_partial, not failing, tuple(included), tuple(failing), tuple(waived),
                      tuple(key for key in included if key not in resolved))


def admitted(strict: GateResult, partial: GateResult) -> tuple[GateResult, GateResult]:
    """Both gates as a script may read them (contract v1.2, "A failing gate admits
    nothing"): where even the ``--allow-partial`` gate fails (the evidence cannot be
    trusted), neither lists a configuration; a strict gate failing only on unresolved
    configurations keeps its resolved subset."""
    if partial.passed:
        return strict, partial
    return (replace(strict, included_configurations=(), included_by_waiver=()),
            replace(partial, included_configurations=(), included_by_waiver=()))
