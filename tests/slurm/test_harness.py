"""The harness's decisions that need no cluster: when it skips, and how it reads a dump.

These run everywhere (no ``slurm`` mark) and have no side effects: the install paths tried
here stop before apt-get would run.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.slurm import cluster
from tests.slurm.endings import stale_tasks

DUMPS = Path(__file__).resolve().parents[2] / "fixtures" / "slurm"


def test_skips_without_the_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AUDITOR_SLURM", raising=False)
    reason = cluster.skip_reason()
    assert reason is not None and "AUDITOR_SLURM=1" in reason


def test_opted_in_skips_only_when_not_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUDITOR_SLURM", "1")
    reason = cluster.skip_reason()
    assert (reason is None) == (os.geteuid() == 0)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "root" in (cluster.skip_reason() or "")


def test_missing_programs_without_apt_get_is_unavailable(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on it, apt-get included
    monkeypatch.setattr(cluster, "PROGRAMS", ("no-such-slurm-program",))
    with pytest.raises(cluster.Unavailable) as caught:
        cluster.ensure_installed()
    message = str(caught.value)
    assert "no-such-slurm-program" in message
    assert ("apt-get" in message) if os.geteuid() == 0 else ("root" in message)
    assert "\n" not in message


def test_apt_failure_reason_is_its_error_line() -> None:
    output = "Reading package lists...\nE: Unable to locate package slurmd\nDone\n"
    assert cluster._last_line(output) == "E: Unable to locate package slurmd"
    assert cluster._last_line("") == "(no output)"


def test_stale_range_found_in_the_saved_dumps() -> None:
    assert stale_tasks((DUMPS / "contract.psv").read_text(), "1") == {14}
    assert stale_tasks((DUMPS / "midrun.psv").read_text(), "1") == set()
    assert stale_tasks("1_[2-7%2]|1|x\n1_2|4|x\n1_9|5|x\n", "1") == {2}
