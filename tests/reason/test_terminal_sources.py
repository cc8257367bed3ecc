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
    device = next((root / record["attempt_dir"]).glob("device-evidence/*.json"))
    host = json.loads(device.read_text())["hostname"]  # (the node the attempt ran on)
    text = (b":job_id:01000000\n:actor_name:WorkerDict\n"
            b"step:1 - training/global_step:1 - training/epoch:0 - actor/loss:0.31\n")
    (root / record["attempt_dir"] / "worker-logs").mkdir()
    pristine = json.dumps(record, indent=2)

    def with_worker_log(node: str) -> str:
        name = f"worker-logs/{node}-{worker['pid']}.out"
        (root / record["attempt_dir"] / name).write_bytes(text)
        listed = json.loads(pristine)
        listed["evidence"].append({"path": name, "kind": "worker_log", "size": len(text),
                                   "sha256": hashlib.sha256(text).hexdigest()})
        record_path.write_text(json.dumps(listed, indent=2))
        return name
    # a node no file of the attempt names: no output of its run, whatever it printed
    with_worker_log("gpu-node-99")
    stranger = _periods(root, tmp_path / "stranger")
    assert (stranger[four]["verdict"], stranger[four]["reason"]) == (
        "unresolved", "terminal_event_missing")
    (root / record["attempt_dir"] / f"worker-logs/gpu-node-99-{worker['pid']}.out").unlink()
    name = with_worker_log(host)
    after = _periods(root, tmp_path / "after")
    assert (after[four]["verdict"], after[four]["reason"]) == ("resolved", "completed")
    assert f"the driver's log lacks `step:1`; worker `{host}-{worker['pid']}`" \
        in str(after[four]["diagnosis"])
    assert f"printed it at `{record['attempt_dir']}/{name}:3`" in str(after[four]["diagnosis"])
    # every other period keeps the seed's verdict
    assert {s: (r["verdict"], r["reason"]) for s, r in after.items() if s != four} == \
        {s: (r["verdict"], r["reason"]) for s, r in before.items() if s != four}
