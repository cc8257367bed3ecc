"""A part's data names no file outside its study for the merge, its report or ``auditor
verify`` to open: each input's absolute path (a period record's, the study's protocol,
commits and dump, a ``--sacct`` dump) must be the one the part's own manifest pins (itself
checked: below the study's root, or an input its options name), raw evidence below the
root; each evidence file read, each unlisted file and each path of the layout a path below
the root. A forger edits the part's data and re-pins it, as in :mod:`tests.test_parts_trust`;
each forgery is refused with one line naming the part and the field, exit 2, nothing
written. An honest part whose record is reached through a link inside the root merges."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from auditor._cli import main
from tests.helpers import copy_example
from tests.test_parts_trust import _lines, _merge, _part, _write_lines
from tests.test_shards import _repin


def _secret(tmp_path: Path) -> Path:
    secret = tmp_path / "secret.txt"
    secret.write_text("the caller may read this; the part's writer may not\n")
    return secret


def _first_unit(lines: list[Any]) -> dict[str, Any]:
    unit: dict[str, Any] = next(line["unit"] for line in lines if "unit" in line)
    return unit


def _refused(capsys: pytest.CaptureFixture[str], part: Path, out: Path, said: str) -> None:
    code, err = _merge(capsys, str(part), "--out", str(out))
    assert code == 2, err
    assert err.startswith(f"auditor: error: merge: {part}: part.jsonl "), err
    assert said in err, err
    assert not out.exists()


@pytest.mark.parametrize("forgery", [
    "outside", "dotdot", "another_file_inside", "group_changed", "path_changed",
])
def test_a_record_input_naming_another_file_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], forgery: str) -> None:
    """The issue: ``unit.record_input.absolute`` set to ``/etc/passwd`` (re-pinned) was
    merged, written into the merged manifest, and ``auditor verify`` then opened it."""
    secret = _secret(tmp_path)
    root = copy_example(tmp_path)
    part = _part(root, tmp_path / "part")
    lines = _lines(part)
    record = _first_unit(lines)["record_input"]
    said = "unit 0 record_input.absolute names"
    if forgery == "outside":
        record["absolute"] = "/etc/passwd"
        said += " '/etc/passwd', outside its study's root"
    elif forgery == "dotdot":
        record["absolute"] = f"{root}/../{secret.name}"
        said += f" '{root}/../{secret.name}', outside its study's root"
    elif forgery == "another_file_inside":  # (below the root, but not what the manifest pins)
        record["absolute"] = str(root / "protocol.json")
        said += f" '{root}/protocol.json', which its output_manifest.json does not pin"
    elif forgery == "group_changed":  # (a source input may lie outside the root)
        record["group"], record["absolute"] = "source_inputs", str(secret)
        said = "unit 0 record_input is not its period record's raw evidence"
    else:
        record["path"] = record["absolute"] = str(secret)
        said = "unit 0 record_input is not its period record's raw evidence"
    _write_lines(part, lines)
    _refused(capsys, part, tmp_path / "merged", said)


def test_the_issue_forgery_never_reaches_verify(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Refused at the merge: no merged manifest names ``/etc/passwd`` for verify to open;
    the honest part, merged, verifies."""
    root = copy_example(tmp_path)
    honest = _part(root, tmp_path / "honest")
    assert _merge(capsys, str(honest), "--out", str(tmp_path / "ok"))[0] in (0, 1)
    assert main(["verify", str(tmp_path / "ok")]) == 0
    capsys.readouterr()
    part = _part(root, tmp_path / "part")
    lines = _lines(part)
    _first_unit(lines)["record_input"]["absolute"] = "/etc/passwd"
    _write_lines(part, lines)
    code, err = _merge(capsys, str(part), "--out", str(tmp_path / "merged"))
    assert code == 2 and "record_input.absolute names '/etc/passwd'" in err
    assert not (tmp_path / "merged").exists()


@pytest.mark.parametrize("name", ["protocol.json", "execution_commits.json",
                                  "accounting/sacct-raw.psv"])
def test_a_study_input_naming_another_file_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    secret = _secret(tmp_path)
    root = copy_example(tmp_path)
    part = _part(root, tmp_path / "part")
    lines = _lines(part)
    index = [item["path"] for item in lines[0]["study_inputs"]].index(name)
    lines[0]["study_inputs"][index]["absolute"] = str(secret)
    _write_lines(part, lines)
    _refused(capsys, part, tmp_path / "merged",
             f"study_inputs[{index}].absolute names '{secret}', outside its study's root")


