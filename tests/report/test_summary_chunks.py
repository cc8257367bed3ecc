"""``summary.json`` is written a batch of periods at a time: the bytes are those of the whole
document laid out at once (a name that is not UTF-8 and a figure past 64 bits included),
and the command never builds the whole document unless ``--json`` asks for it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest

import auditor.report.summary as summary_module
from auditor._cli import main
from auditor.model import AuditResult
from auditor.pipeline.audit import run_audit
from auditor.report.summary import build_summary, dumps, summary_chunks


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("summary") / "study"
    assert main(["example", str(root), "--kind", "mixed"]) == 0
    return root


@pytest.fixture(scope="module")
def result(study: Path) -> AuditResult:
    return run_audit(study)


@pytest.mark.parametrize("batch", [1, 2, 5, 1024])
def test_the_chunks_are_the_whole_document(result: AuditResult, batch: int) -> None:
    chunks = list(summary_chunks(result, batch))
    periods = len(result.verdicts)
    assert periods > 5
    assert b"".join(chunks) == dumps(build_summary(result))
    assert len(chunks) == 2 + -(-periods // batch)  # (the head, each batch, the tail)


def test_a_name_that_is_not_utf8_and_a_huge_figure_are_written_as_at_once(
        result: AuditResult) -> None:
    verdicts = list(result.reasoning.verdicts)
    verdicts[1] = replace(verdicts[1], pair=verdicts[1].pair + "-\udcff")
    facts = list(result.reasoning.facts)
    facts[2] = replace(facts[2], seed=1 << 70)
    odd = replace(result, verdicts=tuple(verdicts), reasoning=replace(
        result.reasoning, verdicts=tuple(verdicts), facts=tuple(facts)))
    whole = dumps(build_summary(odd))
    assert b"-\\\\xff" in whole and str(1 << 70).encode() in whole
    assert b"".join(summary_chunks(odd, 2)) == whole
    assert orjson.loads(whole)["periods"][1]["pair"].endswith("-\\xff")


def test_the_command_writes_the_periods_without_building_the_document(
        study: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[bool] = []
    real = summary_module.build_summary

    def recording(result: AuditResult, periods: bool = True) -> dict[str, Any]:
        built.append(periods)
        return real(result, periods)

    monkeypatch.setattr(summary_module, "build_summary", recording)
    out = tmp_path / "out"
    assert main(["audit", str(study), "--out", str(out), "--quiet", "--no-plots"]) in (0, 1)
    assert built and not any(built)  # (the terminal's summary, then the file's head)
    assert (out / "summary.json").read_bytes() == dumps(real(run_audit(study)))
    built.clear()
    assert main(["audit", str(study), "--out", str(tmp_path / "again"), "--json",
                 "--no-plots"]) in (0, 1)
    assert built.count(True) == 1  # (--json prints the whole document)
