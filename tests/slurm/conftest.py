"""Fixtures for the real-Slurm tests: one cluster per session, the endings array and the
producer kit's array run on it, one after the other (each fills the node's GPUs); and a
three-node cluster (``n1 n2 n3``, namespaces on a bridge) per module that asks for one.

The cluster tests (marked ``slurm`` and ``slow``) run only when ``AUDITOR_SLURM=1`` (``.ci/run``
sets it); anywhere else, or when this is not root, has no apt-get, or the install fails,
they skip with one line saying why. A cluster that installed but misbehaves fails them.
The harness's timings are printed at the end of the run.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.slurm.cluster import Cluster, Unavailable, ensure_installed, skip_reason
from tests.slurm.endings import EndingsRun, run_endings
from tests.slurm.kit import KitRun, run_kit

TIMINGS: dict[str, float] = {}
"""Seconds spent installing, starting, running the array and stopping (for the summary)."""
FAILED: list[str] = []
"""The real-Slurm tests that failed this session (their evidence is then kept and shown)."""
KEPT: list[Path] = []
"""The kit's study, kept because a test failed."""
SHOWN_BYTES = 60_000
"""How much of the kept study's trial records the summary prints (CI keeps no files)."""


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed:
        FAILED.append(report.nodeid)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if TIMINGS:
        parts = ", ".join(f"{name} {value:.1f} s" for name, value in TIMINGS.items())
        terminalreporter.write_line(f"real Slurm harness: {parts}")
    for root in KEPT:
        terminalreporter.write_line(f"a real-Slurm test failed: the kit's study is kept at "
                                    f"{root}; its trial records:")
        left = SHOWN_BYTES
        for path in sorted(root.rglob("trial-*.json")):
            text = path.read_text(errors="replace")[:max(left, 0)]
            left -= len(text)
            terminalreporter.write_line(f"{path.relative_to(root)}: {text.strip()}")


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Cluster]:
    """A running single-node cluster (installed first if need be); stopped at the end."""
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    try:
        TIMINGS["install"] = ensure_installed()
    except Unavailable as error:
        pytest.skip(f"Slurm not available: {error}")
    cluster = Cluster.start()
    TIMINGS["start"] = cluster.timings["start_s"]
    try:
        yield cluster
    finally:
        cluster.stop(remove=os.environ.get("AUDITOR_SLURM_KEEP") != "1")
        TIMINGS["stop"] = cluster.timings["stop_s"]


@pytest.fixture(scope="module")
def multinode_cluster() -> Iterator[Cluster]:
    """A running three-node cluster (``n1 n2 n3``, each slurmd in its own network, UTS,
    mount and pid namespace, two fake GPUs each); one per module, so that it is gone before
    the next module's jobs run. Skips, saying why, where namespaces cannot be made."""
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    try:
        installed = ensure_installed()
        cluster = Cluster.start(nodes=3)
    except Unavailable as error:
        pytest.skip(f"multi-node Slurm not available: {error}")
    if installed:
        TIMINGS["install"] = installed
    TIMINGS["multinode start"] = cluster.timings["start_s"]
    try:
        yield cluster
    finally:
        cluster.stop(remove=os.environ.get("AUDITOR_SLURM_KEEP") != "1")
        TIMINGS["multinode stop"] = cluster.timings["stop_s"]


@pytest.fixture(scope="session")
def endings(slurm_cluster: Cluster) -> EndingsRun:
    """The endings array run once on the session's cluster, with its dumps."""
    run = run_endings(slurm_cluster)
    TIMINGS["array"] = run.seconds
    return run


@pytest.fixture(scope="session")
def kit(slurm_cluster: Cluster) -> Iterator[KitRun]:
    """The producer kit's array (``tests/slurm/kit.py``) run once, its study in a temporary
    directory (removed at the end)."""
    root = Path(tempfile.mkdtemp(prefix="auditor-kit-"))
    try:
        run = run_kit(slurm_cluster, root / "study")
        TIMINGS["kit array"] = run.seconds
        yield run
    finally:
        if FAILED:  # (what the attempts themselves recorded: a failure's first question)
            KEPT.append(root)
        else:
            shutil.rmtree(root, ignore_errors=True)
