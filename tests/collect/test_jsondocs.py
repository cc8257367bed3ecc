"""The JSON document collectors: load_json, period, trial, device and protocol readers.

Every defect fixture under ``fixtures/defects/json/`` is read here; each test
names the handling it proves, and fails when that handling is removed.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from auditor._io import HashingReader
from auditor.collect import jsondoc
from auditor.collect.device import read_device
from auditor.collect.jsondoc import load_json
from auditor.collect.period import identity_from_path, read_period
from auditor.collect.protocol import default_protocol, read_protocol
from auditor.collect.trial import read_trial
from auditor.model import (
    AttemptSpec,
    Configuration,
    EligibleFailure,
    EvidenceEntry,
    Finding,
    IdleCheck,
    ProcessExit,
    Protocol,
    Worker,
)
from tests.test_schemas import DEVICE, PERIOD, PROTOCOL, SHA, TRIAL

DEFECTS = Path(__file__).resolve().parents[2] / "fixtures" / "defects" / "json"
PERIOD_PATH = "pairs/host-qwen25-7b-gsm8k-c2-s161/period-2.json"


def reader(data: bytes) -> HashingReader:
    return HashingReader(io.BytesIO(data))


def fixture(name: str) -> bytes:
    return (DEFECTS / name).read_bytes()


def rules(findings: tuple[Finding, ...] | list[Finding]) -> list[str]:
    return [f.rule_id for f in findings]


def messages(findings: tuple[Finding, ...] | list[Finding]) -> list[str]:
    return [f.message for f in findings]


def as_bytes(doc: Any) -> bytes:
    return orjson.dumps(doc)


# ------------------------------------------------------------------ load_json


def test_load_json_valid_object() -> None:
    doc, findings = load_json(reader(b'{"a": [1, {"b": null}]}'), "x.json")
    assert doc == {"a": [1, {"b": None}]}
    assert findings == []


def test_empty_file_is_aud010() -> None:
    doc, findings = load_json(reader(fixture("empty.json")), "x.json")
    assert doc is None
    assert messages(findings) == ["x.json: file is empty"]
    assert rules(findings) == ["AUD010"]


def test_too_large_is_aud012_and_still_hashed() -> None:
    data = b'{"a": "' + b"x" * 5000 + b'"}'
    stream = reader(data)
    doc, findings = load_json(stream, "x.json", limit=1000, kind="trial record")
    assert doc is None
    assert messages(findings) == [
        f"x.json: {len(data)} bytes exceeds the 1000-byte limit for trial record"
    ]
    assert stream.digest().sha256 == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("nan_value.json", "unexpected character, expected a JSON value: line 1 column 112"),
        ("infinity_value.json", "unexpected character, expected a JSON value"),
        ("period_not_json.json", "unexpected end of data"),
        ("invalid_utf8.json", "not valid UTF-8"),
        ("bom.json", "byte order mark"),
        ("trailing_data.json", "unexpected content after document"),
    ],
)
def test_not_strict_json_is_aud001(name: str, error: str) -> None:
    doc, findings = load_json(reader(fixture(name)), name)
    assert doc is None
    (only,) = findings
    assert only.rule_id == "AUD001"
    assert only.message.startswith(f"{name}: not valid JSON: ")
    assert error in only.message
    assert only.citations[0].line == 1


def test_nan_is_cited_with_a_quote() -> None:
    _, (finding,) = load_json(reader(fixture("nan_value.json")), "n.json")
    assert "NaN" in finding.citations[0].quote


def test_100k_deep_nesting_is_a_finding_not_a_crash(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_bytes(b'{"a":' * 100_000 + b"1" + b"}" * 100_000)
    with deep.open("rb") as handle:
        doc, findings = load_json(HashingReader(handle), "deep.json")
    assert doc is None
    assert rules(findings) == ["AUD001"]
    assert "depth limit exceeded" in findings[0].message
    arrays = b"[" * 100_000 + b"]" * 100_000
    doc, findings = load_json(reader(arrays), "deep.json")
    assert doc is None and rules(findings) == ["AUD001"]


def test_deep_nesting_orjson_accepts_is_checked_by_counting_keys() -> None:
    # Deep enough for a recursive (stdlib) duplicate-key pass to hit the recursion limit:
    # the key count settles it without recursion.
    data = b'{"a":' * 1020 + b"1" + b"}" * 1020
    doc, findings = load_json(reader(data), "d.json")
    assert doc is not None and findings == []
    repeated = b'{"a":' * 1019 + b'{"b":1,"b":2}' + b"}" * 1019
    doc, findings = load_json(reader(repeated), "d.json")
    assert doc is None
    assert messages(findings) == ["d.json: not valid JSON: nesting too deep to check for "
                                  "duplicate keys"]


def test_an_evidence_document_nested_past_pythons_recursion_limit_is_a_finding(
        tmp_path: Path) -> None:
    """orjson parses 1,024 levels, more than Python's recursion limit: the schema check
    of a period record so nested raised RecursionError out of the audit (exit 3), both
    where the document is valid (an extra key) and where it is not (a field's value)."""
    from auditor import AuditOptions, run_audit
    from tests.helpers import copy_example

    root = copy_example(tmp_path)
    deep = b"[" * 1000 + b"]" * 1000
    extra, wrong = sorted(root.glob("pairs/*/period-1.json"))[:2]
    text = extra.read_bytes().rstrip()
    extra.write_bytes(text[:-1] + b', "extra": ' + deep + b"}\n")
    wrong.write_bytes(re.sub(rb'"pair": "[^"]*"', b'"pair": ' + deep, wrong.read_bytes(),
                             count=1))
    result = run_audit(str(root), AuditOptions(jobs=1))
    said = [f.message for f in result.findings if f.rule_id == "AUD002"]
    assert any(str(wrong.relative_to(root)) in m and "nested too deep to check" in m
               for m in said), said


def test_list_where_an_object_belongs_is_aud002_at_the_root() -> None:
    doc, findings = load_json(reader(fixture("list_not_object.json")), "l.json")
    assert doc is None
    assert messages(findings) == ["l.json#: expected an object, found array"]
    assert findings[0].citations[0].pointer == ""


def test_duplicate_keys_are_ambiguous_aud001() -> None:
    doc, findings = load_json(reader(fixture("duplicate_keys.json")), "t.json")
    assert doc is None
    assert messages(findings) == [
        't.json: not valid JSON: duplicate key "exit_code" in the object at #/invocation; '
        "which value counts is ambiguous"
    ]
    assert findings[0].citations[0].pointer == "/invocation"


def test_duplicate_keys_found_at_every_depth() -> None:
    data = b'{"x": [{"k": 1}, {"k": 2, "k": 3}], "y": {"z": {"a/b": 1, "a/b": 2}}}'
    _, findings = load_json(reader(data), "t.json")
    assert messages(findings) == [
        't.json: not valid JSON: duplicate key "k" in the object at #/x/1 (and 1 more); '
        "which value counts is ambiguous"
    ]
    assert rules(load_json(reader(b'{"a": 1, "b": {"a": 1}}'), "t")[1]) == []


def test_whole_stream_is_hashed_whatever_happens() -> None:
    for data in (b"", b"[1]", b"{not json", b'{"a": 1}', b'{"a": 1, "a": 2}'):
        stream = reader(data)
        load_json(stream, "x.json")
        assert stream.digest().sha256 == hashlib.sha256(data).hexdigest()
        assert stream.digest().size == len(data)


def test_load_json_never_raises_on_random_bytes() -> None:
    import random

    generator = random.Random(1)
    alphabet = b'{}[]",:0123456789.eE-+ truefalsnl\\u\xff\x00\n'
    for _ in range(2000):
        data = bytes(generator.choice(alphabet) for _ in range(generator.randint(0, 40)))
        doc, findings = load_json(reader(data), "r.json")
        assert (doc is None) == bool(findings)


def test_typed_getters_reject_bool_and_float_as_int() -> None:
    assert jsondoc.as_int(True) is None
    assert jsondoc.as_int(1.0) is None
    assert jsondoc.as_int(7) == 7
    assert jsondoc.as_job_id(5055845) == "5055845"
    assert jsondoc.as_job_id(True) is None
    assert jsondoc.as_text(1) == "1"
    assert jsondoc.as_text(["console"]) == '["console"]'
    assert jsondoc.as_text("raw") == "raw"


# --------------------------------------------------------------------- period


def test_read_period_single_attempt_form() -> None:
    data = as_bytes(PERIOD)
    record = read_period(reader(data), PERIOD_PATH)
    assert record.readable
    assert record.findings == ()
    assert (record.pair, record.period, record.gpus, record.seed) == (
        "host-qwen25-7b-gsm8k-c2-s161", 2, 4, 161)
    assert (record.study, record.workload, record.model) == (
        "estimation_host_capacity", "gsm8k", "qwen25-7b")
    assert (record.array_job_id, record.array_task_id) == ("5055845", 8)
    assert record.commit == "120e29a146294722a6668f55a1e7fed2878eb62a"
    assert record.attempts == (
        AttemptSpec(
            index=0,
            job_id="5055845",
            attempt_dir="host-qwen25-7b-gsm8k-c2-s161-4gpu/attempt-5055845",
            workers=(Worker("actor_rollout", 0, 3657525, "/workers/0"),),
            evidence=(
                EvidenceEntry("trial-5055845.json", "trial", SHA, 1834, "/evidence/0"),
                EvidenceEntry("training-5055845.log", "training_log", SHA, 90211, "/evidence/1"),
            ),
            pointer="",
            array_task_id=8,  # (the one attempt's element is the period's)
        ),
    )
    assert record.idle_check == IdleCheck(True, 1789500000000000000, (0, 0, 0, 0), 0)
    assert record.digest is not None
    assert record.digest.sha256 == hashlib.sha256(data).hexdigest()


def test_read_period_multi_attempt_form() -> None:
    record = read_period(reader(fixture("period_multi_attempt.json")),
                         PERIOD_PATH.replace("period-2", "period-1"))
    assert record.findings == ()
    assert [(a.index, a.job_id, a.pointer) for a in record.attempts] == [
        (0, "5055850", "/attempts/0"),
        (1, "5055845", "/attempts/1"),
    ]
    second = record.attempts[1]
    assert [w.pointer for w in second.workers] == ["/attempts/1/workers/0",
                                                   "/attempts/1/workers/1"]
    assert [(w.rank, w.pid) for w in second.workers] == [(0, 2001), (1, 2002)]
    assert [e.pointer for e in second.evidence] == ["/attempts/1/evidence/0",
                                                    "/attempts/1/evidence/1"]
    # hex digests are compared case-insensitively: normalised to lower case
    assert record.attempts[0].evidence[0].sha256 == "a" * 64


def test_attempts_wins_over_single_attempt_fields() -> None:
    doc = copy.deepcopy(PERIOD)
    doc["attempts"] = [{"job_id": "9", "attempt_dir": "d/attempt-9", "workers": [],
                        "evidence": []}]
    record = read_period(reader(as_bytes(doc)), PERIOD_PATH)
    assert [a.job_id for a in record.attempts] == ["9"]


@pytest.mark.parametrize(
    ("name", "cause"),
    [
        ("period_not_json.json", "AUD001"),
        ("empty.json", "AUD010"),
        ("list_not_object.json", "AUD002"),
        ("duplicate_keys.json", "AUD001"),
        ("nan_value.json", "AUD001"),
    ],
)
def test_unreadable_period_keeps_pair_and_period_from_its_path(name: str, cause: str) -> None:
    record = read_period(reader(fixture(name)), PERIOD_PATH)
    assert not record.readable
    assert (record.pair, record.period) == ("host-qwen25-7b-gsm8k-c2-s161", 2)
    assert record.attempts == ()
    assert rules(record.findings) == [cause, "AUD011"]
    assert record.findings[1].message.startswith(f"{PERIOD_PATH}: period record unusable: ")
    assert record.findings[1].message.endswith(f"({cause} {record.findings[0].symbol})")
    assert record.digest is not None


def test_unreadable_period_message() -> None:
    record = read_period(reader(fixture("empty.json")), PERIOD_PATH)
    assert messages(record.findings)[1] == (
        f"{PERIOD_PATH}: period record unusable: file is empty (AUD010 file-empty)"
    )


@pytest.mark.parametrize(
    ("path", "identity"),
    [
        ("pairs/host-a-s1/period-3.json", ("host-a-s1", 3)),
        ("study/pairs/p/period-12.json", ("p", 12)),
        ("elsewhere/p/period-4.json", ("p", 4)),
        ("odd.json", ("odd", 0)),
    ],
)
def test_identity_from_path(path: str, identity: tuple[str, int]) -> None:
    assert identity_from_path(path) == identity


def test_readable_period_missing_pair_falls_back_to_path() -> None:
    doc = {k: v for k, v in PERIOD.items() if k not in ("pair", "period")}
    record = read_period(reader(as_bytes(doc)), PERIOD_PATH)
    assert record.readable
    assert (record.pair, record.period) == ("host-qwen25-7b-gsm8k-c2-s161", 2)
    assert [f.citations[0].pointer for f in record.findings] == ["/pair", "/period"]


def test_period_integer_job_id_is_flagged_and_read_as_digits() -> None:
    doc = {**PERIOD, "job_id": 5055845, "array_job_id": 5055845}
    record = read_period(reader(as_bytes(doc)), PERIOD_PATH)
    assert record.attempts[0].job_id == "5055845"
    assert record.array_job_id == "5055845"
    assert messages(record.findings) == [
        f"{PERIOD_PATH}#/array_job_id: expected string, found integer 5055845",
        f"{PERIOD_PATH}#/job_id: expected string, found integer 5055845",
    ]


def test_period_wrong_types_read_as_none_with_findings() -> None:
    doc = copy.deepcopy(PERIOD)
    doc["gpus"] = "4"
    doc["workers"][0]["pid"] = True
    doc["evidence"][0]["size"] = 1.5
    doc["idle_check"]["passed"] = "yes"
    record = read_period(reader(as_bytes(doc)), PERIOD_PATH)
    assert record.gpus is None
    assert record.attempts[0].workers[0].pid is None
    assert record.attempts[0].evidence[0].size is None
    assert record.idle_check is not None and record.idle_check.passed is None
    assert [f.citations[0].pointer for f in record.findings] == [
        "/evidence/0/size", "/gpus", "/idle_check/passed", "/workers/0/pid"]


def test_evidence_entry_without_path_is_skipped_and_flagged() -> None:
    doc = copy.deepcopy(PERIOD)
    del doc["evidence"][0]["path"]
    record = read_period(reader(as_bytes(doc)), PERIOD_PATH)
    assert [e.path for e in record.attempts[0].evidence] == ["training-5055845.log"]
    assert messages(record.findings) == [f"{PERIOD_PATH}#/evidence/0/path: required field missing"]


def test_period_unknown_fields_are_kept_quietly() -> None:
    doc = {**PERIOD, "launcher": {"version": 3}, "notes": None}
    assert read_period(reader(as_bytes(doc)), PERIOD_PATH).findings == ()


def test_period_absent_idle_check_is_none() -> None:
    doc = {k: v for k, v in PERIOD.items() if k != "idle_check"}
    record = read_period(reader(as_bytes(doc)), PERIOD_PATH)
    assert record.idle_check is None
    assert record.findings == ()


# ---------------------------------------------------------------------- trial


def test_read_trial_valid() -> None:
    record = read_trial(reader(as_bytes(TRIAL)), "a/trial-5055845.json")
    assert record.findings == ()
    assert (record.job_id, record.pair, record.period, record.gpus, record.attempt) == (
        "5055845", "host-qwen25-7b-gsm8k-c2-s161", 2, 4, 1)
    assert record.dispatch_value("TOTAL_TRAINING_STEPS") == "1"
    assert record.dispatch_value("TRAINER_LOGGER") == '["console"]'
    assert record.env_value("COSMOS_SHUTDOWN_ON_NO_POLICY_REPLICAS") == "1"
    assert (record.started_ns, record.finished_ns) == (1789499800000000000, 1789500424665561977)
    assert (record.exit_code, record.received_signal) == (0, None)
    assert record.processes == (ProcessExit("driver", 3657400, 0, "/processes/0"),)
    assert record.status == "infrastructure_invalid"
    assert record.validation_error is not None
    assert record.peak_mib == 38560


def test_trial_dispatch_values_are_stringified_in_file_order() -> None:
    doc = {**TRIAL, "dispatch": {"B": 1, "A": "x", "C": True, "D": None, "E": [1, "a"],
                                 "F": {"k": 1.5}}}
    record = read_trial(reader(as_bytes(doc)), "t.json")
    assert record.dispatch == (("B", "1"), ("A", "x"), ("C", "true"), ("D", "null"),
                               ("E", '[1,"a"]'), ("F", '{"k":1.5}'))
    assert record.findings == ()


def test_trial_wrong_type_exit_code() -> None:
    record = read_trial(reader(fixture("wrong_type_exit_code.json")), "t.json")
    assert record.exit_code is None
    assert messages(record.findings) == [
        't.json#/invocation/exit_code: expected integer or null, found string "0"'
    ]
    assert record.findings[0].citations[0].pointer == "/invocation/exit_code"


def test_trial_received_signal_of_wrong_type_still_counts_as_a_signal() -> None:
    record = read_trial(reader(fixture("received_signal_int.json")), "t.json")
    assert record.received_signal == "15"
    assert rules(record.findings) == ["AUD002"]


def test_trial_process_bool_pid_is_none() -> None:
    doc = copy.deepcopy(TRIAL)
    doc["processes"][0]["pid"] = True
    record = read_trial(reader(as_bytes(doc)), "t.json")
    assert record.processes[0].pid is None
    assert messages(record.findings) == ["t.json#/processes/0/pid: expected integer, found "
                                         "boolean true"]


def test_trial_with_duplicate_keys_is_not_used() -> None:
    record = read_trial(reader(fixture("duplicate_keys.json")), "t.json")
    assert record.exit_code is None and record.job_id is None
    assert rules(record.findings) == ["AUD001"]


def test_trial_integer_job_id() -> None:
    record = read_trial(reader(as_bytes({**TRIAL, "job_id": 5055845})), "t.json")
    assert record.job_id == "5055845"
    assert rules(record.findings) == ["AUD002"]


def test_trial_unknown_fields_accepted() -> None:
    doc = {**TRIAL, "host": "n1", "invocation": {**TRIAL["invocation"], "argv": ["a"]}}
    assert read_trial(reader(as_bytes(doc)), "t.json").findings == ()


# --------------------------------------------------------------------- device


def test_read_device_valid() -> None:
    record = read_device(reader(as_bytes(DEVICE)), "d.json")
    assert record.findings == ()
    assert (record.role, record.rank, record.pid, record.job_id) == (
        "actor_rollout", 0, 3657525, "5055845")
    assert (record.hostname, record.cuda_visible_devices, record.local_device) == (
        "gpu-node-17", "0,1,2,3", 0)
    assert (record.gpu_uuid, record.gpu_name, record.gpu_pci_bus_id,
            record.memory_total_mib) == ("GPU-5f3c", "NVIDIA A100-SXM4-40GB",
                                         "00000000:07:00.0", 40960)
    assert (record.peak_allocated_mib, record.peak_reserved_mib, record.captured_ns) == (
        36211, 38560, 1789500424000000000)


def test_device_bool_pid_is_rejected() -> None:
    record = read_device(reader(fixture("pid_bool.json")), "d.json")
    assert record.pid is None
    assert messages(record.findings) == ["d.json#/pid: expected integer, found boolean true"]


def test_device_integer_job_id() -> None:
    record = read_device(reader(fixture("job_id_int.json")), "d.json")
    assert record.job_id == "5055845"
    assert messages(record.findings) == ["d.json#/job_id: expected string, found integer "
                                         "5055845"]


def test_device_missing_gpu_uuid() -> None:
    doc = copy.deepcopy(DEVICE)
    del doc["gpu"]["uuid"]
    record = read_device(reader(as_bytes(doc)), "d.json")
    assert record.gpu_uuid is None
    assert messages(record.findings) == ["d.json#/gpu/uuid: required field missing"]


def test_device_not_json() -> None:
    record = read_device(reader(fixture("nan_value.json")), "d.json")
    assert record.pid is None and rules(record.findings) == ["AUD001"]


# ------------------------------------------------------------------- protocol


def test_read_protocol_contract_example() -> None:
    data = as_bytes({**PROTOCOL, "terminal_event": {
        "steps_from": "STEPS", "pattern": r"step:(?P<step>\d+) - training/global_step:(?P=step)"}})
    protocol = read_protocol(reader(data), "protocol.json")
    assert protocol.findings == ()
    assert protocol.path == "protocol.json"
    assert protocol.name == "host-capacity"
    assert protocol.steps_from == "STEPS"
    assert protocol.terminal_pattern is not None
    assert re.search(protocol.terminal_pattern, "step:1 - training/global_step:1")
    assert protocol.completion_phases == ("actor_update", "weight_sync")
    assert protocol.eligible_failures == (
        EligibleFailure("rollout_init", ("torch.OutOfMemoryError", "torch.cuda.OutOfMemoryError")),
    )
    assert protocol.configurations == (Configuration("gsm8k", 2, (161, 162, 163)),)
    assert protocol.anchors == (("protocol", SHA), ("freeze", SHA), ("prediction_seal", SHA))
    assert protocol.digest is not None
    assert protocol.digest.sha256 == hashlib.sha256(data).hexdigest()


def test_missing_protocol_keys_take_defaults() -> None:
    protocol = read_protocol(reader(b"{}"), "protocol.json")
    defaults = default_protocol()
    assert protocol.findings == ()
    for name in ("name", "steps_from", "terminal_pattern", "completion_phases",
                 "eligible_failures", "coordinated_shutdown_flag", "configurations", "anchors"):
        assert getattr(protocol, name) == getattr(defaults, name), name


def test_default_protocol() -> None:
    protocol = default_protocol()
    assert protocol == Protocol(path=None)
    assert protocol.coordinated_shutdown_flag == "COSMOS_SHUTDOWN_ON_NO_POLICY_REPLICAS"
    assert protocol.findings == ()


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("protocol_pattern_no_step_group.json", "has no named group 'step'"),
        ("protocol_pattern_invalid_regex.json", "does not compile: missing )"),
    ],
)
def test_unusable_terminal_pattern_is_aud014(name: str, problem: str) -> None:
    protocol = read_protocol(reader(fixture(name)), "protocol.json")
    assert protocol.terminal_pattern is None
    (only,) = protocol.findings
    assert only.rule_id == "AUD014"
    assert problem in only.message
    assert only.message.endswith("; the built-in matcher applies")
    assert only.citations[0].pointer == "/terminal_event/pattern"


