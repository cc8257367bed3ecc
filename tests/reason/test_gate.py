"""The gate on hand-built model values: which findings give a reason and in which order
(each rule's :attr:`~auditor.rules.Rule.gate`), what a waiver lifts, and the decision
in both modes."""

from __future__ import annotations

from pathlib import Path

from auditor.model import (
    Citation,
    ConfigurationResult,
    Finding,
    GateReason,
    Reason,
    Verdict,
    VerdictKind,
    Waiver,
)
from auditor.reason.gate import apply_waivers, decide_gate, gate_reasons
from auditor.rules import RULES, finding
from tests.helpers import audit, edit_record, outcome_study, period_records, rewrite
from tests.reason.values import LOG, RECORD, SACCT, attempt, collected, period

A, B = "host-m-gsm8k-c2-s161/period-1", "host-m-gsm8k-c2-s162/period-1"


def verdict(subject: str, kind: VerdictKind = VerdictKind.RESOLVED,
            reason: Reason = Reason.COMPLETED, findings: tuple[Finding, ...] = ()) -> Verdict:
    pair, _, number = subject.partition("/period-")
    return Verdict(subject, pair, int(number), kind, reason, "", "", findings)


def config(status: str, periods: tuple[str, ...], missing: tuple[int, ...] = (),
           gpus: int = 2) -> ConfigurationResult:
    return ConfigurationResult("gsm8k", gpus, status, "completed" if status == "resolved"
                               else None, periods, (161, 162), missing, 1.0, None)


def no_scheduler() -> Finding:
    return finding("AUD123", SACCT, [Citation(SACCT)])


def test_integrity_reasons_come_first_then_the_configurations_then_the_others() -> None:
    """Handed over in the reverse of the gate's order, listed in it: the integrity rules'
    by their ``order`` (evidence, the scheduler's word, anchors), the unresolved
    configuration's period, then the non-integrity rules' by ``order``."""
    unresolved = verdict(B, VerdictKind.UNRESOLVED, Reason.TERMINAL_EVENT_MISSING,
                         (finding("AUD201", B, ranks=2, phases="actor_update", step=1),))
    findings = [
        finding("AUD210", "7000000_[5-6]", [Citation(SACCT, line=9)], form="array",
                job_id="7000000_[5-6]", state="PENDING"),
        finding("AUD217", "gsm8k@8", [Citation(RECORD)], periods="1 period", workload="gsm8k",
                gpus=8, protocol="protocol.json"),
        finding("AUD120", "study", name="model", expected="a" * 64, found="b" * 64),
        finding("AUD101", LOG, [Citation(LOG)], manifest=RECORD),
    ]
    reasons = gate_reasons(collected(findings=[no_scheduler()]), [verdict(A), unresolved],
                           findings, [config("unresolved", (A, B))])
    assert [(r.rule_id, r.subject, r.integrity) for r in reasons] == [
        ("AUD101", LOG, True),
        ("AUD123", SACCT, True),
        ("AUD120", "study", True),
        ("AUD201", B, False),
        ("AUD217", "gsm8k@8", False),
        ("AUD210", "7000000_[5-6]", False),
    ]
    assert [r.text for r in reasons] == [
        f"evidence missing: {LOG}",
        f"scheduler dump unusable: {no_scheduler().message}",
        f"anchor model: expected {'a' * 64}, found {'b' * 64}",
        "configuration gsm8k@2 unresolved: host-m-gsm8k-c2-s162/period-1 is unresolved "
        "(terminal_event_missing)",
        "configuration gsm8k@8 unresolved: the protocol does not list it",
        "array partial: 7000000_[5-6]: element 7000000_[5-6] is still PENDING; the array is "
        "partial",
    ]


def test_every_gate_text_is_the_rules_policy() -> None:
    """Each reason's text is its rule's ``gate.text`` filled in, and its integrity flag
    the policy's."""
    for rule_id, rule in RULES.items():
        if rule.gate is None:
            continue
        item = finding(rule_id, "some/subject", [Citation("some/file")])
        (reason,) = gate_reasons(collected(), [], [item], [])
        assert reason == GateReason(rule_id, "some/subject", rule.gate.text.format(
            subject="some/subject", message=item.message), rule.gate.integrity)


def test_one_reason_per_rule_and_subject() -> None:
    twice = [finding("AUD101", LOG, [Citation(LOG)], manifest=RECORD),
             finding("AUD101", LOG, [Citation(LOG, line=2)], manifest="other"),
             finding("AUD101", "other.log", [Citation("other.log")], manifest=RECORD)]
    reasons = gate_reasons(collected(), [], twice, [])
    assert [(r.rule_id, r.subject) for r in reasons] == [("AUD101", LOG),
                                                         ("AUD101", "other.log")]


