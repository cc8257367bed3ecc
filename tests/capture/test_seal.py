"""``auditor seal``: the period record of attempts ``auditor run`` left, sealed and resealed."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from auditor._cli import main
from tests.capture.support import (
    COMMIT,
    EXAMPLE,
    attempt_of,
    fakes,
    load,
    run_args,
    schema_errors,
)

pytestmark = pytest.mark.slow  # (real child processes, signals)

PAIR = "host-m-gsm8k-c2-s1"
META = ["--workload", "gsm8k", "--seed", "1", "--model", "m", "--study", "kit"]


@pytest.fixture(autouse=True)
def _no_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith(("SLURM_", "AUDITOR_")):
            monkeypatch.delenv(key)


def _run(root: Path, job: str = "5001", mode: str = "completed", *extra: str) -> Path:
    assert main([*run_args(root, job, *extra, "--"), *EXAMPLE, "--mode", mode]) in (0, 1)
    return attempt_of(root, job, restart=int(os.environ.get("SLURM_RESTART_COUNT", "0")))


def _seal(root: Path, attempt: str, *extra: str) -> int:
    return main(["seal", str(root), "--pair", PAIR, "--period", "1", "--gpus", "2",
                 "--attempt-dir", attempt, *extra])


def _rel(root: Path, attempt: Path) -> str:
    return attempt.relative_to(root).as_posix()


def test_seal_lists_every_file_with_kind_hash_and_size(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "5000")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "4")
    attempt = _run(tmp_path)
    assert _seal(tmp_path, _rel(tmp_path, attempt), "--commit", COMMIT, *META) == 0
    record = load(tmp_path / "pairs" / PAIR / "period-1.json")
    assert schema_errors("period", record) == []
    assert (record["study"], record["job_id"], record["array_job_id"],
            record["array_task_id"], record["restart_count"], record["commit"]) == (
        "kit", "5001", "5000", 4, 0, COMMIT)
    assert record["attempt_dir"] == f"{PAIR}-2gpu/attempt-5001"
    on_disk = sorted(p.relative_to(attempt).as_posix() for p in attempt.rglob("*")
                     if p.is_file())
    assert [e["path"] for e in record["evidence"]] == on_disk
    kinds = {e["path"].split("/")[0].split("-")[0]: e["kind"] for e in record["evidence"]}
    assert kinds == {"allocator": "allocator_trace", "device": "device_evidence",
                     "trial": "trial", "training": "training_log"}
    for entry in record["evidence"]:
        data = (attempt / entry["path"]).read_bytes()
        assert (entry["sha256"], entry["size"]) == (hashlib.sha256(data).hexdigest(), len(data))
    host = socket.gethostname().split(".", 1)[0]
    pids = sorted(int(p.stem.rsplit("-", 1)[1]) for p in (attempt / "allocator-traces").iterdir())
    assert record["workers"] == [{"role": "actor_rollout", "rank": rank, "pid": pid,
                                  "host": host} for rank, pid in enumerate(pids)]
    assert record["sealed_by"]["tool"] == "auditor"
    assert record["sealed_ns"] >= load(attempt / "trial-5001.json")["invocation"]["finished_ns"]


def test_reseal_identical_is_0_and_changes_nothing_different_is_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rel = _rel(tmp_path, _run(tmp_path))
    assert _seal(tmp_path, rel, "--commit", COMMIT, *META) == 0
    path = tmp_path / "pairs" / PAIR / "period-1.json"
    before = path.read_bytes()
    assert _seal(tmp_path, rel, "--commit", COMMIT, *META) == 0
    assert path.read_bytes() == before
    capsys.readouterr()
    assert _seal(tmp_path, rel, "--commit", "f" * 40, *META) == 2  # another record
    err = capsys.readouterr().err
    assert "already holds a different record (differing: commit)" in err
    assert len(err.strip().splitlines()) == 1
    log = tmp_path / rel / "training-5001.log"
    log.write_bytes(log.read_bytes() + b"edited\n")
    assert _seal(tmp_path, rel, "--commit", COMMIT, *META) == 2  # the attempt changed
    assert "already sealed differently" in capsys.readouterr().err
    assert path.read_bytes() == before


def test_a_retried_period_gets_an_attempts_list_in_restart_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = _rel(tmp_path, _run(tmp_path, "5001", "oom"))
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    second = _rel(tmp_path, _run(tmp_path, "5001", "completed"))
    assert second.endswith("attempt-5001-r1")
    assert _seal(tmp_path, second, "--commit", COMMIT, *META) == 0  # sealed out of order
    assert _seal(tmp_path, first, "--commit", COMMIT, *META) == 0
    record = load(tmp_path / "pairs" / PAIR / "period-1.json")
    assert schema_errors("period", record) == []
    assert "evidence" not in record and "job_id" not in record
    assert [(a["job_id"], a["restart_count"], a["attempt_dir"]) for a in record["attempts"]] == [
        ("5001", 0, first), ("5001", 1, second)]
    before = record
    assert _seal(tmp_path, first, "--commit", COMMIT, *META) == 0  # each identical again
    assert _seal(tmp_path, second, "--commit", COMMIT, *META) == 0
    assert load(tmp_path / "pairs" / PAIR / "period-1.json") == before


def test_the_commit_comes_from_git_or_seal_refuses(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    rel = _rel(tmp_path, _run(tmp_path))
    assert _seal(tmp_path, rel, *META) == 2
    assert "commit is required" in capsys.readouterr().err
    assert _seal(tmp_path, rel, "--commit", "not-a-sha", *META) == 2
    assert _seal(tmp_path, rel, "--git", str(tmp_path / "nowhere"), *META) == 2
    assert not (tmp_path / "pairs").exists()
    tree = tmp_path / "src"
    tree.mkdir()
    git = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    for argv in (["init", "-q"], ["commit", "-q", "--allow-empty", "-m", "x"]):
        subprocess.run(["git", "-C", str(tree), *argv], env=git, check=True)
    head = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], env=git, check=True,
                          capture_output=True, text=True).stdout.strip()
    assert _seal(tmp_path, rel, "--git", str(tree), *META) == 0
    assert load(tmp_path / "pairs" / PAIR / "period-1.json")["commit"] == head
    assert "changed since" not in capsys.readouterr().err
    # a tracked file edited since HEAD: the pin is HEAD's, and the seal says it is not the
    # source there (it pinned a dirty tree as clean, without a word)
    (tree / "train.py").write_text("v1\n")
    for argv in (["add", "train.py"], ["commit", "-q", "-m", "y"]):
        subprocess.run(["git", "-C", str(tree), *argv], env=git, check=True)
    (tree / "train.py").write_text("v2\n")
    (tmp_path / "pairs" / PAIR / "period-1.json").unlink()
    assert _seal(tmp_path, rel, "--git", str(tree), *META) == 0
    err = capsys.readouterr().err
    assert "has 1 tracked file(s) changed since its HEAD" in err and "train.py" in err


@pytest.mark.parametrize(("attempt", "message"), [
    ("../x", "without '..'"), ("/abs", "must be relative"), ("nowhere", "No such file"),
])
def test_a_bad_attempt_dir_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      attempt: str, message: str) -> None:
    assert _seal(tmp_path, attempt, "--commit", COMMIT) == 2
    assert message in capsys.readouterr().err


def test_a_trial_of_another_period_is_refused(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    rel = _rel(tmp_path, _run(tmp_path))
    assert main(["seal", str(tmp_path), "--pair", PAIR, "--period", "2", "--gpus", "2",
                 "--attempt-dir", rel, "--commit", COMMIT]) == 2
    assert "period is 1, not 2" in capsys.readouterr().err


def test_idle_check_without_nvml_is_recorded_as_not_made(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
        ) -> None:
    rel = _rel(tmp_path, _run(tmp_path))
    assert _seal(tmp_path, rel, "--commit", COMMIT, *META, "--idle-check") == 2
    assert "outside the attempt's job" in capsys.readouterr().err
    monkeypatch.setenv("SLURM_JOB_ID", "5001")
    assert _seal(tmp_path, rel, "--commit", COMMIT, *META, "--idle-check") == 0
    assert "no idle check could be made" in capsys.readouterr().err
    check = load(tmp_path / "pairs" / PAIR / "period-1.json")["idle_check"]
    assert check["passed"] is None and "NVML not available" in check["unavailable"]


def test_idle_check_in_a_study_without_a_scheduler_needs_no_slurm_job(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A study whose protocol says ``"scheduler": "none"`` (a workstation, a Kubernetes pod;
    its idle check required by default) ran ``auditor run --job-id``: no SLURM_JOB_ID can
    say the seal runs in that job, and ``seal --idle-check`` refused, leaving the period
    unresolved (idle_check_failed) unless the variable was faked. A study under a
    scheduler still refuses a check made outside the attempt's job."""
    (tmp_path / "protocol.json").write_text(json.dumps(
        {"schema": "run-evidence/protocol/v1", "scheduler": "none"}))
    rel = _rel(tmp_path, _run(tmp_path))
    assert _seal(tmp_path, rel, "--commit", COMMIT, *META, "--idle-check") == 0
    assert "no idle check could be made" in capsys.readouterr().err
    check = load(tmp_path / "pairs" / PAIR / "period-1.json")["idle_check"]
    assert check["passed"] is None and "NVML not available" in check["unavailable"]
    (tmp_path / "protocol.json").write_text(json.dumps(
        {"schema": "run-evidence/protocol/v1", "scheduler": "slurm"}))
    (tmp_path / "pairs" / PAIR / "period-1.json").unlink()
    assert _seal(tmp_path, rel, "--commit", COMMIT, *META, "--idle-check") == 2
    assert "outside the attempt's job" in capsys.readouterr().err