def test_pathological_pattern_is_a_finding_not_a_crash() -> None:
    data = as_bytes({"terminal_event": {"pattern": "(" * 10_000 + ")" * 10_000}})
    protocol = read_protocol(reader(data), "protocol.json")
    assert protocol.terminal_pattern is None
    assert rules(protocol.findings) == ["AUD014"]


def test_protocol_invalid_keys_fall_back_one_by_one() -> None:
    protocol = read_protocol(reader(fixture("protocol_wrong_types.json")), "protocol.json")
    defaults = default_protocol()
    assert protocol.completion_phases == defaults.completion_phases
    assert protocol.eligible_failures == defaults.eligible_failures
    # valid keys beside them are still read
    assert protocol.name == "host-capacity"
    assert protocol.configurations == (Configuration("gsm8k", 2, (161, 162, 163)),)
    assert messages(protocol.findings) == [
        'protocol.json#/completion_phases: expected array or object, found string "actor_update"',
        "protocol.json#/eligible_failures/0/error_types/1: expected string, found integer 7",
        "protocol.json: invalid completion_phases, eligible_failures: built-in defaults apply "
        "there",
    ]


def test_protocol_nested_problem_keeps_sibling() -> None:
    data = as_bytes({"terminal_event": {"steps_from": 3, "pattern": r"step:(?P<step>\d+)"}})
    protocol = read_protocol(reader(data), "protocol.json")
    assert protocol.steps_from == "TOTAL_TRAINING_STEPS"
    assert protocol.terminal_pattern == r"step:(?P<step>\d+)"
    assert rules(protocol.findings) == ["AUD002", "AUD014"]


