"""Shard parts are data (issue 41, item 2): a part is JSON lines decoded by the model's own
types, checked field by field against ``part.json``; ``merge`` refuses a part another user
owns or may write (``--trust-parts`` to accept it), checks signatures under
``--key-file``, and never hashes a file its manifest names outside the study. Every
adversary's part is built here, from an honest one, as a forger would: edited, re-pinned."""

from __future__ import annotations

import json
import os
import pickle
import stat
from pathlib import Path
from typing import Any

import orjson
import pytest

from auditor._cli import main
from tests.helpers import copy_example, outcome_study
from tests.test_shards import _repin

OTHER_UID = 54321


def _part(root: Path, out: Path, *extra: str, shard: str = "1/1") -> Path:
    assert main(["audit", str(root), "--shard", shard, "--out", str(out), "--quiet",
                 *extra]) == 0
    return out


def _merge(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["merge", *argv, "--quiet", "--no-plots"])
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") <= 1, err
    return code, err


def _gate(out: Path) -> int:
    return main(["gate", str(out)])


def _lines(part: Path) -> list[Any]:
    return [orjson.loads(line) for line in (part / "part.jsonl").read_bytes().splitlines()]


def _write_lines(part: Path, lines: list[Any]) -> None:
    (part / "part.jsonl").write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    _repin(part, "part.jsonl")


def _forge_terminal_events(part: Path) -> int:
    """Give every scanned log without a terminal event one (the forgery of the issue):
    how many were forged."""
    lines = _lines(part)
    forged = 0
    for line in lines[1:]:
        for attempt in line.get("unit", {}).get("evidence", {}).get("attempts", []):
            log = attempt["read"]["log"]
            if log is not None and log["terminal_event"] is None:
                log["terminal_event"] = {"kind": "terminal", "line": 1,
                                         "text": "step:100 - training/global_step:100",
                                         "detail": "100"}
                log["last_step"] = log["expected_steps"]
                forged += 1
    _write_lines(part, lines)
    return forged


@pytest.fixture
def missing_terminal(tmp_path: Path) -> Path:
    return outcome_study(tmp_path / "study", ["completed", "terminal_missing"])


