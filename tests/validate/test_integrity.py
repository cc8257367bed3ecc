"""Validate: every listed file verified against its manifest, and nothing outside the root read."""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pandas as pd
import pytest

from auditor._cli import main
from auditor.model.paths import join_text
from auditor.pipeline.audit import AuditOptions, run_audit
from tests.helpers import (
    audit,
    copy_example,
    edit_json,
    edit_record,
    find,
    period_records,
    rewrite,
    snapshot,
    verdicts,
)


def _evidence(out: Path) -> dict[str, str]:
    table = pd.read_parquet(out / "evidence.parquet")
    return dict(zip(table["path"], table["status"], strict=True))


@contextlib.contextmanager
def _opened_files() -> Iterator[list[str]]:
    """Every path passed to ``open`` or ``os.open`` inside the block, in this process and in
    the workers it forks meanwhile (each writes its paths to one log, appending); the list
    is filled as the block ends."""
    opened: list[str] = []
    real_open = builtins.open
    real_os_open = os.open
    log_fd, log_path = tempfile.mkstemp(prefix="opened-", suffix=".log")
    os.close(log_fd)
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND)

    def note(file: Any) -> None:
        path = os.fspath(file) if isinstance(file, (str, bytes, os.PathLike)) else ""
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        os.write(log, path.encode("utf-8", "surrogateescape") + b"\0")

    def spy(file: Any, *args: Any, **kwargs: Any) -> Any:
        note(file)
        return real_open(file, *args, **kwargs)

    def os_spy(file: Any, *args: Any, **kwargs: Any) -> Any:
        directory = kwargs.get("dir_fd")
        if directory is not None:  # (opened below a directory's descriptor: noted whole)
            file = f"{os.readlink(f'/proc/self/fd/{directory}')}/{os.fspath(file)}"
        note(file)
        return real_os_open(file if directory is None else os.path.basename(file),
                            *args, **kwargs)

    builtins.open = spy
    os.open = os_spy  # type: ignore[assignment]
    try:
        yield opened
    finally:
        builtins.open = real_open
        os.open = real_os_open
        os.close(log)
        with real_open(log_path, "rb") as handle:
            opened.extend(p.decode("utf-8", "surrogateescape")
                          for p in handle.read().split(b"\0")[:-1])
        os.unlink(log_path)


