"""Device evidence a training process writes:
``device-evidence/worker-<role>-<rank>-<host>-<pid>.json`` (contract v1.2: a pid is unique on
one node only).

Which GPU the process had, from NVML (the ``pynvml`` module of the maintained
``nvidia-ml-py`` distribution, the ``.[capture]`` extra) when it is importable, else from
``torch.cuda``, else a record with ``"gpu": null`` and ``gpu_unavailable`` saying why (a
CPU-only process). ``nvidia-smi``'s text is not a stable interface, so it is never parsed.

The local device is an index into ``CUDA_VISIBLE_DEVICES``; NVML is asked by the entry
there: a ``GPU-``/``MIG-`` uuid by uuid, a number by NVML index (NVML numbers GPUs in PCI
bus order, as CUDA does with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` and, on a node of identical
GPUs, by default). Inside a container NVML reports host pids: ``nspid`` (from
``/proc/self/status``) maps this process's pid to the host's.

The same NVML access gives ``seal --idle-check`` the post-period state of the GPUs.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from auditor.capture._files import (
    attempt_dir_of,
    dumps,
    hostname,
    job_id,
    nspid,
    rank_of,
    write_own,
)
from auditor.capture.memory import Memory
from auditor.capture.processes import check_role
from auditor.model.kinds import DEVICE_EVIDENCE

MIB = 1 << 20
IDLE_MEMORY_MIB = 1024
"""Most memory (MiB) a GPU may show in use and still count as idle (the driver's own)."""


def _nvml() -> Any | None:
    """The ``pynvml`` module, initialised; None when it is not importable or NVML is absent
    (no driver). ``nvidia-ml-py`` provides ``pynvml``; so did the deprecated ``pynvml``
    distribution, whose module is the same API."""
    try:
        import pynvml  # type: ignore[import-not-found, import-untyped, unused-ignore]
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded...
        return None
    return pynvml


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _visible_entry(local_device: int) -> str | None:
    """The ``CUDA_VISIBLE_DEVICES`` entry of ``local_device`` (None when unset: all)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    entries = [entry.strip() for entry in visible.split(",") if entry.strip()]
    return entries[local_device] if local_device < len(entries) else ""


def _gpu_from_nvml(nvml: Any, local_device: int) -> tuple[dict[str, Any] | None, str]:
    entry = _visible_entry(local_device)
    if entry == "":
        return None, (f"local device {local_device} is not in CUDA_VISIBLE_DEVICES="
                      f"{os.environ.get('CUDA_VISIBLE_DEVICES', '')!r}")
    try:
        if entry is not None and entry.upper().startswith(("GPU-", "MIG-")):
            handle = nvml.nvmlDeviceGetHandleByUUID(entry)
        else:
            handle = nvml.nvmlDeviceGetHandleByIndex(int(entry) if entry else local_device)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        return {
            "uuid": _text(nvml.nvmlDeviceGetUUID(handle)),
            "name": _text(nvml.nvmlDeviceGetName(handle)),
            "pci_bus_id": _text(nvml.nvmlDeviceGetPciInfo(handle).busId),
            "memory_total_mib": int(memory.total) // MIB,
        }, ""
    except Exception as error:  # noqa: BLE001 - NVMLError_*, a bad entry: said, not raised
        return None, f"NVML could not describe local device {local_device}: {error}"


def _gpu_from_torch(cuda: Any, local_device: int) -> tuple[dict[str, Any] | None, str]:
    try:
        props = cuda.get_device_properties(local_device)
        uuid = str(getattr(props, "uuid", "") or "")
        bus = ""
        if hasattr(props, "pci_bus_id"):
            bus = (f"{getattr(props, 'pci_domain_id', 0):08X}:{props.pci_bus_id:02X}:"
                   f"{getattr(props, 'pci_device_id', 0):02X}.0")
        return {
            "uuid": uuid if uuid.startswith(("GPU-", "MIG-")) or not uuid else f"GPU-{uuid}",
            "name": str(props.name),
            "pci_bus_id": bus,
            "memory_total_mib": int(props.total_memory) // MIB,
        }, ""
    except Exception as error:  # noqa: BLE001
        return None, f"torch.cuda could not describe local device {local_device}: {error}"


def describe_gpu(local_device: int, memory: Memory) -> tuple[dict[str, Any] | None, str, str]:
    """(gpu, why none, source): the GPU of ``local_device`` from NVML, else torch, else
    None with the reason."""
    nvml = _nvml()
    reasons: list[str] = []
    if nvml is not None:
        try:
            gpu, why = _gpu_from_nvml(nvml, local_device)
        finally:
            _shutdown(nvml)
        if gpu is not None:
            return gpu, "", "nvml"
        reasons.append(why)
    else:
        reasons.append("NVML not available (pynvml not importable or no NVIDIA driver)")
    if memory.cuda is not None:
        gpu, why = _gpu_from_torch(memory.cuda, local_device)
        if gpu is not None:
            return gpu, "", "torch"
        reasons.append(why)
    else:
        reasons.append("torch with CUDA not available")
    return None, "; ".join(reasons), ""


def _shutdown(nvml: Any) -> None:
    try:
        nvml.nvmlShutdown()
    except Exception:  # noqa: BLE001
        pass


def _mib(value: int | None) -> int | None:
    return None if value is None else value // MIB


def write_device_evidence(attempt_dir: str | os.PathLike[str] | None = None,
                          rank: int | None = None, role: str = "actor_rollout",
                          local_device: int | None = None, *, trace: Any = None,
                          memory: Memory | None = None) -> Path:
    """Write (atomically, replacing this process's earlier one; another process's of the same
    name, a node of the same hostname and pid, is :class:`~auditor.capture._files.NameTaken`)
    this process's device file; returns
    its path. Call it once the device is chosen and again at the end, so the file carries
    the process's peaks: from ``trace`` (a :class:`~auditor.capture.Trace`, its highest
    phase peak) when given, else torch's since the last reset, else null (not measured)."""
    check_role(role)  # (a '-' in it would make the file's name ambiguous, as a process's)
    memory = memory if memory is not None else (trace.memory if trace is not None else Memory())
    rank = rank_of(rank)
    if local_device is None:
        local_device = _local_device(memory)
    gpu, unavailable, source = describe_gpu(local_device, memory)
    if trace is not None:
        allocated, reserved = trace.peak_allocated_bytes, trace.peak_reserved_bytes
    else:
        allocated, reserved = memory.peaks()
    pid = os.getpid()
    record: dict[str, Any] = {
        "schema": "run-evidence/device/v1", "role": role, "rank": rank, "pid": pid,
        "job_id": job_id(), "hostname": hostname(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        "local_device": local_device, "gpu": gpu,
    }
    if gpu is None:
        record["gpu_unavailable"] = unavailable
    else:
        record["gpu_source"] = source
    record.update({"peak_allocated_mib": _mib(allocated), "peak_reserved_mib": _mib(reserved),
                   "captured_ns": time.time_ns(), "nspid": nspid()})
    path = attempt_dir_of(attempt_dir) / DEVICE_EVIDENCE.path_for(
        role=role, rank=rank, host=record["hostname"], pid=pid)  # (pids repeat across nodes)
    # (only over its own earlier one: another process's of this name, host and pid, is
    # refused, never replaced)
    write_own(path, dumps(record), "the device file of this role, rank, host and pid")
    return path


def _local_device(memory: Memory) -> int:
    """torch's current device when there is one, else ``LOCAL_RANK``, else 0."""
    if memory.cuda is not None:
        try:
            return int(memory.cuda.current_device())
        except Exception:  # noqa: BLE001
            pass
    value = os.environ.get("LOCAL_RANK", "").strip()
    return int(value) if value.isdigit() else 0


def idle_check(visible: str | None = None) -> dict[str, Any]:
    """Whether the GPUs of this job (``visible``: a ``CUDA_VISIBLE_DEVICES`` value, default
    this process's; all of the node's when unset) are left idle: no compute or graphics
    process, at most :data:`IDLE_MEMORY_MIB` used on each. Without NVML: ``passed`` null and
    ``unavailable`` saying why (recorded, not an error)."""
    nvml = _nvml()
    if nvml is None:
        return {"passed": None, "checked_ns": time.time_ns(),
                "unavailable": "NVML not available (pynvml not importable or no NVIDIA "
                               "driver)"}
    try:
        handles = _handles(nvml, os.environ.get("CUDA_VISIBLE_DEVICES")
                           if visible is None else visible)
        used: list[int] = []
        processes = 0
        for handle in handles:
            used.append(int(nvml.nvmlDeviceGetMemoryInfo(handle).used) // MIB)
            processes += len(nvml.nvmlDeviceGetComputeRunningProcesses(handle))
            processes += len(nvml.nvmlDeviceGetGraphicsRunningProcesses(handle))
    except Exception as error:  # noqa: BLE001 - an NVML error: no check could be made
        return {"passed": None, "checked_ns": time.time_ns(),
                "unavailable": f"NVML query failed: {error}"}
    finally:
        _shutdown(nvml)
    if not handles:
        return {"passed": None, "checked_ns": time.time_ns(),
                "unavailable": "no GPU visible to check"}
    return {"passed": processes == 0 and max(used) <= IDLE_MEMORY_MIB,
            "checked_ns": time.time_ns(), "gpu_memory_used_mib": used,
            "gpu_processes": processes, "idle_memory_mib": IDLE_MEMORY_MIB}


def _handles(nvml: Any, visible: str | None) -> list[Any]:
    if visible is None:
        return [nvml.nvmlDeviceGetHandleByIndex(index)
                for index in range(nvml.nvmlDeviceGetCount())]
    handles = []
    for entry in (part.strip() for part in visible.split(",")):
        if not entry:
            continue
        if entry.upper().startswith(("GPU-", "MIG-")):
            handles.append(nvml.nvmlDeviceGetHandleByUUID(entry))
        else:
            handles.append(nvml.nvmlDeviceGetHandleByIndex(int(entry)))
    return handles
