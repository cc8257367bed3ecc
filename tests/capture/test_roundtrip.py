"""A CPU-only study made by the kit, end to end: ``run`` -> ``seal`` -> ``audit`` -> ``verify``.

The example trainer's evidence has null peaks, ``"gpu": null`` and an idle check that could
not be made (contract v1.1). Until the audit side accepts those (issue 18, item 5), the
round trip is expected to fail; the integrity check (a file changed after sealing) does not
depend on them and is tested as it is.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from auditor._cli import main
from tests.capture.support import COMMIT, EXAMPLE, FLAG, fakes, load

pytestmark = pytest.mark.slow  # (real child processes, signals)

MODES = [("s161", "completed", "driver", "resolved"), ("s162", "oom", "driver", "failed"),
         ("s163", "coordinated", "controller", "resolved")]


def _study(root: Path, monkeypatch: pytest.MonkeyPatch, protocol: dict[str, Any] | None = None
           ) -> Path:
    """Three periods of one configuration, one array element each, sealed; a protocol for a
    CPU-only study; a sacct dump as ``sacct -n -P`` prints these jobs."""
    for key in list(os.environ):
        if key.startswith(("SLURM_", "AUDITOR_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "5000")
    rows = []
    for task, (seed, mode, role, _) in enumerate(MODES):
        job = str(5001 + task)
        pair = f"host-m-gsm8k-c2-{seed}"
        monkeypatch.setenv("SLURM_JOB_ID", job)
        monkeypatch.setenv("SLURM_ARRAY_TASK_ID", str(task))
        main(["run", "--pair", pair, "--period", "1", "--gpus", "2", "--root", str(root),
              "--role", role, "--dispatch", "TOTAL_TRAINING_STEPS=1", "--dispatch",
              f"{FLAG}=1", "--", *EXAMPLE, "--mode", mode])
        assert main(["seal", str(root), "--pair", pair, "--period", "1", "--gpus", "2",
                     "--attempt-dir", f"{pair}-2gpu/attempt-{job}", "--commit", COMMIT,
                     "--workload", "gsm8k", "--seed", seed[1:], "--model", "m", "--study",
                     "kit", "--idle-check"]) == 0
        invocation = load(root / f"{pair}-2gpu" / f"attempt-{job}" / f"trial-{job}.json")[
            "invocation"]
        start, end = invocation["started_ns"] // 10**9, invocation["finished_ns"] // 10**9 + 1
        state, code = ("COMPLETED", "0:0") if mode != "oom" else ("FAILED", "1:0")
        rows.append(f"5000_{task}|{job}|kit|{state}|{code}|{_utc(start)}|{_utc(end)}|"
                    f"{end - start}|billing=2,cpu=2,gres/gpu=2,mem=8G,node=1|vm|None")
    (root / "accounting").mkdir()
    (root / "accounting" / "sacct-raw.psv").write_text("\n".join(rows) + "\n")
    (root / "protocol.json").write_text(json.dumps(protocol or {
        "schema": "run-evidence/protocol/v1", "name": "kit-example", "idle_check": "optional",
        "configurations": [{"workload": "gsm8k", "gpus": 2, "seeds": [161, 162, 163]}]}))
    return root


def _utc(seconds: int) -> str:
    """A time as ``TZ=UTC SLURM_TIME_FORMAT=standard sacct`` prints it."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")


def _audit(root: Path, out: Path) -> dict[str, Any]:
    assert main(["audit", str(root), "--out", str(out), "--quiet", "--no-plots"]) == 0
    return load(out / "summary.json")


def test_seal_audit_verify_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _study(tmp_path / "study", monkeypatch)
    summary = _audit(root, tmp_path / "out")
    verdicts = {(p["pair"].rsplit("-", 1)[1], p["verdict"]) for p in summary["periods"]}
    assert verdicts == {(seed, verdict) for seed, _, _, verdict in MODES}
    assert summary["gate"]["passed"] is True
    assert main(["verify", str(tmp_path / "out"), "--quiet"]) == 0
    assert main(["gate", str(tmp_path / "out")]) == 0


@pytest.fixture
def _forget_fake_nvml() -> Iterator[None]:
    """The fake ``pynvml`` imported in this process is forgotten after the test (a later test
    in the same worker must not find NVML)."""
    yield
    sys.modules.pop("pynvml", None)


@pytest.mark.usefixtures("_forget_fake_nvml")
def test_on_a_gpu_node_the_round_trip_audits_clean_today(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """With (fake) torch.cuda and NVML the kit writes contract v1 evidence exactly: measured
    peaks, one GPU per rank, a passed idle check; the audit resolves the study as it is."""
    env = fakes(tmp_path, nvml=True, torch=True)
    monkeypatch.setenv("PYTHONPATH", env["PYTHONPATH"])  # (the ranks import the fakes)
    monkeypatch.syspath_prepend(str(tmp_path / "fakes"))  # (seal --idle-check, in-process)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv("FAKE_NVML", json.dumps([
        {"uuid": f"GPU-{i}", "name": "NVIDIA A100-SXM4-40GB", "bus": f"00000000:0{i}:00.0",
         "total_mib": 40960, "used_mib": 0} for i in range(2)]))
    root = _study(tmp_path / "study", monkeypatch, {
        "schema": "run-evidence/protocol/v1", "name": "kit-gpu",
        "configurations": [{"workload": "gsm8k", "gpus": 2, "seeds": [161, 162, 163]}]})
    device = next((root / "host-m-gsm8k-c2-s161-2gpu" / "attempt-5001" / "device-evidence")
                  .iterdir())
    assert load(device)["gpu_source"] == "nvml"
    summary = _audit(root, tmp_path / "out")
    verdicts = {(p["pair"].rsplit("-", 1)[1], p["verdict"]) for p in summary["periods"]}
    assert verdicts == {(seed, verdict) for seed, _, _, verdict in MODES}
    assert summary["gate"]["passed"] is True, summary["gate"]["reasons"]
    assert main(["verify", str(tmp_path / "out"), "--quiet"]) == 0


def test_a_file_changed_after_sealing_is_caught(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    root = _study(tmp_path / "study", monkeypatch)
    before = _audit(root, tmp_path / "before")["integrity"]
    assert (before["mismatched"], before["missing"], before["unlisted"]) == (0, 0, 0)
    log = root / "host-m-gsm8k-c2-s161-2gpu" / "attempt-5001" / "training-5001.log"
    log.write_bytes(log.read_bytes().replace(b"step:1", b"step:2"))
    summary = _audit(root, tmp_path / "after")
    assert summary["integrity"]["mismatched"] == 1
    period = next(p for p in summary["periods"] if p["pair"].endswith("s161"))
    assert period["verdict"] == "unresolved"
    assert period["reason"] == "evidence_mismatch"