def test_a_non_integrity_finding_about_a_period_is_carried_by_its_configuration() -> None:
    """AUD210 about a period that has a verdict: the configuration's reason names the
    period, the rule's own is not repeated; about an element with no period, it is."""
    partial = verdict(A, VerdictKind.UNRESOLVED, Reason.ARRAY_PARTIAL,
                      (finding("AUD210", A, job_id="7000001", state="RUNNING"),))
    items = [finding("AUD210", A, job_id="7000001", state="RUNNING"),
             finding("AUD210", "7000000_9", form="array", job_id="7000000_9", state="PENDING")]
    reasons = gate_reasons(collected(), [partial], items, [config("unresolved", (A,))])
    assert [(r.rule_id, r.subject) for r in reasons] == [("AUD210", A),
                                                         ("AUD210", "7000000_9")]
    assert reasons[0].text.startswith("configuration gsm8k@2 unresolved: ")


def test_an_integrity_finding_about_a_period_is_its_own_reason_too() -> None:
    unreadable = finding("AUD011", A, [Citation(RECORD)], error="bad JSON")
    failed = verdict(A, VerdictKind.UNRESOLVED, Reason.PERIOD_RECORD_UNREADABLE, (unreadable,))
    reasons = gate_reasons(collected(findings=[unreadable]), [failed], [],
                           [config("unresolved", (A,))])
    assert [(r.rule_id, r.integrity) for r in reasons] == [("AUD011", True),
                                                           ("AUD011", False)]


def test_a_frozen_inputs_error_fails_the_gate_whatever_its_rule() -> None:
    """An error about protocol.json or execution_commits.json, one per input, the
    protocol's AUD014 before its other findings; warnings do not count."""
    study = collected(findings=[
        finding("AUD002", "protocol.json", [Citation("protocol.json")], where="", error="x"),
        finding("AUD014", "protocol.json", [Citation("protocol.json")], error="bad"),
        finding("AUD001", "execution_commits.json", [Citation("execution_commits.json")],
                error="y"),
        finding("AUD105", "execution_commits.json"),
    ])
    reasons = gate_reasons(study, [], [], [])
    assert [(r.rule_id, r.subject, r.text) for r in reasons] == [
        ("AUD001", "execution_commits.json",
         "frozen input unusable: execution_commits.json: not valid JSON: y"),
        ("AUD014", "protocol.json", "frozen input unusable: protocol.json: bad"),
    ]


def test_missing_seeds_are_the_configurations_reason() -> None:
    reasons = gate_reasons(collected(), [verdict(A)], [],
                           [config("unresolved", (A,), missing=(162, 163))])
    assert [(r.rule_id, r.subject, r.text) for r in reasons] == [
        ("AUD213", "gsm8k@2", "configuration gsm8k@2 unresolved: missing seed(s) 162, 163")]


# ------------------------------------------------------------------ waivers


def test_a_waiver_lifts_the_reasons_of_its_rule_and_subject_only() -> None:
    reasons = [GateReason("AUD201", B, "b", False), GateReason("AUD201", A, "a", False),
               GateReason("AUD123", SACCT, "s", True)]
    lifted, uses, found = apply_waivers(reasons, [Waiver("AUD201", A, "log lost"),
                                                  Waiver("AUD202", A, "nothing to lift")])
    assert lifted == {1}
    assert [(u.rule_id, u.subject, u.matched) for u in uses] == [("AUD201", A, 1),
                                                                 ("AUD202", A, 0)]
    assert [(f.rule_id, f.subject, f.value("waived_rule"), f.value("reason"))
            for f in found] == [("AUD215", A, "AUD201", "log lost")]


# ------------------------------------------------------------------ decision


def gate_case() -> tuple[list[ConfigurationResult], list[GateReason], list[Verdict]]:
    """gsm8k@2 resolved; gsm8k@4 unresolved by period B; evidence missing somewhere."""
    cells = [config("resolved", (A,)), config("unresolved", (B,), gpus=4)]
    reasons = [GateReason("AUD101", LOG, "evidence missing", True),
               GateReason("AUD201", B, "period B", False)]
    return cells, reasons, [verdict(A), verdict(B, VerdictKind.UNRESOLVED)]


def test_the_plain_gate_fails_on_every_reason() -> None:
    cells, reasons, verdicts = gate_case()
    gate = decide_gate(cells, reasons, set(), verdicts, allow_partial=False)
    assert (gate.passed, gate.reasons) == (False, ("evidence missing", "period B"))
    assert gate.included_configurations == ("gsm8k@2",)


