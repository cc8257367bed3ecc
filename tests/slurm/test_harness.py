"""The harness itself: when it skips, how it reads a dump, and the multi-node cluster.

The tests without a mark run everywhere and have no side effects: the install paths tried
here stop before apt-get would run, the namespace ones before anything is made. Those
marked ``slurm`` need the three-node cluster (``multinode_cluster`` in ``conftest.py``;
``AUDITOR_SLURM=1``, root) and check what the tests that use it rely on: one job spans
``n1 n2 n3``, each node has its hostname and its own pid namespace, every node writes
into one shared directory, sacct names each step's nodes, and stop leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.slurm import cluster, multinode
from tests.slurm.cluster import Cluster
from tests.slurm.endings import check_midrun, stale_tasks

DUMPS = Path(__file__).resolve().parents[2] / "fixtures" / "slurm"


def test_skips_without_the_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AUDITOR_SLURM", raising=False)
    reason = cluster.skip_reason()
    assert reason is not None and "AUDITOR_SLURM=1" in reason


def test_opted_in_skips_only_when_not_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUDITOR_SLURM", "1")
    reason = cluster.skip_reason()
    assert (reason is None) == (os.geteuid() == 0)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "root" in (cluster.skip_reason() or "")


def test_missing_programs_without_apt_get_is_unavailable(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on it, apt-get included
    monkeypatch.setattr(cluster, "PROGRAMS", ("no-such-slurm-program",))
    with pytest.raises(cluster.Unavailable) as caught:
        cluster.ensure_installed()
    message = str(caught.value)
    assert "no-such-slurm-program" in message
    assert ("apt-get" in message) if os.geteuid() == 0 else ("root" in message)
    assert "\n" not in message


def test_apt_failure_reason_is_its_error_line() -> None:
    output = "Reading package lists...\nE: Unable to locate package slurmd\nDone\n"
    assert cluster._last_line(output) == "E: Unable to locate package slurmd"
    assert cluster._last_line("") == "(no output)"


def test_stale_range_found_in_the_saved_dumps() -> None:
    assert stale_tasks((DUMPS / "contract.psv").read_text(), "1") == {14}
    assert stale_tasks((DUMPS / "midrun.psv").read_text(), "1") == set()
    assert stale_tasks("1_[2-7%2]|1|x\n1_2|4|x\n1_9|5|x\n", "1") == {2}


def _with_task_seven_requeued(text: str, twelve_started: bool, seven: str = "PENDING") -> str:
    """The saved mid-run dump as it reads once task 7 is ``seven`` and, if
    ``twelve_started``, task 12 has started."""
    lines = []
    for line in text.splitlines():
        fields = line.split("|")
        if fields[0] == "1_7":
            fields[3] = seven
        if fields[0] == "1_[12-15%12]" and twelve_started:
            lines.append("|".join(["1_12", fields[1], fields[2], "RUNNING", *fields[4:]]))
            fields[0] = "1_[13-15%12]"
        lines.append("|".join(fields))
    return "\n".join(lines) + "\n"


def test_mid_run_check_allows_task_twelve_in_sevens_slot() -> None:
    """CI once read the mid-run dump after 7 requeued itself and 12 took its slot."""
    text = (DUMPS / "midrun.psv").read_text()
    check_midrun(text, "1")
    check_midrun(_with_task_seven_requeued(text, twelve_started=False), "1")
    check_midrun(_with_task_seven_requeued(text, twelve_started=True), "1")
    check_midrun(_with_task_seven_requeued(text, True, seven="REQUEUED"), "1")
    with pytest.raises(AssertionError):  # 12 gone from the range without a row of its own
        check_midrun(text.replace("1_[12-15%12]", "1_[13-15%12]"), "1")
    with pytest.raises(AssertionError):  # 12 started while 7 still held its slot
        check_midrun(_with_task_seven_requeued(text, True, seven="RUNNING"), "1")


def test_multinode_without_root_or_tools_is_unavailable(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The one-line reasons the multi-node tests skip with; nothing is made first."""
    monkeypatch.setattr(multinode, "PROGRAMS", ("no-such-namespace-tool",))
    with pytest.raises(cluster.Unavailable) as caught:
        Cluster.start(tmp_path / "never", nodes=3)
    expected = "no-such-namespace-tool" if os.geteuid() == 0 else "root"
    assert expected in str(caught.value) and "\n" not in str(caught.value)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(cluster.Unavailable, match="root"):
        Cluster.start(tmp_path / "never", nodes=3)
    assert not (tmp_path / "never").exists()


