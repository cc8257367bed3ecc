"""The shipped JSON Schemas: valid draft 2020-12, agree with the contract, explain with pointers."""

from __future__ import annotations

import copy
import json
from importlib import resources
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from auditor import schema
from auditor.model import Finding

SHA = "a" * 64

PERIOD: dict[str, Any] = {
    "schema": "run-evidence/period/v1",
    "study": "estimation_host_capacity",
    "pair": "host-qwen25-7b-gsm8k-c2-s161",
    "workload": "gsm8k", "seed": 161, "model": "qwen25-7b",
    "period": 2, "gpus": 4,
    "array_job_id": "5055845", "array_task_id": 8, "job_id": "5055845",
    "attempt_dir": "host-qwen25-7b-gsm8k-c2-s161-4gpu/attempt-5055845",
    "commit": "120e29a146294722a6668f55a1e7fed2878eb62a",
    "workers": [{"role": "actor_rollout", "rank": 0, "pid": 3657525}],
    "evidence": [
        {"path": "trial-5055845.json", "kind": "trial", "sha256": SHA, "size": 1834},
        {"path": "training-5055845.log", "kind": "training_log", "sha256": SHA, "size": 90211},
    ],
    "idle_check": {"passed": True, "checked_ns": 1789500000000000000,
                   "gpu_memory_used_mib": [0, 0, 0, 0], "gpu_processes": 0},
}

TRIAL: dict[str, Any] = {
    "schema": "run-evidence/trial/v1",
    "job_id": "5055845", "pair": "host-qwen25-7b-gsm8k-c2-s161", "period": 2, "gpus": 4,
    "attempt": 1,
    "dispatch": {"TOTAL_TRAINING_STEPS": "1", "TRAINER_LOGGER": "[\"console\"]"},
    "env": {"COSMOS_SHUTDOWN_ON_NO_POLICY_REPLICAS": "1"},
    "invocation": {"started_ns": 1789499800000000000, "finished_ns": 1789500424665561977,
                   "exit_code": 0, "received_signal": None},
    "processes": [{"role": "driver", "pid": 3657400, "exit_code": 0}],
    "status": "infrastructure_invalid",
    "validation_error": "ValueError: Successful exit lacks the exact one-step terminal event",
    "peak_mib": 38560,
}

PHASE: dict[str, Any] = {
    "pid": 3657525, "rank": 0, "role": "actor_rollout", "seq": 0, "phase": "init_model",
    "step": 0, "started_ns": 1789499900000000000, "finished_ns": 1789499950000000000,
    "error_type": "", "peak_allocated_bytes": 30000000000, "peak_reserved_bytes": 40000000000,
}

SAMPLE: dict[str, Any] = {
    "pid": 3657525, "seq": 1, "sample_ns": 1789499960000000000,
    "allocated_bytes": 31000000000, "reserved_bytes": 41000000000,
}

DEVICE: dict[str, Any] = {
    "schema": "run-evidence/device/v1", "role": "actor_rollout", "rank": 0, "pid": 3657525,
    "job_id": "5055845", "hostname": "gpu-node-17", "cuda_visible_devices": "0,1,2,3",
    "local_device": 0,
    "gpu": {"uuid": "GPU-5f3c", "name": "NVIDIA A100-SXM4-40GB",
            "pci_bus_id": "00000000:07:00.0", "memory_total_mib": 40960},
    "peak_allocated_mib": 36211, "peak_reserved_mib": 38560,
    "captured_ns": 1789500424000000000,
}

PROTOCOL: dict[str, Any] = {
    "schema": "run-evidence/protocol/v1", "name": "host-capacity",
    "terminal_event": {"steps_from": "TOTAL_TRAINING_STEPS"},
    "completion_phases": ["actor_update", "weight_sync"],
    "eligible_failures": [{"phase": "rollout_init",
                           "error_types": ["torch.OutOfMemoryError",
                                           "torch.cuda.OutOfMemoryError"]}],
    "coordinated_shutdown_flag": "COSMOS_SHUTDOWN_ON_NO_POLICY_REPLICAS",
    "configurations": [{"workload": "gsm8k", "gpus": 2, "seeds": [161, 162, 163]}],
    "anchors": {"protocol": SHA, "freeze": SHA, "prediction_seal": SHA},
}

