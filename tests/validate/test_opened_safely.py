"""Files opened, not checked then opened (issue 41, item 3): every evidence file is opened
below the root's descriptor without following a link, never waited on as a FIFO, checked
with ``fstat`` and read no further than its listed size plus one block. The races are run
for real: a thread swaps a listed file while audits read it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest

from auditor._io import CHUNK_SIZE
from auditor.collect.attempt import read_attempt
from auditor.model import AttemptTask, FileTask
from tests.helpers import audit, copy_example, find

SECRET = "SECRET-OUTSIDE-THE-ROOT"


def _rows(out: Path) -> dict[str, tuple[str, str]]:
    table = pd.read_parquet(out / "evidence.parquet")
    return {path: (status, detail) for path, status, detail
            in zip(table["path"], table["status"], table["detail"], strict=True)}


_SWAPPER = """
import os, sys, time
target, keep, bad, good, kind, secret = sys.argv[1:]
while True:
    os.symlink(secret, bad) if kind == "link" else os.mkfifo(bad)
    os.replace(bad, target)
    time.sleep(0.0002)
    os.link(keep, good)
    os.replace(good, target)
    time.sleep(0.0002)
"""


@contextmanager
def _swapping(target: Path, kind: str, secret: Path | None = None) -> Iterator[None]:
    """Another process swapping ``target`` for a link to ``secret`` or a FIFO (``kind``) and
    back, by rename, until the block ends: the race of a hostile file system, on its own
    core. The file is itself again afterwards."""
    keep = target.with_name(target.name + ".keep")
    os.link(target, keep)
    bad, good = target.with_name(".bad"), target.with_name(".good")
    swapper = subprocess.Popen([sys.executable, "-c", _SWAPPER, str(target), str(keep),
                                str(bad), str(good), kind, str(secret)])
    try:
        yield
    finally:
        swapper.kill()
        swapper.wait()
        for leftover in (bad, good):
            leftover.unlink(missing_ok=True)
        os.replace(keep, target)


def _secret_log(tmp_path: Path, root: Path) -> tuple[Path, Path]:
    """A training log of the study whose failure a report quotes, and, outside the root,
    its copy with every line marked secret: a link could lead there."""
    log = root / find(root, "host-qwen25-7b-code_heavy_tail-c2-s161-2gpu/attempt-*/"
                            "training-*.log")
    secret = tmp_path / "secret.log"
    secret.write_text("".join(f"{SECRET} {line}" for line in log.read_text().splitlines(True)))
    return log, secret


def test_a_file_swapped_for_a_link_out_of_the_root_is_never_read(tmp_path: Path) -> None:
    """The issue's race: with the check then the open, 18 of 40 audits quoted the outside
    file into diagnostic.md. Now the open refuses a link the check did not see."""
    root = copy_example(tmp_path)
    log, secret = _secret_log(tmp_path, root)
    with _swapping(log, "link", secret):
        for run in range(12):
            out = tmp_path / f"out-{run}"
            audit(root, out, "--jobs", str(1 + run % 2))
            for path in out.iterdir():
                assert SECRET.encode() not in path.read_bytes(), (run, path.name)


def test_a_file_swapped_for_a_fifo_never_hangs_the_audit(tmp_path: Path) -> None:
    """The issue's other race: a FIFO put in a listed file's place hung 6 of 22 audits."""
    root = copy_example(tmp_path)
    log = root / find(root, "host-qwen25-7b-math-c2-s161-4gpu/attempt-*/training-*.log")
    with _swapping(log, "fifo"):
        for run in range(8):
            done = subprocess.run(
                [sys.executable, "-m", "auditor", "audit", str(root), "--out",
                 str(tmp_path / f"out-{run}"), "--quiet", "--no-plots", "--jobs", "1"],
                timeout=120, capture_output=True, text=True, check=False)
            assert done.returncode == 0, done.stderr


def test_a_file_grown_past_its_listing_is_read_no_further(tmp_path: Path) -> None:
    """A listed file that grew (three blocks past its listed size) is read to its listed
    size plus one block, and is an unreadable row saying so; a file that grows without
    end is never read for ever."""
    root = copy_example(tmp_path)
    rel = find(root, "host-qwen25-7b-math-c2-s161-4gpu/attempt-*/allocator-traces/*.jsonl")
    listed = (root / rel).stat().st_size
    with (root / rel).open("ab") as handle:
        handle.write(b"\n" * (3 * CHUNK_SIZE))
    audit(root, tmp_path / "out")
    status, detail = _rows(tmp_path / "out")[rel]
    assert status == "unreadable"
    assert f"read no further than {listed + CHUNK_SIZE:,} bytes" in detail


def test_a_file_that_keeps_growing_ends_the_read(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    rel = find(root, "host-qwen25-7b-math-c2-s161-4gpu/attempt-*/training-*.log")
    stop = threading.Event()

    def grow() -> None:
        with (root / rel).open("ab") as handle:
            while not stop.is_set():
                handle.write(b"step:1 - more\n" * 4096)
                handle.flush()

    thread = threading.Thread(target=grow, daemon=True)
    thread.start()
    try:
        audit(root, tmp_path / "out")
    finally:
        stop.set()
        thread.join()
    status, detail = _rows(tmp_path / "out")[rel]
    assert status == "unreadable"
    assert "larger than its listed size" in detail or "changed while" in detail


@pytest.mark.parametrize("swap", ["file", "directory"])
def test_a_link_where_the_check_saw_none_is_refused_by_the_reader(
        tmp_path: Path, swap: str) -> None:
    """The reader's own guarantee, without a race: a task's path (checked when planned)
    whose file, or a directory on its way, became a link is refused, not followed."""
    (tmp_path / "root" / "a" / "traces").mkdir(parents=True)
    outside = tmp_path / "outside"
    (outside / "traces").mkdir(parents=True)
    (outside / "traces" / "t.jsonl").write_text(f'{{"{SECRET}": 1}}\n')
    rel = "a/traces/t.jsonl"
    if swap == "file":
        (tmp_path / "root" / rel).symlink_to(outside / "traces" / "t.jsonl")
    else:
        (tmp_path / "root" / "a" / "traces").rmdir()
        (tmp_path / "root" / "a" / "traces").symlink_to(outside / "traces")
    task = AttemptTask("pair/period-1#1", str(tmp_path / "root"),
                       (FileTask(rel, "allocator_trace", None, 20),), "TOTAL_TRAINING_STEPS",
                       None)
    read = read_attempt(task)
    assert read.files[0].digest is None
    assert "not followed" in read.files[0].error
    assert read.traces == ()


def test_a_log_cut_at_its_listed_size_is_not_said_to_end_mid_line(tmp_path: Path) -> None:
    """Review T: a log past its listed size is read no further (``AUD104`` says so); the
    audit's own cut then fell inside a line, and ``AUD017`` blamed the writer for a log
    "cut while it was being written". Only the audit's word stands."""
    root = copy_example(tmp_path)
    rel = find(root, "*/attempt-*/training-*.log")
    with (root / rel).open("ab") as handle:
        handle.write(b"step:1 - a line of the log that goes on\n" * (2 * CHUNK_SIZE // 40))
    audit(root, tmp_path / "out")
    findings = pd.read_parquet(tmp_path / "out" / "findings.parquet")
    said = findings[findings["path"] == rel]["rule_id"].tolist()
    assert "AUD104" in said and "AUD017" not in said


def test_a_trial_records_environment_is_kept_only_where_the_audit_reads_it(
        tmp_path: Path) -> None:
    """Review T: a trial record whose ``env`` held a million variables (under the 16 MiB
    limit) was kept whole through the audit, 175 MB a record. Only the entries the audit
    reads (the coordinated-shutdown flag, the step count's key) are kept."""
    import json

    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    env = {f"VAR_{n}": "x" * 10 for n in range(50_000)}
    env["COSMOS_SHUTDOWN_ON_NO_POLICY_REPLICAS"] = "1"
    data = json.dumps({"job_id": "1", "env": env, "invocation": {"exit_code": 0}}).encode()
    (root / "a" / "trial-1.json").write_bytes(data)
    task = AttemptTask("pair/period-1#1", str(root),
                       (FileTask("a/trial-1.json", "trial", None, len(data)),),
                       "TOTAL_TRAINING_STEPS", None,
                       env_keys=("COSMOS_SHUTDOWN_ON_NO_POLICY_REPLICAS", "TOTAL_TRAINING_STEPS"))
    trial = read_attempt(task).trial
    assert trial is not None
    assert trial.env == (("COSMOS_SHUTDOWN_ON_NO_POLICY_REPLICAS", "1"),)
