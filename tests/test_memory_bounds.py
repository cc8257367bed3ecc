"""Memory a user can count on, measured as a user would: the peak resident set of the
command's process and of every process it starts, auditing a generated many-file study
(the million-file bound, 512 MiB a process, is ``benchmarks/run.py --sizes million``'s).
Each runs the console script in a fresh interpreter, as ``auditor audit`` runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from auditor._cli import main

pytestmark = pytest.mark.slow

OWN_BOUND = 140
"""MiB: the command's own process (114 MiB measured on the development machine, either way
the store keeps its records, 2026-12-06)."""
CHILD_BOUND = 64
"""MiB: each reader (28 MiB measured)."""

PEAKS = """
import json, resource, sys
usage_path = sys.argv[1]
sys.argv = ["auditor", *sys.argv[2:]]
try:
    from auditor._cli import entry
    entry()
finally:
    with open("/proc/self/status") as status:
        own = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    with open(usage_path, "w") as handle:
        json.dump([own, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss], handle)
"""
"""Runs the console script and records its own peak RSS and its largest child's (KiB). Its
own is the kernel's high-water mark of its memory (``VmHWM``): ``getrusage``'s would be at
least the test process's, from which it was forked before it exec'd."""


def _peaks(tmp_path: Path, *arguments: str, env: dict[str, str] | None = None
           ) -> tuple[int, int]:
    """The command's peak RSS and its largest child's, in MiB."""
    usage = tmp_path / "usage.json"
    done = subprocess.run([sys.executable, "-c", PEAKS, str(usage), *arguments],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert done.returncode in (0, 1), done.stderr
    own, child = json.loads(usage.read_text())
    return own >> 10, child >> 10


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A study of 6,753 small files in 750 periods."""
    root = tmp_path_factory.mktemp("many") / "study"
    assert main(["example", "--kind", "scale", "--elements", "375", "--trace-samples", "2",
                 "--log-lines", "0", str(root)]) == 0
    return root


@pytest.mark.parametrize("spill", ["by size", "from the first record"])
def test_every_process_of_a_many_file_audit_stays_small(
        many: Path, tmp_path: Path, spill: str) -> None:
    """Two readers, the outputs written: the command's process and each reader stay under
    their bounds (:data:`OWN_BOUND`, :data:`CHILD_BOUND`), whether the store keeps the
    records as objects (this study's size) or out of memory from the first one."""
    import os

    env = dict(os.environ)
    if spill != "by size":
        env["AUDITOR_SPILL_FROM"] = "0"
    own, child = _peaks(tmp_path, "audit", str(many), "--out", str(tmp_path / "out"),
                        "--quiet", "--no-plots", "--jobs", "2", env=env)
    assert (tmp_path / "out" / "diagnostic.md").is_file()
    assert own <= OWN_BOUND and child <= CHILD_BOUND, (own, child)
