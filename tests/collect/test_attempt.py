"""read_attempt and hash_only: what a file that cannot be read gives (never an exception)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from auditor.collect.attempt import hash_only, read_attempt
from auditor.model import AttemptTask, FileOutcome, FileTask


def _task(root: Path, *files: FileTask) -> AttemptTask:
    return AttemptTask("pair/period-1#1", str(root), files, "TOTAL_TRAINING_STEPS", None)


def test_a_directory_or_a_missing_file_is_an_outcome_with_why(tmp_path: Path) -> None:
    (tmp_path / "a" / "trial-1.json").mkdir(parents=True)
    (tmp_path / "a" / "training-1.log").write_bytes(b"step:1 - training/global_step:1\n")
    read = read_attempt(_task(
        tmp_path, FileTask("a/trial-1.json", "trial", None),
        FileTask("a/gone.jsonl", "allocator_trace", None),
        FileTask("a/training-1.log", "training_log", None)))
    by_name = {outcome.display: outcome for outcome in read.files}
    assert by_name["a/trial-1.json"] == FileOutcome("a/trial-1.json", "trial", None,
                                                    "Is a directory")
    assert by_name["a/gone.jsonl"] == FileOutcome("a/gone.jsonl", "allocator_trace", None,
                                                  "No such file or directory")
    assert read.trial is None and read.traces == ()
    log = by_name["a/training-1.log"].digest
    assert log is not None and log.size == 32
    assert log.sha256 == hashlib.sha256(b"step:1 - training/global_step:1\n").hexdigest()
    assert read.log is not None and read.log.lines == 1


def test_hash_only_of_a_directory_or_a_missing_file(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "f").write_bytes(b"x" * 70_000)
    assert hash_only(str(tmp_path), FileTask("d", "other", str(tmp_path / "d"))).error \
        == "Is a directory"
    assert hash_only(str(tmp_path), FileTask("g", "other", str(tmp_path / "g"))).error \
        == "No such file or directory"
    digest = hash_only(str(tmp_path), FileTask("f", "other", str(tmp_path / "f"))).digest
    assert digest is not None and digest.size == 70_000
    assert digest.sha256 == hashlib.sha256(b"x" * 70_000).hexdigest()
