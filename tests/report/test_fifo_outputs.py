"""``verify`` and ``gate`` read an audit's own files as regular files only: a FIFO put in
place of the manifest or the summary is one line and exit 2, never a wait for ever (a
writer opens it after 10 s, so without the guard these fail instead of hanging)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from auditor._cli import main
from tests.catalog.studies import fifo_in_place_of
from tests.helpers import copy_example

WATCHDOG_S = 10
"""When a writer opens the FIFO, ending a read that waits on it."""


@pytest.fixture(scope="module")
def audit_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("fifo")
    out = tmp / "out"
    assert main(["audit", str(copy_example(tmp)), "--out", str(out), "--quiet",
                 "--no-plots"]) == 0
    return out


@pytest.mark.parametrize("command", ["verify", "gate"])
def test_a_fifo_in_place_of_the_manifest_is_not_waited_on(
        audit_out: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        command: str) -> None:
    out = tmp_path / "out"
    shutil.copytree(audit_out, out)
    started = time.monotonic()
    with fifo_in_place_of(out / "output_manifest.json", after_s=WATCHDOG_S):
        assert main([command, str(out)]) == 2
    assert time.monotonic() - started < WATCHDOG_S  # (refused, not read once unblocked)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "output_manifest.json" in err


def test_gate_does_not_wait_on_a_fifo_in_place_of_the_summary(
        audit_out: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    shutil.copytree(audit_out, out)
    started = time.monotonic()
    with fifo_in_place_of(out / "summary.json", after_s=WATCHDOG_S):
        assert main(["gate", str(out)]) == 2
    assert time.monotonic() - started < WATCHDOG_S
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "summary.json" in err and "not a regular file" in err
