"""Scheduler dumps in the forms sites save them (issue 39, contract v1.2 "Scheduler dumps,
more forms"), each made from a real dump of ``fixtures/slurm`` (Slurm 22.05, the endings
array; ``fixtures/slurm/NOTES.md``) the way that form comes about: a field more without a
header, ``-p`` output under a dashed frame line, rows pasted from a Python repr, a row short
of a field, no ElapsedRaw, a site's own state words. Each is read through ``auditor sacct``
and compared with what the real dump itself reads as.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from auditor._cli import main
from tests.helpers import sacct_document as sacct
from tests.slurm.cluster import CONTRACT_FORMAT

DUMPS = Path(__file__).resolve().parents[2] / "fixtures" / "slurm"


def refused(capsys: pytest.CaptureFixture[str], path: Path, *extra: str) -> str:
    """``auditor sacct PATH --json``'s one line on stderr (the command must exit 2)."""
    capsys.readouterr()
    assert main(["sacct", str(path), "--json", *extra]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def lines_of(name: str) -> list[str]:
    return (DUMPS / name).read_text().splitlines()


def write(tmp_path: Path, name: str, lines: list[str]) -> Path:
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines))
    return path


def jobs_of(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The entries without the lines they came from (a derived form may move them)."""
    return [{key: value for key, value in job.items() if key != "attempts"}
            for job in document["jobs"]]


def test_headerless_dump_with_a_field_more_is_refused_not_folded(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Slurm 24.11's real dump with the contract's fields plus ``Restarts``, no header
    (``fixtures/slurm/24.11/restarts.psv``): read with the contract's format, the extra
    value was folded into Reason (``None|0``); it is refused in one line that names the
    counts, and read right with its --format, as the contract's own dump of that moment."""
    path = DUMPS / "24.11" / "restarts.psv"
    line = refused(capsys, path)
    assert str(path) in line and "12 fields" in line and "has 11" in line
    assert "--format=" + CONTRACT_FORMAT + ",Restarts" in line
    document = sacct(capsys, path, "--format", CONTRACT_FORMAT + ",Restarts")
    contract = sacct(capsys, DUMPS / "24.11" / "contract.psv")
    restarts = {job["job_id"]: job.pop("restarts") for job in document["jobs"]}
    assert restarts == {job["job_id"]: 1 if job["job_id"] in ("1_6", "1_7") else 0
                        for job in contract["jobs"]}
    assert [f["rule_id"] for f in document.pop("findings")] == ["AUD024"]  # (no -D)
    contract.pop("findings")
    assert document == contract


def test_a_headerless_row_with_a_field_more_is_refused_alone_too(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The refusal held from two rows on: one row (``sacct -X`` of one job) folded its
    ``Restarts`` into Reason and was read, exit 0."""
    (row, *_) = (DUMPS / "24.11" / "restarts.psv").read_text().splitlines()
    line = refused(capsys, write(tmp_path, "one.psv", [row]))
    assert "12 fields" in line and "has 11" in line
    # (a job name holding the delimiter is no field more: -P does not escape it, contract)
    named = row.split("|")
    named[2] = "my|job"
    path = write(tmp_path, "named.psv", ["|".join(named[:11])])
    document = sacct(capsys, path)
    assert [job["state"] for job in document["jobs"]] == ["COMPLETED"]


def test_p_output_under_a_dashed_frame_line_is_read(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """``sacct -p`` (every line ends in the delimiter) with its header and a dashed line
    under it, as a terminal paste frames it: read as the header dump, not refused as
    fixed width."""
    header, *rows = lines_of("header.psv")
    path = write(tmp_path, "framed.txt",
                 [header + "|", "-" * len(header), *(row + "|" for row in rows)])
    assert sacct(capsys, path) == sacct(capsys, DUMPS / "header.psv")


def test_fixed_width_under_a_dashed_line_is_still_refused(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A real fixed-width dump keeps being refused: its rows hold no delimiter."""
    path = write(tmp_path, "fixed.txt", [
        "       JobID    JobName      State ExitCode ",
        "------------ ---------- ---------- -------- ",
        "1_0             endings  COMPLETED      0:0 ",
        "1_0.batch         batch  COMPLETED      0:0 ",
    ])
    assert "fixed-width" in refused(capsys, path)


@pytest.mark.parametrize("form", ["fields", "repr"])
def test_quoted_rows_pasted_from_a_python_repr_lose_no_job(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, form: str) -> None:
    """Each field quoted (``'1_3'|'5'|...``) or each row as ``repr(line)`` prints it
    (``'1_3|5|...|None\\n'``): every job is read as in the dump itself."""
    rows = lines_of("contract.psv")
    if form == "fields":
        quoted = ["|".join(f"'{value}'" for value in row.split("|")) for row in rows]
    else:
        quoted = [repr(row + "\n") for row in rows]
    path = write(tmp_path, f"quoted-{form}.txt", quoted)
    assert sacct(capsys, path) == sacct(capsys, DUMPS / "contract.psv")


def test_row_short_of_a_field_under_a_p_header_is_aud008(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """``-p`` output (a trailing delimiter) with a header, one row short of a field (its
    NodeList lost): the row's Reason read as NodeList and an empty Reason, silently; it is
    an AUD008 at its line, and the job row is not used."""
    header, *rows = lines_of("header.psv")
    at = next(i for i, row in enumerate(rows) if row.startswith("1_3|"))
    values = rows[at].split("|")
    rows[at] = "|".join(values[:9] + values[10:])
    path = write(tmp_path, "short.txt", [header + "|", *(row + "|" for row in rows)])
    document = sacct(capsys, path)
    said = [(f["rule_id"], f["line"]) for f in document["findings"]]
    assert ("AUD008", at + 2) in said, said
    message = next(f["message"] for f in document["findings"] if f["line"] == at + 2)
    assert "10 fields where the format has 11" in message, message
    assert "1_3" not in [job["job_id"] for job in document["jobs"]]


def test_no_elapsedraw_takes_end_minus_start(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The contract's dump captured without ElapsedRaw: each record's elapsed time is End
    minus Start (what sacct computes ElapsedRaw from), so the allocation scope is known and
    the same as with it."""
    fields = CONTRACT_FORMAT.split(",")
    drop = fields.index("ElapsedRaw")
    rows = ["|".join(v for i, v in enumerate(row.split("|")) if i != drop)
            for row in lines_of("contract-D.psv")]
    path = write(tmp_path, "no-elapsedraw.psv", rows)
    fmt = ",".join(f for f in fields if f != "ElapsedRaw")
    document = sacct(capsys, path, "--format", fmt)
    contract = sacct(capsys, DUMPS / "contract-D.psv")
    # (the stale pending range never started: its Start is None, its elapsed time unknown)
    assert [job["elapsed_s"] for job in document["jobs"]] == [
        None if "[" in job["job_id"] else job["elapsed_s"] for job in contract["jobs"]]
    assert [[a["elapsed_s"] for a in job["attempts"]] for job in document["jobs"]] == [
        [a["elapsed_s"] for a in job["attempts"]] for job in contract["jobs"]]
    for key in ("gpu_seconds", "requeued_gpu_seconds", "states"):
        assert document["totals"][key] == contract["totals"][key], key
    assert document["totals"]["gpu_seconds"] == 482


def test_a_state_sacct_never_prints_is_a_finding(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A site's own state word (``ZOMBIE``) is said (AUD124, at its first row, with how
    many rows hold it), never accepted in silence."""
    rows = [row.replace("|FAILED|", "|ZOMBIE|") for row in lines_of("contract.psv")]
    path = write(tmp_path, "zombie.psv", rows)
    document = sacct(capsys, path)
    said = [f for f in document["findings"] if f["rule_id"] == "AUD124"]
    assert len(said) == 1, said
    first = next(i for i, row in enumerate(rows) if "|ZOMBIE|" in row) + 1
    assert said[0]["line"] == first
    assert "state 'ZOMBIE' of 1_1 " in said[0]["message"] and "more row(s)" in said[0]["message"]


def test_a_record_without_a_slurm_state_never_replaces_the_last_real_one(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Task 3's ``CANCELLED by 0`` record followed by an ``INVALID`` record of the same job
    (a site's tool appending its own word): the job stays CANCELLED; the INVALID record is
    an AUD124 saying it was not used."""
    rows = lines_of("contract.psv")
    cancelled = next(row for row in rows if row.startswith("1_3|"))
    path = write(tmp_path, "invalid.psv", [*rows, cancelled.replace("CANCELLED by 0", "INVALID")])
    document = sacct(capsys, path)
    job = next(job for job in document["jobs"] if job["job_id"] == "1_3")
    assert (job["state"], job["attempts"]) == ("CANCELLED", [])
    said = [f for f in document["findings"] if f["rule_id"] == "AUD124"]
    assert len(said) == 1 and said[0]["line"] == len(rows) + 1, said
    assert "'INVALID'" in said[0]["message"] and "not used" in said[0]["message"]
    assert jobs_of(document) == jobs_of(sacct(capsys, DUMPS / "contract.psv"))
