"""What the kit is given that is not UTF-8, or not a number a record holds: the record is
written whatever the command was given (never lost after the command ran), a trace keeps a
phase's record and the caller's own error, and an argument the audit would refuse is refused
before anything runs, with one line and exit 2."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from auditor._cli import main
from auditor.capture import Trace
from tests.capture.support import lines

ODD = os.fsdecode(b"caf\xe9")
"""A text made of a byte that is not UTF-8, as the system hands it to Python."""


def _run(target: Path, job: str, *extra: str) -> int:
    return main(["run", "--pair", "p", "--period", "1", "--gpus", "1", "--attempt-dir",
                 str(target), "--job-id", job, *extra])


@pytest.mark.parametrize("given", [
    ["--", "sh", "-c", "echo ran", "sh", ODD],
    ["--dispatch", f"NOTE={ODD}", "--", "sh", "-c", "echo ran"],
])
def test_a_run_given_text_that_is_not_utf8_keeps_its_record(tmp_path: Path,
                                                            given: list[str]) -> None:
    target = tmp_path / "attempt"
    assert _run(target, "60", *given) == 0
    record = json.loads((target / "trial-60.json").read_bytes())
    assert record["invocation"]["exit_code"] == 0
    assert "caf\\\\xe9" in (target / "trial-60.json").read_text()  # (written printable)
    assert "ran" in (target / "training-60.log").read_text()


def test_a_step_given_text_that_is_not_utf8_keeps_its_process_record(tmp_path: Path) -> None:
    target = tmp_path / "attempt"
    target.mkdir()
    assert main(["run", "--step", "worker", "--attempt-dir", str(target), "--", "sh", "-c",
                 "exit 3", "sh", ODD]) == 3
    (record,) = (target / "processes").iterdir()
    assert json.loads(record.read_bytes())["exit_code"] == 3


def test_a_phase_whose_error_is_not_utf8_keeps_its_record_and_the_error(
        tmp_path: Path) -> None:
    with Trace(tmp_path, rank=0) as trace:
        with pytest.raises(MemoryError) as raised, trace.phase("rollout_init"):
            raise MemoryError(f"x {ODD}")
    assert raised.value.__context__ is None  # (the caller's own error, not one of the kit's)
    (record,) = lines(trace.path)
    assert (record["phase"], record["error_type"], record["error_message"]) == (
        "rollout_init", "MemoryError", "x caf\\xe9")


def test_seal_refuses_a_file_name_that_is_not_utf8(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "p-1gpu" / "attempt-70"
    assert _run(target, "70", "--", "true") == 0
    (target / f"core{ODD}").write_bytes(b"x")
    capsys.readouterr()
    assert main(["seal", str(tmp_path), "--pair", "p", "--period", "1", "--gpus", "1",
                 "--attempt-dir", "p-1gpu/attempt-70", "--commit", "0" * 40]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not UTF-8" in err and "corecaf\\xe9" in err, err
    assert not (tmp_path / "pairs").exists()


@pytest.mark.parametrize(("argv", "message"), [
    (["run", "--pair", "p", "--period", "1", "--gpus", "1", "--job-id", "\u0663", "--",
      "true"], "no job id"),
    (["run", "--pair", "p", "--period", "1", "--gpus", "1", "--job-id", "\u00b2", "--",
      "true"], "no job id"),
    (["run", "--pair", "p", "--period", str(1 << 63), "--gpus", "1", "--job-id", "1", "--",
      "true"], "past what a record holds"),
    (["run", "--pair", "p", "--period", "\u0661", "--gpus", "1", "--job-id", "1", "--",
      "true"], "not a whole number"),
    (["run", "--step", "w", "--rank", "-3", "--", "true"], "not 0 or more"),
    (["seal", ".", "--pair", "p", "--period", "99999999999999999999999", "--gpus", "1",
      "--attempt-dir", "a"], "past what a record holds"),
    (["seal", ".", "--pair", "p", "--period", "1", "--gpus", "1", "--attempt-dir", "a",
      "--seed", str(1 << 64)], "past what a record holds"),
])
def test_numbers_a_record_cannot_hold_are_refused(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str],
                                                  argv: list[str], message: str) -> None:
    os.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert list(tmp_path.iterdir()) == []


def test_a_device_file_refuses_a_role_that_would_make_its_name_ambiguous(
        tmp_path: Path) -> None:
    from auditor.capture import write_device_evidence

    with pytest.raises(ValueError, match="letters, digits"):
        write_device_evidence(tmp_path, rank=0, role="pol-icy")
    assert not (tmp_path / "device-evidence").exists()
    assert write_device_evidence(tmp_path, rank=0, role="policy").name.startswith(
        "worker-policy-0-")


def test_output_still_in_the_pipe_as_the_command_exits_is_no_pipe_held_open(
        tmp_path: Path) -> None:
    """A command that writes 100 KB and exits leaves some of it in the pipe: that is read,
    not called a pipe held open (half of such runs said so); a straggler that keeps the
    pipe is still named."""
    held = []
    for run in range(8):
        target = tmp_path / f"a{run}"
        assert _run(target, str(90 + run), "--", "sh", "-c",
                    "head -c 100000 /dev/zero | tr '\\0' x") == 0
        held.append(json.loads((target / f"trial-{90 + run}.json").read_bytes())[
            "pipe_held_open"])
    assert held == [False] * 8
    target = tmp_path / "straggler"
    assert _run(target, "99", "--drain", "1", "--", "sh", "-c", "(sleep 3) & echo hi") == 0
    assert json.loads((target / "trial-99.json").read_bytes())["pipe_held_open"] is True


def test_a_stdout_nobody_reads_never_stops_the_grace(tmp_path: Path) -> None:
    """The wrapper's stdout a pipe whose reader stopped, the command ignoring SIGTERM and
    writing on: the SIGKILL still comes when the grace is over (a blocking echo held the
    wrapper in a write, its clock stopped, until the reader went away)."""
    import signal
    import subprocess
    import sys
    import time

    from tests.capture.support import clean_env

    target = tmp_path / "attempt"
    command = ("import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
               "while True: print('y' * 1000, flush=True)")
    wrapper = subprocess.Popen(
        [sys.executable, "-m", "auditor", "run", "--pair", "p", "--period", "1", "--gpus",
         "1", "--attempt-dir", str(target), "--job-id", "39", "--grace", "2", "--",
         sys.executable, "-c", command],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=clean_env())
    try:
        deadline = time.monotonic() + 30
        while not (target / "training-39.log").exists() \
                or (target / "training-39.log").stat().st_size < 1 << 20:
            assert time.monotonic() < deadline, "the command never wrote"
            time.sleep(0.1)
        wrapper.send_signal(signal.SIGTERM)  # (its stdout full, nobody reading it)
        assert wrapper.wait(timeout=20) == 137  # (the command, SIGKILLed after the grace)
    finally:
        if wrapper.poll() is None:
            wrapper.kill()
            wrapper.wait()
        assert wrapper.stdout is not None
        wrapper.stdout.close()
    record = json.loads((target / "trial-39.json").read_bytes())
    assert record["killed_after_grace"] is True


def test_the_echo_writes_to_a_descriptor_past_1023() -> None:
    """A launcher holding many files open hands the wrapper a high stdout descriptor: the
    echo still reaches it (``select.select`` refuses one past 1023; ``poll`` does not)."""
    import resource

    from auditor.capture.supervise import _echo

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1100:
        pytest.skip("this system allows fewer than 1,100 open files")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1100), hard))
    read, write = os.pipe()
    try:
        high = os.dup2(write, 1090)
        assert _echo(high, b"echoed") == high
        assert os.read(read, 100) == b"echoed"
        os.close(high)
    finally:
        os.close(read)
        os.close(write)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _deep(path: Path, head: str = "", tail: str = "") -> None:
    path.write_text(head + "[" * 100_000 + "]" * 100_000 + tail)


HOSTILE = {
    "process record nested past recursion": lambda a: _deep(
        a / "processes" / "node1-policy-77.json"),
    "device file nested past recursion": lambda a: _deep(
        a / "device-evidence" / "worker-policy-0-77.json"),
    "device file a FIFO": lambda a: os.mkfifo(a / "device-evidence" / "worker-policy-0-77.json"),
    "trace a FIFO": lambda a: os.mkfifo(a / "allocator-traces" / "allocator-77.jsonl"),
    "trace's terminal record nested past recursion": lambda a: _deep(
        a / "allocator-traces" / "allocator-77.jsonl", '{"kind":"terminal","x":', "}\n"),
    "protocol a FIFO": lambda a: os.mkfifo(a.parent.parent / "protocol.json"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_file_a_worker_left_never_costs_the_run_its_record(
        tmp_path: Path, case: str) -> None:
    """One file in the attempt (or the study's protocol) that the kit's readers at the
    command's end cannot use: a JSON document nested past the interpreter's recursion ended
    the run in an internal error (exit 3) without its trial record, and a FIFO blocked it
    for ever (the allocation held until Slurm killed it). Each is now a file it cannot
    use: the record is written and the run ends as its command did."""
    from tests.capture.support import auditor

    root = tmp_path / "root"
    attempt = root / "p-4gpu" / "attempt-9001"
    for folder in ("processes", "device-evidence", "allocator-traces"):
        (attempt / folder).mkdir(parents=True)
    HOSTILE[case](attempt)
    done = auditor(["run", "--root", str(root), "--pair", "p", "--period", "1", "--gpus", "4",
                    "--job-id", "9001", "--dispatch", "TOTAL_TRAINING_STEPS=5", "--", "sh",
                    "-c", "echo hi"], timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    assert json.loads((attempt / "trial-9001.json").read_bytes())["invocation"][
        "exit_code"] == 0
