"""``auditor audit --executor dask://HOST:PORT``: the reading on a Dask cluster.

A ``LocalCluster`` of two worker processes on 127.0.0.1 stands for the cluster; a scheduler
plugin records every task it runs, so the tests see the work went there. Its outputs are
byte-identical to the local pool's; a scheduler that cannot be reached, or a malformed
address, is one line and exit 2; Ctrl-C cancels what the cluster has not done and exits 130.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from auditor._cli import main
from auditor.errors import UsageError
from auditor.model import AuditOptions
from auditor.pipeline.pool import AHEAD, DaskPool, LocalPool, chunk_size, make_pool
from fixtures.generate import scale_spec, write_study
from tests.helpers import EXAMPLE, note_task, noted_tasks

distributed = pytest.importorskip("distributed")

from distributed.diagnostics.plugin import SchedulerPlugin  # noqa: E402 (after the skip)

COMPARED = ("summary.json", "diagnostic.md", "periods.parquet", "attempts.parquet",
            "findings.parquet", "evidence.parquet", "phases.parquet", "devices.parquet")
"""What must be byte-identical between a Dask audit and a local one (the output manifest
names the outputs' directory, which differs)."""


class Runs(SchedulerPlugin):
    """Records the auditor's batches the scheduler sees: each key once queued or processing
    (``seen``), and the worker of each one done (``done``: key -> worker address)."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.done: dict[str, str] = {}
        self.scheduler: Any = None

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        if not str(key).startswith("run_batch-"):
            return
        if finish in ("processing", "queued", "no-worker"):
            self.seen.add(str(key))
        elif finish == "memory":
            task = self.scheduler.tasks.get(key)
            workers = sorted(w.address for w in task.who_has) if task is not None else []
            self.done[str(key)] = workers[0] if workers else ""


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[Any, Runs]]:
    """Two worker processes of one thread each, on 127.0.0.1 only; its scheduler here."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  host="127.0.0.1", dashboard_address="127.0.0.1:0") as local:
        runs = Runs()
        local.scheduler.add_plugin(runs)
        runs.scheduler = local.scheduler
        yield local, runs


def _url(local: Any) -> str:
    return local.scheduler_address.replace("tcp://", "dask://")


@pytest.fixture(scope="module")
def scale_study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("scale") / "study"
    write_study(scale_spec(elements=6, trace_samples=2000, log_lines=2000), root)
    return root


@pytest.fixture(scope="module")
def big_study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Seconds of reading for two workers: time to interrupt it."""
    root = tmp_path_factory.mktemp("big") / "study"
    write_study(scale_spec(elements=24, trace_samples=4000, log_lines=4000), root)
    return root


@contextlib.contextmanager
def _slowed(local: Any, seconds: float = 0.2) -> Iterator[None]:
    """Each of the auditor's batches starts ``seconds`` late on the cluster's workers:
    every batch of a study is sent at once (the window is eight a worker thread), so
    whether one is still waiting when an audit is stopped was a race against the cancel
    (lost now and then on a loaded machine); slowed, the batches in hand outlast it."""

    from distributed.diagnostics.plugin import WorkerPlugin

    def make() -> Any:  # (defined here: pickled by value for the workers)
        class Slow(WorkerPlugin):
            def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
                if finish == "executing" and str(key).startswith("run_batch-"):
                    time.sleep(seconds)
        return Slow()

    with distributed.Client(local) as client:
        client.register_plugin(make(), name="auditor-slow")
        try:
            yield
        finally:
            client.unregister_worker_plugin("auditor-slow")


def _drained(local: Any, runs: Runs, before: set[str]) -> None:
    """Wait until the scheduler holds none of the auditor's tasks; some of those sent
    since ``before`` never ran (they were cancelled, not waited for)."""
    deadline = time.monotonic() + 15
    while any(str(key).startswith("run_batch-") for key in local.scheduler.tasks):
        assert time.monotonic() < deadline, "the cluster still holds the audit's tasks"
        time.sleep(0.05)
    sent = runs.seen - before
    assert sent - set(runs.done), "every batch ran: nothing was cancelled"


def _same_outputs(one: Path, other: Path) -> None:
    for name in COMPARED:
        assert (one / name).read_bytes() == (other / name).read_bytes(), name


@pytest.mark.slow
@pytest.mark.parametrize("study", ["example", "scale"])
def test_a_dask_audit_writes_what_the_local_pool_writes(
        cluster: tuple[Any, Runs], scale_study: Path, tmp_path: Path, study: str) -> None:
    """The same study audited on the cluster and by the local pool (two workers): the same
    bytes. The example study is small (read in-process without --executor), yet every
    task goes to the cluster; the larger one's batches are shared by both workers."""
    local, runs = cluster
    root = EXAMPLE if study == "example" else scale_study
    before = set(runs.done)
    assert main(["audit", str(root), "--out", str(tmp_path / "dask"), "--quiet", "--no-plots",
                 "--executor", _url(local)]) == 0
    assert main(["audit", str(root), "--out", str(tmp_path / "pool"), "--quiet", "--no-plots",
                 "--jobs", "2"]) == 0
    _same_outputs(tmp_path / "dask", tmp_path / "pool")
    assert main(["verify", str(tmp_path / "dask"), "--quiet"]) == 0
    ran = {key: worker for key, worker in runs.done.items() if key not in before}
    # the scheduler's dump, the period records' batches and the attempts' batches at least
    assert len(ran) >= 3, ran
    if study == "scale":
        assert len(set(ran.values())) == 2, ran  # both workers read


@pytest.mark.slow
def test_the_library_api_reads_on_the_cluster(cluster: tuple[Any, Runs]) -> None:
    """``AuditOptions(executor=...)``: the same result as the local pool's."""
    from auditor.pipeline.audit import run_audit

    local, runs = cluster
    before = set(runs.done)
    on_cluster = run_audit(EXAMPLE, AuditOptions(executor=_url(local)))
    here = run_audit(EXAMPLE, AuditOptions(jobs=1))
    assert set(runs.done) - before
    assert list(on_cluster.collected.evidence) == list(here.collected.evidence)
    assert on_cluster.findings == here.findings
    assert on_cluster.verdicts == here.verdicts


def test_batches_go_to_the_cluster_only_a_little_ahead(cluster: tuple[Any, Runs],
                                                       tmp_path: Path) -> None:
    """Told how many tasks there are, the pool makes them only as their batches go out, a
    few per worker thread ahead of the caller (a million files' batches, made and sent at
    once, were all held here and on the scheduler before the first result came back)."""
    local, _ = cluster
    log = tmp_path / "started.log"
    made: list[int] = []
    pool = DaskPool(_url(local))
    try:
        results = pool.map(note_task, noted_tasks(log, 400, made), 400 << 20, count=400)
        first = next(results)
        time.sleep(1.0)  # (a cluster sent every batch would have started them all by now)
        planned, started = len(made), len(log.read_text().splitlines())
        rest = list(results)
    finally:
        pool.close()
    assert [first, *rest] == list(range(400)) and len(made) == 400
    assert max(planned, started) <= (AHEAD * 2 + 1) * chunk_size(400, 400 << 20, 2) < 400


def test_the_clients_log_lines_are_held_back_until_the_pool_closes(
        cluster: tuple[Any, Runs], tmp_path: Path) -> None:
    """Dask's client logs through its own loggers and tornado's: a batch cancelled while
    its result is awaited (Ctrl-C) raised in the client's event loop, which logged a
    traceback per batch to stderr through ``tornado.application``. Both are quiet while the
    pool is open, and as they were once it closes."""
    import logging

    local, _ = cluster
    loggers = [logging.getLogger(name) for name in ("distributed.client", "tornado.application")]
    before = [logger.level for logger in loggers]
    pool = DaskPool(_url(local))
    try:
        assert list(pool.map(note_task, noted_tasks(tmp_path / "log", 4, []), 4, count=4)) \
            == [0, 1, 2, 3]
        assert not any(logger.isEnabledFor(logging.CRITICAL) for logger in loggers)
    finally:
        pool.close()
    assert [logger.level for logger in loggers] == before


def test_make_pool_picks_the_executor_asked_for() -> None:
    assert isinstance(make_pool(AuditOptions()), LocalPool)
    pool = make_pool(AuditOptions(executor="dask://scheduler.example:9000"))
    assert isinstance(pool, DaskPool)
    assert pool.address == "tcp://scheduler.example:9000"
    assert DaskPool("dask://head").address == "tcp://head:8786"  # Dask's usual port
    assert DaskPool("dask://[::1]:8786").address == "tcp://[::1]:8786"
    pool.close()  # (never connected: nothing to close)


@pytest.mark.parametrize("executor", ["tcp://127.0.0.1:8786", "dask://", "dask://host:port",
                                      "dask://host:99999", "dask://host:8786/path",
                                      "127.0.0.1:8786", "dask://user@host:8786"])
def test_a_malformed_executor_is_one_line_and_exit_2(
        executor: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["audit", str(EXAMPLE), "--out", str(out), "--executor", executor]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "expected dask://HOST:PORT" in err, err
    assert not out.exists()


@pytest.mark.parametrize(("executor", "said"), [
    ("dask://127.0.0.1:0", "the port '0' is not a number from 1 to 65535"),
    ("dask://host:0", "the port '0' is not a number from 1 to 65535"),
    ("dask://host:65536", "the port '65536' is not a number from 1 to 65535"),
    ("dask://host:", "the port '' is not a number from 1 to 65535"),
    ("dask://host:+80", "the port '+80' is not a number from 1 to 65535"),
    ("dask://host:\u0668\u0660", "is not a number from 1 to 65535"),  # (Arabic-Indic 80)
    ("dask://host:-1", "the port '-1' is not a number from 1 to 65535"),
    ("dask://:8786", "; no host"),
    ("dask://[]:8786", "; no host"),
    ("dask://::1", "an IPv6 address goes in brackets"),
    ("dask://[zz]:8786", "[zz] is not an IPv6 address"),
    ("dask://ho st:8786", "'ho st' is not a host name or address"),
])
def test_a_port_or_host_no_scheduler_has_is_refused_before_any_connection(
        executor: str, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Port 0 (which would mean "any port") was taken for Dask's usual 8786."""
    def no_connection(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a connection was attempted")

    monkeypatch.setattr(distributed, "Client", no_connection)
    out = tmp_path / "out"
    assert main(["audit", str(EXAMPLE), "--out", str(out), "--executor", executor]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "expected dask://HOST:PORT" in err and said in err, err
    assert not out.exists()
    with pytest.raises(UsageError, match="expected dask://HOST:PORT"):
        make_pool(AuditOptions(executor=executor))


def test_the_ports_at_the_ends_of_the_range_and_a_bracketed_address_are_taken() -> None:
    assert DaskPool("dask://127.0.0.1:1").address == "tcp://127.0.0.1:1"
    assert DaskPool("dask://head:65535/").address == "tcp://head:65535"
    assert DaskPool("dask://[::1]").address == "tcp://[::1]:8786"


def test_executor_and_jobs_are_one_or_the_other(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", str(EXAMPLE), "--executor", "dask://h:1", "--jobs", "2"]) == 2
    assert "--jobs" in capsys.readouterr().err


def test_without_distributed_the_executor_says_what_to_install(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)  # (find_spec: not installed)
    with pytest.raises(UsageError, match=r"auditor\[dask\]"):
        make_pool(AuditOptions(executor="dask://127.0.0.1:8786"))


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.slow
def test_an_unreachable_scheduler_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """Nothing listens there: after the stated 10 s, one line (no log lines of Dask's, no
    traceback) and exit 2; no output is left."""
    out = tmp_path / "out"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "auditor", "audit", str(EXAMPLE), "--out", str(out),
         "--quiet", "--executor", f"dask://127.0.0.1:{_closed_port()}"],
        capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert "no Dask scheduler answered" in done.stderr and "within 10 s" in done.stderr
    assert 9 < time.monotonic() - started < 60
    assert not out.exists()


@pytest.mark.slow
def test_a_port_that_speaks_no_dask_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """Something accepts there but never answers (a silent server on 127.0.0.1): the
    handshake is not waited on for ever; one line and exit 2 within the stated time."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        port = int(server.getsockname()[1])
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "auditor", "audit", str(EXAMPLE), "--out",
             str(tmp_path / "out"), "--quiet", "--executor", f"dask://127.0.0.1:{port}"],
            capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "speaks no Dask" in done.stderr, done.stderr
    assert time.monotonic() - started < 40


CLUSTER = """
import sys
from distributed import LocalCluster
cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                       dashboard_address="127.0.0.1:0")
print(cluster.scheduler_address, flush=True)
sys.stdin.read()
"""
"""A cluster in a process of its own (to be killed)."""


@pytest.mark.slow
def test_a_cluster_lost_half_way_is_one_line_and_exit_2(big_study: Path, tmp_path: Path) -> None:
    """The cluster dies as it reads (its processes killed): one line (none of the client's
    log lines of its reconnection attempts, no traceback), exit 2, no output."""
    cluster = subprocess.Popen([sys.executable, "-c", CLUSTER], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    try:
        assert cluster.stdout is not None
        address = cluster.stdout.readline().decode().strip()
        assert address.startswith("tcp://127.0.0.1:"), address
        process = subprocess.Popen(
            [sys.executable, "-m", "auditor", "audit", str(big_study), "--out",
             str(tmp_path / "out"), "--quiet", "--no-plots", "--executor",
             address.replace("tcp://", "dask://")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        with distributed.Client(address, set_as_default=False) as watcher:
            deadline = time.monotonic() + 60
            while not watcher.run_on_scheduler(_auditor_tasks):
                assert process.poll() is None, process.communicate()
                assert time.monotonic() < deadline, "the audit never sent its work"
                time.sleep(0.02)
        os.killpg(cluster.pid, signal.SIGKILL)
        _, err = process.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(cluster.pid, signal.SIGKILL)
        cluster.wait(timeout=30)
    assert process.returncode == 2, err.decode()
    assert err.decode().count("\n") == 1, err.decode()
    assert "the Dask cluster lost the audit's work" in err.decode()
    assert not (tmp_path / "out").exists()


def _auditor_tasks(dask_scheduler: Any) -> int:
    """(On the scheduler) how many of the auditor's batches it holds."""
    return sum(str(key).startswith("run_batch-") for key in dask_scheduler.tasks)


@pytest.mark.slow
def test_an_abandoned_audit_cancels_the_clusters_work(cluster: tuple[Any, Runs],
                                                      big_study: Path) -> None:
    """A library caller that stops an audit half-way (closes its generator) leaves the
    cluster idle: the batches not done are cancelled, not left to run for nothing."""
    from auditor.pipeline.audit import Auditor

    local, runs = cluster
    before = set(runs.seen)
    with _slowed(local):
        run = Auditor(big_study, AuditOptions(executor=_url(local))).run()
        for event in run:
            if event.stage == "read" and event.done:  # (the first read: more in hand)
                break
        run.close()
        _drained(local, runs, before)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs Linux")
def test_ctrl_c_cancels_the_clusters_work(cluster: tuple[Any, Runs], big_study: Path,
                                          tmp_path: Path) -> None:
    """Ctrl-C (the terminal's SIGINT to the audit's process group) as the cluster reads:
    exit 130 and one line, no output, and the tasks not done are cancelled (the cluster
    holds none of them moments later, and did not run them all); the cluster serves the
    next audit."""
    local, runs = cluster
    before = set(runs.seen)
    with _slowed(local):
        process = subprocess.Popen(
            [sys.executable, "-m", "auditor", "audit", str(big_study), "--out",
             str(tmp_path / "out"), "--quiet", "--no-plots", "--executor", _url(local)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        deadline = time.monotonic() + 60
        while len(runs.seen - before) < 4:  # the cluster has work in hand
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the audit never sent its work"
            time.sleep(0.005)
        os.killpg(process.pid, signal.SIGINT)
        _, err = process.communicate(timeout=60)
        assert process.returncode == 130, err.decode()
        assert err.decode().count("\n") == 1 and "interrupted" in err.decode(), err.decode()
        assert "Traceback" not in err.decode()
        assert not (tmp_path / "out").exists()
        _drained(local, runs, before)
    assert main(["audit", str(EXAMPLE), "--quiet", "--executor", _url(local)]) == 0


def test_the_walk_stats_no_evidence_file_and_each_input_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a network file system every stat is a round trip: the walk takes each file's
    type from its directory's listing (no stat of any file under ``pairs/`` or an attempt
    directory), and a study input at the top (``protocol.json``, the commits) is looked at
    once, not found in the listing, checked through its resolved path and statted again.
    (Counted at Python's ``os.stat``/``os.lstat``; ``strace -c`` says the same of the
    system calls, and that each file is opened once.)"""
    from collections import Counter

    from auditor.pipeline.audit import run_audit
    from tests.helpers import copy_example

    root = copy_example(tmp_path).resolve()
    calls: Counter[str] = Counter()
    real_stat, real_lstat = os.stat, os.lstat

    def counted(real: Any) -> Any:
        def call(path: Any, *args: Any, **kwargs: Any) -> Any:
            text = os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else ""
            if text.startswith(f"{root}/"):
                calls[text[len(str(root)) + 1:]] += 1
            return real(path, *args, **kwargs)
        return call

    monkeypatch.setattr(os, "stat", counted(real_stat))
    monkeypatch.setattr(os, "lstat", counted(real_lstat))
    result = run_audit(root, AuditOptions(jobs=1))
    monkeypatch.undo()
    assert len(result.collected.evidence) > 100
    walked = {rel: n for rel, n in calls.items()
              if rel.startswith("pairs/") or rel.count("/") >= 2}
    assert walked == {}
    assert calls["protocol.json"] == 1 and calls["execution_commits.json"] == 1, calls
    assert calls["pairs"] == 1, calls  # (a directory, not a link to one: one lstat)
