"""Today's scheduler findings as a reviewer reads them in the report: a dump's finding at a
line keeps its line beside its file, and one unresolved period is counted in the singular."""

from __future__ import annotations

from pathlib import Path

import pytest

from auditor._cli import main
from tests.helpers import outcome_study


def test_a_dump_findings_line_stays_with_its_file_in_the_findings_list(tmp_path: Path) -> None:
    """A dump saved twice into one file (``AUD027``, about no single period): the list read
    "`accounting/sacct-raw.psv`: 9: job ...", the line parted from its file, and its head
    "1 findings"."""
    root = outcome_study(tmp_path / "study", ["completed", "completed"])
    dump = root / "accounting" / "sacct-raw.psv"
    dump.write_text(dump.read_text() * 2)
    out = tmp_path / "out"
    assert main(["audit", str(root), "--out", str(out), "--quiet", "--no-plots"]) == 0
    report = (out / "diagnostic.md").read_text()
    assert ("- `AUD027` `accounting/sacct-raw.psv:9`: job `7000000_0` is recorded again with "
            "the Start of line 1: one run, counted once") in report
    assert "\n1 finding (0 errors, 1 warning, 0 informational), each" in report


def test_one_unresolved_periods_reason_is_said_in_the_singular(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A period on more GPUs than its allocation held (``AUD129``), the study's one error:
    the terminal summary said "the 1 unresolved periods' reasons"."""
    root = outcome_study(tmp_path / "study", ["completed", "completed"])
    dump = root / "accounting" / "sacct-raw.psv"
    dump.write_text(dump.read_text().replace("gres/gpu:a100=4,gres/gpu=4,mem=240G,node=1|"
                                             "gpu-node-10|None", "gres/gpu:a100=2,gres/gpu=2,"
                                             "mem=240G,node=1|gpu-node-10|None", 1))
    assert main(["audit", str(root), "--out", str(tmp_path / "out"), "--no-plots"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "1 error finding: the 1 unresolved period's reason; the gate fails" in said
