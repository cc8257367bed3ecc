"""``auditor.capture.Trace``: phase records, samples, raising phases, killed processes.

The trace is written by real code on real files; torch.cuda is a fake module in a child
process where the test needs measured figures.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from auditor.capture import Trace
from tests.capture.support import clean_env, fakes, lines, python, schema_errors, wait_for


class OutOfMemoryError(RuntimeError):
    """Named as torch's."""


OutOfMemoryError.__module__ = "torch"


def test_phases_write_one_record_each_with_null_peaks_without_a_gpu(tmp_path: Path) -> None:
    with Trace(tmp_path, rank=1) as trace:
        with trace.phase("init_model"):
            pass

        @trace.phase("actor_update", step=1)
        def update() -> int:
            return 7

        assert update() == 7
        assert update() == 7
        trace.sample()
    host = socket.gethostname().split(".", 1)[0]  # (v1.2: pids repeat across nodes)
    records = lines(tmp_path / "allocator-traces" / f"allocator-{host}-{os.getpid()}.jsonl")
    assert [(r.get("phase"), r.get("step"), r["seq"]) for r in records] == [
        ("init_model", 0, 0), ("actor_update", 1, 1), ("actor_update", 1, 2), (None, None, 3)]
    first = records[0]
    assert (first["pid"], first["rank"], first["role"], first["error_type"]) == (
        os.getpid(), 1, "actor_rollout", "")
    assert first["peak_allocated_bytes"] is None and first["peak_reserved_bytes"] is None
    assert first["started_ns"] <= first["finished_ns"]
    assert records[3]["allocated_bytes"] is None  # not measured, never 0
    for record in records[:3]:
        assert schema_errors("allocator-record", record) == []


def test_a_phase_that_raises_leaves_its_record_and_the_error_goes_on(tmp_path: Path) -> None:
    with Trace(tmp_path, rank=0) as trace:
        with pytest.raises(OutOfMemoryError, match="Tried to allocate"), \
                trace.phase("rollout_init"):
            raise OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

        @trace.phase("weight_sync", step=1)
        def sync() -> None:
            raise ValueError("bad weights")

        with pytest.raises(ValueError, match="bad weights"):
            sync()
    records = lines(trace.path)
    assert [(r["phase"], r["error_type"], r["error_message"]) for r in records] == [
        ("rollout_init", "torch.OutOfMemoryError",
         "CUDA out of memory. Tried to allocate 2.00 GiB"),
        ("weight_sync", "ValueError", "bad weights")]


def test_rank_comes_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("LOCAL_RANK", "3")
    with Trace(tmp_path) as trace, trace.phase("idle"):
        pass
    assert lines(trace.path)[0]["rank"] == 3
    monkeypatch.setenv("RANK", "5")
    assert Trace(tmp_path / "b").rank == 5


@pytest.mark.slow
def test_torch_cuda_peaks_are_measured_and_reset_at_each_phase(tmp_path: Path) -> None:
    done = python(f"""
        import torch
        from auditor.capture import Trace, write_device_evidence
        with Trace({str(tmp_path)!r}, rank=0) as trace:
            with trace.phase("init_model"):
                torch.cuda.allocate(300 << 20)
                torch.cuda.allocate(-200 << 20)
            with trace.phase("rollout_init"):
                torch.cuda.allocate(10 << 20)
            trace.sample()
            write_device_evidence({str(tmp_path)!r}, 0, trace=trace)
        """, {**fakes(tmp_path, torch=True), "AUDITOR_JOB_ID": "77"})
    assert done.returncode == 0, done.stderr
    (trace_file,) = (tmp_path / "allocator-traces").iterdir()
    init, rollout, sample = lines(trace_file)
    assert init["peak_allocated_bytes"] == 300 << 20
    assert rollout["peak_allocated_bytes"] == 110 << 20  # reset at entry: not 300 MiB
    assert rollout["peak_reserved_bytes"] == 220 << 20
    assert sample["allocated_bytes"] == 110 << 20
    assert sample["device_used_bytes"] == 330 << 20
    (device_file,) = (tmp_path / "device-evidence").iterdir()
    device = __import__("json").loads(device_file.read_text())
    assert (device["peak_allocated_mib"], device["peak_reserved_mib"]) == (300, 600)
    assert device["gpu"] == {"uuid": "GPU-5f3c0000-0000-0000-0000-000000000001",
                             "name": "Fake GPU", "pci_bus_id": "00000000:07:00.0",
                             "memory_total_mib": 40960}
    assert device["gpu_source"] == "torch"
    assert schema_errors("device", device) == []


def test_the_background_sampler_takes_samples(tmp_path: Path) -> None:
    with Trace(tmp_path, rank=0, sample_every=0.02) as trace:
        wait_for(lambda: trace.path.read_bytes().count(b"\n") >= 3, timeout=10)
    records = lines(trace.path)
    assert len(records) >= 3 and all("sample_ns" in r for r in records)
    assert [r["seq"] for r in records] == list(range(len(records)))


@pytest.mark.slow
def test_a_process_killed_mid_run_leaves_only_whole_lines(tmp_path: Path) -> None:
    code = textwrap.dedent(f"""
        import sys
        from auditor.capture import Trace
        trace = Trace({str(tmp_path)!r}, rank=0, sample_every=0.0005)
        print("ready", flush=True)
        step = 0
        while True:
            step += 1
            with trace.phase("actor_update", step):
                pass
        """)
    child = subprocess.Popen([sys.executable, "-c", code], env=clean_env(),
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        time.sleep(0.5)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    (trace_file,) = (tmp_path / "allocator-traces").iterdir()
    data = trace_file.read_bytes()
    assert data.endswith(b"\n")
    records = lines(trace_file)
    assert len(records) > 100
    assert [r["seq"] for r in records] == list(range(len(records)))
    assert {bool(r.get("phase")) for r in records} == {True, False}  # both kinds interleaved


@pytest.mark.slow
def test_a_trace_refuses_to_write_from_a_forked_child(tmp_path: Path) -> None:
    done = python(f"""
        import os
        from auditor.capture import Trace
        trace = Trace({str(tmp_path)!r}, rank=0)
        pid = os.fork()
        if pid == 0:
            try:
                trace.sample()
            except RuntimeError as error:
                os._exit(0 if "forked process makes its own" in str(error) else 2)
            os._exit(1)
        _, status = os.waitpid(pid, 0)
        raise SystemExit(os.waitstatus_to_exitcode(status))
        """, clean_env())
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                    reason="torch is not installed (optional: the CPU build is enough)")
def test_with_the_real_torch_cpu_build(tmp_path: Path) -> None:
    done = python(f"""
        import torch
        from auditor.capture import Trace
        with Trace({str(tmp_path)!r}, rank=0) as trace:
            try:
                with trace.phase("rollout_init"):
                    raise torch.OutOfMemoryError("CUDA out of memory.")
            except torch.OutOfMemoryError:
                pass
        """, clean_env())
    assert done.returncode == 0, done.stderr
    (record,) = lines(next((tmp_path / "allocator-traces").iterdir()))
    assert record["error_type"] == "torch.OutOfMemoryError"  # (torch.cuda.OutOfMemoryError too)
    if not record.get("peak_allocated_bytes"):  # a CPU build: not measured
        assert record["peak_allocated_bytes"] is None
