"""The output manifest's ``root``: written for a root whose name is not UTF-8 (it crashed
the audit), read back by ``verify``, and refused, never a crash, when a manifest's is not a
name."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest

from auditor._cli import main
from tests.helpers import EXAMPLE


def _one_line(capsys: pytest.CaptureFixture[str], *words: str) -> None:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error" not in err, err
    for word in words:
        assert word in err, err


def test_a_root_whose_name_is_not_utf8_is_audited_and_verified(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = Path(os.fsdecode(bytes(tmp_path) + b"/odd\xffroot"))
    shutil.copytree(EXAMPLE, root, symlinks=True)
    out = tmp_path / "out"
    assert main(["audit", str(root), "--out", str(out), "--quiet", "--no-plots"]) == 0
    manifest = orjson.loads((out / "output_manifest.json").read_bytes())
    assert manifest["root"] == f"{tmp_path}/odd\\xffroot"
    capsys.readouterr()
    assert main(["verify", str(out)]) == 0
    assert "match" in capsys.readouterr().out
    trial = next(root.glob("*/attempt-*/trial-*.json"))
    trial.write_bytes(trial.read_bytes() + b" ")
    assert main(["verify", str(out)]) == 1  # (read there, through the name as it is)
    assert "changed" in capsys.readouterr().out


@pytest.mark.parametrize("change", [
    lambda m: m.update(root=None),
    lambda m: m.update(root=7),
    lambda m: m["raw_evidence"][0].update(absolute=5),
])
def test_a_manifest_whose_root_is_not_a_name_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], change: Any) -> None:
    out = tmp_path / "out"
    assert main(["audit", str(EXAMPLE), "--out", str(out), "--quiet", "--no-plots"]) == 0
    path = out / "output_manifest.json"
    manifest = orjson.loads(path.read_bytes())
    change(manifest)
    path.write_bytes(orjson.dumps(manifest))
    capsys.readouterr()
    assert main(["verify", str(out)]) == 2
    _one_line(capsys, "malformed manifest")
    assert main(["catalog", str(out), "--into", str(tmp_path / "cat")]) == 2
    _one_line(capsys, "malformed manifest")


def test_shards_of_a_root_whose_name_is_not_utf8_merge(tmp_path: Path) -> None:
    root = Path(os.fsdecode(bytes(tmp_path) + b"/odd\xffroot"))
    shutil.copytree(EXAMPLE, root, symlinks=True)
    for shard in ("1/2", "2/2"):
        assert main(["audit", str(root), "--shard", shard, "--out",
                     str(tmp_path / f"part{shard[0]}"), "--quiet"]) == 0
    assert main(["merge", str(tmp_path / "part1"), str(tmp_path / "part2"), "--out",
                 str(tmp_path / "merged"), "--quiet", "--no-plots"]) == 0
    assert main(["audit", str(root), "--out", str(tmp_path / "whole"), "--quiet",
                 "--no-plots"]) == 0
    for name in ("summary.json", "diagnostic.md", "evidence.md"):
        assert (tmp_path / "merged" / name).read_bytes() == \
            (tmp_path / "whole" / name).read_bytes(), name


def test_verify_reads_the_evidence_below_its_root_without_following_a_link(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An evidence file swapped for a link to a copy of itself outside the root: verify
    does not read through it (a link-following verify found it unchanged)."""
    root = tmp_path / "study"
    shutil.copytree(EXAMPLE, root, symlinks=True)
    out = tmp_path / "out"
    assert main(["audit", str(root), "--out", str(out), "--quiet", "--no-plots"]) == 0
    trial = next(root.glob("*/attempt-*/trial-*.json"))
    outside = tmp_path / "elsewhere.json"
    shutil.copy(trial, outside)
    trial.unlink()
    trial.symlink_to(outside)
    capsys.readouterr()
    assert main(["verify", str(out)]) == 1
    said = capsys.readouterr().out
    assert "unreadable" in said and trial.name in said and "not followed" in said, said