SUMMARY: dict[str, Any] = {
    "schema": "run-evidence/summary/v1",
    "launches": 18,
    "verdicts": {"resolved": 0, "failed": 9, "unresolved": 9},
    "configurations": [{"workload": "gsm8k", "gpus": 2, "status": "resolved",
                        "outcome": "failed", "periods": 3}],
    "configurations_resolved": 3, "configurations_total": 6,
    "periods": [{"pair": "host-qwen25-7b-gsm8k-c2-s161", "period": 2, "gpus": 4,
                 "job_id": "5055845", "verdict": "unresolved",
                 "reason": "terminal_event_missing"}],
    "accounting": {"allocation_gpu_seconds": 20828, "task_gpu_seconds": 17605.783111,
                   "reservation_gpu_seconds": 20199.935106, "wasted_gpu_seconds": 0},
    "integrity": {"files_listed": 162, "verified": 162, "mismatched": 0, "missing": 0,
                  "unlisted": 0, "unsafe_paths": 0},
    "gate": {"passed": False, "included_configurations": ["gsm8k@2"], "reasons": ["..."]},
}

MANIFEST: dict[str, Any] = {
    "schema": "run-evidence/output-manifest/v1",
    "created_utc": "2026-11-30T04:00:00Z",
    "auditor_version": "0.1.0",
    "outputs": [{"path": "summary.json", "sha256": SHA, "size": 10}],
    "raw_evidence": [{"path": "pairs/p/period-1.json", "sha256": SHA, "size": 20}],
    "source_inputs": [],
    "protocol_inputs": [],
}

EXAMPLES: dict[str, list[dict[str, Any]]] = {
    "period": [PERIOD],
    "trial": [TRIAL],
    "allocator-record": [PHASE, SAMPLE, {"kind": "terminal", "pid": 7, "rank": 0, "seq": 9,
                                         "step": 1, "host": "n2", "recorded_ns": 1},
                         {"kind": "params", "pid": 7, "seq": 10, "step": 1, "when": "before",
                          "digest": "0" * 64, "tensors": 2, "sampled_bytes": 512}],
    "device": [DEVICE],
    "process": [{"schema": "run-evidence/process/v1", "role": "policy", "host": "n2", "pid": 42,
                 "rank": 0, "started_ns": 1, "ended_ns": 2, "exit_code": 143,
                 "signal": "SIGTERM", "received_signal": None, "job_id": "7"}],
    "idle-check": [{"schema": "run-evidence/idle-check/v1", "host": "n2", "passed": True,
                    "unavailable": None, "checked_ns": 3},
                   {"host": "n3", "passed": None, "unavailable": "no NVML"}],
    "protocol": [PROTOCOL, {}, {"completion_phases": {"policy": ["actor_update", "weight_sync"],
                                                      "rollout": ["weight_sync"]}}],
    "summary": [SUMMARY],
    "output-manifest": [MANIFEST],
}


def where(findings: list[Finding]) -> list[tuple[str, str]]:
    """(pointer, message tail) of each finding."""
    return [(f.citations[0].pointer or "", f.message.split(": ", 1)[1]) for f in findings]


def test_every_shipped_schema_is_a_kind_and_every_kind_ships() -> None:
    shipped = {
        entry.name.removesuffix(".schema.json")
        for entry in resources.files("auditor").joinpath("schemas").iterdir()
        if entry.name.endswith(".schema.json")
    }
    assert shipped == set(schema.KINDS)
    assert set(EXAMPLES) == set(schema.KINDS)