def test_protocol_empty_completion_phases_is_refused() -> None:
    protocol = read_protocol(reader(b'{"completion_phases": []}'), "protocol.json")
    assert protocol.completion_phases == ("actor_update", "weight_sync")
    assert rules(protocol.findings) == ["AUD002", "AUD014"]


@pytest.mark.parametrize("name", ["empty.json", "nan_value.json", "list_not_object.json"])
def test_unreadable_protocol_gives_defaults_and_aud014(name: str) -> None:
    protocol = read_protocol(reader(fixture(name)), "protocol.json")
    assert protocol.path == "protocol.json"
    assert protocol.completion_phases == default_protocol().completion_phases
    assert rules(protocol.findings)[-1] == "AUD014"
    assert protocol.findings[-1].message.endswith("; built-in defaults apply")
    assert len(protocol.findings) == 2


# ------------------------------------------------------------- every reader


READERS: list[tuple[str, Callable[[HashingReader, str], Any]]] = [
    ("period", read_period),
    ("trial", read_trial),
    ("device", read_device),
    ("protocol", read_protocol),
]


@pytest.mark.parametrize(("kind", "read"), READERS)
@pytest.mark.parametrize("name", sorted(p.name for p in DEFECTS.glob("*.json")))
def test_every_reader_survives_every_defect(
    kind: str, read: Callable[[HashingReader, str], Any], name: str
) -> None:
    data = fixture(name)
    stream = reader(data)
    record = read(stream, PERIOD_PATH)
    assert isinstance(record.findings, tuple)
    assert stream.digest().sha256 == hashlib.sha256(data).hexdigest()


