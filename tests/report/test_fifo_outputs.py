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


@pytest.mark.parametrize("name", ["output_manifest.json", "summary.json"])
def test_an_output_of_its_own_linked_elsewhere_is_never_read_where_the_link_leads(
        audit_out: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        name: str) -> None:
    """The manifest (or the summary) moved out and linked back is refused by every reader
    of an audit's outputs, as a table linked so is: the manifest pins the outputs, and one
    read through a link pins nothing in the directory (it verified, loaded and was
    catalogued before)."""
    import auditor
    from auditor.errors import VerifyError

    out = tmp_path / "out"
    shutil.copytree(audit_out, out)
    (out / name).rename(tmp_path / name)
    (out / name).symlink_to(tmp_path / name)
    for command in (["verify", str(out)], ["gate", str(out)],
                    ["catalog", str(out), "--into", str(tmp_path / "cat")]):
        assert main(command) == (2 if name == "output_manifest.json" or command[0] != "verify"
                                 else 1), command
        said = "".join(capsys.readouterr())
        assert name in said and "link" in said, (command, said)
    assert not (tmp_path / "cat" / "catalog.json").exists()
    with pytest.raises(VerifyError, match="link"):
        auditor.load(out)
