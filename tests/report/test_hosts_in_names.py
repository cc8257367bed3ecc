"""A multi-node period's files named by host and pid (contract v1.2): the report's evidence
pattern names a node's files as every node's (``<host>``, as ``<pid>``), not once per node."""

from __future__ import annotations

import hashlib
from pathlib import Path

import orjson
import pandas as pd

from auditor._cli import main
from tests.helpers import element_study, period_records, period_spec

NODES = 4
PER_NODE = 4


def _on_nodes(root: Path, names: tuple[str, ...] | None = None,
              per_node: int = PER_NODE) -> list[str]:
    """Spread every period's workers over nodes of ``per_node`` ranks (hosts ``trainer-<n>``,
    one of them a prefix of none and ``trainer-1``'s name inside none; else ``names``), their
    traces and device files renamed by host and pid and re-pinned; the hosts."""
    hosts: list[str] = []
    for record_path in period_records(root):
        record = orjson.loads(record_path.read_bytes())
        attempt = root / record["attempt_dir"]
        renamed: dict[str, str] = {}
        for worker in record["workers"]:
            node = worker["rank"] // per_node
            host = names[node] if names else f"trainer-{node}"
            hosts.append(host)
            worker["host"] = host
            pid, rank, role = worker["pid"], worker["rank"], worker["role"]
            renamed[f"allocator-traces/allocator-{pid}.jsonl"] = \
                f"allocator-traces/allocator-{host}-{pid}.jsonl"
            old = f"device-evidence/worker-{role}-{rank}-{pid}.json"
            device = orjson.loads((attempt / old).read_bytes())
            device["hostname"] = host
            (attempt / old).write_bytes(orjson.dumps(device))
            renamed[old] = f"device-evidence/worker-{role}-{rank}-{host}-{pid}.json"
        for entry in record["evidence"]:
            if entry["path"] in renamed:
                (attempt / entry["path"]).rename(attempt / renamed[entry["path"]])
                entry["path"] = renamed[entry["path"]]
                data = (attempt / entry["path"]).read_bytes()
                entry["sha256"], entry["size"] = hashlib.sha256(data).hexdigest(), len(data)
        idle = record["idle_check"]  # (each node's own result, as the seal gathers them)
        idle["hosts"] = {host: {"passed": True, "unavailable": None,
                                "checked_ns": idle["checked_ns"]}
                         for host in sorted({w["host"] for w in record["workers"]})}
        record_path.write_bytes(orjson.dumps(record, option=orjson.OPT_INDENT_2))
    return sorted(set(hosts))


def test_a_nodes_files_are_one_pattern_for_every_rank(tmp_path: Path) -> None:
    root = element_study(tmp_path / "study", [
        (str(7000001 + i), [period_spec(seed=161 + i, gpus=NODES * PER_NODE,
                                        outcome="terminal_missing")]) for i in range(3)])
    hosts = _on_nodes(root)
    assert len(hosts) == NODES
    out = tmp_path / "out"
    assert main(["audit", str(root), "--out", str(out), "--quiet", "--no-plots"]) == 0
    report = (out / "diagnostic.md").read_text()
    evidence = [line for line in report.splitlines() if line.startswith("Evidence")]
    assert evidence, report
    assert any("`allocator-traces/allocator-<host>-<pid>.jsonl" in line
               and "for every rank" in line for line in evidence), evidence
    assert not any(host in line for line in evidence for host in hosts), evidence


def test_an_idle_check_on_many_nodes_names_a_few_and_counts_the_rest(tmp_path: Path) -> None:
    """Each node's own idle check passed on 12 nodes: the diagnosis names 8 and counts 4 (the
    record names every one; a period on 1,024 nodes said each in every diagnosis)."""
    root = element_study(tmp_path / "study", [("7000001", [period_spec(gpus=12)])])
    hosts = _on_nodes(root, per_node=1)
    assert len(hosts) == 12
    out = tmp_path / "out"
    assert main(["audit", str(root), "--out", str(out), "--quiet", "--no-plots"]) == 0
    (diagnosis,) = pd.read_parquet(out / "periods.parquet")["diagnosis"]
    named = sorted(hosts)[:8]  # (in the record's order: the seal's, by name)
    assert f"The post-period idle check passed on {', '.join(named)} and 4 more." \
        in diagnosis, diagnosis


def test_a_host_named_like_a_word_of_the_kits_file_names_is_only_the_hosts_part(
        tmp_path: Path) -> None:
    """Nodes called ``worker`` (a compose service's or pod's name), ``allocator``, ``traces``
    and ``device``: only the host part of a file's name becomes ``<host>``, never the
    ``worker-`` of a device file's name, the ``allocator-`` of a trace's or a folder
    (``allocator-traces``, ``device-evidence``), which read ``<host>-traces/<host>-<host>``."""
    root = element_study(tmp_path / "study", [
        (str(7000001 + i), [period_spec(seed=161 + i, gpus=NODES * PER_NODE,
                                        outcome="terminal_missing")]) for i in range(3)])
    _on_nodes(root, ("worker", "allocator", "traces", "device"))
    out = tmp_path / "out"
    assert main(["audit", str(root), "--out", str(out), "--quiet", "--no-plots"]) == 0
    report = (out / "diagnostic.md").read_text()
    evidence = [line for line in report.splitlines() if line.startswith("Evidence")]
    assert any("`allocator-traces/allocator-<host>-<pid>.jsonl" in line
               and "for every rank" in line for line in evidence), evidence
    assert not any("<host>-traces" in line or "<host>-<host>" in line
                   or "-evidence/<host>-" in line for line in evidence), evidence