def test_a_requeue_sealed_after_the_root_moved_keeps_the_records_study(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --study the record's study is the root folder's name; a root moved (or
    renamed) between a requeue's two seals made the second seal 'differ' (refused) though
    nothing of the study changed. The record's own name is kept; a new record takes the
    folder's (never the protocol's name, which several studies may share)."""
    import shutil

    first = tmp_path / "kit-study"
    first.mkdir()
    (first / "protocol.json").write_text(json.dumps(
        {"schema": "run-evidence/protocol/v1", "name": "shared-protocol"}))
    rel = _rel(first, _run(first))
    meta = [item for item in META if item not in ("--study", "kit")]
    assert _seal(first, rel, "--commit", COMMIT, *meta) == 0
    assert load(first / "pairs" / PAIR / "period-1.json")["study"] == "kit-study"
    moved = tmp_path / "kit-study-2024"
    shutil.move(first, moved)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    rerun = _rel(moved, _run(moved, "5001", "completed"))
    assert _seal(moved, rerun, "--commit", COMMIT, *meta) == 0
    record = load(moved / "pairs" / PAIR / "period-1.json")
    assert record["study"] == "kit-study" and len(record["attempts"]) == 2
    (moved / "pairs" / PAIR / "period-1.json").unlink()
    assert _seal(moved, rerun, "--commit", COMMIT, *meta) == 0  # (a new record)
    assert load(moved / "pairs" / PAIR / "period-1.json")["study"] == "kit-study-2024"


def test_a_resealed_attempt_never_drops_an_idle_check_unsaid(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
        ) -> None:
    """Sealed without an idle check, then again with one: the check just made is not the
    record's, and the sealed record is not changed, so the seal is refused (it said
    'identically; unchanged', exit 0, the check's result dropped); the same check again is
    the no-op a re-seal is."""
    rel = _rel(tmp_path, _run(tmp_path))
    assert _seal(tmp_path, rel, "--commit", COMMIT, *META) == 0
    monkeypatch.setenv("SLURM_JOB_ID", "5001")
    capsys.readouterr()
    assert _seal(tmp_path, rel, "--commit", COMMIT, *META, "--idle-check") == 2
    assert "the idle check just made (passed=None) is not its own (none)" in \
        capsys.readouterr().err
    assert "idle_check" not in load(tmp_path / "pairs" / PAIR / "period-1.json")
    other = tmp_path / "other"
    rel = _rel(other, _run(other))
    assert _seal(other, rel, "--commit", COMMIT, *META, "--idle-check") == 0
    assert _seal(other, rel, "--commit", COMMIT, *META, "--idle-check") == 0


def test_a_temporary_a_writer_left_is_never_sealed_as_evidence(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A half-written ``.NAME.tmp-PID`` (a rank killed mid-write, or one still writing) was
    pinned as an evidence file of kind ``other`` and the period resolved: refused, saying
    what it is."""
    attempt = _run(tmp_path)
    (attempt / "device-evidence").mkdir(exist_ok=True)
    for name in (".worker-actor_rollout-2-h-99999.json.tmp-99999-0a1b2c3d",  # (as now named)
                 ".worker-actor_rollout-2-h-99999.json.tmp-99999"):  # (by earlier versions)
        (attempt / "device-evidence" / name).write_text('{"half": ')
        assert _seal(tmp_path, _rel(tmp_path, attempt), "--commit", COMMIT, *META) == 2
        assert "a write in progress or cut short (writer pid 99999" in capsys.readouterr().err
        assert not (tmp_path / "pairs" / PAIR / "period-1.json").exists()
        (attempt / "device-evidence" / name).unlink()


