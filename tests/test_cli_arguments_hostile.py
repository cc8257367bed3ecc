"""Hostile command-line arguments: each is refused with one line and exit 2, never a hang,
a read without end or an internal error (exit 3)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from auditor._cli import main
from tests.helpers import example_catalogue

MAIN = "import sys; from auditor._cli import main; sys.exit(main(sys.argv[1:]))"
"""``main([...])`` in a child process: one that hangs is killed at its deadline and fails."""
DEADLINE_S = 30


def _main_within_deadline(*argv: str) -> subprocess.CompletedProcess[str]:
    """``main(argv)`` in a child, failing the test (not hanging it) past :data:`DEADLINE_S`."""
    try:
        return subprocess.run([sys.executable, "-c", MAIN, *argv], capture_output=True,
                              text=True, check=False, timeout=DEADLINE_S,
                              env={**os.environ, "NO_COLOR": "1"})
    except subprocess.TimeoutExpired:
        pytest.fail(f"auditor {' '.join(argv)} still running after {DEADLINE_S} s")


def _one_line(err: str, needle: str) -> None:
    assert err.count("\n") == 1, err
    assert "Traceback" not in err and "internal error" not in err, err
    assert needle in err, err


@pytest.fixture(scope="module")
def cat(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A catalogue of the example study's audit."""
    return example_catalogue(tmp_path_factory.mktemp("hostile-query"))


@pytest.mark.parametrize("what", ["fifo", "/dev/zero"])
def test_causes_refuses_a_protocol_that_is_no_regular_file(tmp_path: Path, what: str) -> None:
    """A FIFO as --protocol would wait for a writer for ever, /dev/zero never end."""
    log = tmp_path / "training-1.log"
    log.write_text("step: 1\n")
    protocol = what
    if what == "fifo":
        protocol = str(tmp_path / "protocol.json")
        os.mkfifo(protocol)
    done = _main_within_deadline("causes", str(log), "--protocol", protocol)
    assert done.returncode == 2, done.stderr
    _one_line(done.stderr, f"--protocol {protocol}: not a regular file")


@pytest.mark.parametrize("what", ["fifo", "/dev/zero", "directory"])
def test_audit_refuses_a_protocol_input_or_dump_that_is_no_regular_file(
        tmp_path: Path, what: str) -> None:
    """/dev/zero as --protocol-input was read without end (the audit hung), and a FIFO with
    no writer waited for one for ever; as --sacct they were "no such file"."""
    from tests.helpers import copy_example

    root = copy_example(tmp_path)
    given = {"fifo": str(tmp_path / "input"), "/dev/zero": "/dev/zero",
             "directory": str(tmp_path)}[what]
    if what == "fifo":
        os.mkfifo(given)
    done = _main_within_deadline("audit", str(root), "--protocol-input", f"p={given}",
                                 "--anchor", "p=" + "a" * 64, "--quiet", "--no-plots")
    assert done.returncode == 2, done.stderr
    _one_line(done.stderr, f"--protocol-input p={given}: cannot read (" + (
        "a pipe, which no later 'auditor verify' can read again; save it to a file"
        if what == "fifo" else "not a regular file"))
    done = _main_within_deadline("audit", str(root), "--sacct", given, "--quiet",
                                 "--no-plots")
    assert done.returncode == 2, done.stderr
    _one_line(done.stderr, f"--sacct {given}: " + (
        "is a directory" if what == "directory" else "is not a regular file"))


