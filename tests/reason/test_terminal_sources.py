"""Seed 002's study, and the same study with what its workers printed (contract v1.2): the
terminal line the driver's log lost, found in a worker's own output, resolves the period and
the diagnosis says where; without it the seed's verdicts and limits stand."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow.parquet as pq

from auditor._cli import main

PAIR = "host-qwen25-7b-gsm8k-c2-s161"


def _periods(root: Path, out: Path) -> dict[str, dict[str, object]]:
    assert main(["audit", str(root), "--out", str(out), "--quiet", "--no-plots"]) == 0
    return {row["subject"]: row for row in pq.read_table(out / "periods.parquet").to_pylist()}


def test_the_seeds_unresolved_period_resolves_from_its_workers_own_output(tmp_path: Path
                                                                          ) -> None:
    root = tmp_path / "study"
    assert main(["example", str(root)]) == 0
    before = _periods(root, tmp_path / "before")
    four = next(subject for subject, row in sorted(before.items())
                if subject.startswith(PAIR) and row["reason"] == "terminal_event_missing")
    assert "no line with `step:1`" in str(before[four]["diagnosis"])
    record_path = root / "pairs" / f"{four.split('/')[0]}" / f"{four.split('/')[1]}.json"
    record = json.loads(record_path.read_text())
    worker = record["workers"][0]
    name = f"worker-logs/gpu-node-17-{worker['pid']}.out"
    text = (b":job_id:01000000\n:actor_name:WorkerDict\n"
            b"step:1 - training/global_step:1 - training/epoch:0 - actor/loss:0.31\n")
    target = root / record["attempt_dir"] / name
    target.parent.mkdir()
    target.write_bytes(text)
    record["evidence"].append({"path": name, "kind": "worker_log",
                               "sha256": hashlib.sha256(text).hexdigest(), "size": len(text)})
    record_path.write_text(json.dumps(record, indent=2))
    after = _periods(root, tmp_path / "after")
    assert (after[four]["verdict"], after[four]["reason"]) == ("resolved", "completed")
    assert f"the driver's log lacks `step:1`; worker `gpu-node-17-{worker['pid']}`" \
        in str(after[four]["diagnosis"])
    assert f"printed it at `{record['attempt_dir']}/{name}:3`" in str(after[four]["diagnosis"])
    # every other period keeps the seed's verdict
    assert {s: (r["verdict"], r["reason"]) for s, r in after.items() if s != four} == \
        {s: (r["verdict"], r["reason"]) for s, r in before.items() if s != four}
