"""The rule catalogue as data: unique ids, consistent policy (``blocks``, ``gate``,
``family``), and findings that carry the values their message was rendered from."""

from __future__ import annotations

import re
import string
from dataclasses import replace

import pytest

from auditor import rules
from auditor.model import Citation, Reason, Severity
from auditor.rules import BY_SYMBOL, RULES, GatePolicy, describe, finding, in_family

FAMILIES = ("identity", "job_ids", "timeline")
ALL = rules._RULES  # (the tuple the dicts are built from: a duplicate id would vanish)


def test_every_rule_id_and_symbol_is_unique_and_well_formed() -> None:
    ids = [rule.rule_id for rule in ALL]
    symbols = [rule.symbol for rule in ALL]
    assert len(set(ids)) == len(ids) == len(RULES)
    assert len(set(symbols)) == len(symbols) == len(BY_SYMBOL)
    assert all(re.fullmatch(r"AUD[0-2]\d\d", rule_id) for rule_id in ids)
    assert all(re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", symbol) for symbol in symbols)


def test_the_stage_is_the_ids_hundreds() -> None:
    assert {RULES["AUD001"].stage, RULES["AUD123"].stage, RULES["AUD217"].stage} == {
        "collect", "validate", "reason"}
    for rule in ALL:
        assert rule.stage == ("collect", "validate", "reason")[int(rule.rule_id[3])]


def test_the_policy_fields_have_their_types() -> None:
    for rule in ALL:
        assert rule.blocks is None or isinstance(rule.blocks, Reason), rule.rule_id
        assert rule.gate is None or isinstance(rule.gate, GatePolicy), rule.rule_id
        assert rule.family is None or rule.family in FAMILIES, rule.rule_id
        assert isinstance(rule.severity, Severity)


def test_only_errors_block_or_gate() -> None:
    """A warning or an info finding never blocks a verdict nor fails the gate by itself."""
    for rule in ALL:
        if rule.blocks is not None or rule.gate is not None:
            assert rule.severity is Severity.ERROR, rule.rule_id


def test_every_gate_policy_renders_and_integrity_comes_first() -> None:
    """Each text fills from ``subject`` and ``message`` alone; every integrity policy's
    order is below every other's (the gate lists them before the configurations')."""
    policies = [rule.gate for rule in ALL if rule.gate is not None] + [rules.FROZEN_GATE]
    for policy in policies:
        fields = {name for _, name, _, _ in string.Formatter().parse(policy.text) if name}
        assert fields <= {"subject", "message"}, policy
        assert policy.text.format(subject="S", message="M")
    integrity = [p.order for p in policies if p.integrity]
    others = [p.order for p in policies if not p.integrity]
    assert integrity and others and max(integrity) < min(others)


def test_each_family_is_counted_by_its_rules() -> None:
    assert {rule.family for rule in ALL} - {None} == set(FAMILIES)
    assert in_family("identity") == ("AUD110", "AUD113", "AUD114")
    assert in_family("job_ids") == ("AUD111", "AUD119")
    assert in_family("timeline") == ("AUD115", "AUD116", "AUD117")
    assert in_family("nothing") == ()


def test_every_validation_error_blocks_or_gates() -> None:
    """An ``AUD1xx`` error changes a verdict or the gate; the one exception is
    ``AUD122`` (a ``--source`` file that cannot be read: provenance, not evidence)."""
    inert = sorted(rule.rule_id for rule in ALL
                   if rule.stage == "validate" and rule.severity is Severity.ERROR
                   and rule.blocks is None and rule.gate is None)
    assert inert == ["AUD122"]


def test_every_verdict_reason_but_the_engines_own_is_some_rules() -> None:
    """The reasons no rule blocks with are the ones the engine decides itself."""
    blocked = {rule.blocks for rule in ALL if rule.blocks is not None}
    assert set(Reason) - blocked == {Reason.COMPLETED, Reason.ELIGIBLE_FAILURE,
                                     Reason.KILLED, Reason.PERIOD_RECORD_UNREADABLE}


def test_a_cross_check_in_a_family_blocks() -> None:
    """A family rule that is an error blocks its period (else the report would count a
    disagreement the verdict ignores)."""
    for rule in ALL:
        if rule.family is not None and rule.severity is Severity.ERROR:
            assert rule.blocks is not None, rule.rule_id


def test_every_template_field_is_a_plain_name() -> None:
    """``str.format`` fields only (no attribute or index access: never evaluated code)."""
    for rule in ALL:
        for _, name, _, _ in string.Formatter().parse(rule.template):
            if name is not None:
                assert re.fullmatch(r"[a-z_]+", name), (rule.rule_id, name)


# ------------------------------------------------------------- findings and values


def test_a_finding_carries_the_values_it_was_rendered_from() -> None:
    item = finding("AUD007", "t.log", [Citation("a/t.log", line=7)], length=900, limit=64)
    assert item.message == "a/t.log:7: line of 900 bytes clipped to 64"
    assert item.values == (("path", "a/t.log"), ("line", 7), ("length", 900), ("limit", 64))
    assert (item.value("length"), item.value("path"), item.value("line")) == (900, "a/t.log", 7)
    assert item.value("subject") is None  # (a field of the finding's own, not a value)
    assert item.value("absent") is None and item.value("absent", 3) == 3
    assert (item.rule_id, item.symbol, item.severity) == ("AUD007", "line-clipped",
                                                          Severity.WARNING)


def test_a_value_given_overrides_the_citations() -> None:
    item = finding("AUD001", "x", [Citation("cited.json")], path="given.json", error="e")
    assert item.message == "given.json: not valid JSON: e"
    assert item.value("path") == "given.json"


def test_a_missing_value_renders_as_a_question_mark() -> None:
    item = finding("AUD102", "f", [Citation("f")])
    assert item.message == "f: ? differs from ? (expected ?, found ?)"


def test_no_message_prints_none_whatever_value_is_missing() -> None:
    """Every rule's template and each of its forms, every field given as None (a reader
    that found no value): the message and the report's description say ``?``, never
    Python's ``None`` (issue 43 item 5's sweep)."""
    for rule in ALL:
        for form in (None, *rule.forms):
            template = rule.template_of(form)
            values: dict[str, object] = {
                name: None for _, name, _, _ in string.Formatter().parse(template)
                if name and name not in ("subject",)}
            if form:
                values["form"] = form
            item = finding(rule.rule_id, "subject", (), **values)
            assert "None" not in item.message, (rule.rule_id, form, item.message)
            assert "None" not in describe(item), (rule.rule_id, form)


def test_an_unknown_rule_is_refused() -> None:
    with pytest.raises(KeyError):
        finding("AUD999", "x")


def test_describe_drops_the_leading_path_or_subject() -> None:
    assert describe(finding("AUD001", "p.json", [Citation("p.json")], error="bad")) == \
        "not valid JSON: bad"
    assert describe(finding("AUD201", "pair/period-1", ranks=2, phases="actor_update",
                            step=1)) == ("clean exit; all 2 ranks completed actor_update for "
                                         "step 1; terminal event absent from the training log")
    assert describe(finding("AUD120", "study", name="m", form="not_given")) == \
        "anchor m: no --protocol-input m=PATH was given to check it against"  # (the whole)
    # (a form's own template, not the rule's)
    assert describe(finding("AUD110", "s", form="not_a_worker", file="w.json", pid=7)) == \
        "w.json: pid 7 is not among the period's workers"


def test_describe_renders_from_the_values_not_the_message() -> None:
    """A message is never parsed back: change it, and describe still says the values."""
    item = finding("AUD014", "protocol.json", [Citation("protocol.json")], error="a: b: c")
    assert describe(replace(item, message="something else entirely")) == "a: b: c"
    assert describe(replace(item, values=(("error", "other"),))) == "other"


def test_every_message_is_rendered_from_named_values() -> None:
    """No template or form says ``{detail}``: what a finding found is its named values
    (a pid, a state, a file), never a sentence made beforehand and passed whole."""
    import string

    for rule in ALL:
        for template in (rule.template, *rule.forms.values()):
            names = [name for _, name, _, _ in string.Formatter().parse(template) if name]
            assert "detail" not in names, (rule.rule_id, template)


def test_every_form_a_check_names_is_one_its_rule_has_and_fills() -> None:
    """Each ``finding("AUDnnn", ..., form="x")`` in the package names a form of AUDnnn (a
    typo would otherwise be found only when that defect is first met), and passes every
    value the form's template names but the subject and the first citation's path and line
    (a value left out renders as ``?``)."""
    import ast
    import string
    from pathlib import Path

    package = Path(__file__).resolve().parents[1] / "auditor"
    named = []
    unfilled = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if not (isinstance(node, ast.Call) and node.args
                    and isinstance(node.args[0], ast.Constant)
                    and str(node.args[0].value).startswith("AUD")):
                continue
            given = {keyword.arg for keyword in node.keywords}
            for keyword in node.keywords:
                if keyword.arg == "form" and isinstance(keyword.value, ast.Constant):
                    rule, form = str(node.args[0].value), str(keyword.value.value)
                    named.append((rule, form))
                    if None in given or form not in RULES[rule].forms:
                        continue  # (**values: not known here)
                    fields = {name for _, name, _, _ in
                              string.Formatter().parse(RULES[rule].forms[form]) if name}
                    missing = fields - given - {"subject", "path", "line"}
                    if missing:
                        unfilled.append((path.name, node.lineno, rule, form, sorted(missing)))
    assert len(named) > 20
    assert [(rule, form) for rule, form in named if form not in RULES[rule].forms] == []
    assert unfilled == []


def test_a_samples_finding_without_a_line_names_none() -> None:
    """AUD116's form for memory samples cites the trace, not a line: its message had
    rendered ``PATH:?:`` from a template asking for one."""
    item = finding("AUD116", "a/allocator-1.jsonl", [Citation("a/allocator-1.jsonl")],
                   form="samples")
    assert item.message == "a/allocator-1.jsonl: memory samples outside the invocation window"


def test_a_form_the_rule_lacks_is_refused() -> None:
    with pytest.raises(KeyError, match="AUD110 has no form 'nope'"):
        finding("AUD110", "s", form="nope")
    assert finding("AUD110", "s", form="misnamed", file="x", expected="y").message == \
        "s: x: name is not y"


def test_a_message_opening_with_its_line_says_it_as_one_and_keeps_it_with_its_file() -> None:
    """``{path}:{line}: ...`` described for a sentence naming the file itself was ``9: job
    ...``, a number of nothing (a period record's unreadable cause, a cancellation line
    after a clean exit): it says ``line 9: ...``; located, the line stays with the file."""
    from auditor.rules import located

    log = finding("AUD017", "a/attempt-1/training-1.log",
                  [Citation("a/attempt-1/training-1.log", line=9)])
    assert describe(log) == "line 9: the log ends mid-line (no final newline)"
    assert located(log) == ("a/attempt-1/training-1.log:9",
                            "the log ends mid-line (no final newline)")
    owned = replace(log, subject="pair/period-1")  # (another subject: the line stays said)
    assert located(owned) == ("pair/period-1",
                              "line 9: the log ends mid-line (no final newline)")
    plain = finding("AUD010", "a/attempt-1/allocator-traces/allocator-7.jsonl",
                    [Citation("a/attempt-1/allocator-traces/allocator-7.jsonl")])
    assert describe(plain) == located(plain)[1] == plain.message.split(": ", 1)[1]