def test_period_record_disagreeing_with_its_path() -> None:
    import io

    import orjson

    from auditor._io import HashingReader
    from auditor.collect.period import read_period

    doc = {"schema": "run-evidence/period/v1", "pair": "other-pair", "period": 3, "gpus": 4,
           "job_id": "1", "attempt_dir": "x/attempt-1", "workers": [], "evidence": []}
    record = read_period(HashingReader(io.BytesIO(orjson.dumps(doc))),
                         "pairs/real-pair/period-1.json")
    flagged = sorted(f.message for f in record.findings if f.rule_id == "AUD015")
    assert flagged == [
        "pairs/real-pair/period-1.json: pair is other-pair inside, real-pair in the path",
        "pairs/real-pair/period-1.json: period is 3 inside, 1 in the path",
    ]
    assert record.subject == "real-pair/period-1"  # (the period its path names)


class _Obj(tuple[Any, ...]):
    """A JSON object as its (key, value) pairs, repeats kept."""


_KEYS = st.text(alphabet='ab:"\\é', max_size=3)
_OBJECTS = st.deferred(lambda: st.lists(st.tuples(_KEYS, _VALUES), max_size=4).map(_Obj))
_VALUES: st.SearchStrategy[Any] = st.one_of(st.integers(), st.booleans(), st.none(), _KEYS,
                    st.lists(st.deferred(lambda: _VALUES), max_size=3), _OBJECTS)


