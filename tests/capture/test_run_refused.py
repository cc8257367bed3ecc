"""A refused ``auditor run`` is one line on stderr and exit 2, with no banner before it
(it printed the banner, then the refusal: two lines), and the command never starts."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from auditor._cli import main
from tests.capture.support import attempt_of, run_args

BANNER = "auditor run: job"


def _already_run(root: Path) -> Path:
    assert main([*run_args(root, "5001"), "--", "true"]) == 0
    return root


def _file_root(root: Path) -> Path:
    (root / "f").write_text("")
    return root / "f"


def _log_is_a_dangling_link(root: Path) -> Path:
    attempt_of(root).mkdir(parents=True)
    (attempt_of(root) / "training-5001.log").symlink_to(root / "elsewhere.log")
    return root


def _trial_is_a_directory(root: Path) -> Path:
    (attempt_of(root) / "trial-5001.json").mkdir(parents=True)
    return root


@pytest.mark.parametrize(("make_root", "said"), [
    (_already_run, "already holds this job's trial record"),
    (_file_root, "cannot create (Not a directory)"),
    (_log_is_a_dangling_link, "already holds this job's training log"),
    (_trial_is_a_directory, "already holds this job's trial record"),
])
def test_a_refused_run_is_one_line_without_the_banner(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        make_root: Callable[[Path], Path], said: str) -> None:
    root = make_root(tmp_path)
    capsys.readouterr()
    marker = tmp_path / "started"
    assert main([*run_args(root, "5001"), "--", "touch", str(marker)]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and BANNER not in captured.err, captured.err
    assert said in captured.err and captured.err.startswith("auditor: error: run: ")
    assert not marker.exists()  # the command never started
    assert not (tmp_path / "elsewhere.log").exists()  # (nothing written through a link)


def test_an_attempt_dir_that_is_a_file_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "f").write_text("")
    assert main(["run", "--pair", "p", "--period", "1", "--gpus", "1", "--attempt-dir",
                 str(tmp_path / "f"), "--job-id", "1", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and BANNER not in err
    assert f"run: {tmp_path / 'f'}: exists and is not a directory" in err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc and /sys")
@pytest.mark.parametrize("where", ["/proc/self", "/sys/kernel"])
def test_an_attempt_dir_no_file_can_be_made_in_is_one_line_not_an_internal_error(
        capsys: pytest.CaptureFixture[str], where: str) -> None:
    """/proc and /sys say a root may write there (access()); creating the log then failed
    with an internal error (exit 3) after the banner."""
    if not os.path.isdir(where):
        pytest.skip(f"no {where}")
    assert main(["run", "--pair", "p", "--period", "1", "--gpus", "1", "--attempt-dir",
                 where, "--job-id", "1", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and BANNER not in err, err
    assert f"run: {where}: cannot write there (" in err
    assert "internal error" not in err


def test_a_run_that_starts_still_says_where_its_attempt_goes_first(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*run_args(tmp_path, "5002"), "--", "true"]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and lines[0].startswith(BANNER) and "exit 0" in lines[1]
    # (the probe of the directory leaves nothing behind)
    assert sorted(p.name for p in attempt_of(tmp_path, "5002").iterdir()) == [
        "training-5002.log", "trial-5002.json"]


def test_a_trial_record_that_cannot_be_written_is_said_and_given_never_an_internal_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The command itself puts a directory where its trial record goes: after the banner
    and the run, one line saying so, then the record (one JSON line, for the batch log),
    and the command's own exit (it was an internal error, exit 3; then exit 2, which a batch
    script's retry reads as the run's failure)."""
    import json

    assert main([*run_args(tmp_path, "5003"), "--", "sh", "-c",
                 'mkdir "$AUDITOR_ATTEMPT_DIR/trial-5003.json"']) == 0
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3 and lines[0].startswith(BANNER), lines
    assert lines[1].startswith("auditor run: the trial record could not be written "
                               f"({attempt_of(tmp_path, '5003')}/")
    assert "Is a directory); the command's own exit, 0, is passed on" in lines[1]
    assert json.loads(lines[2])["job_id"] == "5003"


def test_the_library_run_never_writes_through_a_link_in_the_logs_place(
        tmp_path: Path) -> None:
    """``auditor.capture.launch.run`` (the library, not the CLI's checks) refuses a dangling
    link where the training log goes: ``exists()`` said no, and opening the log followed
    the link and made the file it points to."""
    from auditor.capture.launch import RunRefused, RunSpec, run

    attempt = tmp_path / "attempt"
    attempt.mkdir()
    (attempt / "training-5001.log").symlink_to(tmp_path / "elsewhere.log")
    marker = tmp_path / "started"
    spec = RunSpec("pair", 1, 2, ("touch", str(marker)), attempt_dir=attempt, job_id="5001")
    with pytest.raises(RunRefused, match="already holds this job's training log"):
        run(spec, {})
    assert not (tmp_path / "elsewhere.log").exists() and not marker.exists()