def test_idle_check_refuses_another_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    attempt = _run(tmp_path)
    trial_path = attempt / "trial-5001.json"
    trial = load(trial_path)
    trial["hostname"] = "gpu-node-99"
    trial_path.write_text(json.dumps(trial))
    monkeypatch.setenv("SLURM_JOB_ID", "5001")
    assert _seal(tmp_path, _rel(tmp_path, attempt), "--commit", COMMIT, "--idle-check") == 2
    err = capsys.readouterr().err
    assert f"on {socket.gethostname().split('.')[0]}, but the attempt ran on 'gpu-node-99'" in err


@pytest.mark.parametrize(("used", "processes", "passed"), [(3, 0, True), (3, 1, False),
                                                          (30000, 0, False)])
def test_idle_check_with_nvml(tmp_path: Path, used: int, processes: int, passed: bool) -> None:
    rel = _rel(tmp_path, _run(tmp_path))
    env = fakes(tmp_path, nvml=True)
    env.update(SLURM_JOB_ID="5001", CUDA_VISIBLE_DEVICES="0,1", FAKE_NVML=json.dumps([
        {"uuid": f"GPU-{i}", "name": "n", "bus": "b", "total_mib": 40960,
         "used_mib": used if i == 1 else 0, "processes": processes if i == 1 else 0}
        for i in range(2)]))
    done = subprocess.run([sys.executable, "-m",
                           "auditor", "seal", str(tmp_path), "--pair", PAIR, "--period", "1",
                           "--gpus", "2", "--attempt-dir", rel, "--commit", COMMIT, *META,
                           "--idle-check"], env=env, capture_output=True, text=True,
                          check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    record = load(tmp_path / "pairs" / PAIR / "period-1.json")
    check = record["idle_check"]
    assert (check["passed"], check["gpu_memory_used_mib"], check["gpu_processes"]) == (
        passed, [0, used], processes)
    assert schema_errors("period", record) == []


def _sealed_with_check(root: Path, rel: str, used: int) -> int:
    """``seal --idle-check`` of ``rel`` in the job, NVML saying ``used`` MiB in use."""
    env = fakes(root, nvml=True)
    env.update(SLURM_JOB_ID="5001", CUDA_VISIBLE_DEVICES="0", FAKE_NVML=json.dumps([
        {"uuid": "GPU-0", "name": "n", "bus": "b", "total_mib": 40960, "used_mib": used,
         "processes": 0}]))
    return subprocess.run([sys.executable, "-m", "auditor", "seal", str(root), "--pair", PAIR,
                           "--period", "1", "--gpus", "2", "--attempt-dir", rel, "--commit",
                           COMMIT, *META, "--idle-check"], env=env, capture_output=True,
                          text=True, check=False, timeout=60).returncode


@pytest.mark.parametrize("order", ["in order", "out of order"])
def test_each_sealed_attempt_keeps_its_own_idle_check(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, order: str) -> None:
    """The single-node flow (run, then seal --idle-check in the job), requeued once: the
    first run's check failed, the rerun's passed. The rerun's seal put its check in the
    record's place, the failed one kept nowhere (the audit then counted the first run); a
    seal out of restart order put the earlier run's check in the last one's place. Each
    earlier attempt now keeps its own in its entry, the record's is the last attempt's, and
    sealing an attempt again, as it was, is still a no-op."""
    first = _rel(tmp_path, _run(tmp_path, "5001", "completed"))
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    rerun = _rel(tmp_path, _run(tmp_path, "5001", "completed"))
    seals = [(first, 30000), (rerun, 0)]
    for rel, used in seals if order == "in order" else seals[::-1]:
        assert _sealed_with_check(tmp_path, rel, used) == 0
    path = tmp_path / "pairs" / PAIR / "period-1.json"
    record = load(path)
    assert schema_errors("period", record) == []
    earlier, last = record["attempts"]
    assert earlier["idle_check"]["passed"] is False and earlier["idle_check"][
        "gpu_memory_used_mib"] == [30000]
    assert "idle_check" not in last and record["idle_check"]["passed"] is True
    before = path.read_bytes()
    assert _sealed_with_check(tmp_path, first, 30000) == 0  # (each as it was: no-ops)
    assert _seal(tmp_path, first, "--commit", COMMIT, *META) == 0
    assert _sealed_with_check(tmp_path, rerun, 0) == 0
    assert path.read_bytes() == before
    assert _sealed_with_check(tmp_path, first, 0) == 2  # (not its own check: refused)


def test_a_link_or_unlistable_folder_in_the_attempt_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    attempt = _run(tmp_path)
    (attempt / "extra").symlink_to(tmp_path)
    assert _seal(tmp_path, _rel(tmp_path, attempt), "--commit", COMMIT) == 2
    assert "a link; not sealed" in capsys.readouterr().err
    (attempt / "extra").unlink()
    (attempt / "stray.txt").write_text("kept\n")
    assert _seal(tmp_path, _rel(tmp_path, attempt), "--commit", COMMIT, *META) == 0
    record = load(tmp_path / "pairs" / PAIR / "period-1.json")
    assert {"path": "stray.txt", "kind": "other"}.items() <= next(
        e for e in record["evidence"] if e["path"] == "stray.txt").items()


@pytest.mark.parametrize("swap", ["link", "fifo"])
def test_a_file_swapped_after_listing_is_refused_never_followed_nor_waited_on(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        swap: str) -> None:
    """Between the listing (regular files only) and the hashing, a file becomes a link out of
    the root or a FIFO: the seal refuses it (it read the link's target and pinned it, or
    waited on the FIFO for ever)."""
    import auditor.capture.seal as sealing

    attempt = _run(tmp_path)
    outside = tmp_path / "outside.txt"
    outside.write_text("not the attempt's\n")
    (attempt / "zzz.log").write_text("listed\n")
    listed = sealing._files

    def listed_then_swapped(directory: Path) -> list[str]:
        names = listed(directory)
        (attempt / "zzz.log").unlink()
        if swap == "link":
            (attempt / "zzz.log").symlink_to(outside)
        else:
            os.mkfifo(attempt / "zzz.log")
        return names
    monkeypatch.setattr(sealing, "_files", listed_then_swapped)
    assert _seal(tmp_path, _rel(tmp_path, attempt), "--commit", COMMIT, *META) == 2
    err = capsys.readouterr().err
    assert "zzz.log" in err and "not sealed" in err
    assert not (tmp_path / "pairs" / PAIR / "period-1.json").exists()


def test_a_file_changing_as_it_is_hashed_or_a_record_place_taken_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A file written to while the seal hashes it would be pinned as neither what it was
    nor what it became; a link or a FIFO in the period record's place is neither read (out
    of the root, or a wait for ever) nor replaced."""
    import auditor.capture.seal as sealing

    attempt = _run(tmp_path)
    growing = attempt / "zzz.log"
    growing.write_text("first line\n")
    made = hashlib.sha256

    class Appending:
        def __init__(self) -> None:
            self.inner = made()

        def update(self, chunk: bytes) -> None:
            if chunk.startswith(b"first line"):  # (the writer goes on as it is read)
                with open(growing, "a") as handle:
                    handle.write("more\n")
            self.inner.update(chunk)

        def hexdigest(self) -> str:
            return self.inner.hexdigest()
    monkeypatch.setattr(sealing.hashlib, "sha256", Appending)
    assert _seal(tmp_path, _rel(tmp_path, attempt), "--commit", COMMIT, *META) == 2
    assert "changed while it was hashed" in capsys.readouterr().err
    monkeypatch.undo()
    record = tmp_path / "pairs" / PAIR / "period-1.json"
    record.parent.mkdir(parents=True)
    for taken in ("link", "fifo"):
        if taken == "link":
            record.symlink_to(tmp_path / "elsewhere.json")
        else:
            os.mkfifo(record)
        assert _seal(tmp_path, _rel(tmp_path, attempt), "--commit", COMMIT, *META) == 2
        assert "period-1.json" in capsys.readouterr().err
        assert record.is_symlink() or record.is_fifo()
        record.unlink()


@pytest.mark.parametrize("change", ["appended", "added"])
def test_a_file_written_after_it_was_hashed_while_the_seal_ran_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, change: str) -> None:
    """A straggler still writing the attempt: a file appended to (or one come) once it was
    hashed, while the seal hashed the others, was pinned as it was, the record then never
    to be sealed again (differently) once the writer stopped; refused now, naming it."""
    import auditor.capture.seal as sealing

    attempt = _run(tmp_path)
    early = attempt / "aaa-straggler.out"
    early.write_text("first line\n")
    (attempt / "zzz.log").write_text("last file hashed\n")
    made = hashlib.sha256

    class Writing:
        def __init__(self) -> None:
            self.inner = made()

        def update(self, chunk: bytes) -> None:
            if chunk.startswith(b"last file hashed"):  # (the straggler goes on meanwhile)
                if change == "appended":
                    with open(early, "a") as handle:
                        handle.write("more\n")
                else:
                    (attempt / "core.1234").write_bytes(b"core")
            self.inner.update(chunk)

        def hexdigest(self) -> str:
            return self.inner.hexdigest()
    monkeypatch.setattr(sealing.hashlib, "sha256", Writing)
    assert _seal(tmp_path, _rel(tmp_path, attempt), "--commit", COMMIT, *META) == 2
    err = capsys.readouterr().err
    assert ("aaa-straggler.out: written to while the attempt was sealed" in err
            if change == "appended" else "core.1234: came or went" in err), err
    assert not (tmp_path / "pairs" / PAIR / "period-1.json").exists()
    monkeypatch.undo()
    assert _seal(tmp_path, _rel(tmp_path, attempt), "--commit", COMMIT, *META) == 0


def _seal_process(root: Path, attempt: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "auditor", "seal", str(root), "--pair", PAIR, "--period", "1",
         "--gpus", "2", "--attempt-dir", attempt, "--commit", COMMIT, *META],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_seals_of_one_period_at_once_both_land(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's race (a job and its requeue sealed together lost an attempt in 3 of 20
    runs, both seals exiting 0): with the record's lock, every round keeps both, and no
    lock file is left beside the record."""
    first = _rel(tmp_path, _run(tmp_path, "5001", "oom"))
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    second = _rel(tmp_path, _run(tmp_path, "5001", "completed"))
    record = tmp_path / "pairs" / PAIR / "period-1.json"
    for _ in range(8):
        record.unlink(missing_ok=True)
        seals = [_seal_process(tmp_path, first), _seal_process(tmp_path, second)]
        for process in seals:
            _, err = process.communicate(timeout=60)
            assert process.returncode == 0, err
        assert [a["attempt_dir"] for a in load(record)["attempts"]] == [first, second]
        assert sorted(os.listdir(record.parent)) == ["period-1.json"]


