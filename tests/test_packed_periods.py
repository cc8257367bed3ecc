"""A long study's judged periods are kept packed (``auditor.fold.PACKED_ABOVE``): no
period is held as live objects once the audit is done, and the report, which reads them
back in order and at random, is byte for byte the one of an audit that kept them live."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

import auditor.fold
from auditor._cli import main
from auditor._spill import PackedSequence
from auditor.audit import run_audit
from auditor.model import PeriodEvidence, PeriodRecord


def _outputs(out: Path) -> dict[str, bytes]:
    return {path.relative_to(out).as_posix(): path.read_bytes()
            for path in sorted(out.rglob("*")) if path.is_file()
            and path.name != "output_manifest.json"}


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One period per outcome, a retried one among them (its table rows read the period
    at random: by subject, in the table's order)."""
    root = tmp_path_factory.mktemp("packed") / "mixed"
    assert main(["example", str(root), "--kind", "mixed"]) == 0
    return root


def test_a_packed_audit_writes_the_live_audits_bytes(mixed: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(["audit", str(mixed), "--out", str(tmp_path / "live"), "--quiet"]) == 0
    monkeypatch.setattr(auditor.fold, "PACKED_ABOVE", 0)
    assert main(["audit", str(mixed), "--out", str(tmp_path / "packed"), "--quiet"]) == 0
    live, packed = _outputs(tmp_path / "live"), _outputs(tmp_path / "packed")
    assert "plots/phase_timeline.png" in live and "diagnostic.md" in live
    assert b", attempt 2" in live["diagnostic.md"]  # (the retried period's rows)
    assert packed == live


def test_no_period_is_held_live_once_packed(mixed: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auditor.fold, "PACKED_ABOVE", 0)
    result = run_audit(mixed)
    periods = result.collected.periods
    assert isinstance(periods, PackedSequence) and len(periods) > 10
    gc.collect()
    live = [item for item in gc.get_objects() if isinstance(item, PeriodEvidence | PeriodRecord)]
    assert live == []
    assert [period.subject for period in periods] == [v.subject for v in result.verdicts]


def test_a_short_study_keeps_its_periods_live(mixed: Path) -> None:
    result = run_audit(mixed)
    assert isinstance(result.collected.periods, tuple)


def test_a_packed_audits_verdicts_keep_their_citations_packed(
        mixed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """...and equal to the live audit's, citation for citation."""
    live = run_audit(mixed)
    monkeypatch.setattr(auditor.fold, "PACKED_ABOVE", 0)
    packed = run_audit(mixed)
    assert all(isinstance(v.citations, tuple) for v in live.verdicts)
    assert all(isinstance(v.citations, PackedSequence) for v in packed.verdicts)
    assert sum(len(v.citations) for v in packed.verdicts) > 20
    assert [list(v.citations) for v in packed.verdicts] \
        == [list(v.citations) for v in live.verdicts]
    assert packed.verdicts == live.verdicts