def _text(node: Any, escape: bool, colon: str = ": ") -> str:
    """JSON text of a tree of :class:`_Obj`; ``escape`` writes each colon in strings as
    ``\\u003a``; ``colon`` is what separates a key from its value (spaces included)."""
    if isinstance(node, _Obj):
        return "{" + ",".join(f"{_text(k, escape, colon)}{colon}{_text(v, escape, colon)}"
                              for k, v in node) + "}"
    if isinstance(node, list):
        return "[" + ",".join(_text(item, escape, colon) for item in node) + "]"
    if isinstance(node, str):
        text = json.dumps(node, ensure_ascii=False)
        return text.replace(":", "\\u003a") if escape else text
    return json.dumps(node)


@given(_OBJECTS, st.booleans(), st.sampled_from([":", ": ", " :", " \t:\n "]))
@example(_Obj([("a", 1), ("a", 2)]), False, " :")
@example(_Obj([("a:", 1), ("a:", 2)]), False, ":")
@example(_Obj([("x", _Obj([("k", "v:w"), ("k", "")]))]), True, ":")
def test_duplicate_keys_are_found_exactly(tree: _Obj, escape: bool, colon: str) -> None:
    data = _text(tree, escape, colon).encode()
    repeated = False

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal repeated
        repeated |= len({k for k, _ in pairs}) < len(pairs)
        return dict(pairs)

    json.loads(data, object_pairs_hook=hook)
    doc, findings = load_json(reader(data), "t.json")
    assert (doc is None) == repeated
    assert all("duplicate key" in m for m in messages(findings))


