"""A failing gate admits nothing (issue 43 item 3, contract v1.2): where the
``--allow-partial`` gate fails (evidence altered, missing, unsafe or unreadable, an anchor
mismatch, an unusable dump), both gates' ``included_configurations`` are empty and the
terminal, ``auditor gate`` and the report say "none"; a strict gate that fails only because
some configurations are unresolved still lists the resolved subset."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from auditor._cli import main
from tests.helpers import copy_example, find, rewrite


def _summary(out: Path) -> dict[str, object]:
    document: dict[str, object] = orjson.loads((out / "summary.json").read_bytes())
    return document


def test_unresolved_configurations_alone_keep_the_resolved_subset(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = copy_example(tmp_path)
    assert main(["audit", str(root), "--out", str(tmp_path / "out"), "--quiet",
                 "--no-plots"]) == 0
    summary = _summary(tmp_path / "out")
    gate, partial = summary["gate"], summary["gate_allow_partial"]
    assert isinstance(gate, dict) and isinstance(partial, dict)
    assert gate["passed"] is False and partial["passed"] is True
    assert gate["included_configurations"] == partial["included_configurations"] != []


def test_altered_evidence_admits_no_configuration(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's case: with tampered evidence ``gate --allow-partial`` printed FAIL and
    still listed ``code_heavy_tail@2, math@2``; a script reading the list admitted them."""
    root = copy_example(tmp_path)
    log = find(root, "host-qwen25-7b-math-c2-s161-4gpu/attempt-*/training-*.log")
    rewrite(root, log, lambda data: data + b"tampered\n", update_manifest=False)
    out = tmp_path / "out"
    assert main(["audit", str(root), "--out", str(out), "--no-plots"]) == 0
    printed = capsys.readouterr().out
    assert "included: none" in printed
    summary = _summary(out)
    for key in ("gate", "gate_allow_partial"):
        gate = summary[key]
        assert isinstance(gate, dict)
        assert gate["passed"] is False
        assert gate["included_configurations"] == [] and gate["included_by_waiver"] == []
    assert main(["gate", str(out), "--allow-partial"]) == 1
    assert "included configurations: none" in capsys.readouterr().out
    assert main(["gate", str(out)]) == 1
    assert "included configurations: none" in capsys.readouterr().out
    report = (out / "diagnostic.md").read_text()
    assert "No configuration can enter the evaluation" in report
    assert "Included configurations: none." in report  # (contract v1.2: the report says none)