def test_a_protocol_input_from_a_process_substitution_is_refused_in_one_line(
        tmp_path: Path) -> None:
    """``--protocol-input freeze=<(git show HEAD:freeze.md)``: a pipe, which the audit could
    pin but no later ``auditor verify`` (nor the catalogue) could read again, refusing the
    audit for ever: refused at once, saying to save it to a file, never waited on."""
    import shutil

    from tests.helpers import copy_example

    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash for a process substitution")
    root = copy_example(tmp_path)
    script = (f'"$PY" -c "$MAIN" audit "{root}" --out "{tmp_path / "out"}" --quiet '
              "--no-plots --protocol-input freeze=<(printf 'frozen\\n') "
              f"--anchor freeze={'a' * 64}")
    done = subprocess.run([bash, "-c", script], capture_output=True, text=True,
                          timeout=DEADLINE_S, check=False,
                          env={**os.environ, "NO_COLOR": "1", "PY": sys.executable,
                               "MAIN": MAIN})
    assert done.returncode == 2, done.stderr
    _one_line(done.stderr, "save it to a file")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("option", "value", "said"), [
    ("--sacct-delimiter", "", "--sacct-delimiter '' is unusable"),
    ("--sacct-delimiter", "\n", "is unusable"),
    ("--sacct-format", ",,,", "--sacct-format names no field"),
])
def test_audit_refuses_unusable_dump_options_before_any_work(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str,
        said: str) -> None:
    """An option no dump can be read with ended the audit 0, its dump refused (AUD009) and
    every verdict reached without the scheduler's word; 'auditor sacct' refused it (exit
    2). Now the audit does, before reading anything."""
    from tests.helpers import copy_example

    root = copy_example(tmp_path)
    assert main(["audit", str(root), "--out", str(tmp_path / "out"), option, value]) == 2
    _one_line(capsys.readouterr().err, said)
    assert not (tmp_path / "out").exists()


def test_causes_reads_at_most_the_protocol_limit(tmp_path: Path) -> None:
    """A protocol.json of a terabyte (sparse: zeros) is refused after its first MiB, not
    read to its end."""
    log = tmp_path / "training-1.log"
    log.write_text("step: 1\n")
    huge = tmp_path / "protocol.json"
    huge.touch()
    try:
        os.truncate(huge, 1 << 40)
    except OSError as error:
        pytest.skip(f"no sparse terabyte file here: {error.strerror}")
    done = _main_within_deadline("causes", str(log), "--protocol", str(huge))
    assert done.returncode == 2, done.stderr
    _one_line(done.stderr, "larger than the 1,048,576 bytes a protocol file may have")


@pytest.mark.parametrize("limit", ["99999999999999999999999", str(1 << 63)])
def test_query_refuses_a_limit_over_2_63_minus_1(cat: Path, limit: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["query", str(cat), "SELECT 1", "--limit", limit]) == 2
    _one_line(capsys.readouterr().err, f"--limit: {limit} rows is more than the most a query "
              "can give (9223372036854775807, 2**63-1; 0: all)")


def test_query_takes_a_limit_of_2_63_minus_1_and_its_help_says_the_most(
        cat: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["query", str(cat), "SELECT 1 AS one", "--limit", str((1 << 63) - 1),
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"one": 1}]
    with pytest.raises(SystemExit):
        main(["query", "--help"])
    assert "N above 2**63-1 is refused" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("argv", [["--grace", "inf"], ["--grace=-inf"], ["--grace", "Infinity"],
                                  ["--grace", "1e999"], ["--drain", "inf"]])
