"""Configurations on hand-built model values: which (workload, gpus) cells resolve, what a
missing seed or an unlisted configuration says, and the reservation scope only with the
scheduler's GPUs."""

from __future__ import annotations

from auditor.model import Configuration, VerdictKind
from auditor.reason.configurations import configurations
from auditor.rules import describe
from tests.helpers import CountedInt
from tests.reason.values import (
    cell,
    collected,
    outcome,
    sacct,
    sacct_job,
    verdict,
    with_protocol,
)

PROTOCOL = with_protocol(path="protocol.json", configurations=(
    Configuration("gsm8k", 2, (161, 162)), Configuration("math", 4, (161,))))


def test_a_configuration_resolves_when_every_seed_is_resolved_or_failed() -> None:
    a, b, c = cell("gsm8k", 2, 161, "1"), cell("gsm8k", 2, 162, "2"), cell("math", 4, 161, "3")
    study = collected(a, b, c, protocol=PROTOCOL)
    cells, findings = configurations(study, [verdict(a), verdict(b, VerdictKind.FAILED),
                                             verdict(c, VerdictKind.UNRESOLVED)],
                                     [outcome(a, 10), outcome(b, 20), outcome(c, 5)])
    assert findings == []
    assert [(x.key, x.status, x.outcome, x.seeds) for x in cells] == [
        ("gsm8k@2", "resolved", "mixed", (161, 162)),
        ("math@4", "unresolved", None, (161,)),
    ]
    assert (cells[0].task_gpu_seconds, cells[1].task_gpu_seconds) == (60.0, 20.0)
    assert cells[0].periods == (a.subject, b.subject)


def test_a_missing_seed_and_an_uncovered_configuration_are_aud213() -> None:
    a = cell("gsm8k", 2, 161, "1")
    cells, findings = configurations(collected(a, protocol=PROTOCOL), [verdict(a)],
                                     [outcome(a, 10)])
    assert [(x.key, x.status, x.missing_seeds) for x in cells] == [
        ("gsm8k@2", "unresolved", (162,)), ("math@4", "unresolved", (161,))]
    assert [(f.rule_id, f.subject, describe(f)) for f in findings] == [
        ("AUD213", "gsm8k@2", "no period covers seed(s) 162"),
        ("AUD213", "math@4", "no period covers seed(s) 161"),
    ]


def test_a_configuration_the_protocol_does_not_list_stays_unresolved() -> None:
    a, b, x = cell("gsm8k", 2, 161, "1"), cell("gsm8k", 2, 162, "2"), cell("gsm8k", 8, 161, "3")
    c = cell("math", 4, 161, "4")
    cells, findings = configurations(collected(a, b, c, x, protocol=PROTOCOL),
                                     [verdict(a), verdict(b), verdict(c), verdict(x)], [])
    assert [(f.rule_id, f.subject) for f in findings] == [("AUD217", "gsm8k@8")]
    assert findings[0].citations[0].pointer == "/workload"
    assert [(y.key, y.status) for y in cells] == [("gsm8k@2", "resolved"),
                                                  ("math@4", "resolved"),
                                                  ("gsm8k@8", "unresolved")]


def test_without_a_protocol_file_every_configuration_run_is_expected() -> None:
    a = cell("gsm8k", 8, 161, "1")
    cells, findings = configurations(collected(a), [verdict(a)], [outcome(a, 1)])
    assert findings == [] and [(y.key, y.status) for y in cells] == [("gsm8k@8", "resolved")]


def test_the_reservation_scope_needs_the_schedulers_gpus() -> None:
    a = cell("gsm8k", 2, 161, "1")
    runs = [outcome(a, 10, allocation_gpus=8)]
    without, _ = configurations(collected(a), [verdict(a)], runs)
    assert without[0].reservation_gpu_seconds is None
    dump = sacct(sacct_job(raw="1", gpus=8))
    with_gpus, _ = configurations(collected(a, dump=dump), [verdict(a)], runs)
    assert with_gpus[0].reservation_gpu_seconds == 80.0
    no_tres = sacct(sacct_job(raw="1"), fields=("JobID", "JobIDRaw", "State", "ElapsedRaw"))
    unknown, _ = configurations(collected(a, dump=no_tres), [verdict(a)], runs)
    assert unknown[0].reservation_gpu_seconds is None


def test_a_configuration_of_many_seeds_looks_each_expected_one_up_once() -> None:
    """A configuration of N seeds, each run, the protocol listing them and one more: each
    expected seed is looked up, not compared with every seed run (N²/2 tests: 2 s at the
    18,500 seeds per configuration of a million-file study)."""
    many = 2_000
    ran = [cell("gsm8k", 2, CountedInt(1000 + i), str(i)) for i in range(many)]
    protocol = with_protocol(path="protocol.json", configurations=(
        Configuration("gsm8k", 2, tuple(CountedInt(1000 + i) for i in range(many + 1))),))
    CountedInt.compared = 0
    cells, findings = configurations(collected(*ran, protocol=protocol),
                                     [verdict(one) for one in ran], [])
    assert [(x.key, x.status, len(x.seeds), x.missing_seeds) for x in cells] == [
        ("gsm8k@2", "unresolved", many, (1000 + many,))]
    assert [describe(f) for f in findings] == [f"no period covers seed(s) {1000 + many}"]
    assert CountedInt.compared <= 2 * many, CountedInt.compared
