"""A period record is named one way only (``period-<n>.json``, ``n`` in ASCII digits, no
leading zero, below 2^63): another spelling of a period's number is never read as a second
record of it, and a number past 64 bits is a finding, never a crash where the tables are
written."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from auditor.collect.period import identity_from_path
from auditor.model.paths import period_number
from tests.helpers import audit, copy_example

PAIR = "host-qwen25-7b-gsm8k-c2-s161"


def _stray(out: Path) -> set[str]:
    return {row["subject"] for row in pq.read_table(out / "findings.parquet").to_pylist()
            if row["rule_id"] == "AUD105"}


@pytest.mark.parametrize("name", ["period-01.json", "period-\u0661.json", "period-\uff11.json",
                                  "period-1.json\n", "period-+1.json"])
def test_another_spelling_of_a_period_is_not_a_second_record(tmp_path: Path,
                                                             name: str) -> None:
    root = copy_example(tmp_path)
    before = audit(root, tmp_path / "before")
    shutil.copy(root / "pairs" / PAIR / "period-1.json", root / "pairs" / PAIR / name)
    after = audit(root, tmp_path / "after")
    assert after["launches"] == before["launches"]
    assert after["periods"] == before["periods"]
    assert after["accounting"] == before["accounting"]
    assert f"pairs/{PAIR}/{name}" in _stray(tmp_path / "after")


def test_a_period_past_64_bits_is_a_finding(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    big = 1 << 63
    record = root / "pairs" / PAIR / "period-1.json"
    text = record.read_text()
    assert '"period": 1,' in text
    (root / "pairs" / PAIR / f"period-{big}.json").write_text(
        text.replace('"period": 1,', f'"period": {big},'))
    record.unlink()
    summary = audit(root, tmp_path / "out")  # (it wrote its tables: exit 0, no crash)
    assert f"pairs/{PAIR}/period-{big}.json" in _stray(tmp_path / "out")
    assert all(period["period"] < big for period in summary["periods"])


def test_period_number() -> None:
    assert period_number("period-1.json") == 1
    assert period_number("period-0.json") == 0
    assert period_number(f"period-{(1 << 63) - 1}.json") == (1 << 63) - 1
    for name in ("period-01.json", "period-\u0661.json", f"period-{1 << 63}.json",
                 "period-1.json\n", "period-.json", "period-1.jsonl", "xperiod-1.json"):
        assert period_number(name) is None, name
    assert identity_from_path(f"pairs/p/period-{1 << 64}.json") == ("p", 0)
    assert identity_from_path("pairs/p/period-01.json") == ("p", 1)  # (not a record's name:
    # the number its name holds, as for any other file read as a record)
