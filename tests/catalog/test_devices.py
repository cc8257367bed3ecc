"""``devices.parquet``: one row per device evidence file (a rank of an attempt), pinned by
the output manifest and re-checked by ``auditor verify``."""

from __future__ import annotations

from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest

from auditor._cli import main
from auditor.report.tables import SCHEMAS
from tests.catalog.studies import audited
from tests.helpers import EXAMPLE, edit_json


def test_one_row_per_device_file_as_the_file_says(tmp_path: Path) -> None:
    out = audited(EXAMPLE, tmp_path / "out")
    table = pq.read_table(out / "devices.parquet")
    assert table.schema.names == SCHEMAS["devices"].names
    rows = table.to_pylist()
    files = sorted(p.relative_to(EXAMPLE).as_posix()
                   for p in EXAMPLE.rglob("device-evidence/*.json"))
    assert sorted(r["path"] for r in rows) == files and len(files) == 54
    for row in rows:
        doc = orjson.loads((EXAMPLE / row["path"]).read_bytes())
        assert (row["hostname"], row["gpu_uuid"], row["gpu_name"], row["gpu_pci_bus_id"],
                row["memory_total_mib"], row["rank"], row["pid"], row["job_id"],
                row["peak_reserved_mib"]) == (
            doc["hostname"], doc["gpu"]["uuid"], doc["gpu"]["name"],
            doc["gpu"]["pci_bus_id"], doc["gpu"]["memory_total_mib"], doc["rank"],
            doc["pid"], doc["job_id"], doc["peak_reserved_mib"])
        assert row["attempt"] == 1 and row["gpu_unavailable"] is None
        assert row["subject"] == f"{row['pair']}/period-{row['period']}"


def test_attempts_count_from_one_and_a_missing_gpu_is_said(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "study"
    assert main(["example", str(root), "--kind", "mixed"]) == 0
    device = next(p for p in sorted(root.rglob("device-evidence/*.json"))
                  if "gsm8k-c2-s161" in p.as_posix()).relative_to(root).as_posix()

    def no_gpu(doc: dict[str, object]) -> None:
        doc["gpu"] = None
        doc["gpu_unavailable"] = "no CUDA device visible"

    edit_json(root, device, no_gpu)
    out = audited(root, tmp_path / "out")
    rows = pq.read_table(out / "devices.parquet").to_pylist()
    retried = [r for r in rows if r["pair"] == "host-qwen25-7b-math-c2-s164"]
    assert sorted({r["attempt"] for r in retried}) == [1, 2]
    assert len({r["job_id"] for r in retried}) == 2
    blind = next(r for r in rows if r["path"] == device)
    assert (blind["gpu_uuid"], blind["gpu_name"], blind["gpu_unavailable"]) == \
        (None, None, "no CUDA device visible")
    capsys.readouterr()
    assert main(["verify", str(out), "--quiet"]) == 0
    (out / "devices.parquet").write_bytes((out / "devices.parquet").read_bytes()[:-1])
    assert main(["verify", str(out), "--quiet"]) == 1
    assert "changed: outputs/devices.parquet" in capsys.readouterr().out
