"""The harness's decisions that need no cluster: when it skips, and how it reads a dump.

These run everywhere (no ``slurm`` mark) and have no side effects: the install paths tried
here stop before apt-get would run.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.slurm import cluster
from tests.slurm.endings import check_midrun, stale_tasks

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


def _with_task_seven_requeued(text: str, twelve_started: bool, seven: str = "PENDING") -> str:
    """The saved mid-run dump as it reads once task 7 is ``seven`` and, if
    ``twelve_started``, task 12 has started."""
    lines = []
    for line in text.splitlines():
        fields = line.split("|")
        if fields[0] == "1_7":
            fields[3] = seven
        if fields[0] == "1_[12-15%12]" and twelve_started:
            lines.append("|".join(["1_12", fields[1], fields[2], "RUNNING", *fields[4:]]))
            fields[0] = "1_[13-15%12]"
        lines.append("|".join(fields))
    return "\n".join(lines) + "\n"


def test_mid_run_check_allows_task_twelve_in_sevens_slot() -> None:
    """CI once read the mid-run dump after 7 requeued itself and 12 took its slot."""
    text = (DUMPS / "midrun.psv").read_text()
    check_midrun(text, "1")
    check_midrun(_with_task_seven_requeued(text, twelve_started=False), "1")
    check_midrun(_with_task_seven_requeued(text, twelve_started=True), "1")
    check_midrun(_with_task_seven_requeued(text, True, seven="REQUEUED"), "1")
    with pytest.raises(AssertionError):  # 12 gone from the range without a row of its own
        check_midrun(text.replace("1_[12-15%12]", "1_[13-15%12]"), "1")
    with pytest.raises(AssertionError):  # 12 started while 7 still held its slot
        check_midrun(_with_task_seven_requeued(text, True, seven="RUNNING"), "1")