def test_run_refuses_a_grace_or_drain_that_is_not_finite(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    """As nan and -1 are: no attempt is started that would wait for ever."""
    code = main(["run", "--pair", "p", "--period", "1", "--gpus", "1", "--root", str(tmp_path),
                 "--job-id", "1", *argv, "--", "true"])
    assert code == 2
    name = argv[0].split("=")[0]
    _one_line(capsys.readouterr().err, f"{name} must be a finite number of seconds, 0 or more")
    assert not (tmp_path / "p-1gpu").exists()


@pytest.mark.parametrize(("name", "said"), [
    ("nonexistent", "no such file (nor can its kind be told from the name; pass --kind)"),
    ("trial-1.json", "no such file"),
    ("training-1.log", "no such file"),
])
def test_validate_says_a_missing_file_does_not_exist(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, said: str) -> None:
    """Exit 2 (unreadable or no kind, as documented), saying first that there is no file."""
    path = tmp_path / name
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    _one_line(err, f"{path}: {said}")
    assert "cannot tell its kind" not in err and "plain text" not in err


def test_validate_says_a_dangling_link_does_not_exist(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    link = tmp_path / "trial-1.json"
    link.symlink_to(tmp_path / "gone.json")
    assert main(["validate", str(link)]) == 2
    _one_line(capsys.readouterr().err, f"{link}: no such file")


def test_sacct_says_what_the_dumps_fields_leave_unknown(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A dump captured with made-up field names: every row's state is UNKNOWN, and the
    command says why (as the audit's AUD021 and AUD019), on stderr and in --json."""
    dump = tmp_path / "sacct.psv"
    dump.write_text("1|2|3\n4|5|6\n")
    assert main(["sacct", str(dump), "--format", "A,B,C"]) == 0
    err = capsys.readouterr().err
    assert "captured without JobID, State" in err and "the gate fails" in err, err
    assert err.count("invocations are not placed inside their allocation") == 1, err
    assert main(["sacct", str(dump), "--format", "A,B,C", "--json"]) == 0
    rules = {item["rule_id"] for item in json.loads(capsys.readouterr().out)["findings"]}
    assert {"AUD019", "AUD021"} <= rules


@pytest.mark.parametrize("argv", [
    ["example", "{tmp}/big", "--kind", "scale", "--elements", "99999999999999999999"],
    ["example", "{tmp}/big", "--kind", "scale", "--log-lines", "10000001"],
    ["example", "{tmp}/fixed", "--elements", "5"],  # (the example study is fixed: not ignored)
    ["example", "{tmp}/fixed", "--kind", "mixed", "--log-lines", "5"],
    ["causes", "{log}", "--steps", "-1"],
    ["causes", "{log}", "--steps", "99999999999999999999"],
    ["run", "--pair", "p\x1b]0;owned\x07", "--period", "1", "--gpus", "1", "--root",
     "{tmp}/root", "--job-id", "5", "--", "true"],
    ["seal", "{tmp}/root", "--pair", "p\x1b[31m", "--period", "1", "--gpus", "1",
     "--attempt-dir", "x/attempt-5"],
    # (not UTF-8: run took it, and no seal could ever name it)
    ["run", "--pair", "p\udcff", "--period", "1", "--gpus", "1", "--root", "{tmp}/root",
     "--job-id", "5", "--", "true"],
])
def test_an_impossible_count_or_a_pair_with_control_characters_is_one_line(
        argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A study of 10^20 elements (a MemoryError, exit 3), a step count no run has (never
    matched: "none found"), a pair's name a terminal would obey: each one line, exit 2."""
    log = Path(__file__).resolve().parent.parent / "fixtures" / "causes" / \
        "host_oom__trinity-notes-exceeded-memory-limit-job-cancelled.log"
    (tmp_path / "root").mkdir()
    given = [part.format(tmp=tmp_path, log=log) for part in argv]
    assert main(given) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\x1b" not in err and "Traceback" not in err
    assert not (tmp_path / "big").exists()


def test_causes_says_when_a_line_was_read_only_in_part(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A progress bar redrawn with carriage returns for 100 KB, then slurmstepd's time-limit
    line glued on: the line is longer than the scan reads, and the cause past its read part
    is not seen; 'none found' now says so (AUD007), in text and in --json."""
    bar = b"".join(b"\rMap (num_proc=64):  28%%|#  | %d/3468 [00:18<01:08]" % n
                   for n in range(2000))
    log = tmp_path / "long.log"
    log.write_bytes(bar + b"slurmstepd: error: *** JOB 1 ON r2 CANCELLED AT 2025-05-06T10:25:00"
                    b" DUE TO TIME LIMIT ***\n")
    capsys.readouterr()
    assert main(["causes", str(log)]) == 0
    assert "note: line 1 read only in part" in capsys.readouterr().out
    assert main(["causes", str(log), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["lines_read_in_part"] == [1]
