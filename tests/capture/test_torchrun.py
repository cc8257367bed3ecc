"""A real two-rank ``torchrun`` under ``auditor run``: its elastic agent starts each rank in a
session of its own; when the agent dies, no rank may outlive the wrapper.

Needs torch (the CPU build is enough: ``pip install torch==2.13.0``, as ``.ci/run`` does);
skips, saying so, without it.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.capture.support import attempt_of, clean_env, load, run_args, start_auditor, wait_for

pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch", reason="torch is not installed (pip install "
                            "torch==2.13.0: the CPU build is enough)")

RANK = """
import os, sys, time
from pathlib import Path
out = Path(sys.argv[1])
(out / f"rank-{os.environ['RANK']}").write_text(f"{os.getpid()} {os.getppid()} {os.getsid(0)}")
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def test_killing_the_agent_leaves_no_rank_behind(tmp_path: Path) -> None:
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    assert torchrun is not None
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    out = tmp_path / "ranks"
    out.mkdir()
    wrapper = start_auditor([*run_args(tmp_path, "7001", "--drain", "1", "--"), torchrun,
                             "--standalone", "--nproc-per-node=2", str(script), str(out)],
                            clean_env())
    try:
        wait_for(lambda: len(list(out.glob("rank-*"))) == 2, 90)
        ranks = [tuple(map(int, p.read_text().split())) for p in sorted(out.glob("rank-*"))]
        agents = {parent for _, parent, _ in ranks}
        assert len(agents) == 1
        (agent,) = agents
        assert all(session == pid for pid, _, session in ranks), ranks  # (sessions of their own)
        os.kill(agent, signal.SIGKILL)  # (the agent dies; its ranks would be orphans)
        wrapper.communicate(timeout=60)
    finally:
        wrapper.kill()
    deadline = time.monotonic() + 5
    while any(_alive(pid) for pid, _, _ in ranks) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [pid for pid, _, _ in ranks if _alive(pid)] == []
    trial = load(attempt_of(tmp_path, "7001") / "trial-7001.json")
    assert sorted(item["pid"] for item in trial["outlived"]) == sorted(p for p, _, _ in ranks)
    assert trial["invocation"]["exit_code"] == 137