def test_a_part_is_json_lines_of_the_model_and_merges_back(
        tmp_path: Path, missing_terminal: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mask = os.umask(0o002)  # (a lab's shared-group umask: the part is still the owner's)
    try:
        part = _part(missing_terminal, tmp_path / "part")
    finally:
        os.umask(mask)
    names = sorted(path.name for path in part.iterdir())
    assert names == ["output_manifest.json", "part.json", "part.jsonl"]
    lines = _lines(part)
    assert set(lines[0]) >= {"root", "protocol", "units", "periods_total"}
    assert [set(line) for line in lines[1:]] == [{"unit"}, {"unit"}]
    for path in part.iterdir():  # (whatever the umask: merge refuses what others may write)
        assert not stat.S_IMODE(path.stat().st_mode) & 0o022, path
    assert _merge(capsys, str(part), "--out", str(tmp_path / "merged"))[0] == 0
    assert _gate(tmp_path / "merged") == 1


def test_a_forged_part_of_another_user_is_refused_unless_trusted(
        tmp_path: Path, missing_terminal: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's forgery: terminal events the logs lack, re-pinned. A part someone else
    owns, or may write, decides nothing unless the caller says it trusts them; told so,
    the forgery is merged (what --trust-parts means, said in its help and the docs)."""
    assert main(["audit", str(missing_terminal), "--out", str(tmp_path / "direct"),
                 "--quiet", "--no-plots"]) == 0
    assert _gate(tmp_path / "direct") == 1
    part = _part(missing_terminal, tmp_path / "part")
    assert _forge_terminal_events(part) == 1
    for path in (part, *part.iterdir()):
        os.chown(path, OTHER_UID, OTHER_UID)
    code, err = _merge(capsys, str(part), "--out", str(tmp_path / "merged"))
    assert code == 2 and f"owned by another user (uid {OTHER_UID})" in err
    assert "--trust-parts" in err
    for path in part.iterdir():  # (the directory alone: its owner may swap any file)
        os.chown(path, 0, 0)
    code, err = _merge(capsys, str(part), "--out", str(tmp_path / "merged"))
    assert code == 2 and f"{part}: owned by another user" in err
    os.chown(part, 0, 0)
    (part / "part.jsonl").chmod(0o666)
    code, err = _merge(capsys, str(part), "--out", str(tmp_path / "merged"))
    assert code == 2 and "part.jsonl: others may write it (mode 0666)" in err
    code, _ = _merge(capsys, str(part), "--out", str(tmp_path / "merged"), "--trust-parts")
    assert code == 0 and _gate(tmp_path / "merged") == 0  # (trusted: the forgery passes)


def test_signed_parts_refuse_a_forgery_and_another_key(
        tmp_path: Path, missing_terminal: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key, other = tmp_path / "key", tmp_path / "other"
    key.write_bytes(os.urandom(32))
    other.write_bytes(os.urandom(32))
    key.chmod(0o600)
    other.chmod(0o600)
    part = _part(missing_terminal, tmp_path / "part", "--key-file", str(key))
    assert (part / "part.hmac").is_file()
    for path in (part, *part.iterdir()):  # (a signed part may travel: who owns it is moot)
        os.chown(path, OTHER_UID, OTHER_UID)
    code, _ = _merge(capsys, str(part), "--out", str(tmp_path / "m1"), "--key-file", str(key))
    assert code == 0 and _gate(tmp_path / "m1") == 1
    code, err = _merge(capsys, str(part), "--out", str(tmp_path / "m2"), "--key-file",
                       str(other))
    assert code == 2 and "signature does not match" in err
    _forge_terminal_events(part)
    code, err = _merge(capsys, str(part), "--out", str(tmp_path / "m3"), "--key-file", str(key))
    assert code == 2 and "signature does not match" in err
    unsigned = _part(missing_terminal, tmp_path / "unsigned")
    code, err = _merge(capsys, str(unsigned), "--out", str(tmp_path / "m4"), "--key-file",
                       str(key))
    assert code == 2 and "not signed" in err


@pytest.mark.parametrize(("content", "mode", "said"), [
    (b"short", 0o600, "at least 16 bytes"),
    (b"k" * 32, 0o604, "others may read or write it"),
])
def test_a_weak_or_open_key_is_refused_before_any_work(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, mode: int,
        said: str) -> None:
    key = tmp_path / "key"
    key.write_bytes(content)
    key.chmod(mode)
    root = copy_example(tmp_path)
    assert main(["audit", str(root), "--shard", "1/2", "--out", str(tmp_path / "p"),
                 "--key-file", str(key)]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1
    assert not (tmp_path / "p").exists()
    assert main(["audit", str(root), "--key-file", str(key)]) == 2
    assert "needs --shard" in capsys.readouterr().err


def _edited_head(part: Path, **changes: Any) -> None:
    lines = _lines(part)
    lines[0].update(changes)
    _write_lines(part, lines)


@pytest.mark.parametrize("attack", [
    "pickle", "class_named", "root_differs", "total_differs", "extra_unit", "deep",
    "unknown_enum", "float_for_int", "too_long", "period_of_another_shard",
])
def test_hostile_part_data_is_one_line_never_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], attack: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What the pickled parts let through (a class patched for the process, a segfault,
    a memo bomb) has no form here: the bytes name no type, and every mismatch with the
    types or with ``part.json`` is refused with one line, after a re-pin."""
    root = copy_example(tmp_path)
    part = _part(root, tmp_path / "part", shard="1/2")
    said = {"pickle": "not JSON", "class_named": "fields differ",
            "root_differs": "disagree on root", "total_differs": "disagree on periods_total",
            "extra_unit": "past the", "deep": "cannot be read",
            "unknown_enum": "cannot be read", "float_for_int": "expected an integer",
            "too_long": "longer than", "period_of_another_shard": "not shard 1/2's"}[attack]
    lines = _lines(part)
    if attack == "pickle":
        (part / "part.jsonl").write_bytes(pickle.dumps(os.getcwd))
        _repin(part, "part.jsonl")
    elif attack == "class_named":
        lines[1]["unit"] = {"__class__": "pathlib.PosixPath", "args": ["/"]}
        _write_lines(part, lines)
    elif attack == "root_differs":
        _edited_head(part, root=str(tmp_path))
    elif attack == "total_differs":
        _edited_head(part, periods_total=lines[0]["periods_total"] + 2)
    elif attack == "extra_unit":
        _write_lines(part, [*lines, lines[1]])
    elif attack == "deep":
        body = b"[" * 1000 + b"]" * 1000
        (part / "part.jsonl").write_bytes(orjson.dumps(lines[0]) + b"\n{\"unit\":" + body
                                          + b"}\n")
        _repin(part, "part.jsonl")
    elif attack == "unknown_enum":
        head = lines[0]
        head["study_findings"] = [{"rule_id": "AUD001", "symbol": "x", "severity": "fatal!",
                                   "subject": "s", "message": "m", "citations": [],
                                   "values": []}]
        _write_lines(part, lines)
    elif attack == "float_for_int":
        lines[1]["unit"]["index"] = 0.5
        _write_lines(part, lines)
    elif attack == "too_long":
        monkeypatch.setattr("auditor.pipeline.parts.MAX_LINE", 1000)
    elif attack == "period_of_another_shard":
        meta = json.loads((part / "part.json").read_text())
        meta["periods"][0] += 1
        (part / "part.json").write_text(json.dumps(meta))
        _repin(part, "part.json")
    other = _part(root, tmp_path / "other", shard="2/2")
    code, err = _merge(capsys, str(part), str(other), "--out", str(tmp_path / "merged"))
    assert code == 2 and said in err, err
    assert not (tmp_path / "merged").exists()


def test_a_manifest_names_no_file_outside_the_study(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A forged manifest that names a file elsewhere (for merge to hash and say whether it
    changed) is refused before anything is opened."""
    secret = tmp_path / "secret.txt"
    secret.write_text("the caller may read this; the part's writer may not\n")
    root = copy_example(tmp_path)
    part = _part(root, tmp_path / "part")
    manifest = json.loads((part / "output_manifest.json").read_text())
    manifest["raw_evidence"][0]["absolute"] = str(secret)
    (part / "output_manifest.json").write_text(json.dumps(manifest))
    code, err = _merge(capsys, str(part), "--out", str(tmp_path / "merged"))
    assert code == 2 and "outside its study's root" in err and str(secret) in err
    manifest["raw_evidence"][0]["absolute"] = f"{root}/../secret.txt"
    (part / "output_manifest.json").write_text(json.dumps(manifest))
    code, err = _merge(capsys, str(part), "--out", str(tmp_path / "merged"))
    assert code == 2 and "outside its study's root" in err


@pytest.mark.parametrize("swap", ["dir_link", "file_link", "fifo"])
def test_links_and_fifos_in_a_part_are_refused_not_followed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], swap: str) -> None:
    root = copy_example(tmp_path)
    part = _part(root, tmp_path / "part")
    given = part
    if swap == "dir_link":
        given = tmp_path / "linked"
        given.symlink_to(part)
        said = "a link is not followed"
    elif swap == "file_link":
        moved = tmp_path / "elsewhere.jsonl"
        (part / "part.jsonl").rename(moved)
        (part / "part.jsonl").symlink_to(moved)
        said = "a link is not followed"
    else:
        (part / "part.json").unlink()
        os.mkfifo(part / "part.json")
        said = "not a regular file"
    code, err = _merge(capsys, str(given), "--out", str(tmp_path / "merged"))
    assert code == 2 and said in err, err


def test_big_integers_and_undecodable_names_cross_a_part_exactly(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """What JSON cannot hold as it is (an integer past 64 bits in a device file, a file
    name that is not UTF-8) is spelled out in the part and read back exactly: the merge
    writes the single audit's bytes."""
    root = copy_example(tmp_path)
    device = next(root.glob("*/attempt-*/device-evidence/*.json"))
    document = json.loads(device.read_text())
    document["memory_total_mib"] = 2 ** 70
    device.write_text(json.dumps(document))
    stray = next(root.glob("*/attempt-*"))
    (stray / os.fsdecode(b"stray-\xff.txt")).write_text("unlisted\n")
    assert main(["audit", str(root), "--out", str(tmp_path / "single"), "--quiet",
                 "--no-plots"]) in (0, 1)
    parts = [_part(root, tmp_path / f"p{n}", shard=f"{n}/2") for n in (1, 2)]
    assert b"__int__" in b"".join((p / "part.jsonl").read_bytes() for p in parts) or \
        b"__str__" in b"".join((p / "part.jsonl").read_bytes() for p in parts)
    code, _ = _merge(capsys, *map(str, parts), "--out", str(tmp_path / "merged"))
    assert code in (0, 1)
    for name in ("diagnostic.md", "summary.json", "findings.parquet", "evidence.md"):
        assert (tmp_path / "single" / name).read_bytes() == \
            (tmp_path / "merged" / name).read_bytes(), name


def test_a_part_changed_after_its_manifest_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The bytes the merge decodes are the bytes it checks against the manifest's pin (read
    once: the merge's verification does not hash the part's own files again)."""
    root = copy_example(tmp_path)
    part = _part(root, tmp_path / "part")
    data = (part / "part.jsonl").read_bytes()
    (part / "part.jsonl").write_bytes(data.replace(b"}\n", b"} \n", 1))  # (still JSON)
    code, err = _merge(capsys, str(part), "--out", str(tmp_path / "merged"))
    assert code == 2 and "part.jsonl differs from its output manifest" in err
