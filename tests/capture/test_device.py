"""``write_device_evidence``: NVML (a fake ``pynvml``), else torch, else ``"gpu": null``."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from auditor.capture import write_device_evidence
from tests.capture.support import fakes, load, python

GPUS = [
    {"uuid": "GPU-aaaa", "name": "NVIDIA A100-SXM4-40GB", "bus": "00000000:07:00.0",
     "total_mib": 40960, "used_mib": 3},
    {"uuid": "GPU-bbbb", "name": "NVIDIA A100-SXM4-40GB", "bus": "00000000:0B:00.0",
     "total_mib": 40960, "used_mib": 5},
]


def test_without_nvml_or_torch_the_gpu_is_null_and_says_why(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "5055845")
    monkeypatch.delenv("AUDITOR_JOB_ID", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    path = write_device_evidence(tmp_path, rank=2, role="actor_rollout", local_device=0)
    host = socket.gethostname().split(".", 1)[0]  # (v1.2: pids repeat across nodes)
    assert path == (tmp_path / "device-evidence"
                    / f"worker-actor_rollout-2-{host}-{os.getpid()}.json")
    record = load(path)
    assert record["gpu"] is None
    assert "NVML not available" in record["gpu_unavailable"]
    assert "torch with CUDA not available" in record["gpu_unavailable"]
    assert (record["rank"], record["pid"], record["job_id"]) == (2, os.getpid(), "5055845")
    assert record["peak_allocated_mib"] is None and record["peak_reserved_mib"] is None
    assert record["nspid"][-1] == os.getpid()
    assert record["hostname"]


@pytest.mark.slow
def test_nvml_describes_the_visible_device_by_uuid_or_index(tmp_path: Path) -> None:
    env = fakes(tmp_path, nvml=True)
    env["FAKE_NVML"] = json.dumps(GPUS)
    env["AUDITOR_JOB_ID"] = "77"
    for visible, local, expected in (("GPU-bbbb", 0, "GPU-bbbb"), ("1,0", 1, "GPU-aaaa"),
                                     ("0", 1, None)):
        env["CUDA_VISIBLE_DEVICES"] = visible
        out = tmp_path / visible
        done = python(f"""
            from auditor.capture import write_device_evidence
            print(write_device_evidence({str(out)!r}, 1, local_device={local}))
            """, env)
        assert done.returncode == 0, done.stderr
        record = load(Path(done.stdout.strip()))
        assert record["job_id"] == "77"
        assert record["cuda_visible_devices"] == visible
        if expected is None:  # local device 1 of one visible device
            assert record["gpu"] is None
            assert "not in CUDA_VISIBLE_DEVICES" in record["gpu_unavailable"]
            continue
        assert record["gpu"] == {"uuid": expected, "name": "NVIDIA A100-SXM4-40GB",
                                 "pci_bus_id": next(g["bus"] for g in GPUS
                                                    if g["uuid"] == expected),
                                 "memory_total_mib": 40960}
        assert record["gpu_source"] == "nvml"
        assert "gpu_unavailable" not in record


@pytest.mark.slow
def test_nvml_present_but_failing_falls_back_and_says_so(tmp_path: Path) -> None:
    env = fakes(tmp_path, nvml=True)
    env["FAKE_NVML_FAIL"] = "1"
    done = python(f"""
        from auditor.capture import write_device_evidence
        print(write_device_evidence({str(tmp_path)!r}, 0))
        """, env)
    assert done.returncode == 0, done.stderr
    assert load(Path(done.stdout.strip()))["gpu"] is None


def test_a_device_file_written_again_is_replaced_whole(tmp_path: Path) -> None:
    first = write_device_evidence(tmp_path, 0)
    second = write_device_evidence(tmp_path, 0)
    assert first == second
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no temporary left
    assert load(second)["captured_ns"] >= load(first)["captured_ns"]