@pytest.mark.parametrize(("text", "repeated"), [
    (b'{"a" :1,"a":2}', True), (b'{"a":1,\n "a"\t: 2}', True), (b'{"a":{"b" :1,"b":2}}', True),
    (b'{"k":"x:y","k" :"z"}', True), (b'{"a:":1,"a:" :2}', True), (b'{"a" :1,"b":2}', False),
    (b'{"a:b" : "c:d", "e":[{"f" :"g"}]}', False), (b'{"\\u0061":1,"a":2}', True),
    (b'{"k":"x\\"y:","k":1}', True), (b'{"k":"x\\"y:","j":"\\\\:"}', False),
    (b'{"k\\u003a":1,"k:":2}', True), (b'{"k":"\\u003a","j":1}', False),
    (b'{"a":1,"a":2,"b":"\\u003a"}', True),  # (colons as many as written back)
])
def test_duplicate_keys_whatever_the_spacing(text: bytes, repeated: bool) -> None:
    doc, findings = load_json(reader(text), "t.json")
    assert (doc is None) == repeated
    assert all("duplicate key" in m for m in messages(findings))


def test_repeated_short_names_are_kept_once() -> None:
    """A study repeats role, host and GPU names in thousands of records: one copy each."""
    first = read_device(reader(as_bytes(DEVICE)), "a/device-evidence/worker-x-0-1.json")
    second = read_device(reader(as_bytes(DEVICE)), "b/device-evidence/worker-x-0-2.json")
    assert first.role == "actor_rollout" and first.role is second.role
    assert first.hostname is second.hostname and first.gpu_name is second.gpu_name
