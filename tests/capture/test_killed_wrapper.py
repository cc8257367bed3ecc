"""Nothing outlives a killed wrapper (issue 41, item 5): ``auditor run`` SIGKILLed at a
random moment takes its trainer with it (the death signal on the command, the guardian for
what left its group or session), and the next run of the job finds the attempt without a
trial record, says so in its own, and removes the temporaries a killed write left there.

The issue's experiment is run for real: 17 of 20 wrappers killed so left their trainers
alive, writing into the attempt."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # (real processes, SIGKILL)

TRAINER = r"""
import os, subprocess, sys, time
attempt = os.environ["AUDITOR_ATTEMPT_DIR"]
beat = '''
import os, sys, time
with open(sys.argv[1], "a") as out:
    while True:
        out.write("beat\\n"); out.flush(); time.sleep(0.02)
'''
os.makedirs(os.path.join(attempt, "beats"), exist_ok=True)
children = [subprocess.Popen([sys.executable, "-c", beat,
                              os.path.join(attempt, "beats", "child")]),
            subprocess.Popen([sys.executable, "-c", beat,  # (a session of its own)
                              os.path.join(attempt, "beats", "daemon")],
                             start_new_session=True)]
with open(os.path.join(attempt, "pids.txt"), "a") as out:
    out.write("".join(f"{pid}\n" for pid in [os.getpid(), *(c.pid for c in children)]))
print("training", flush=True)
with open(os.path.join(attempt, "beats", "trainer"), "a") as out:
    while True:
        out.write("beat\n"); out.flush(); time.sleep(0.02)
"""


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, waiting for whoever adopted it, does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3] != b"Z"


def _wrapper(root: Path, restart: int = 0) -> subprocess.Popen[bytes]:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("SLURM_", "AUDITOR_"))}
    env["SLURM_RESTART_COUNT"] = str(restart)
    return subprocess.Popen(
        [sys.executable, "-m", "auditor", "run", "--root", str(root), "--pair", "p",
         "--period", "1", "--gpus", "1", "--job-id", "7001", "--",
         sys.executable, "-c", TRAINER], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL)


def _pids(attempt: Path, deadline: float) -> list[int]:
    while time.monotonic() < deadline:
        text = (attempt / "pids.txt").read_text() if (attempt / "pids.txt").exists() else ""
        if text.count("\n") == 3:
            return [int(line) for line in text.split()]
        time.sleep(0.02)
    raise AssertionError("the trainer never started its children")


def test_a_sigkilled_wrapper_takes_every_process_of_its_command(tmp_path: Path) -> None:
    chance = random.Random(41)
    for run in range(6):
        root = tmp_path / f"root-{run}"
        wrapper = _wrapper(root)
        attempt = root / "p-1gpu" / "attempt-7001"
        pids = _pids(attempt, time.monotonic() + 30)
        time.sleep(chance.uniform(0.0, 0.8))
        wrapper.kill()
        wrapper.wait()
        deadline = time.monotonic() + 5
        while any(map(_alive, pids)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [pid for pid in pids if _alive(pid)], f"run {run}: left alive"
        sizes = {path.name: path.stat().st_size for path in (attempt / "beats").iterdir()}
        time.sleep(0.3)
        assert sizes == {path.name: path.stat().st_size
                         for path in (attempt / "beats").iterdir()}, "still writing"


CLEAN_DAEMON = r"""
import os, subprocess, sys, time
attempt = os.environ["AUDITOR_ATTEMPT_DIR"]
beat = "import time\nwhile True: time.sleep(0.02)\n"
daemon = subprocess.Popen([sys.executable, "-c", beat], env={},  # (no token in it)
                          start_new_session=True)
with open(os.path.join(attempt, "pids.txt"), "a") as out:
    out.write(f"{os.getpid()}\n{daemon.pid}\n\n")
