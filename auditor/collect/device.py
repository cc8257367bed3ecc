"""Read device evidence, ``device-evidence/worker-<role>-<rank>-<pid>.json``.

What one worker process saw of its GPU: its identity (role, rank, pid, job),
where it ran (host, ``CUDA_VISIBLE_DEVICES``, local device, GPU uuid/name/PCI
bus) and its peak memory. Mistyped fields read as None with a schema finding;
an integer ``job_id`` is read as its digits (still flagged). Agreement with the
file name, the period's workers and the allocator trace is checked later, by
the identity validator.
"""

from __future__ import annotations

from typing import BinaryIO

from auditor._io import HashingReader
from auditor.collect.jsondoc import (
    DEFAULT_LIMIT,
    as_int,
    as_job_id,
    as_obj,
    as_str,
    finish,
    load_json,
)
from auditor.model import DeviceEvidence
from auditor.schema import validate_document

DEVICE_LIMIT = DEFAULT_LIMIT
"""Largest device evidence document parsed (bytes)."""


def read_device(stream: BinaryIO | HashingReader, path: str) -> DeviceEvidence:
    """Read one device evidence file from ``stream``; ``path`` is its root-relative path."""
    doc, findings = load_json(stream, path, DEVICE_LIMIT, kind="device evidence")
    finish(stream)
    if doc is None:
        return DeviceEvidence(path=path, findings=tuple(findings))
    findings.extend(validate_document("device", doc, path))
    gpu = as_obj(doc.get("gpu"))
    return DeviceEvidence(
        path=path,
        role=as_str(doc.get("role")),
        rank=as_int(doc.get("rank")),
        pid=as_int(doc.get("pid")),
        job_id=as_job_id(doc.get("job_id")),
        hostname=as_str(doc.get("hostname")),
        cuda_visible_devices=as_str(doc.get("cuda_visible_devices")),
        local_device=as_int(doc.get("local_device")),
        gpu_uuid=as_str(gpu.get("uuid")),
        gpu_name=as_str(gpu.get("name")),
        gpu_pci_bus_id=as_str(gpu.get("pci_bus_id")),
        memory_total_mib=as_int(gpu.get("memory_total_mib")),
        peak_allocated_mib=as_int(doc.get("peak_allocated_mib")),
        peak_reserved_mib=as_int(doc.get("peak_reserved_mib")),
        captured_ns=as_int(doc.get("captured_ns")),
        findings=tuple(findings),
        gpu_unavailable=as_str(doc.get("gpu_unavailable")) if doc.get("gpu") is None else None,
    )