def test_multinode_link_refused_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel (or container) that refuses the bridge: Unavailable with ip's own line."""
    monkeypatch.setattr(multinode, "unavailable_reason", lambda: None)

    def refused(command: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(command, 2, "", "RTNETLINK answers: Operation "
                                           "not permitted\n")

    monkeypatch.setattr(multinode, "_tool", refused)
    with pytest.raises(multinode.NamespaceUnavailable, match="Operation not permitted"):
        multinode.NodeNetwork.claim()


# ---------------------------------------------------------------- the multi-node cluster

PROBE = """import json, os, socket, sys
from pathlib import Path
status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
init = Path("/proc/1/cmdline").read_bytes().decode(errors="replace").split("\\0")
record = {"hostname": socket.gethostname(), "node": os.environ.get("SLURMD_NODENAME"),
          "step": os.environ.get("SLURM_STEP_ID"), "pid": os.getpid(),
          "pid_ns": os.readlink("/proc/self/ns/pid"), "nspid": status["NSpid"].split(),
          "init": init}
name = f"probe-{record['hostname']}-{record['step']}.json"
Path(sys.argv[1], name).write_text(json.dumps(record))
"""
"""What a step reports (into the shared directory ``argv[1]``): its hostname as Python
sees it, its pid namespace, its NSpid line and what pid 1 is where it runs."""


@dataclass
class Spread:
    """One three-node job's step outputs (in one shared directory) and its sacct rows."""

    job: str
    shared: Path
    sacct: list[list[str]]

    def probes(self) -> list[dict[str, Any]]:
        """Every probe record the job's steps wrote."""
        return [json.loads(path.read_text()) for path in sorted(self.shared.glob("probe-*"))]


@pytest.fixture(scope="module")
def spread(multinode_cluster: Cluster) -> Spread:
    """A ``sbatch -N3`` job: ``srun -N3 hostname``, then probes on n2 and n3 at once (in
    the background, ``--overlap``), then a probe on every node."""
    shared = multinode_cluster.root / "jobs" / "spread"
    shared.mkdir()
    (shared / "probe.py").write_text(PROBE)
    python = sys.executable
    job = multinode_cluster.sbatch(f"""#!/bin/bash
set -e
cd {shared}
srun -N3 -n3 -J hostnames hostname > hostnames.txt
srun -N1 -n1 -w n2 --overlap -J probe-n2 {python} probe.py {shared} &
srun -N1 -n1 -w n3 --overlap -J probe-n3 {python} probe.py {shared} &
wait
srun -N3 -n3 -J everywhere {python} probe.py {shared}
""", "-N3", "--job-name=spread", f"--output={shared}/batch.out")
    multinode_cluster.wait_done(job, timeout=120, named="spread")
    text = multinode_cluster.sacct(job, fmt="JobID,JobName,State,ExitCode,NodeList")
    return Spread(job, shared, [line.split("|") for line in text.splitlines() if line])


@pytest.mark.slurm
@pytest.mark.slow
def test_multinode_job_spans_three_named_nodes(multinode_cluster: Cluster,
                                               spread: Spread) -> None:
    assert multinode_cluster.nodes == ["n1", "n2", "n3"]
    hostnames = (spread.shared / "hostnames.txt").read_text().split()
    assert sorted(hostnames) == ["n1", "n2", "n3"], (spread.shared / "batch.out").read_text()
    for probe in spread.probes():  # the UTS name, as Python's socket.gethostname() sees it
        assert probe["hostname"] == probe["node"]
    assert multinode_cluster.on_node("n2", ["hostname"]).stdout.strip() == "n2"


@pytest.mark.slurm
@pytest.mark.slow
def test_multinode_steps_have_their_own_pid_namespaces(multinode_cluster: Cluster,
                                                       spread: Spread) -> None:
    """Two steps at once on n2 and n3: each in its node's pid namespace, where pid 1 is that
    node's init (so one pid names a process on each node) and /proc is the node's own."""
    probes = {p["hostname"]: p for p in spread.probes() if p["step"] in ("1", "2")}
    assert sorted(probes) == ["n2", "n3"], spread.probes()
    host_ns = os.readlink("/proc/self/ns/pid")
    assert len({probes["n2"]["pid_ns"], probes["n3"]["pid_ns"], host_ns}) == 3
    for name, probe in probes.items():
        assert len(probe["nspid"]) == 1  # the node's /proc: its own namespace only
        assert probe["init"][1].endswith("node-init.sh") and probe["init"][2] == name
    assert multinode_cluster.network is not None
    for node in multinode_cluster.network.nodes:  # from the host: two levels, pid 1 inside
        status = Path(f"/proc/{node.init}/status").read_text()
        nspid = next(line for line in status.splitlines() if line.startswith("NSpid:"))
        assert nspid.split()[1:] == [str(node.init), "1"]


@pytest.mark.slurm
@pytest.mark.slow
def test_multinode_steps_write_one_shared_directory(spread: Spread) -> None:
    everywhere = [p for p in spread.probes() if p["step"] == "3"]
    assert sorted(p["hostname"] for p in everywhere) == ["n1", "n2", "n3"]
    assert {p["pid_ns"] for p in everywhere} >= {p["pid_ns"] for p in spread.probes()}
    assert len({p["pid_ns"] for p in everywhere}) == 3


@pytest.mark.slurm
@pytest.mark.slow
def test_multinode_sacct_names_each_steps_nodes(spread: Spread) -> None:
    found = {row[0].removeprefix(spread.job): (row[1], row[4]) for row in spread.sacct}
    assert found == {
        "": ("spread", "n[1-3]"), ".batch": ("batch", "n1"),
        ".0": ("hostnames", "n[1-3]"), ".1": found[".1"], ".2": found[".2"],
        ".3": ("everywhere", "n[1-3]"),
    }, spread.sacct
    assert sorted([found[".1"], found[".2"]]) == [("probe-n2", "n2"), ("probe-n3", "n3")]
    assert {(row[2], row[3]) for row in spread.sacct} == {("COMPLETED", "0:0")}


@pytest.mark.slurm
@pytest.mark.slow
def test_multinode_stop_leaves_nothing_behind(multinode_cluster: Cluster) -> None:
    """A second cluster beside the module's takes the next range, and its stop ends every
    process it started and removes its links and bridge."""
    second = Cluster.start(nodes=2)
    try:
        assert second.network is not None and multinode_cluster.network is not None
        assert second.network.octet != multinode_cluster.network.octet
        links = [second.network.bridge, *(node.veth for node in second.network.nodes)]
        pids = [*second.pids().values(), *(node.init for node in second.network.nodes)]
        assert all(Path(f"/sys/class/net/{link}").exists() for link in links)
        assert second.on_node("n2", ["hostname"]).stdout.strip() == "n2"
    finally:
        second.stop()
    assert [link for link in links if Path(f"/sys/class/net/{link}").exists()] == []
    assert [pid for pid in pids if Path(f"/proc/{pid}").exists()] == []
    assert not second.root.exists()
