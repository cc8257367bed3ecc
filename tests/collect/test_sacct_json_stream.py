"""``auditor sacct --json`` writes its entries as they are made: the document is the library's
(``summary_json``), laid out byte for byte as orjson's two-space indent, and a whole cluster's
dump costs no more memory than the table of it (the entries made whole took about 8 times
the dump's bytes: 1,781 MB of peak for a 200 MB dump, 595 MB now)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import orjson
import pytest

from auditor._cli import main
from auditor._io import HashingReader
from auditor.collect.inputs import field_findings
from auditor.collect.sacct import parse_sacct, summary_json
from tests.helpers import REPO
from tests.test_memory_bounds import PEAKS

SOURCE = REPO / "fixtures/slurm/header-D.psv"


def _scaled(path: Path, copies: int) -> Path:
    """``SOURCE`` (header, -D records, steps) repeated ``copies`` times, each copy's job ids
    moved on by 1,000 (every job its own)."""
    header, *rows = SOURCE.read_text().splitlines()
    number = re.compile(r"^(\d+)(.*)$")
    with path.open("w") as out:
        out.write(header + "\n")
        for copy in range(copies):
            for row in rows:
                parts = row.split("|")
                for at in (0, 1):
                    if (match := number.match(parts[at])) is not None:
                        parts[at] = f"{int(match[1]) + copy * 1000}{match[2]}"
                out.write("|".join(parts) + "\n")
    return path


@pytest.mark.parametrize("name", ["header-D.psv", "24.11/json-D.json", "scaled"])
def test_sacct_json_is_the_library_document_in_orjson_layout(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str) -> None:
    """Over more than one batch of entries too (``scaled``: 1,600 jobs)."""
    path = _scaled(tmp_path / "d.psv", 100) if name == "scaled" else REPO / "fixtures/slurm" / name
    capsys.readouterr()
    assert main(["sacct", str(path), "--json"]) == 0
    out = capsys.readouterr().out
    document = json.loads(out)
    assert out == (orjson.dumps(document, option=orjson.OPT_INDENT_2) + b"\n").decode()
    with path.open("rb") as handle:
        dump = parse_sacct(HashingReader(handle), str(path))
    dump = replace(dump, findings=(*dump.findings, *field_findings(dump, str(path))))
    assert document == json.loads(orjson.dumps(summary_json(dump)))
    assert len(document["jobs"]) == document["totals"]["jobs"] > 0


@pytest.mark.slow
def test_sacct_json_of_a_large_dump_peaks_as_its_table_does(tmp_path: Path) -> None:
    """A 10 MB dump (28,000 jobs): the --json document held whole added about 60 MiB."""
    dump = _scaled(tmp_path / "big.psv", 1800)

    def peak(*extra: str) -> int:
        usage = tmp_path / "usage.json"
        done = subprocess.run([sys.executable, "-c", PEAKS, str(usage), "sacct", str(dump),
                               *extra], capture_output=True, timeout=300, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        return int(json.loads(usage.read_text())[0]) >> 10

    table, document = peak(), peak("--json")
    assert document <= table + 16, (document, table)
