"""The ``phases`` and ``devices`` rows of one attempt, as plain tuples: what the workers
make of each period they judge (without pyarrow, which :mod:`auditor.report.tables` needs
to write them: importing it cost each worker about 45 MB of RSS, 14 MB of it its own)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from auditor.model import AttemptEvidence, PeriodEvidence


def phase_rows(period: PeriodEvidence, attempt: AttemptEvidence) -> Iterator[tuple[Any, ...]]:
    """The ``phases`` rows of one attempt of ``period``."""
    subject = period.subject
    index = attempt.spec.index + 1  # (1-based, as in the trial record)
    for trace in attempt.read.traces:
        for r in trace.phases:
            yield (
                subject, index, r.path, r.line, r.pid, r.rank, r.role, r.seq,
                r.phase, r.step,
                r.started_ns, r.finished_ns,  # started, finished
                r.error_type, r.peak_allocated_bytes, r.peak_reserved_bytes,
            )


def device_rows(period: PeriodEvidence, attempt: AttemptEvidence) -> Iterator[tuple[Any, ...]]:
    """The ``devices`` rows of one attempt of ``period``."""
    record = period.record
    index = attempt.spec.index + 1  # (1-based, as in the trial record)
    for d in attempt.read.devices:
        yield (
            period.subject, record.pair, record.period, index, d.job_id,
            d.rank, d.role, d.pid, d.hostname, d.cuda_visible_devices, d.local_device,
            d.gpu_uuid, d.gpu_name, d.gpu_pci_bus_id, d.memory_total_mib,
            d.peak_allocated_mib, d.peak_reserved_mib,
            d.captured_ns,  # captured
            d.gpu_unavailable, d.path,
        )
