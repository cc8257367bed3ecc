"""Shared by the producer-kit tests: run the CLI in a child process, fake NVML and torch.

The fakes stand only for what the kit reads from outside (``pynvml``, ``torch.cuda``): they
are modules put first on ``PYTHONPATH`` of a child process; the kit's code is the real one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SCHEMAS = REPO / "auditor" / "schemas"
COMMIT = "120e29a146294722a6668f55a1e7fed2878eb62a"
FLAG = "COSMOS_SHUTDOWN_ON_NO_POLICY_REPLICAS"
EXAMPLE = [sys.executable, "-m", "auditor.capture.example"]

FAKE_PYNVML = '''
"""A fake NVML (pynvml API) for tests: GPUs described by FAKE_NVML (JSON list)."""
import json, os

class _Pci:
    def __init__(self, bus): self.busId = bus

class _Memory:
    def __init__(self, total, used): self.total, self.used, self.free = total, used, total - used

def _gpus():
    return json.loads(os.environ.get("FAKE_NVML", "[]"))

def nvmlInit():
    if os.environ.get("FAKE_NVML_FAIL"):
        raise RuntimeError("NVML Shared Library Not Found")

def nvmlShutdown(): pass
def nvmlDeviceGetCount(): return len(_gpus())
def nvmlDeviceGetHandleByIndex(index): return _gpus()[index]
def nvmlDeviceGetHandleByUUID(uuid):
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    return next(g for g in _gpus() if g["uuid"] == uuid)
def nvmlDeviceGetUUID(h): return h["uuid"]
def nvmlDeviceGetName(h): return h["name"].encode()
def nvmlDeviceGetPciInfo(h): return _Pci(h["bus"])
def nvmlDeviceGetMemoryInfo(h): return _Memory(h["total_mib"] << 20, h.get("used_mib", 0) << 20)
def nvmlDeviceGetComputeRunningProcesses(h): return [object()] * h.get("processes", 0)
def nvmlDeviceGetGraphicsRunningProcesses(h): return []
'''

FAKE_TORCH_CUDA = '''
"""A fake torch.cuda for tests: an allocator whose figures the test drives."""
_state = {"allocated": 0, "peak": 0}

def is_available(): return True
def current_device(): return 0
def reset_peak_memory_stats(device=None): _state["peak"] = _state["allocated"]
def max_memory_allocated(device=None): return _state["peak"]
def max_memory_reserved(device=None): return _state["peak"] * 2
def memory_allocated(device=None): return _state["allocated"]
def memory_reserved(device=None): return _state["allocated"] * 2
def mem_get_info(device=None): return (1 << 34) - _state["allocated"] * 3, 1 << 34
def allocate(n):
    _state["allocated"] += n
    _state["peak"] = max(_state["peak"], _state["allocated"])
class _Props:
    name = "Fake GPU"
    total_memory = 40960 << 20
    uuid = "5f3c0000-0000-0000-0000-000000000001"
    pci_domain_id, pci_bus_id, pci_device_id = 0, 7, 0
def get_device_properties(device): return _Props()
'''


def fakes(tmp_path: Path, *, nvml: bool = False, torch: bool = False) -> dict[str, str]:
    """An environment whose ``PYTHONPATH`` starts with the requested fakes."""
    place = tmp_path / "fakes"
    place.mkdir(exist_ok=True)
    if nvml:
        (place / "pynvml.py").write_text(FAKE_PYNVML)
    if torch:
        (place / "torch").mkdir(exist_ok=True)
        (place / "torch" / "__init__.py").write_text('"""Fake torch."""\nfrom . import cuda\n')
        (place / "torch" / "cuda.py").write_text(FAKE_TORCH_CUDA)
    env = clean_env()
    env["PYTHONPATH"] = os.pathsep.join([str(place), env["PYTHONPATH"]])
    return env


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without SLURM's, the flag or the kit's own variables."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("SLURM_", "AUDITOR_")) and key not in (FLAG, "RANK",
                                                                          "LOCAL_RANK")}
    # the repository first, then what the caller's PYTHONPATH held (an optional torch)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])
    env.update(extra)
    return env


def python(code: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a child Python."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def auditor(args: list[str], env: dict[str, str] | None = None, cwd: Path | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m auditor ARGS`` in a child process."""
    return subprocess.run([sys.executable, "-m", "auditor", *args], env=env or clean_env(),
                          cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)


def start_auditor(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """``python -m auditor ARGS`` started, not waited for."""
    return subprocess.Popen([sys.executable, "-m", "auditor", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_for(predicate: Any, timeout: float = 30.0) -> None:
    """Poll ``predicate()`` until true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.05)


def load(path: Path) -> dict[str, Any]:
    """A JSON document."""
    result: dict[str, Any] = json.loads(path.read_text())
    return result


def lines(path: Path) -> list[dict[str, Any]]:
    """Every record of a JSONL file (each line must be whole JSON)."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def schema_errors(kind: str, document: Any) -> list[str]:
    """What ``auditor/schemas/<kind>.schema.json`` says is wrong with ``document``."""
    import jsonschema

    schema = json.loads((SCHEMAS / f"{kind}.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    return sorted(f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
                  for e in validator.iter_errors(document))


def run_args(root: Path, job: str = "5001", *extra: str, pair: str = "host-m-gsm8k-c2-s1",
             period: int = 1, gpus: int = 2) -> list[str]:
    """``run`` arguments for an attempt under ``root`` outside SLURM."""
    return ["run", "--pair", pair, "--period", str(period), "--gpus", str(gpus), "--root",
            str(root), "--job-id", job, *extra]


def attempt_of(root: Path, job: str = "5001", pair: str = "host-m-gsm8k-c2-s1",
               gpus: int = 2, restart: int = 0) -> Path:
    """Where ``run`` puts the attempt."""
    return root / f"{pair}-{gpus}gpu" / (f"attempt-{job}" + (f"-r{restart}" if restart else ""))


def namespaces() -> list[str] | None:
    """``unshare`` arguments for a node of its own hostname and pid namespace, or None."""
    command = ["unshare", "--user", "--map-root-user", "--uts", "--pid", "--fork",
               "--mount-proc"]
    if shutil.which("unshare") is None:
        return None
    try:
        done = subprocess.run([*command, "sh", "-c", "hostname trainer && test $$ = 1"],
                              capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return command if done.returncode == 0 else None
