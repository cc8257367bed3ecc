"""A scheduler dump saved as UTF-16 (PowerShell 5's ``>``, a Windows editor's "Unicode").

Read decoded, it gives what its UTF-8 twin gives, with one ``AUD026`` naming the file and its
encoding (not an AUD006 a line and a lost first row); one that does not decode whole is
refused (``AUD009``: nothing of it lets a run count); a UTF-8 dump with a stray NUL is still
one line's AUD006.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from auditor._cli import main
from auditor._io import CHUNK_SIZE, HashingReader
from auditor.collect.sacct import parse_sacct
from tests.helpers import REPO, audit, copy_example, sacct_document

DUMP = "accounting/sacct-raw.psv"
ENCODINGS = {"UTF-16 LE": b"\xff\xfe", "UTF-16 BE": b"\xfe\xff"}
"""Each encoding as the finding names it, and its byte-order mark."""


def _utf16(data: bytes, name: str) -> bytes:
    """``data`` (UTF-8) as Out-File writes it: the mark, then the text in ``name``."""
    codec = "utf-16-le" if name.endswith("LE") else "utf-16-be"
    return ENCODINGS[name] + data.decode("utf-8").encode(codec)


def _findings(out: Path) -> pd.DataFrame:
    return pd.read_parquet(out / "findings.parquet")


@pytest.fixture(scope="module")
def utf8_audit(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The example study's summary, its dump as committed (UTF-8)."""
    tmp = tmp_path_factory.mktemp("utf8")
    return audit(copy_example(tmp), tmp / "out")


@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_a_utf16_dump_is_audited_as_its_utf8_twin_with_one_finding(
        utf8_audit: dict[str, Any], tmp_path: Path, name: str) -> None:
    root = copy_example(tmp_path)
    (root / DUMP).write_bytes(_utf16((root / DUMP).read_bytes(), name))
    summary = audit(root, tmp_path / "out")
    for key in ("verdicts", "accounting", "gate", "gate_allow_partial", "periods"):
        assert summary[key] == utf8_audit[key], key
    findings = _findings(tmp_path / "out")
    of_dump = findings[findings["subject"] == DUMP]
    assert of_dump["rule_id"].tolist() == ["AUD026"]  # (no AUD005/6/8 a line)
    [message] = of_dump["message"].tolist()
    assert message == (
        f"{DUMP}: {name} (a byte-order mark at byte 0); sacct writes UTF-8: it was read "
        "decoded; re-run sacct with its output redirected by a POSIX shell, or convert with "
        "`iconv -f UTF-16 -t UTF-8`")


@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_auditor_sacct_reads_a_utf16_dump_as_its_utf8_twin(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str) -> None:
    source = REPO / "fixtures/slurm/header-D.psv"
    dump = tmp_path / "dump.psv"
    dump.write_bytes(_utf16(source.read_bytes(), name))
    plain = sacct_document(capsys, source)
    read = sacct_document(capsys, dump)
    assert read["jobs"] == plain["jobs"] and read["totals"] == plain["totals"]
    assert [f["rule_id"] for f in read["findings"]] == \
        ["AUD026"] + [f["rule_id"] for f in plain["findings"]]
    assert read["findings"][0]["message"].startswith(f"{dump}: {name} (a byte-order mark")
    assert main(["sacct", str(dump)]) == 0  # (the table: the finding said on stderr)
    assert f"{name} (a byte-order mark at byte 0)" in capsys.readouterr().err


def test_a_large_utf16_dump_with_wide_characters_reads_as_its_utf8_twin() -> None:
    """Over a chunk's worth, with job names of characters of 2 and 4 bytes in UTF-16 (a
    surrogate pair cut by a chunk's end): every job, name and line as in UTF-8."""
    rows = [f"900_{i}|{9000 + i}|训练-🚀-{i}|COMPLETED|0:0|2026-09-15T18:55:15|"
            f"2026-09-15T19:05:00|585|billing=8,gres/gpu=2|node{i}|None\n" for i in range(9000)]
    data = "".join(rows).encode()
    wide = _utf16(data, "UTF-16 LE")
    assert len(wide) > 2 * CHUNK_SIZE
    plain = parse_sacct(HashingReader(io.BytesIO(data)), "d.psv")
    read = parse_sacct(HashingReader(io.BytesIO(wide)), "d.psv")
    assert len(read.jobs) == 9000 and read.jobs == plain.jobs
    assert [f.rule_id for f in read.findings] == ["AUD026"]
    assert read.digest is not None and read.digest.size == len(wide)  # (the file's bytes)


@pytest.mark.parametrize(("cut", "where"), [
    (lambda b: b[:3001], "at byte 3,000 (truncated data)"),  # (an odd byte count)
    (lambda b: b[:2000] + b"\x00\xd8" + b[2000:], "at byte 2,000 (illegal UTF-16 surrogate)"),
])
def test_a_utf16_dump_that_does_not_decode_is_refused_and_counts_nothing(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, cut: Any, where: str) -> None:
    root = copy_example(tmp_path)
    (root / DUMP).write_bytes(cut(_utf16((root / DUMP).read_bytes(), "UTF-16 LE")))
    capsys.readouterr()
    assert main(["sacct", str(root / DUMP)]) == 2
    assert f"UTF-16 LE (a byte-order mark at byte 0) that does not decode as UTF-16 LE {where}" \
        in capsys.readouterr().err
    summary = audit(root, tmp_path / "out")
    assert summary["accounting"]["allocation_gpu_seconds"] is None
    for gate in ("gate", "gate_allow_partial"):
        assert summary[gate]["passed"] is False
        assert summary[gate]["included_configurations"] == []
    findings = _findings(tmp_path / "out")
    assert findings[findings["subject"] == DUMP]["rule_id"].tolist() == ["AUD009"]


def test_a_utf8_dump_with_one_stray_nul_is_still_that_lines_finding(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The near miss: no byte-order mark, one NUL inside line 3; read as UTF-8, as before."""
    root = copy_example(tmp_path)
    lines = (root / DUMP).read_bytes().splitlines(keepends=True)
    lines[2] = lines[2].replace(b"|", b"|\x00", 1)
    (root / DUMP).write_bytes(b"".join(lines))
    document = sacct_document(capsys, root / DUMP)
    assert [(f["rule_id"], f["line"]) for f in document["findings"]] == [("AUD006", 3)]
    audit(root, tmp_path / "out")
    findings = _findings(tmp_path / "out")
    of_dump = findings[findings["subject"] == DUMP]
    assert list(zip(of_dump["rule_id"], of_dump["line"], strict=True)) == [("AUD006", 3)]