def test_a_seal_waits_for_the_record_lock(tmp_path: Path) -> None:
    """A seal that finds the record locked (another seal writing it) waits, then reads
    what that one wrote: the lock is an flock on .period-N.json.lock beside the record."""
    import fcntl
    import time

    rel = _rel(tmp_path, _run(tmp_path))
    folder = tmp_path / "pairs" / PAIR
    folder.mkdir(parents=True)
    with open(folder / ".period-1.json.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        waiting = _seal_process(tmp_path, rel)
        time.sleep(1.5)
        assert waiting.poll() is None and not (folder / "period-1.json").exists()
        fcntl.flock(lock, fcntl.LOCK_UN)
    _, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 0, err
    assert load(folder / "period-1.json")["attempt_dir"] == rel


def test_a_killed_seals_temporary_is_removed_by_the_next(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A seal SIGKILLed inside its atomic write leaves ``.period-N.json.tmp-PID`` (a stray
    file the audit would flag); the next seal of the period removes it and says so."""
    rel = _rel(tmp_path, _run(tmp_path))
    folder = tmp_path / "pairs" / PAIR
    folder.mkdir(parents=True)
    killed = subprocess.Popen([sys.executable, "-c", "import os, time; time.sleep(60)"])
    (folder / f".period-1.json.tmp-{killed.pid}").write_text('{"half": ')
    killed.kill()
    killed.wait()
    (folder / ".period-2.json.tmp-1").write_text("another period's: left alone")
    capsys.readouterr()
    assert _seal(tmp_path, rel, "--commit", COMMIT, *META) == 0
    assert f".period-1.json.tmp-{killed.pid}" in capsys.readouterr().err
    assert sorted(os.listdir(folder)) == [".period-2.json.tmp-1", "period-1.json"]


def test_a_file_system_without_locks_refuses_the_seal_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Lustre mounted without ``-o flock`` answers flock with ENOSYS: the seal refuses
    (exit 2, one line saying how to mount) rather than write the record unlocked."""
    import errno
    import fcntl

    rel = _rel(tmp_path, _run(tmp_path))

    def no_locks(*_: object) -> None:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    capsys.readouterr()
    assert _seal(tmp_path, rel, "--commit", COMMIT, *META) == 2
    err = capsys.readouterr().err
    assert "cannot lock the period record" in err and "-o flock" in err
    assert err.count("\n") == 1
    assert not (tmp_path / "pairs" / PAIR / "period-1.json").exists()


def test_a_record_the_disk_cannot_take_is_named_in_the_one_line(tmp_path: Path) -> None:
    """A full disk (here: a file-size limit the record is over) as the record is written:
    the line names the record ('seal: ROOT: No space left on device' named the root)."""
    import resource
    import signal as signals

    rel = _rel(tmp_path, _run(tmp_path))

    def limited() -> None:
        signals.signal(signals.SIGXFSZ, signals.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (512, 512))

    done = subprocess.run(
        [sys.executable, "-m", "auditor", "seal", str(tmp_path), "--pair", PAIR, "--period",
         "1", "--gpus", "2", "--attempt-dir", rel, "--commit", COMMIT, *META],
        capture_output=True, text=True, timeout=120, preexec_fn=limited, check=False)
    assert done.returncode == 2, done.stderr
    assert f"pairs/{PAIR}/period-1.json" in done.stderr and done.stderr.count("\n") == 1
    assert not (tmp_path / "pairs" / PAIR / "period-1.json").exists()


@pytest.mark.parametrize("which", ["trial", "device", "trace"])
def test_a_file_nested_past_recursion_is_refused_or_skipped_never_a_crash(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], which: str) -> None:
    """A JSON document nested past the interpreter's recursion in the attempt (a hostile or
    broken worker's) ended the seal in an internal error (exit 3): the trial record is now
    refused as unreadable in one line, and a worker's file gives no worker, as a malformed
    one does (the audit names it)."""
    attempt = _run(tmp_path)
    capsys.readouterr()  # (the run's own lines)
    deep = "[" * 100_000 + "]" * 100_000
    if which == "trial":
        (attempt / "trial-5001.json").write_text(deep)
    elif which == "device":
        next((attempt / "device-evidence").iterdir()).write_text(deep)
    else:
        next((attempt / "allocator-traces").iterdir()).write_text(deep + "\n")
    code = _seal(tmp_path, _rel(tmp_path, attempt), "--commit", COMMIT, *META)
    err = capsys.readouterr().err
    assert code == (2 if which == "trial" else 0), err
    assert "internal error" not in err and "Traceback" not in err
    if which == "trial":
        assert "trial-5001.json: not a readable JSON object" in err and err.count("\n") == 1


def test_a_period_record_the_audit_would_refuse_is_not_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Review T: an attempt of 100,000 files sealed into a 19.6 MB record, over the 16 MiB
    the audit parses: the audit then called the period unreadable and its files unlisted.
    Seal refuses what the audit would refuse, by the audit's own limit (here made small, as
    a real one needs some 90,000 files)."""
    from auditor.capture import seal
    from auditor.collect import jsondoc
    from auditor.model.kinds import DOCUMENT_LIMIT

    assert jsondoc.DEFAULT_LIMIT == seal.DOCUMENT_LIMIT == DOCUMENT_LIMIT  # (one limit)
    rel = _rel(tmp_path, _run(tmp_path))
    monkeypatch.setattr(seal, "DOCUMENT_LIMIT", 500)
    capsys.readouterr()
    assert _seal(tmp_path, rel, "--commit", COMMIT, *META) == 2
    err = capsys.readouterr().err
    assert "over the 500 bytes the audit reads" in err and "files listed" in err
    assert not (tmp_path / "pairs" / PAIR / "period-1.json").exists()
    monkeypatch.undo()
    assert _seal(tmp_path, rel, "--commit", COMMIT, *META) == 0


def test_a_step_still_writing_without_its_record_is_not_sealed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Review R: a step on another node still ran (its output growing, no process record
    yet) when the batch node sealed: the attempt was pinned as it was, the audit then found
    its output changed, and the period could never be sealed again. Seal watches such an
    output a moment and refuses while it grows; once the step is quiet, it seals."""
    import threading
    import time

    rel = _rel(tmp_path, _run(tmp_path))
    host = socket.gethostname().split(".", 1)[0]
    output = tmp_path / rel / "worker-logs" / f"{host}-rollout-4242.out"
    output.parent.mkdir(exist_ok=True)
    output.write_text("draining\n")
    stop = threading.Event()

    def write() -> None:
        while not stop.is_set():
            with output.open("a") as handle:
                handle.write("draining\n")
            time.sleep(0.3)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        capsys.readouterr()
        assert _seal(tmp_path, rel, "--commit", COMMIT, *META) == 2
        err = capsys.readouterr().err
        assert "rollout-4242.out: a step's output, written to while the seal looked" in err
        assert not (tmp_path / "pairs" / PAIR / "period-1.json").exists()
    finally:
        stop.set()
        writer.join()
    assert _seal(tmp_path, rel, "--commit", COMMIT, *META) == 0  # (quiet: its end unknown)