print("training", flush=True)
time.sleep(60)
"""


def test_a_sigkilled_wrapper_takes_a_helper_without_its_token(tmp_path: Path) -> None:
    """A helper the command started with an environment of its own (no run token) in a
    session of its own, seen by the wrapper while it ran: the guardian knows it by its pid
    and start time, and ends it when the wrapper is SIGKILLed; a process outside the run
    is left alone."""
    outside = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                               start_new_session=True)
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("SLURM_", "AUDITOR_"))}
    wrapper = subprocess.Popen(
        [sys.executable, "-m", "auditor", "run", "--root", str(tmp_path), "--pair", "p",
         "--period", "1", "--gpus", "1", "--job-id", "7003", "--",
         sys.executable, "-c", CLEAN_DAEMON], env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    pids = _pids(tmp_path / "p-1gpu" / "attempt-7003", time.monotonic() + 30)
    time.sleep(1.5)  # (a look at the command's processes comes every second)
    wrapper.kill()
    wrapper.wait()
    deadline = time.monotonic() + 5
    try:
        while any(map(_alive, pids)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [pid for pid in pids if _alive(pid)], "left alive"
        assert _alive(outside.pid)
    finally:
        outside.kill()
        outside.wait()
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_the_next_run_finds_the_killed_attempt_and_removes_its_temporaries(
        tmp_path: Path) -> None:
    """The requeue (restart 1) of a job whose wrapper was SIGKILLed: its trial record
    names the attempt left without one, and the temporary a write killed midway left in it
    (a device file's) is gone, so no seal lists it and no audit flags it."""
    wrapper = _wrapper(tmp_path)
    attempt = tmp_path / "p-1gpu" / "attempt-7001"
    _pids(attempt, time.monotonic() + 30)
    (attempt / "device-evidence").mkdir()
    (attempt / "device-evidence" / ".device-rank0-p-1.json.tmp-4242").write_text('{"ha')
    wrapper.kill()
    wrapper.wait()
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("SLURM_", "AUDITOR_"))}
    again = subprocess.run(
        [sys.executable, "-m", "auditor", "run", "--root", str(tmp_path), "--pair", "p",
         "--period", "1", "--gpus", "1", "--job-id", "7001", "--", "true"],
        env={**env, "SLURM_RESTART_COUNT": "1"}, capture_output=True, check=False)
    assert again.returncode in (0, 1), again.stderr
    trial = json.loads((tmp_path / "p-1gpu" / "attempt-7001-r1" / "trial-7001.json")
                       .read_text())
    assert trial["unfinished_attempts"] == [{
        "attempt_dir": "attempt-7001", "log": True,
        "temporaries_removed": ["device-evidence/.device-rank0-p-1.json.tmp-4242"]}]
    assert not (attempt / "device-evidence" / ".device-rank0-p-1.json.tmp-4242").exists()
    log = (tmp_path / "p-1gpu" / "attempt-7001-r1" / "training-7001.log").read_text()
    assert "attempt-7001 has no trial record" in log


def test_a_finished_run_leaves_its_guardian_nothing_to_do(tmp_path: Path) -> None:
    """The guardian of a run that ended as it should touches nothing, and is gone: a
    process the command left running on purpose (outside the run, without its token)
    is not its to end."""
    outside = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                               start_new_session=True)
    try:
        env = {key: value for key, value in os.environ.items()
               if not key.startswith(("SLURM_", "AUDITOR_"))}
        done = subprocess.Popen(
            [sys.executable, "-m", "auditor", "run", "--root", str(tmp_path), "--pair", "p",
             "--period", "1", "--gpus", "1", "--job-id", "7002", "--", "true"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, err = done.communicate(timeout=60)
        assert done.returncode in (0, 1), err
        assert _alive(outside.pid)
        token = f"\0{done.pid}-".encode()  # (the run's token starts with its wrapper's pid)
        guardians = [name for name in os.listdir("/proc") if name.isdigit()
                     and b"AUDITOR_RUN_TOKEN" in _cmdline(int(name))
                     and token in _cmdline(int(name))]
        assert guardians == []
    finally:
        outside.send_signal(signal.SIGKILL)
        outside.wait()


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read()
    except OSError:
        return b""


def test_a_hangup_ends_auditor_run_as_it_always_did(tmp_path: Path) -> None:
    """Review U: the audit's SIGHUP handling (a closed terminal cleans up as Ctrl-C) was
    installed for every command: ``auditor run`` then said "interrupted; no output was left
    half-written" and exited 130, neither true of a run without its trial record. The run
    keeps the contract's signals; a hangup ends it as before (129), its command with it."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("SLURM_", "AUDITOR_"))}
    wrapper = subprocess.Popen(
        [sys.executable, "-m", "auditor", "run", "--root", str(tmp_path), "--pair", "p",
         "--period", "1", "--gpus", "1", "--job-id", "7004", "--", sys.executable, "-c",
         "import time; print('started', flush=True); time.sleep(60)"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert wrapper.stdout is not None and wrapper.stdout.readline()
    wrapper.send_signal(signal.SIGHUP)
    _, err = wrapper.communicate(timeout=30)
    assert wrapper.returncode == -signal.SIGHUP, err
    assert b"interrupted" not in err