def test_a_sacct_dump_outside_the_root_names_only_the_dump_given(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A ``--sacct`` dump may lie outside the root (a source input): the part may name that
    dump, the one its manifest pins, and no other file."""
    secret = _secret(tmp_path)
    root = copy_example(tmp_path)
    dump = tmp_path / "dump.psv"
    shutil.copy(root / "accounting" / "sacct-raw.psv", dump)
    honest = _part(root, tmp_path / "honest", "--sacct", str(dump))
    assert _merge(capsys, str(honest), "--out", str(tmp_path / "ok"))[0] in (0, 1)
    part = _part(root, tmp_path / "part", "--sacct", str(dump))
    lines = _lines(part)
    groups = [item["group"] for item in lines[0]["study_inputs"]]
    index = groups.index("source_inputs")
    lines[0]["study_inputs"][index]["absolute"] = str(secret)
    _write_lines(part, lines)
    _refused(capsys, part, tmp_path / "merged",
             f"study_inputs[{index}].absolute names '{secret}', which its "
             "output_manifest.json does not pin as source_inputs")


@pytest.mark.parametrize("where", ["evidence", "unlisted", "layout_root", "stray_pair_file"])
def test_a_path_of_the_data_leaving_the_root_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str) -> None:
    """An evidence file's path (the merged manifest lists the root joined with it), an
    unlisted file's, the layout's root and paths (the merge's layout findings look at
    them on disk)."""
    secret = _secret(tmp_path)
    root = copy_example(tmp_path)
    stray = next(root.glob("*/attempt-*"))
    (stray / "stray.txt").write_text("unlisted\n")
    part = _part(root, tmp_path / "part")
    lines = _lines(part)
    escape = f"../{secret.name}"
    if where == "evidence":
        row = _first_unit(lines)["evidence"]["attempts"][0]["files"][0]
        assert row["status"] == "verified"
        row["path"] = escape
        said = f"unit 0 evidence path '{escape}' is not a path below its study's root"
    elif where == "unlisted":
        line = next(line for line in lines[1:] if "unlisted" in line)
        line["unlisted"][1]["display"] = escape
        said = f"unlisted display '{escape}' is not a path below its study's root"
    elif where == "layout_root":
        lines[0]["layout"]["root"] = str(tmp_path)
        said = f"layout.root '{tmp_path}' is not its study's root"
    else:
        lines[0]["layout"]["stray_pair_files"] = [escape]
        said = f"layout.stray_pair_files '{escape}' is not a path below its study's root"
    _write_lines(part, lines)
    _refused(capsys, part, tmp_path / "merged", said)


def test_a_part_of_the_root_directory_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every root (data, ``part.json``, manifest) set to ``/``: below it is every file."""
    root = copy_example(tmp_path)
    part = _part(root, tmp_path / "part")
    lines = _lines(part)
    lines[0]["root"] = lines[0]["layout"]["root"] = "/"
    _write_lines(part, lines)
    meta = json.loads((part / "part.json").read_text())
    meta["root"] = "/"
    (part / "part.json").write_text(json.dumps(meta))
    _repin(part, "part.json")
    manifest = json.loads((part / "output_manifest.json").read_text())
    manifest["root"] = "/"
    (part / "output_manifest.json").write_text(json.dumps(manifest))
    _refused(capsys, part, tmp_path / "merged", "root '/' is not a study root")


def test_an_honest_record_reached_through_a_link_inside_the_root_merges(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A period record that is a link to a file inside the root is read at its resolved
    path (its input's absolute path is not the root joined with its path): still merged,
    and the merged output verifies."""
    root = copy_example(tmp_path)
    record = next(root.glob("pairs/*/period-1.json"))
    kept = root / "records" / f"{record.parent.name}-period-1.json"
    kept.parent.mkdir()
    record.rename(kept)
    record.symlink_to(os.path.relpath(kept, record.parent))
    parts = [_part(root, tmp_path / f"p{n}", shard=f"{n}/2") for n in (1, 2)]
    absolute = [line["unit"]["record_input"]["absolute"] for part in parts
                for line in _lines(part) if "unit" in line]
    assert str(kept) in absolute
    code, err = _merge(capsys, *map(str, parts), "--out", str(tmp_path / "merged"))
    assert code in (0, 1), err
    assert main(["verify", str(tmp_path / "merged")]) == 0
