"""The report's inputs digest is streamed (the evidence files' lines are never held and
sorted at once): it is still the SHA-256 of every input line the manifest lists, sorted as
text, when file names sort apart from their lines (a control character below TAB, a byte
that is not UTF-8)."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from auditor._cli import main
from tests.helpers import copy_example


def _recomputed(out: Path) -> str:
    manifest = orjson.loads((out / "output_manifest.json").read_bytes())
    lines = sorted(f"{item['path']}\t{item['sha256']}\t{item['size']}\n"
                   for group in ("raw_evidence", "source_inputs", "protocol_inputs")
                   for item in manifest[group])
    return hashlib.sha256("".join(lines).encode("utf-8")).hexdigest()


def _stated(out: Path) -> str:
    found = re.search(r"inputs digest: ([0-9a-f]{64})", (out / "diagnostic.md").read_text())
    assert found is not None
    return found.group(1)


def test_names_sorting_apart_from_their_lines_give_the_sorted_lines_digest(
        tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    extra = os.fsencode(sorted(root.glob("*/attempt-*"))[0])
    for name in (b"zz", b"zz\x01", b"zz\xff", b"zz-\x02"):  # (unlisted: read and hashed)
        with open(os.path.join(extra, name), "wb") as handle:
            handle.write(name)
    out = tmp_path / "out"
    assert main(["audit", str(root), "--out", str(out), "--quiet", "--no-plots"]) in (0, 1)
    manifest = (out / "output_manifest.json").read_text()
    assert "/zz\\u0001" in manifest and "/zz\\\\xff" in manifest and "/zz-\\u0002" in manifest
    assert _stated(out) == _recomputed(out)


def test_the_usual_names_give_the_sorted_lines_digest(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["audit", str(copy_example(tmp_path)), "--out", str(out), "--quiet",
                 "--no-plots"]) == 0
    assert _stated(out) == _recomputed(out)


def test_the_usual_names_are_digested_as_they_stream(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Names whose lines sort as their paths do (every usual name) are digested in one
    streamed pass, in order: the fallback that sorts every line is not taken."""
    import auditor.report.appendix as appendix

    passes: list[str] = []
    real = appendix._in_order

    def watched(lines: Iterator[str]) -> Iterator[str]:
        passes.append("started")
        yield from real(lines)
        passes.append("finished")

    monkeypatch.setattr(appendix, "_in_order", watched)
    out = tmp_path / "out"
    assert main(["audit", str(copy_example(tmp_path)), "--out", str(out), "--quiet",
                 "--no-plots"]) == 0
    assert passes == ["started", "finished"]
    assert _stated(out) == _recomputed(out)
