"""The producer kit's array as a real Slurm 22.05 ran it, from its saved copy: no cluster needed.

``fixtures/slurm/kit/`` holds what ``python -m tests.slurm.kit DIR`` saved (see its NOTES.md):
the sealed study (``study/``: protocol, period records, every attempt's files and
``accounting/sacct-raw.psv``, the ``-D`` dump), the contract's dump and the ``-D`` one
(``contract.psv``, ``contract-D.psv``) and the batch outputs. Every check of
:class:`tests.slurm.kit_checks.KitVerdicts` runs here on an audit of that copy, with each
dump; ``auditor sacct --json`` is checked on both dumps. Where the auditor is wrong today the
test asserts the right answer and is marked ``xfail(strict=True)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from auditor._cli import main
from tests.slurm.kit import GPUS
from tests.slurm.kit_checks import SACCT, Audited, KitVerdicts, audit, elements, records

KIT = Path(__file__).resolve().parents[2] / "fixtures" / "slurm" / "kit"
ARRAY = "1"
DUMPS = {name: (KIT / f"{name}.psv").read_text() for name in ("contract", "contract-D")}


@pytest.fixture(scope="module", params=["contract-D", "contract"])
def audited(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Audited:
    out = tmp_path_factory.mktemp("kit-saved") / "out"
    return audit(KIT / "study", out, ARRAY, DUMPS, request.param)


class TestSavedKit(KitVerdicts):
    """The checks on the saved study."""


def test_the_study_holds_the_D_dump() -> None:
    assert (KIT / "study" / "accounting" / "sacct-raw.psv").read_text() == DUMPS["contract-D"]


def sacct_json(capsys: pytest.CaptureFixture[str], name: str) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["sacct", str(KIT / f"{name}.psv"), "--json"]) == 0
    document = orjson.loads(capsys.readouterr().out)
    assert isinstance(document, dict)
    return document


def by_task(document: dict[str, Any]) -> dict[int | None, dict[str, Any]]:
    return {job["array_task_id"]: job for job in document["jobs"]}


@pytest.mark.parametrize("name", ["contract", "contract-D"])
def test_sacct_json_reads_each_element(capsys: pytest.CaptureFixture[str], name: str) -> None:
    jobs = by_task(sacct_json(capsys, name))
    assert set(jobs) == set(SACCT)                       # 11 absent, no pending range
    for task, (state, code, batch_state, batch_code) in SACCT.items():
        job = jobs[task]
        exit_code, signal = (int(part) for part in code.split(":"))
        assert (job["state"], job["exit_code"], job["signal"]) == (
            state.split()[0], exit_code, signal), task
        batch_exit, batch_signal = (int(part) for part in batch_code.split(":"))
        assert (job["steps"][0]["step"], job["steps"][0]["state"], job["steps"][0]["exit_code"],
                job["steps"][0]["signal"]) == (
            "batch", batch_state.split()[0], batch_exit, batch_signal), task
        assert (job["array_job_id"], job["gpus"]) == (ARRAY, GPUS), task
        latest = records(DUMPS[name], ARRAY, task)[-1]
        assert (job["job_id_raw"], job["elapsed_s"]) == (latest[1], int(latest[7])), task
        assert job["gpu_seconds"] == GPUS * int(latest[7]), task
    assert jobs[12]["job_id_raw"] == ARRAY               # the last task took the array's record


def test_sacct_json_totals(capsys: pytest.CaptureFixture[str]) -> None:
    totals = sacct_json(capsys, "contract")["totals"]
    latest = elements(DUMPS["contract"], ARRAY)
    assert totals["jobs"] == len(SACCT) == len(latest)
    assert totals["gpu_seconds"] == sum(GPUS * int(row[7]) for row in latest)
    assert totals["states"] == {"COMPLETED": 4, "FAILED": 6, "CANCELLED": 1, "TIMEOUT": 1}


def test_sacct_json_exit_code_may_have_lost_128(capsys: pytest.CaptureFixture[str]) -> None:
    jobs = by_task(sacct_json(capsys, "contract"))
    for task, printed in ((4, 15), (7, 10), (9, 9), (10, 127)):
        assert jobs[task]["exit_code"] == printed, task
        assert jobs[task]["exit_code_may_be"] == [printed, printed + 128], task


def test_sacct_json_keeps_the_requeued_attempt(capsys: pytest.CaptureFixture[str]) -> None:
    document = sacct_json(capsys, "contract-D")
    first = records(DUMPS["contract-D"], ARRAY, 8)[0]
    attempts = by_task(document)[8]["attempts"]
    assert [(a["state"], a["elapsed_s"], a["gpus"]) for a in attempts] == [
        ("REQUEUED", int(first[7]), GPUS)]
    every = elements(DUMPS["contract-D"], ARRAY)
    assert document["totals"]["gpu_seconds"] == sum(GPUS * int(row[7]) for row in every)
    assert document["totals"]["requeued_gpu_seconds"] == GPUS * int(first[7])
