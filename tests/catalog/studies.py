"""Generated studies with fixed answers for the catalogue's tests.

Each study is one 2-GPU period per array element, each element on a named node; the node
names the GPUs too (the generator derives a GPU's UUID from its node and index), so
failures planted on one node are failures of its GPUs as well.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pyarrow.parquet as pq

from auditor._cli import main
from auditor._studygen import (
    MODEL,
    SEED_COMMIT,
    ElementSpec,
    PeriodSpec,
    StudySpec,
    default_protocol,
    write_study,
)

BAD_NODE = "gpu-node-66"
FAILING = "node_failure"
"""A period that fails for the hardware: sacct NODE_FAIL, unresolved infrastructure_failure."""


def hardware_study(root: Path, study: str, array_job: int,
                   elements: list[tuple[str, str]]) -> Path:
    """A study of one 2-GPU period per (node, outcome) of ``elements``, array task ids
    from 0 in order."""
    specs: list[ElementSpec] = []
    periods: list[PeriodSpec] = []
    for task, (node, outcome) in enumerate(elements):
        period = PeriodSpec(pair=f"host-{MODEL}-gsm8k-c2-s{161 + task}", workload="gsm8k",
                            seed=161 + task, model=MODEL, period=1, gpus=2, outcome=outcome)
        periods.append(period)
        specs.append(ElementSpec(array_task_id=task, job_id=str(array_job + 1 + task),
                                 periods=[period], node=node, alloc_gpus=2))
    write_study(StudySpec(study=study, array_job_id=str(array_job), elements=specs,
                          protocol=default_protocol(periods),
                          execution_commits={p.pair: SEED_COMMIT for p in periods}), root)
    return root


def audited(root: Path, out: Path) -> Path:
    """``auditor audit root --out out`` (no plots); returns ``out``."""
    assert main(["audit", str(root), "--out", str(out), "--quiet", "--no-plots"]) == 0
    return out


def drop_column(out: Path, table: str, column: str) -> None:
    """Rewrite ``out/<table>.parquet`` without ``column`` (a table of an older layout) and
    pin the new bytes in the output manifest, as an older auditor would have written it."""
    path = out / f"{table}.parquet"
    data = pq.read_table(path)
    pq.write_table(data.drop_columns([column]), path)
    repin(out, path.name)


def repin(out: Path, name: str) -> None:
    """Pin the bytes ``out/<name>`` holds now in the output manifest (as a forger would, so
    that ``auditor verify`` passes)."""
    blob = (out / name).read_bytes()
    manifest_path = out / "output_manifest.json"
    manifest = orjson.loads(manifest_path.read_bytes())
    for item in manifest["outputs"]:
        if item["path"] == name:
            item["sha256"], item["size"] = hashlib.sha256(blob).hexdigest(), len(blob)
    manifest_path.write_bytes(orjson.dumps(manifest, option=orjson.OPT_INDENT_2) + b"\n")


def three_studies(tmp: Path) -> list[Path]:
    """Three audited studies (alpha, beta, gamma; gamma's periods of an older layout, no
    ``last_step``). ``BAD_NODE`` runs 9 attempts across all three and fails 8 of them;
    gpu-node-07 fails 1 of 2; gpu-node-13 fails 1 of 2; every other attempt completes.
    In all: 42 attempts, 10 failures."""
    alpha = [(BAD_NODE, FAILING)] * 4 + [(f"gpu-node-0{1 + i // 2}", "completed")
                                         for i in range(12)]
    beta = [(BAD_NODE, FAILING)] * 4 + [("gpu-node-07", FAILING)] + [
        (f"gpu-node-{7 + (i + 1) // 2:02d}", "completed") for i in range(11)]
    gamma = [(BAD_NODE, "completed"), ("gpu-node-13", FAILING)] + [
        (f"gpu-node-{13 + (i + 1) // 2}", "completed") for i in range(8)]
    outs = []
    for name, job, elements in (("alpha", 8100000, alpha), ("beta", 8200000, beta),
                                ("gamma", 8300000, gamma)):
        root = hardware_study(tmp / name, name, job, elements)
        outs.append(audited(root, tmp / f"{name}-out"))
    drop_column(outs[2], "periods", "last_step")
    return outs


@contextlib.contextmanager
def fifo_in_place_of(path: Path, after_s: float = 10) -> Iterator[Path]:
    """A FIFO at ``path`` (what was there removed); if the block still runs ``after_s`` s
    later, a writer opens it and the read waiting on it ends: a test of a guard against
    FIFOs then fails instead of hanging for ever."""
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    done = threading.Event()

    def unblock() -> None:
        deadline = time.monotonic() + after_s
        while not done.is_set() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not done.is_set():
            with contextlib.suppress(OSError):
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))

    watchdog = threading.Thread(target=unblock, daemon=True)
    watchdog.start()
    try:
        yield path
    finally:
        done.set()
        watchdog.join()
