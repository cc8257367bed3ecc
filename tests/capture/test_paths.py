"""The producer kit writes only where it is told: a pair name is one directory name, and
seal never writes (nor reads) through a link out of its root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from auditor._cli import main

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("pair", ["../../evil", "a/b", "..", ""])
def test_run_and_seal_refuse_a_pair_name_that_is_not_one_directory(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], pair: str) -> None:
    err = _refused(capsys, "run", "--pair", pair, "--period", "1", "--gpus", "2",
                   "--job-id", "15", "--root", str(tmp_path / "r"), "--", "true")
    assert "one directory name" in err
    assert not (tmp_path / "evil-2gpu").exists() and not any(tmp_path.iterdir())
    err = _refused(capsys, "seal", str(tmp_path), "--pair", pair, "--period", "1", "--gpus",
                   "2", "--attempt-dir", "x", "--commit", COMMIT)
    assert "one directory name" in err


def test_seal_never_writes_through_a_link_out_of_its_root(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (outside / "pairs").mkdir(parents=True)
    assert main(["run", "--pair", "c", "--period", "1", "--gpus", "2", "--job-id", "43",
                 "--root", str(root), "--", "true"]) == 0
    capsys.readouterr()
    os.symlink(outside / "pairs", root / "pairs")
    err = _refused(capsys, "seal", str(root), "--pair", "c", "--period", "1", "--gpus", "2",
                   "--attempt-dir", "c-2gpu/attempt-43", "--commit", COMMIT)
    assert "a link" in err and not any((outside / "pairs").iterdir())
    (root / "pairs").unlink()
    (root / "pairs").mkdir()
    os.symlink(outside / "pairs", root / "pairs" / "c")
    err = _refused(capsys, "seal", str(root), "--pair", "c", "--period", "1", "--gpus", "2",
                   "--attempt-dir", "c-2gpu/attempt-43", "--commit", COMMIT)
    assert "a link" in err and not any((outside / "pairs").iterdir())


def test_seal_never_reads_an_attempt_through_a_link(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    assert main(["run", "--pair", "h", "--period", "1", "--gpus", "2", "--job-id", "48",
                 "--root", str(outside), "--", "true"]) == 0
    capsys.readouterr()
    root.mkdir()
    os.symlink(outside / "h-2gpu", root / "h-2gpu")
    err = _refused(capsys, "seal", str(root), "--pair", "h", "--period", "1", "--gpus", "2",
                   "--attempt-dir", "h-2gpu/attempt-48", "--commit", COMMIT)
    assert "a link on the way" in err and not (root / "pairs").exists()