def test_damaged_study_reports_each_file_with_its_status(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    altered = find(root, "host-qwen25-7b-gsm8k-c2-s161-4gpu/attempt-*/allocator-traces/*.jsonl")
    rewrite(root, altered, lambda b: b.replace(b'"step":1', b'"step":2', 1),
            update_manifest=False)
    deleted = find(root, "host-qwen25-7b-math-c2-s162-2gpu/attempt-*/device-evidence/*.json")
    (root / deleted).unlink()
    unlisted = "host-qwen25-7b-math-c2-s161-4gpu/attempt-5055864/notes.txt"
    (root / unlisted).write_text("left behind\n")
    outside = tmp_path / "secret.json"
    outside.write_text('{"not": "evidence"}')
    escape_record = root / "pairs/host-qwen25-7b-code_heavy_tail-c2-s163/period-1.json"

    def escape(record: dict) -> None:
        record["evidence"][0]["path"] = "../../../secret.json"
        record["evidence"][1]["path"] = str(outside)

    edit_record(escape_record, escape)
    before = snapshot(root)
    with _opened_files() as opened:
        summary = audit(root, tmp_path / "out", "--jobs", "1")
    assert snapshot(root) == before
    assert not [p for p in opened if "secret" in p]

    status = _evidence(tmp_path / "out")
    assert status[altered] == "mismatched"
    assert status[deleted] == "missing"
    assert status[unlisted] == "unlisted"
    unsafe = [p for p, s in status.items() if s == "unsafe"]
    assert len(unsafe) == 2
    integrity = summary["integrity"]
    assert (integrity["mismatched"], integrity["missing"], integrity["unlisted"],
            integrity["unsafe_paths"]) == (1, 1, 3, 2)  # the two redirected files are unlisted
    by_period = verdicts(summary)
    assert by_period["host-qwen25-7b-gsm8k-c2-s161/period-2"] == ("unresolved",
                                                                  "evidence_mismatch")
    assert by_period["host-qwen25-7b-math-c2-s162/period-1"] == ("unresolved",
                                                                 "evidence_missing")
    assert by_period["host-qwen25-7b-code_heavy_tail-c2-s163/period-1"] == (
        "unresolved", "evidence_unsafe")
    assert summary["gate"]["passed"] is False
    assert summary["gate_allow_partial"]["passed"] is False  # evidence is not intact
    # the report names every affected file and period on its first screen
    first_screen = "\n".join((tmp_path / "out" / "diagnostic.md").read_text()
                             .splitlines()[:60])  # (v1.2: the first 60 lines)
    for path in (altered, deleted, unlisted):
        assert f"`{path}`" in first_screen  # (a code span: no escapes)
    for subject in ("gsm8k-c2-s161/period-2", "math-c2-s162/period-1",
                    "code_heavy_tail-c2-s163/period-1"):
        assert f"{subject}`" in first_screen
    # ...and counts them as the integrity table does: the listed files that failed, then
    # those no period record lists (not one count of both)
    assert ("4 listed evidence files failed verification; the periods concerned cannot "
            "resolve. 3 files beside the evidence are listed by no period record.") \
        in first_screen
    # a file no record lists is read too: pinned as an input, so verify re-checks it
    manifest = orjson.loads((tmp_path / "out" / "output_manifest.json").read_bytes())
    pinned = {entry["path"]: entry["sha256"] for entry in manifest["raw_evidence"]}
    assert pinned[unlisted] == hashlib.sha256(b"left behind\n").hexdigest()
    (root / unlisted).write_text("changed since\n")
    assert main(["verify", str(tmp_path / "out")]) == 1


def test_link_out_of_the_root_is_unsafe_and_never_read(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    rel = find(root, "host-qwen25-7b-gsm8k-c2-s162-4gpu/attempt-*/trial-*.json")
    target = tmp_path / "elsewhere.json"
    target.write_bytes((root / rel).read_bytes())
    (root / rel).unlink()
    (root / rel).symlink_to(target)
    summary = audit(root, tmp_path / "out")
    assert _evidence(tmp_path / "out")[rel] == "unsafe"
    assert verdicts(summary)["host-qwen25-7b-gsm8k-c2-s162/period-1"] == (
        "unresolved", "evidence_unsafe")


@pytest.mark.parametrize("jobs", ["1", "2"])
@pytest.mark.parametrize("linked", ["attempt directory", "its parent"])
def test_attempt_directory_linked_out_of_the_root_is_never_read(
        tmp_path: Path, linked: str, jobs: str) -> None:
    """Every file a period lists under a directory that is a link leading out of the root
    is unsafe and never opened, whichever directory on the way is the link, whether the
    period is read in this process or in a worker."""
    root = copy_example(tmp_path)
    trial = find(root, "host-qwen25-7b-gsm8k-c2-s162-4gpu/attempt-*/trial-*.json")
    top, attempt = trial.split("/")[:2]
    moved = root / top / attempt if linked == "attempt directory" else root / top
    secret = tmp_path / "secret-evidence"
    secret.mkdir()
    moved.rename(secret / moved.name)
    moved.symlink_to(secret / moved.name)
    with _opened_files() as opened:
        summary = audit(root, tmp_path / "out", "--jobs", jobs)
    assert [p for p in opened if p.endswith(".jsonl")]  # (the spy sees every reader)
    assert not [p for p in opened if "secret" in p]
    status = _evidence(tmp_path / "out")
    under = {path: value for path, value in status.items()
             if path.startswith(f"{top}/{attempt}/")}
    assert trial in under
    assert set(under.values()) == {"unsafe"}, under
    assert verdicts(summary)["host-qwen25-7b-gsm8k-c2-s162/period-1"] == (
        "unresolved", "evidence_unsafe")


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_files_in_attempt_directories_no_period_reads_are_unlisted(
        tmp_path: Path, jobs: str) -> None:
    """Files below an attempt directory that no period names, or names only through a link
    (its files are then read through the link, and found again under their real path),
    are each hashed and reported unlisted, with the directory itself."""
    root = copy_example(tmp_path)
    trial = find(root, "host-qwen25-7b-math-c2-s162-2gpu/attempt-*/trial-*.json")
    top, attempt = trial.split("/")[:2]
    (root / top / attempt).rename(root / top / "attempt-real")
    (root / top / attempt).symlink_to("attempt-real")
    orphan = root / "host-qwen25-7b-gsm8k-c2-s161-2gpu" / "attempt-999"
    orphan.mkdir()
    (orphan / "left.log").write_text("left behind\n")
    (orphan / "odd\\name.txt").write_text("a backslash is part of this name\n")
    audit(root, tmp_path / "out", "--jobs", jobs)
    status = _evidence(tmp_path / "out")
    through_link = {p: s for p, s in status.items() if p.startswith(f"{top}/{attempt}/")}
    real = {p: s for p, s in status.items() if p.startswith(f"{top}/attempt-real/")}
    assert through_link and set(through_link.values()) == {"verified"}
    assert real == {p.replace(f"/{attempt}/", "/attempt-real/"): "unlisted"
                    for p in through_link}
    orphan_rel = "host-qwen25-7b-gsm8k-c2-s161-2gpu/attempt-999"
    assert status[f"{orphan_rel}/left.log"] == "unlisted"
    findings = pd.read_parquet(tmp_path / "out" / "findings.parquet")
    unreferenced = set(findings[findings["rule_id"] == "AUD106"]["subject"])
    assert unreferenced == {orphan_rel, f"{top}/attempt-real"}
    table = pd.read_parquet(tmp_path / "out" / "evidence.parquet").set_index("path")
    assert table.loc[f"{orphan_rel}/left.log", "size"] == len("left behind\n")
    odd = table.loc[f"{orphan_rel}/odd\\name.txt"]  # its name as it is, hashed
    assert (odd["status"], odd["size"], odd["detail"]) == (
        "unlisted", len("a backslash is part of this name\n"), "")


def test_period_record_linked_out_of_the_root_is_never_read(tmp_path: Path) -> None:
    """A period record that is a link leading outside the root is refused unread (AUD011);
    one linked to a file inside the root is read as before."""
    root = copy_example(tmp_path)
    records = sorted((root / "pairs").glob("*/period-*.json"))
    outside, inside = records[0], records[1]
    secret = tmp_path / "secret-period.json"
    secret.write_bytes(outside.read_bytes())
    outside.unlink()
    outside.symlink_to(secret)
    kept = root / "accounting" / "kept-period.json"
    kept.write_bytes(inside.read_bytes())
    inside.unlink()
    inside.symlink_to(kept)
    with _opened_files() as opened:
        audit(root, tmp_path / "out", "--jobs", "1")
    assert not [p for p in opened if "secret" in p]
    findings = pd.read_parquet(tmp_path / "out" / "findings.parquet")
    refused = findings[findings["rule_id"] == "AUD011"]
    subject = str(outside.relative_to(root))
    assert list(refused["subject"]) == [subject], refused
    assert "unsafe" in refused["message"].iloc[0]
    assert str(kept) in opened


def test_link_loop_and_directory_are_unreadable(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    loop = find(root, "host-qwen25-7b-math-c2-s161-4gpu/attempt-*/training-*.log")
    (root / loop).unlink()
    (root / loop).symlink_to(root / loop)
    folder = find(root, "host-qwen25-7b-math-c2-s161-4gpu/attempt-*/trial-*.json")
    (root / folder).unlink()
    (root / folder).mkdir()
    audit(root, tmp_path / "out")
    status = _evidence(tmp_path / "out")
    assert status[loop] == "unreadable"
    assert status[folder] == "unreadable"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files without read permission")
def test_file_without_permission_is_unreadable(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    rel = find(root, "host-qwen25-7b-math-c2-s161-4gpu/attempt-*/trial-*.json")
    (root / rel).chmod(0)
    audit(root, tmp_path / "out")
    assert _evidence(tmp_path / "out")[rel] == "unreadable"


@pytest.mark.parametrize("damage", ["not json", "a directory"])
def test_unparseable_period_record_still_counts(tmp_path: Path, damage: str) -> None:
    """Nothing found on disk drops out: a record that is no JSON, or a directory in its
    place (the walk once went into it and the period vanished from every output)."""
    root = copy_example(tmp_path)
    record = root / "pairs/host-qwen25-7b-math-c2-s161/period-2.json"
    if damage == "not json":
        record.write_bytes(b"{not json")
    else:
        record.unlink()
        (record / "inside").mkdir(parents=True)
        (record / "inside" / "note.txt").write_text("a file inside\n")
    summary = audit(root, tmp_path / "out")
    assert summary["launches"] == 17
    assert verdicts(summary)["host-qwen25-7b-math-c2-s161/period-2"] == (
        "unresolved", "period_record_unreadable")
    assert len(summary["periods"]) == 18
    integrity = summary["integrity"]  # (the record is listed evidence that failed)
    assert (integrity["unreadable"], integrity["period_records_unreadable"]) == (1, 1)
    assert integrity["verified"] == integrity["files_listed"] - 1
    assert summary["gate_allow_partial"]["passed"] is False
    problems = (tmp_path / "out" / "diagnostic.md").read_text().split(
        "## Evidence problems", 1)[1].split("\n## ", 1)[0]
    assert "1 period record could not be read; the periods concerned cannot resolve." \
        in problems
    assert "Affected periods: `host-qwen25-7b-math-c2-s161/period-2`." in problems


def test_identity_mismatch_blocks_the_period(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    device = find(root, "host-qwen25-7b-gsm8k-c2-s161-2gpu/attempt-*/device-evidence/"
                        "worker-actor_rollout-1-*.json")

    def wrong_rank(doc: dict) -> None:
        doc["rank"] = 0

    edit_json(root, device, wrong_rank)
    summary = audit(root, tmp_path / "out")
    assert verdicts(summary)["host-qwen25-7b-gsm8k-c2-s161/period-1"] == (
        "unresolved", "identity_mismatch")


def test_shared_gpu_and_job_id_disagreement(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    devices = sorted((root / "host-qwen25-7b-math-c2-s163-4gpu").glob(
        "attempt-*/device-evidence/*.json"))
    uuid = orjson.loads(devices[0].read_bytes())["gpu"]["uuid"]

    def same_gpu(doc: dict) -> None:
        doc["gpu"]["uuid"] = uuid

    edit_json(root, devices[1].relative_to(root).as_posix(), same_gpu)

    def other_job(doc: dict) -> None:
        doc["job_id"] = "999"

    trial = find(root, "host-qwen25-7b-math-c2-s162-4gpu/attempt-*/trial-*.json")
    edit_json(root, trial, other_job)
    audit(root, tmp_path / "out")
    findings = pd.read_parquet(tmp_path / "out" / "findings.parquet")
    shared = findings[findings["rule_id"] == "AUD113"]
    assert list(shared["subject"]) == ["host-qwen25-7b-math-c2-s163/period-1"]
    jobs = findings[findings["rule_id"] == "AUD111"]
    assert "host-qwen25-7b-math-c2-s162/period-2" in set(jobs["subject"])
    assert "999" in " ".join(jobs["message"])


def test_one_gpu_named_in_two_cases_is_still_shared(tmp_path: Path) -> None:
    """A GPU's uuid is hex: the same GPU written ``GPU-ABC...`` by one rank and ``GPU-abc...``
    by another (a hand-edited or re-encoded file) is still two ranks on one GPU."""
    root = copy_example(tmp_path)
    devices = sorted((root / "host-qwen25-7b-math-c2-s163-4gpu").glob(
        "attempt-*/device-evidence/*.json"))
    uuid = orjson.loads(devices[0].read_bytes())["gpu"]["uuid"]
    assert uuid != uuid.upper()

    def same_gpu(doc: dict) -> None:
        doc["gpu"]["uuid"] = uuid.upper()

    edit_json(root, devices[1].relative_to(root).as_posix(), same_gpu)
    summary = audit(root, tmp_path / "out")
    findings = pd.read_parquet(tmp_path / "out" / "findings.parquet")
    shared = findings[findings["rule_id"] == "AUD113"]
    assert list(shared["subject"]) == ["host-qwen25-7b-math-c2-s163/period-1"]
    assert verdicts(summary)["host-qwen25-7b-math-c2-s163/period-1"][0] == "unresolved"


def test_timeline_outside_invocation(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    trial = find(root, "host-qwen25-7b-gsm8k-c2-s163-4gpu/attempt-*/trial-*.json")

    def late_start(doc: dict) -> None:
        doc["invocation"]["started_ns"] = doc["invocation"]["finished_ns"] - 1_000_000_000

    edit_json(root, trial, late_start)
    summary = audit(root, tmp_path / "out")
    assert verdicts(summary)["host-qwen25-7b-gsm8k-c2-s163/period-2"] == (
        "unresolved", "timeline_inconsistent")


def test_idle_check_failure_and_commit_mismatch(tmp_path: Path) -> None:
    root = copy_example(tmp_path)

    def busy(record: dict) -> None:
        record["idle_check"]["passed"] = False

    def other_commit(record: dict) -> None:
        record["commit"] = "0" * 40

    edit_record(root / "pairs/host-qwen25-7b-math-c2-s163/period-1.json", busy)
    edit_record(root / "pairs/host-qwen25-7b-math-c2-s161/period-1.json", other_commit)
    summary = audit(root, tmp_path / "out")
    by_period = verdicts(summary)
    assert by_period["host-qwen25-7b-math-c2-s163/period-1"] == ("unresolved",
                                                                 "idle_check_failed")
    assert by_period["host-qwen25-7b-math-c2-s161/period-1"] == ("unresolved",
                                                                 "commit_mismatch")


def test_anchors_checked_against_protocol_inputs(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    frozen = tmp_path / "freeze.json"
    frozen.write_text('{"frozen": true}\n')
    import hashlib

    good = hashlib.sha256(frozen.read_bytes()).hexdigest()
    summary = audit(root, tmp_path / "ok", "--anchor", f"freeze={good}",
                    "--protocol-input", f"freeze={frozen}")
    assert summary["gate_allow_partial"]["passed"] is True
    manifest = orjson.loads((tmp_path / "ok" / "output_manifest.json").read_bytes())
    assert [i["path"] for i in manifest["protocol_inputs"]] == ["freeze"]
    summary = audit(root, tmp_path / "bad", "--anchor", f"freeze={'0' * 64}",
                    "--protocol-input", f"freeze={frozen}")
    assert summary["gate_allow_partial"]["passed"] is False
    assert any("anchor freeze" in r for r in summary["gate_allow_partial"]["reasons"])


def test_source_inputs_are_hashed_into_the_manifest(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    source = tmp_path / "src"
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "trainer.py").write_text("def train():\n    pass\n")
    audit(root, tmp_path / "out", "--source-root", str(source), "--source", "pkg/trainer.py")
    manifest = orjson.loads((tmp_path / "out" / "output_manifest.json").read_bytes())
    assert [i["path"] for i in manifest["source_inputs"]] == ["pkg/trainer.py"]
    assert "pkg/trainer.py" in (tmp_path / "out" / "diagnostic.md").read_text()


def test_library_api_matches_cli(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    result = run_audit(root, AuditOptions(jobs=1))
    kinds = sorted(v.verdict.value for v in result.verdicts)
    assert kinds.count("failed") == 9 and kinds.count("unresolved") == 9
    assert all(v.diagnosis and v.limits for v in result.verdicts)
    assert all(f.citations or f.rule_id in ("AUD215",) for f in result.findings
               if f.severity.value == "error")


def test_verify_passes_then_catches_changes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = copy_example(tmp_path)
    out = tmp_path / "out"
    audit(root, out)
    assert main(["verify", str(out)]) == 0
    summary = out / "summary.json"
    summary.write_bytes(summary.read_bytes().replace(b'"launches": 18', b'"launches": 19'))
    assert main(["verify", str(out)]) == 1
    assert "changed: outputs/summary.json" in capsys.readouterr().out
    out2 = tmp_path / "out2"
    audit(root, out2)
    trace = next(root.glob("*/attempt-*/allocator-traces/*.jsonl"))
    trace.write_bytes(trace.read_bytes() + b"\n")
    assert main(["verify", str(out2)]) == 1
    printed = capsys.readouterr().out
    assert "changed: raw_evidence/" in printed and trace.name in printed
    (out2 / "extra.txt").write_text("x")
    (out2 / "diagnostic.md").unlink()
    assert main(["verify", str(out2)]) == 1
    printed = capsys.readouterr().out
    assert "added: outputs/extra.txt" in printed
    assert "missing: outputs/diagnostic.md" in printed


def test_verify_says_once_that_the_evidence_root_is_gone(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The study moved: one line names its root (there were 165 "missing" lines)."""
    root = copy_example(tmp_path)
    audit(root, tmp_path / "out")
    capsys.readouterr()
    root.rename(tmp_path / "moved")
    assert main(["verify", str(tmp_path / "out")]) == 1
    printed = capsys.readouterr().out.splitlines()
    assert printed == [f"missing: evidence root {root} (moved, deleted or no longer a "
                       "directory: none of the 165 evidence files read from it was checked)"]


def test_verify_refuses_a_directory_without_manifest(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "output_manifest.json" in err


def test_report_states_cross_check_outcomes(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    device = find(root, "host-qwen25-7b-gsm8k-c2-s161-2gpu/attempt-*/device-evidence/"
                        "worker-actor_rollout-1-*.json")
    edit_json(root, device, lambda doc: doc.__setitem__("rank", 0))
    audit(root, tmp_path / "out")
    text = (tmp_path / "out" / "diagnostic.md").read_text()
    assert "device file name and content: 1 finding (AUD110);" in text  # (the rule that fired)


def test_verify_never_reads_outside_the_output_directory(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    audit(copy_example(tmp_path), out)
    secret = tmp_path / "secret.txt"
    secret.write_text("not an output")
    manifest = orjson.loads((out / "output_manifest.json").read_bytes())
    manifest["outputs"].append({"path": "../secret.txt", "sha256": "0" * 64, "size": 13})
    (out / "output_manifest.json").write_bytes(orjson.dumps(manifest))
    with _opened_files() as opened:
        assert main(["verify", str(out)]) == 1
    assert "unsafe: outputs/../secret.txt" in capsys.readouterr().out
    assert not [p for p in opened if p.endswith("secret.txt")]


@pytest.mark.slow  # (a process is started, to have a pid that is dead)
def test_stale_staging_of_a_killed_audit_is_removed(tmp_path: Path) -> None:
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    stale = tmp_path / f".out.tmp-{dead}-abc"
    stale.mkdir()
    (stale / "summary.json").write_text("{half")
    live = tmp_path / f".out.tmp-{os.getpid()}-xyz"  # a running audit's: left alone
    live.mkdir()
    audit(copy_example(tmp_path), tmp_path / "out")
    assert not stale.exists()
    assert live.exists()


def test_failure_while_streaming_a_table_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An error in the middle of a streamed Parquet table (a row group written, the next
    failing) removes the staging directory, and an earlier audit's output stays whole."""
    from auditor.pipeline.audit import run_audit as run
    from auditor.report import output, tables

    root = copy_example(tmp_path)
    out = tmp_path / "out"
    audit(root, out)
    before = snapshot(out)
    result = run(root, AuditOptions(jobs=1))
    monkeypatch.setattr("auditor.store.tables.BATCH_ROWS", 10)
    monkeypatch.setattr(tables, "ROW_GROUP_ROWS", 10)
    calls = 0
    write_group = tables._write_group

    def failing(*args: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise OSError(28, "No space left on device")
        write_group(*args)

    monkeypatch.setattr(tables, "_write_group", failing)
    with pytest.raises(OSError):
        output.write_outputs(result, out, force=True, plots=False)
    assert calls == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "study"]
    assert snapshot(out) == before


def _reference_join(parts: tuple[str, ...]) -> str | None:
    if not parts:
        return None
    pieces: list[str] = []
    for part in parts:
        text = part.replace("\\", "/")
        if not text or text.startswith("/") or text[1:2] == ":":
            return None
        kept = [piece for piece in text.split("/") if piece not in ("", ".")]
        if ".." in kept:
            return None
        pieces.extend(kept)
    return "/".join(pieces) or None


def _texts(alphabet: str, longest: int) -> list[str]:
    return ["".join(chars) for size in range(longest + 1)
            for chars in itertools.product(alphabet, repeat=size)]


def test_manifest_paths_join_as_normalised_posix() -> None:
    """Every part of up to 5 characters, and every pair of up to 3, over the characters
    that matter (exhaustive: a sample misses the rare `..` or drive-letter cases)."""
    singles = _texts("a./\\:", 5)
    pairs = list(itertools.product(_texts("a./\\:", 3), repeat=2))
    for parts in [(text,) for text in singles] + pairs + [(), ("a", "b", "c/./d")]:
        assert join_text(*parts) == _reference_join(tuple(parts)), parts


def test_manifest_is_streamed_in_orjson_layout_and_lists_every_input(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The manifest's input lists are written a few entries at a time; the document is
    still exactly orjson's indented form, every hashed evidence file is listed once with
    its digest, and ``verify`` accepts it."""
    from auditor.report import output

    monkeypatch.setattr(output, "MANIFEST_CHUNK", 3)
    root = copy_example(tmp_path)
    weird = find(root, "host-qwen25-7b-math-c2-s161-4gpu/attempt-*/trial-*.json")
    renamed = weird.replace("trial-", 'trial-"q" é\t-')  # a listed name JSON must escape
    (root / weird).rename(root / renamed)
    for record_path in period_records(root):
        def rename(record: Any) -> None:
            for attempt in record.get("attempts") or [record]:
                for entry in attempt.get("evidence", []):
                    if f"{attempt['attempt_dir']}/{entry['path']}" == weird:
                        entry["path"] = renamed.rsplit("/", 1)[1]
        edit_record(record_path, rename)
    source = tmp_path / "src"
    source.mkdir()
    (source / "a.py").write_text("x = 1\n")
    out = tmp_path / "out"
    audit(root, out, "--source-root", str(source), "--source", "a.py")
    data = (out / "output_manifest.json").read_bytes()
    manifest = orjson.loads(data)
    assert data == orjson.dumps(manifest, option=orjson.OPT_INDENT_2) + b"\n"
    result = run_audit(root, AuditOptions(jobs=1))
    hashed = {e.path: e.actual_sha256 for e in result.collected.evidence
              if e.status in ("verified", "mismatched")}
    listed = {i["path"]: i["sha256"] for i in manifest["raw_evidence"]}
    assert len(listed) == len(manifest["raw_evidence"])
    assert renamed in listed and hashed.items() <= listed.items()
    assert set(listed) - set(hashed) == {i.path for i in result.collected.inputs
                                          if i.group == "raw_evidence"}
    assert [i["path"] for i in manifest["source_inputs"]] == ["a.py"]
    assert manifest["protocol_inputs"] == []
    assert main(["verify", str(out)]) == 0


def test_a_study_result_keeps_each_file_once(tmp_path: Path) -> None:
    """Per-file data is kept once in the result (memory on 10^5-file studies): a verified
    row's actual digest is its listed one, the per-attempt file outcomes and the discovery
    listings are folded into ``evidence``, and manifest inputs are made on demand."""
    result = run_audit(copy_example(tmp_path), AuditOptions(jobs=1))
    collected = result.collected
    listed = {f"{a.spec.attempt_dir}/{e.path}": e for p in collected.periods
              for a in p.attempts for e in a.spec.evidence}
    verified = [e for e in collected.evidence if e.status == "verified"]
    assert len(verified) > 100
    for row in verified:
        assert row.actual_sha256 is listed[row.path].sha256
    assert all(a.read.files == () for p in collected.timeline for a in p.attempts)
    assert collected.layout.attempt_files == {}
    assert not any(i.path in {row.path for row in verified} for i in collected.inputs)
    assert {i.path for i in collected.all_inputs()} >= {row.path for row in verified}


def test_an_attempt_job_missing_from_sacct_is_named_not_silently_left_out(
        tmp_path: Path) -> None:
    """Without the scheduler's rows for one element, the headline and the accounting say
    which job they leave out, rather than present the rest as the whole array."""
    root = copy_example(tmp_path)
    rewrite(root, "accounting/sacct-raw.psv",
            lambda b: b"".join(line for line in b.splitlines(keepends=True)
                               if not line.startswith(b"5055845_8")), update_manifest=False)
    whole = audit(copy_example(tmp_path / "whole"), tmp_path / "whole-out")["accounting"]
    summary = audit(root, tmp_path / "out")
    accounting = summary["accounting"]
    assert accounting["jobs_without_element"] == ["5055845"]
    findings = pd.read_parquet(tmp_path / "out" / "findings.parquet")
    assert "job 5055845 has no allocation row in the sacct dump" in " ".join(
        findings[findings["rule_id"] == "AUD119"]["message"])
    assert whole["jobs_without_element"] == []
    assert accounting["allocation_gpu_seconds"] < whole["allocation_gpu_seconds"]
    text = (tmp_path / "out" / "diagnostic.md").read_text()
    assert "**The scheduler's dump has no element row for job `5055845`**" in text.split(
        "\n## ", 1)[0]  # (the headline)
    assert (f"**{accounting['allocation_gpu_seconds']:,} GPU-seconds = "
            in text and "over the eight elements the scheduler's dump reports: 1 attempt job "
            "without an element row (`5055845`) is not counted" in text)
    # the table states no allocation for it (the reservation scope counts the period's GPUs,
    # as the report says: a figure the dump never gave is not shown as the allocation's)
    attempts = pd.read_parquet(tmp_path / "out" / "attempts.parquet")
    missing = attempts[attempts["job_id"] == "5055845"]
    assert len(missing) and missing["allocation_gpus"].isna().all()
    assert (missing["reservation_gpu_seconds"] > 0).all()
    assert attempts[attempts["job_id"] != "5055845"]["allocation_gpus"].notna().all()


def test_a_log_cut_or_read_in_part_is_said_where_the_terminal_line_is_missing(
        tmp_path: Path) -> None:
    """Where the terminal line is missing, the diagnosis says when the log ends mid-line
    (it was cut: AUD017), or when a line was read only in part (a terminal line past the
    limit would not be seen), rather than that no metric line appears at all."""
    subject = "host-qwen25-7b-gsm8k-c2-s161/period-2"
    log = "host-qwen25-7b-gsm8k-c2-s161-4gpu/attempt-5055845/training-5055845.log"

    def diagnosis(root: Path, out: Path) -> str:
        summary = audit(root, out)
        assert verdicts(summary)[subject] == ("unresolved", "terminal_event_missing")
        periods = pd.read_parquet(out / "periods.parquet")
        return str(periods.set_index(periods["pair"] + "/period-" + periods["period"]
                                     .astype(str)).loc[subject, "diagnosis"])

    cut = copy_example(tmp_path / "cut")
    rewrite(cut, log, lambda b: b[: b.rindex(b"Terminating") + 5])  # (mid-line, no newline)
    lines = (cut / log).read_bytes().count(b"\n") + 1
    text = diagnosis(cut, tmp_path / "cut-out")
    assert (f"The training log ends mid-line at line {lines} (no final newline): it was cut "
            "while being written, and what followed is lost.") in text
    clipped = copy_example(tmp_path / "clipped")
    rewrite(clipped, log, lambda b: b + b"y" * (5 << 20) + b" step:1 - training/global_step:1\n")
    text = diagnosis(clipped, tmp_path / "clipped-out")
    assert "no `step:` metric line appears at all in what was read" in text
    assert (f"was examined only in part (line of {(5 << 20) + 32} bytes clipped to 65536): a "
            "terminal line past that point would not be seen.") in text


def test_a_rank_whose_completion_phase_raised_is_named_with_its_error(tmp_path: Path) -> None:
    """The diagnosis of a period one rank of which raised in its update names the rank and
    the error, and the finding cites the trace line that raised, not the period record."""
    root = copy_example(tmp_path)
    trace = ("host-qwen25-7b-gsm8k-c2-s161-4gpu/attempt-5055845/allocator-traces/"
             "allocator-3657527.jsonl")
    error = b'"error_type":"torch.distributed.DistBackendError",' \
            b'"error_message":"NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited"'

    def raised(data: bytes) -> bytes:
        lines = data.split(b"\n")
        assert b'"phase":"actor_update"' in lines[6]
        lines[6] = lines[6].replace(b'"error_type":""', error)
        return b"\n".join(lines)

    rewrite(root, trace, raised)
    summary = audit(root, tmp_path / "out")
    subject = "host-qwen25-7b-gsm8k-c2-s161/period-2"
    assert verdicts(summary)[subject] == ("unresolved", "completion_phase_missing")
    findings = pd.read_parquet(tmp_path / "out" / "findings.parquet")
    gap = findings[(findings["rule_id"] == "AUD202") & (findings["subject"] == subject)]
    assert (gap["path"].iloc[0], gap["line"].iloc[0]) == (trace, 7)
    periods = pd.read_parquet(tmp_path / "out" / "periods.parquet")
    text = periods[(periods["pair"] == subject.split("/")[0])
                   & (periods["period"] == 2)]["diagnosis"].iloc[0]
    assert ("3 of 4 ranks recorded every completion phase (actor_update, weight_sync) at step 1 "
            "without error; rank 2: actor_update step 1 raised "
            "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, "
            "remote process exited.") in text


def test_names_that_are_not_utf8_and_paths_with_nul_are_findings_not_crashes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file or directory name that is not UTF-8 (an unlisted file, a stray period record,
    an arm or pair directory) is reported with its odd bytes as \\xNN in every output, and
    verify still finds it; a manifest path holding a NUL byte is unsafe. Both exited 3."""
    import os as os_

    root = copy_example(tmp_path)
    attempt = root / "host-qwen25-7b-gsm8k-c2-s161-4gpu" / "attempt-5055845"
    raw = os_.fsencode(attempt)
    for name in (b"/bad\xff.json",):
        with open(raw + name, "wb") as handle:
            handle.write(b"{}")
    pairs = os_.fsencode(root / "pairs")
    os_.mkdir(pairs + b"/p\xfd")
    with open(pairs + b"/p\xfd/period-1.json", "wb") as handle:
        handle.write(b"{}")
    edit_record(root / "pairs/host-qwen25-7b-gsm8k-c2-s162/period-1.json",
                lambda record: record["evidence"][0].__setitem__(
                    "path", record["evidence"][0]["path"] + "\u0000x"))
    for jobs in ("1", "2"):
        out = tmp_path / f"out-{jobs}"
        summary = audit(root, out, "--jobs", jobs)
        status = _evidence(out)
        assert status["host-qwen25-7b-gsm8k-c2-s161-4gpu/attempt-5055845/bad\\xff.json"] == \
            "unlisted"
        assert [s for p, s in status.items() if "\u0000" in p or "\\u0000" in p] == ["unsafe"]
        assert summary["integrity"]["unsafe_paths"] == 1
        text = (out / "diagnostic.md").read_text(encoding="utf-8")
        assert "bad\\xff.json" in text and "NUL byte in the path" in text
        assert main(["verify", str(out)]) == 0
        capsys.readouterr()


def test_a_prefixed_manifest_digest_is_a_mismatch_that_says_why(tmp_path: Path) -> None:
    """``"sha256": "sha256:<hex>"`` is not verified (never read loosely), and the finding
    says the manifest's value is malformed rather than leave 'expected sha256:544b…, found
    544b…' to puzzle over."""
    root = copy_example(tmp_path)
    record = root / "pairs/host-qwen25-7b-math-c2-s161/period-2.json"
    edit_record(record, lambda r: r["evidence"][0].__setitem__(
        "sha256", "sha256:" + r["evidence"][0]["sha256"]))
    audit(root, tmp_path / "out")
    findings = pd.read_parquet(tmp_path / "out" / "findings.parquet")
    said = findings[findings["rule_id"] == "AUD102"]["message"].tolist()
    assert len(said) == 1, said
    assert "(expected sha256:" in said[0]
    assert "which is not 64 hex digits, found " in said[0]


def test_verify_never_blocks_on_a_fifo_in_a_pinned_file_s_place(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A pinned input replaced by a FIFO is unreadable (verify waited for a writer for
    ever), like the audit's own refusal of anything but a regular file."""
    root = copy_example(tmp_path)
    audit(root, tmp_path / "out")
    capsys.readouterr()
    trial = root / find(root, "host-qwen25-7b-math-c2-s161-4gpu/attempt-*/trial-*.json")
    trial.unlink()
    os.mkfifo(trial)
    assert main(["verify", str(tmp_path / "out")]) == 1
    printed = capsys.readouterr().out
    assert f"unreadable: raw_evidence/{trial.relative_to(root).as_posix()} " \
           "(not a regular file)" in printed


@pytest.mark.parametrize("damage", ["not json", "a list", "another schema",
                                    "link out of the root", "commits not json",
                                    "commits a list", "commits not strings"])
def test_frozen_rules_that_cannot_be_used_fail_the_gate(tmp_path: Path, damage: str) -> None:
    """A protocol.json (or execution_commits.json) that is there but unusable: the verdicts
    were reached under the built-in rules (or without the commit check), so neither gate
    passes (--allow-partial passed), and provenance says why rather than 'no protocol.json'
    or 'Protocol default from protocol.json'."""
    root = copy_example(tmp_path)
    name = "execution_commits.json" if damage.startswith("commits") else "protocol.json"
    original = (root / name).read_text()
    (root / name).unlink()
    if damage == "link out of the root":
        (tmp_path / "elsewhere.json").write_text("{}")
        (root / name).symlink_to(tmp_path / "elsewhere.json")
    elif damage == "another schema":
        (root / name).write_text(original.replace("run-evidence/protocol/v1",
                                                  "run-evidence/protocol/v2"))
    elif damage == "commits a list":
        (root / name).write_text('{"pairs": []}')
    elif damage == "commits not strings":
        (root / name).write_text('{"pairs": {"a/pair~1": 5}}')
    else:
        (root / name).write_text("[]" if damage == "a list" else "{bad")
    summary = audit(root, tmp_path / "out")
    for gate in ("gate", "gate_allow_partial"):
        assert summary[gate]["passed"] is False
        assert any(reason.startswith(f"frozen input unusable: {name}")
                   for reason in summary[gate]["reasons"]), summary[gate]["reasons"]
    if name == "protocol.json":
        provenance = (tmp_path / "out" / "diagnostic.md").read_text().split(
            "## Provenance", 1)[1]
        assert "the gate fails" in provenance and "`protocol.json`" in provenance
        assert "No `protocol.json`" not in provenance
        assert "Protocol `default`" not in provenance


@pytest.mark.parametrize("variable", ["HOME", "MPLCONFIGDIR"])
def test_a_home_inside_the_root_gets_no_matplotlib_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str) -> None:
    """Nothing is written under the evidence root, even when HOME (or MPLCONFIGDIR) lies
    inside it: matplotlib would put its font list there (it did, with plots on)."""
    root = copy_example(tmp_path)
    for name in ("MPLCONFIGDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, str(root / "inside"))
    before = snapshot(root)
    assert main(["audit", str(root), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    assert (tmp_path / "out" / "plots").is_dir()  # (drawn: matplotlib ran)
    assert snapshot(root) == before



def _without_dac(argv: list[str]) -> list[str]:
    """``argv`` run so that file permissions hold: as root, without the capabilities that
    override them (``setpriv``); else as is."""
    if os.geteuid() != 0:
        return argv
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("root without setpriv reads any folder")
    return [setpriv, "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search",
            *argv]


def _audit_unlistable(root: Path, folder: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """The audit of ``root`` (a child process, file permissions holding) while ``folder``
    cannot be listed."""
    folder.chmod(0)
    try:
        return subprocess.run(_without_dac([
            sys.executable, "-m", "auditor", "audit", str(root), "--out", str(out), "--quiet",
            "--no-plots", "--jobs", "1"]), capture_output=True, text=True, timeout=300,
            check=False)
    finally:
        folder.chmod(0o755)


@pytest.mark.parametrize("pairs", ["one of several", "the only one"])
def test_a_pair_folder_that_cannot_be_listed_is_named_never_silently_missing(
        tmp_path: Path, pairs: str) -> None:
    """Its period records were silently missing (the walk took an unlistable folder for an
    empty one): the audit counted 16 periods and the --allow-partial gate passed; a study
    whose one pair folder it was said "is this a study root?"."""
    root = copy_example(tmp_path)
    hidden = root / "pairs" / "host-qwen25-7b-math-c2-s161"
    if pairs == "the only one":
        for other in (root / "pairs").iterdir():
            if other != hidden:
                shutil.rmtree(other)
    out = tmp_path / "out"
    done = _audit_unlistable(root, hidden, out)
    if pairs == "the only one":
        assert done.returncode == 2
        assert "pairs/host-qwen25-7b-math-c2-s161 cannot be listed" in done.stderr
        return
    assert done.returncode in (0, 1), done.stderr
    summary = json.loads((out / "summary.json").read_bytes())
    assert not summary["gate"]["passed"] and not summary["gate_allow_partial"]["passed"]
    assert summary["integrity"]["unreadable"] == 1
    findings = pd.read_parquet(out / "findings.parquet")
    rows = findings[findings["rule_id"] == "AUD025"]
    assert list(rows["path"]) == ["pairs/host-qwen25-7b-math-c2-s161"]
    assert "cannot be listed" in rows["message"].iloc[0]


def test_a_folder_below_a_pair_folder_that_cannot_be_listed_holds_no_period(
        tmp_path: Path) -> None:
    """``pairs/<pair>/old/`` cannot hold a period record: unlistable, it is a stray entry
    (a warning), never AUD025, whose failed gates admit nothing."""
    root = copy_example(tmp_path)
    old = root / "pairs" / "host-qwen25-7b-math-c2-s161" / "old"
    old.mkdir()
    (old / "notes.txt").write_text("kept\n")
    out = tmp_path / "out"
    done = _audit_unlistable(root, old, out)
    assert done.returncode in (0, 1), done.stderr
    findings = pd.read_parquet(out / "findings.parquet")
    assert "AUD025" not in set(findings["rule_id"])
    assert "pairs/host-qwen25-7b-math-c2-s161/old" in set(
        findings[findings["rule_id"] == "AUD105"]["path"])
    summary = json.loads((out / "summary.json").read_bytes())
    assert summary["gate_allow_partial"]["passed"]


def test_a_study_whose_only_pair_folder_is_a_link_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One pair folder, a link out of the root (never followed): no period record is found,
    and the one line says why (it asked whether this is a study root at all)."""
    from auditor._cli import main

    root = copy_example(tmp_path)
    keep = root / "pairs" / "host-qwen25-7b-math-c2-s161"
    for other in (root / "pairs").iterdir():
        if other != keep:
            shutil.rmtree(other)
    shutil.move(keep, tmp_path / "elsewhere")
    keep.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    assert main(["audit", str(root), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "pairs/host-qwen25-7b-math-c2-s161 is a link, never followed" in err, err


def test_a_link_in_an_arms_or_attempts_place_is_named(tmp_path: Path) -> None:
    """Review Q: a link named as an attempt directory, or one at the top leading to a
    directory (an arm's place), that no record names dropped out of the audit silently
    (a real such directory is AUD106). It is never followed, and now named: AUD106."""
    root = copy_example(tmp_path)
    outside = tmp_path / "outside"
    (outside / "attempt-1").mkdir(parents=True)
    (outside / "attempt-1" / "trial-1.json").write_text("{}")
    arm = next(p for p in sorted(root.iterdir()) if p.name.endswith("gpu"))
    (arm / "attempt-5").symlink_to(outside / "attempt-1")
    (root / "host-yy-s1-2gpu").symlink_to(outside)
    audit(root, tmp_path / "out")
    findings = pd.read_parquet(tmp_path / "out" / "findings.parquet")
    named = findings[findings["rule_id"] == "AUD106"]
    links = dict(zip(named["subject"], named["message"], strict=True))
    assert "never followed" in links[f"{arm.name}/attempt-5"]
    assert "never followed" in links["host-yy-s1-2gpu"]
    (root / "slurm-logs").symlink_to(outside)  # (a link of no arm's name: the study's own)
    audit(root, tmp_path / "again")
    findings = pd.read_parquet(tmp_path / "again" / "findings.parquet")
    assert "slurm-logs" not in set(findings["subject"])
