"""An audit killed mid-run leaves no output directory or a complete one, never half a report."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from auditor._cli import main
from fixtures.generate import scale_spec, write_study


@pytest.fixture(scope="module")
def slow_study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("slow") / "study"
    write_study(scale_spec(elements=12, trace_samples=4000, log_lines=4000), root)
    return root


def _start(root: Path, out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "auditor", "audit", str(root), "--out",
                             str(out), "--quiet", "--jobs", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
@pytest.mark.parametrize("delay", [0.3, 1.0, 2.0])
def test_killed_audit_leaves_nothing_half_written(slow_study: Path, tmp_path: Path,
                                                  sig: signal.Signals, delay: float) -> None:
    out = tmp_path / "out"
    process = _start(slow_study, out)
    time.sleep(delay)
    process.send_signal(sig)
    _, err = process.communicate(timeout=120)
    assert b"Traceback" not in err, err.decode()
    if out.exists():  # it finished before the signal: the output must be whole
        assert main(["verify", str(out), "--quiet"]) == 0
    if sig == signal.SIGTERM:
        left = [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.")]
        assert not left, (left, process.returncode, err.decode())
    # a second run succeeds (and clears what a SIGKILL left behind)
    assert main(["audit", str(slow_study), "--out", str(out), "--quiet", "--force",
                 "--no-plots"]) == 0
    assert main(["verify", str(out), "--quiet"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def _catches_sigterm(pid: int) -> bool:
    """Whether process ``pid`` has a SIGTERM handler installed (Linux ``/proc``)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_sigterm_exit_status(slow_study: Path, tmp_path: Path) -> None:
    process = _start(slow_study, tmp_path / "out")
    deadline = time.monotonic() + 60  # start-up is slow on a loaded machine
    while not _catches_sigterm(process.pid) and process.poll() is None:
        assert time.monotonic() < deadline, "the command never installed its handler"
        time.sleep(0.01)
    os.kill(process.pid, signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    # killed as its audit starts (it takes seconds): interrupted, in one line
    assert process.returncode == 130, err.decode()
    assert err.decode().count("\n") == 1 and "interrupted" in err.decode()