@pytest.mark.parametrize("kind", schema.KINDS)
def test_schema_is_valid_draft_2020_12(kind: str) -> None:
    text = resources.files("auditor").joinpath("schemas", f"{kind}.schema.json").read_text()
    document = json.loads(text)
    assert document["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(document)
    assert not list(_closed_objects(document)), "schemas must accept unknown fields"


def _closed_objects(node: object, pointer: str = "") -> Any:
    """Pointers of every ``additionalProperties: false`` (or unevaluated...) in a schema."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("additionalProperties", "unevaluatedProperties") and value is False:
                yield pointer
            yield from _closed_objects(value, f"{pointer}/{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _closed_objects(value, f"{pointer}/{index}")


def test_closed_object_detector_works() -> None:
    assert list(_closed_objects({"$defs": {"a": {"additionalProperties": False}}})) == ["/$defs/a"]


@pytest.mark.parametrize("kind", schema.KINDS)
def test_contract_examples_are_valid(kind: str) -> None:
    for example in EXAMPLES[kind]:
        assert schema.validate_document(kind, example, "x.json") == []


@pytest.mark.parametrize("kind", schema.KINDS)
def test_unknown_fields_are_accepted(kind: str) -> None:
    for example in EXAMPLES[kind]:
        extended = {**copy.deepcopy(example), "x_extra": {"anything": [1, None, "x"]}}
        assert schema.validate_document(kind, extended, "x.json") == []


def test_validator_is_cached() -> None:
    assert schema.validator("trial") is schema.validator("trial")


def test_underscore_kind_is_an_alias() -> None:
    assert schema.validator("output_manifest") is schema.validator("output-manifest")
    bad = {**MANIFEST, "outputs": [{"path": "a", "sha256": "nothex", "size": 1}]}
    assert where(schema.validate_document("output_manifest", bad, "m.json")) == [
        ("/outputs/0/sha256", "'nothex' does not match '^[0-9a-f]{64}$'")
    ]


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown schema kind"):
        schema.validator("nope")


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("pairs/host-x/period-2.json", "period"),
        ("period-12.json", "period"),
        ("a/attempt-5055845/trial-5055845.json", "trial"),
        ("allocator-traces/allocator-3657525.jsonl", "allocator-record"),
        ("device-evidence/worker-actor_rollout-0-3657525.json", "device"),
        ("protocol.json", "protocol"),
        ("out/summary.json", "summary"),
        ("out/output_manifest.json", "output-manifest"),
        ("training-5055845.log", None),
        ("period-x.json", None),
        ("allocator-1.json", None),
    ],
)
def test_kind_for_filename(name: str, kind: str | None) -> None:
    assert schema.kind_for_filename(name) == kind


def test_a_boolean_is_not_an_integer() -> None:
    findings = schema.validate_document("device", {**DEVICE, "pid": True}, "d.json")
    assert where(findings) == [("/pid", "expected integer, found boolean true")]
    assert findings[0].rule_id == "AUD002"
    assert findings[0].message == "d.json#/pid: expected integer, found boolean true"


def test_an_integral_float_is_not_an_integer() -> None:
    findings = schema.validate_document("device", {**DEVICE, "rank": 1.0}, "d.json")
    assert where(findings) == [("/rank", "expected integer, found number 1.0")]


def test_missing_field_is_cited_at_its_own_pointer() -> None:
    trial = copy.deepcopy(TRIAL)
    del trial["invocation"]["exit_code"]
    findings = schema.validate_document("trial", trial, "t.json")
    assert where(findings) == [("/invocation/exit_code", "required field missing")]


def test_nullable_fields() -> None:
    trial = copy.deepcopy(TRIAL)
    trial["invocation"]["exit_code"] = None
    trial["invocation"]["received_signal"] = "SIGTERM"
    assert schema.validate_document("trial", trial, "t.json") == []
    trial["invocation"]["received_signal"] = 15
    assert where(schema.validate_document("trial", trial, "t.json")) == [
        ("/invocation/received_signal", "expected string or null, found integer 15")
    ]


def test_job_id_must_be_a_string_of_digits() -> None:
    assert where(schema.validate_document("period", {**PERIOD, "job_id": 5055845}, "p")) == [
        ("/job_id", "expected string, found integer 5055845")
    ]
    assert where(schema.validate_document("period", {**PERIOD, "job_id": "5055845_8"}, "p")) == [
        ("/job_id", "'5055845_8' does not match '^[0-9]+$'")
    ]


def test_period_needs_single_attempt_fields_or_attempts() -> None:
    single = {k: v for k, v in PERIOD.items() if k not in ("workers", "evidence")}
    assert [p for p, _ in where(schema.validate_document("period", single, "p"))] == [
        "/evidence",
        "/workers",
    ]
    retried = {
        k: v for k, v in PERIOD.items() if k not in ("job_id", "attempt_dir", "workers", "evidence")
    }
    retried["attempts"] = [
        {"job_id": "1", "attempt_dir": "a/attempt-1", "workers": [], "evidence": []},
        {"job_id": "2", "attempt_dir": "a/attempt-2", "workers": []},
    ]
    assert where(schema.validate_document("period", retried, "p")) == [
        ("/attempts/1/evidence", "required field missing")
    ]


def test_pointer_escapes_tilde_and_slash() -> None:
    assert schema.pointer_of(("a/b", "c~d", 0)) == "/a~1b/c~0d/0"
    bad = {**PROTOCOL, "anchors": {"in/put~1": "short"}}
    assert [p for p, _ in where(schema.validate_document("protocol", bad, "p.json"))] == [
        "/anchors/in~1put~01"
    ]


def test_document_findings_cite_pointer_and_quote() -> None:
    findings = schema.validate_document("period", {**PERIOD, "gpus": "4"}, "pairs/p/period-2.json")
    (only,) = findings
    assert only.citations[0].locator() == "pairs/p/period-2.json#/gpus"
    assert only.citations[0].quote == '"4"'
    assert only.subject == "pairs/p/period-2.json"


def test_record_findings_cite_the_line() -> None:
    findings = schema.validate_record("allocator-record", {**SAMPLE, "pid": "x"}, "a.jsonl", 7)
    (only,) = findings
    assert only.message == 'a.jsonl:7: /pid: expected integer, found string "x"'
    assert only.citations[0].line == 7
    assert only.citations[0].pointer == "/pid"


def test_allocator_record_forms() -> None:
    checker = schema.validator("allocator-record")
    assert checker.is_valid(PHASE)
    assert checker.is_valid(SAMPLE)
    assert not checker.is_valid({**SAMPLE, "phase": "idle"})  # half a phase record
    assert not checker.is_valid({"pid": 1})
    # Explained against the form the record claims, not as "not valid under any":
    findings = schema.validate_record("allocator-record", {**PHASE, "step": -1}, "a", 3)
    assert [f.message for f in findings] == ["a:3: /step: -1 is less than the minimum of 0"]
    assert where(schema.validate_document("allocator-record", {**PHASE, "step": -1}, "a")) == [
        ("/step", "-1 is less than the minimum of 0")
    ]
    missing = {k: v for k, v in SAMPLE.items() if k != "reserved_bytes"}
    findings = schema.validate_record("allocator-record", missing, "a", 4)
    assert [f.message for f in findings] == ["a:4: /reserved_bytes: required field missing"]


def test_summary_verdict_and_reason_words() -> None:
    bad = copy.deepcopy(SUMMARY)
    bad["periods"][0]["verdict"] = "passed"
    bad["periods"][0]["reason"] = "Terminal event missing"
    assert [p for p, _ in where(schema.validate_document("summary", bad, "s"))] == [
        "/periods/0/reason",
        "/periods/0/verdict",
    ]


def test_non_object_document_is_one_finding_at_the_root() -> None:
    findings = schema.validate_document("trial", ["not", "an", "object"], "t.json")
    assert where(findings) == [("", 'expected object, found array ["not","an","object"]')]
    assert findings[0].message.startswith("t.json#: ")