def test_allow_partial_fails_only_on_integrity() -> None:
    cells, reasons, verdicts = gate_case()
    gate = decide_gate(cells, reasons, set(), verdicts, allow_partial=True)
    assert (gate.passed, gate.reasons) == (False, ("evidence missing",))
    passed = decide_gate(cells, reasons[1:], set(), verdicts, allow_partial=True)
    assert (passed.passed, passed.included_configurations) == (True, ("gsm8k@2",))


def test_waived_reasons_are_set_aside_and_may_include_a_configuration() -> None:
    cells, reasons, verdicts = gate_case()
    gate = decide_gate(cells, reasons, {0, 1}, verdicts, allow_partial=False)
    assert (gate.passed, gate.reasons, gate.waived) == (True, (), ("evidence missing",
                                                                   "period B"))
    assert gate.included_configurations == ("gsm8k@2", "gsm8k@4")
    assert gate.included_by_waiver == ("gsm8k@4",)


def test_nothing_resolved_or_nothing_found_fails() -> None:
    cells, reasons, verdicts = gate_case()
    partial = decide_gate(cells[1:], reasons[1:], set(), verdicts, allow_partial=True)
    assert (partial.passed, partial.reasons) == (False, ("no configuration resolved",))
    plain = decide_gate([], [], set(), [], allow_partial=False)
    assert (plain.passed, plain.reasons) == (False, ("no configuration found",))


def test_a_configuration_with_missing_seeds_is_never_included_by_waiver() -> None:
    cells = [config("unresolved", (A,), missing=(162,))]
    reasons = [GateReason("AUD213", "gsm8k@2", "missing", False)]
    gate = decide_gate(cells, reasons, {0}, [verdict(A)], allow_partial=False)
    assert gate.included_configurations == ()


def test_the_study_built_for_the_gate_is_clean() -> None:
    """The builders' own study gives no reason at all (the cases above add every one)."""
    one = period(attempt())
    assert gate_reasons(collected(one), [verdict(one.subject)], [],
                        [config("resolved", (one.subject,))]) == []


def test_the_plain_gate_is_never_laxer_than_allow_partial() -> None:
    """A waived missing seed (--waive AUD213:CONFIG) lifts the plain gate's only reason, but
    a configuration with missing seeds is never included: the plain gate then fails with
    'no configuration resolved', as --allow-partial does (it passed once, with nothing
    included)."""
    cells = [config("unresolved", (A,), missing=(162,))]
    reasons = [GateReason("AUD213", "gsm8k@2", "missing", False)]
    plain = decide_gate(cells, reasons, {0}, [verdict(A)], allow_partial=False)
    partial = decide_gate(cells, reasons, {0}, [verdict(A)], allow_partial=True)
    assert partial.passed or not plain.passed, (plain, partial)


def test_a_waiver_of_one_rule_leaves_a_periods_other_blocking_rules(tmp_path: Path) -> None:
    """A period unresolved by its element still running (AUD210) and by its idle check
    (AUD118): waiving AUD210 for it lifts that reason, not the idle check's; the gate still
    fails, and passes once both are waived."""
    root = outcome_study(tmp_path / "study", ["completed", "completed"])
    rewrite(root, "accounting/sacct-raw.psv",
            lambda data: data.replace(b"7000000_0|7000001|host-capacity|COMPLETED|",
                                      b"7000000_0|7000001|host-capacity|RUNNING|", 1),
            update_manifest=False)
    record = next(path for path in period_records(root) if "s161" in str(path))

    def failed_check(doc: dict) -> None:
        doc["idle_check"].update(passed=False, gpu_processes=3)
    edit_record(record, failed_check)
    subject = "host-qwen25-7b-gsm8k-c2-s161/period-1"
    one = audit(root, tmp_path / "one", "--waive", f"AUD210:{subject}", "--reason", "lag")
    assert one["gate"]["passed"] is False
    assert any("AUD118" in reason for reason in one["gate"]["reasons"]), one["gate"]
    both = audit(root, tmp_path / "both", "--waive", f"AUD210:{subject}", "--reason", "lag",
                 "--waive", f"AUD118:{subject}", "--reason", "checked by hand")
    assert both["gate"]["passed"] is True


def test_what_the_schedulers_end_left_missing_is_no_reason_of_its_own(tmp_path: Path) -> None:
    """A node failure (sacct's NODE_FAIL) leaves no trial record and no idle check behind:
    those absences are the failure's consequence, so waiving the failure's rule for the
    period is enough (the period's other reasons are its own causes, not these)."""
    root = outcome_study(tmp_path / "study", ["completed", "node_failure"])
    subject = "host-qwen25-7b-gsm8k-c2-s162/period-1"
    summary = audit(root, tmp_path / "out", "--waive", f"AUD208:{subject}", "--reason",
                    "node replaced")
    assert summary["gate"]["passed"] is True, summary["gate"]
