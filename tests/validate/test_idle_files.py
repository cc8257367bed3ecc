"""Each node's own idle check file (contract v1.2: ``ATTEMPT/idle/<host>.json``) is read and
held against the period record that gathered it, through whole audits."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.helpers import audit, edit_record, find, outcome_study, period_records, verdicts

S = "host-qwen25-7b-gsm8k-c2-s161/period-1"


def _with_own_file(root: Path, own: dict[str, Any]) -> None:
    """The period's node's own idle check file, listed in its record (kind idle_check)."""
    attempt = find(root, "*/attempt-*/trial-*.json").rsplit("/", 1)[0]
    data = json.dumps({"schema": "run-evidence/idle-check/v1", "host": "gpu-node-10",
                       "checked_ns": 1_789_500_500_000_000_000, **own}).encode()
    (root / attempt / "idle").mkdir()
    (root / attempt / "idle" / "gpu-node-10.json").write_bytes(data)
    (record_path,) = period_records(root)
    edit_record(record_path, lambda period: period["evidence"].append(
        {"path": "idle/gpu-node-10.json", "kind": "idle_check", "size": len(data),
         "sha256": hashlib.sha256(data).hexdigest()}))


def _optional(root: Path) -> None:
    protocol = json.loads((root / "protocol.json").read_text())
    protocol["idle_check"] = "optional"
    (root / "protocol.json").write_text(json.dumps(protocol))


@pytest.mark.parametrize(("own", "optional", "expected"), [
    ({"passed": False}, False, ("unresolved", "idle_check_failed")),
    ({"passed": False}, True, ("unresolved", "idle_check_failed")),  # (made, and failed)
    ({"passed": None, "unavailable": "nvidia-smi not found"}, False,
     ("unresolved", "idle_check_failed")),
    ({"passed": None, "unavailable": "nvidia-smi not found"}, True, ("resolved", "completed")),
    ({"passed": True}, False, ("resolved", "completed")),
])
def test_a_nodes_own_file_is_held_against_the_record(
        tmp_path: Path, own: dict[str, Any], optional: bool, expected: tuple[str, str]) -> None:
    root = outcome_study(tmp_path / "study", ["completed"])
    if optional:
        _optional(root)
    _with_own_file(root, own)
    summary = audit(root, tmp_path / "out")
    assert verdicts(summary)[S] == expected
    diagnostic = (tmp_path / "out" / "diagnostic.md").read_text()
    if expected[0] == "unresolved":
        assert "gpu-node-10's own idle check" in diagnostic
        assert "where the period record says passed=true" in diagnostic


def test_a_malformed_own_file_is_a_finding_naming_it(tmp_path: Path) -> None:
    root = outcome_study(tmp_path / "study", ["completed"])
    _with_own_file(root, {"passed": "no"})
    audit(root, tmp_path / "out")
    findings = pq.read_table(tmp_path / "out" / "findings.parquet").to_pylist()
    assert any((f["path"] or "").endswith("idle/gpu-node-10.json") for f in findings), findings


@pytest.mark.parametrize("extra", [{"gpu_memory_used_mib": [0.0, 3.5]}, {"checked_ns": None},
                                   {"gpu_processes": "none"}])
def test_a_sites_own_fields_in_its_file_decide_nothing(tmp_path: Path,
                                                       extra: dict[str, Any]) -> None:
    """The contract's fields are host, passed, unavailable and checked_ns: a site's checker
    writing its own fields its own way (floats, a null time) leaves a passed check passed."""
    root = outcome_study(tmp_path / "study", ["completed"])
    _with_own_file(root, {"passed": True, **extra})
    assert verdicts(audit(root, tmp_path / "out"))[S] == ("resolved", "completed")


@pytest.mark.parametrize(("controller", "overall"), [(False, False), (True, False)])
def test_a_failed_check_on_a_node_no_worker_ran_on_fails_the_period(
        tmp_path: Path, controller: bool, overall: bool) -> None:
    """Every node of a multi-node attempt writes its own check (contract v1.2), the
    controller's too: one that failed there, or the record's own ``passed: false``, never
    passes because the workers' nodes passed."""
    root = outcome_study(tmp_path / "study", ["completed"])
    checked = 1_789_500_500_000_000_000

    def hosts(period: dict[str, Any]) -> None:
        for worker in period["workers"]:
            worker["host"] = "gpu-node-10"
        period["idle_check"] = {"passed": overall, "hosts": {
            "gpu-node-10": {"passed": True, "checked_ns": checked},
            "ctl-node": {"passed": controller, "checked_ns": checked}}}

    (record_path,) = period_records(root)
    edit_record(record_path, hosts)
    assert verdicts(audit(root, tmp_path / "out"))[S] == ("unresolved", "idle_check_failed")
    diagnostic = (tmp_path / "out" / "diagnostic.md").read_text()
    if not controller:
        assert "idle check passed on gpu-node-10; it failed on ctl-node" in diagnostic
    edit_record(record_path, lambda period: period["idle_check"].update(
        passed=True, hosts={**period["idle_check"]["hosts"],
                            "ctl-node": {"passed": True, "checked_ns": checked}}))
    assert verdicts(audit(root, tmp_path / "passed"))[S] == ("resolved", "completed")
