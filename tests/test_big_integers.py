"""Integers of any size (issue 41, item 1): a value past 64 bits in any integer field of any
evidence file is a finding naming the file, never a crash; the audit still writes its report.

Built at test time: the bundled example study, one field of one file set past the 64-bit
range (and the manifest re-pinned, so the file is otherwise "verified").
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from auditor._cli import main

pytestmark = pytest.mark.slow

PAIR = "host-qwen25-7b-gsm8k-c2-s161"
HUGE = (1 << 63, (1 << 64) - 1, -(1 << 63) - 1, 10 ** 30)
FIELDS: list[tuple[str, tuple[str | int, ...]]] = [
    ("trial_record", ("invocation", "started_ns")), ("trial_record", ("invocation", "exit_code")),
    ("trial_record", ("period",)), ("trial_record", ("restart_count",)),
    ("trial_record", ("peak_mib",)), ("trial_record", ("array_task_id",)),
    ("device_evidence", ("pid",)), ("device_evidence", ("rank",)),
    ("device_evidence", ("peak_reserved_mib",)), ("device_evidence", ("captured_ns",)),
    ("device_evidence", ("gpu", "memory_total_mib")), ("device_evidence", ("local_device",)),
    ("allocator_trace", ("pid",)), ("allocator_trace", ("seq",)), ("allocator_trace", ("step",)),
    ("allocator_trace", ("started_ns",)), ("allocator_trace", ("peak_reserved_bytes",)),
    ("allocator_trace", ("allocated_bytes",)), ("allocator_trace", ("sample_ns",)),
    ("period", ("gpus",)), ("period", ("seed",)), ("period", ("array_task_id",)),
    ("period", ("workers", 0, "pid")), ("period", ("evidence", 0, "size")),
    ("period", ("idle_check", "checked_ns")),
]


def _set(document: Any, where: tuple[str | int, ...], value: int) -> None:
    for key in where[:-1]:
        document = document[key]
    document[where[-1]] = value


CASES = [(kind, where, value) for kind, where in FIELDS
         for value in (HUGE if kind == "device_evidence" else HUGE[:1])]
"""Every field at 2**63; the device file's at every size (2**64-1, below -2**63, 10**30)."""


@pytest.mark.parametrize(("kind", "where", "value"), CASES,
                         ids=[f"{k}:{'/'.join(map(str, w))}:{v}" for k, w, v in CASES])
def test_an_integer_past_64_bits_is_a_finding_never_a_crash(
        tmp_path: Path, kind: str, where: tuple[str | int, ...], value: int) -> None:
    root = tmp_path / "study"
    assert main(["example", str(root)]) == 0
    record_path = root / "pairs" / PAIR / "period-1.json"
    record = json.loads(record_path.read_text())
    if kind == "period":
        _set(record, where, value)
        changed = record_path.relative_to(root).as_posix()
    else:
        wanted = "trial" if kind == "trial_record" else kind
        entry = next(e for e in record["evidence"] if e["kind"] == wanted)
        path = root / record["attempt_dir"] / entry["path"]
        if kind == "allocator_trace":  # (the first line that has the field: a sample or phase)
            lines = path.read_text().splitlines()
            at = next(i for i, text in enumerate(lines) if where[0] in json.loads(text))
            changed_line = json.loads(lines[at])
            _set(changed_line, where, value)
            lines[at] = json.dumps(changed_line)
            data = "\n".join(lines).encode() + b"\n"
        else:
            document = json.loads(path.read_text())
            _set(document, where, value)
            data = json.dumps(document).encode()
        path.write_bytes(data)
        entry["sha256"], entry["size"] = hashlib.sha256(data).hexdigest(), len(data)
        changed = path.relative_to(root).as_posix()
    record_path.write_text(json.dumps(record))
    out = tmp_path / "out"
    assert main(["audit", str(root), "--out", str(out), "--quiet", "--no-plots"]) == 0
    assert (out / "diagnostic.md").is_file() and (out / "summary.json").is_file()
    findings = pq.read_table(out / "findings.parquet").to_pylist()
    named = [f for f in findings if changed in f["subject"] or any(
        changed in c for c in (f.get("message") or "",))]
    assert named, sorted({f["rule_id"] for f in findings})
