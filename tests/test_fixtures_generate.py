"""Tests for the study generator (``auditor._studygen``, re-exported by the clone's
``fixtures.generate`` shim): determinism, manifest integrity, the seed study's facts,
the committed example never drifting, and what each ``mixed`` outcome writes."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from auditor import _studygen as gen
from auditor._studygen import presets
from fixtures import generate as shim

REPO = Path(__file__).resolve().parents[1]
COMMITTED_EXAMPLE = REPO / "fixtures" / "example_study"
NS = 1_000_000_000

SEED_TABLE = {
    # index: (workload, seed, job, 4-GPU period, actor update, post-update sync, peak, pids)
    0: (
        "code_heavy_tail",
        161,
        "5055846",
        1,
        "19:01:31.699704267",
        "19:02:18.386028932",
        39842,
        [758712, 758713, 758714, 758715],
    ),
    1: (
        "gsm8k",
        163,
        "5055847",
        2,
        "19:05:57.381348829",
        "19:08:02.327763208",
        38560,
        [3563810, 3563811, 3563812, 3563813],
    ),
    2: (
        "code_heavy_tail",
        162,
        "5055848",
        2,
        "19:04:48.459750884",
        "19:05:59.536233566",
        39392,
        [3495668, 3495669, 3495670, 3495671],
    ),
    3: (
        "gsm8k",
        162,
        "5055858",
        1,
        "19:09:58.895325061",
        "19:10:32.865654877",
        38560,
        [802123, 802124, 802125, 802126],
    ),
    4: (
        "math",
        162,
        "5055859",
        2,
        "19:14:44.017014711",
        "19:15:55.046759828",
        39086,
        [3539673, 3539674, 3539675, 3539676],
    ),
    5: (
        "code_heavy_tail",
        163,
        "5055860",
        2,
        "19:16:12.444318056",
        "19:17:22.263802288",
        39648,
        [3613579, 3613580, 3613582, 3613583],
    ),
    6: (
        "math",
        163,
        "5055863",
        1,
        "19:19:05.722544967",
        "19:20:47.573877478",
        39086,
        [843954, 843955, 843956, 843957],
    ),
    7: (
        "math",
        161,
        "5055864",
        1,
        "19:21:44.142735712",
        "19:22:20.560774115",
        39086,
        [3571156, 3571157, 3571158, 3571159],
    ),
    8: (
        "gsm8k",
        161,
        "5055845",
        2,
        "19:25:33.619484057",
        "19:27:04.665561977",
        38560,
        [3657525, 3657526, 3657527, 3657528],
    ),
}


# --------------------------------------------------------------------------- helpers


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def load_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def period_records(root: Path) -> dict[tuple[str, int], dict[str, Any]]:
    records = {}
    for path in sorted((root / "pairs").glob("*/period-*.json")):
        record = load_json(path)
        records[(record["pair"], record["period"])] = record
    return records


def attempts(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The contract's two forms (single attempt / ``attempts`` list) as one list."""
    if "attempts" in record:
        return record["attempts"]
    return [{key: record[key] for key in ("job_id", "attempt_dir", "workers", "evidence")}]


def evidence_of(root: Path, attempt: dict[str, Any], kind: str) -> list[Path]:
    base = root / attempt["attempt_dir"]
    return [base / item["path"] for item in attempt["evidence"] if item["kind"] == kind]


def trace_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def phases(path: Path) -> list[tuple[str, int, str]]:
    return [
        (rec["phase"], rec["step"], rec["error_type"])
        for rec in trace_lines(path)
        if "phase" in rec
    ]


def sacct_rows(root: Path) -> list[list[str]]:
    text = (root / "accounting" / "sacct-raw.psv").read_text()
    rows = [line.split("|") for line in text.splitlines()]
    assert all(len(row) == 11 for row in rows), "every row has the contract's 11 fields"
    return rows


def outer_rows(root: Path) -> dict[str, list[str]]:
    """JobIDRaw -> the allocation row (JobID without a step suffix)."""
    return {row[1]: row for row in sacct_rows(root) if "." not in row[0]}


def sacct_ns(text: str) -> int:
    stamp = datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    return int(stamp.timestamp()) * NS


def seed_clock(text: str) -> int:
    return presets._seed_clock(text)


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return gen.generate("example", tmp_path_factory.mktemp("example") / "study")


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return gen.generate("mixed", tmp_path_factory.mktemp("mixed") / "study")


# --------------------------------------------------------------------------- determinism


@pytest.mark.parametrize("kind", ["example", "mixed", "scale"])
def test_generation_is_byte_identical_across_runs(kind: str, tmp_path: Path) -> None:
    options = {"elements": 4, "trace_samples": 20, "log_lines": 15}
    first = gen.generate(kind, tmp_path / "a", **options)
    second = gen.generate(kind, tmp_path / "b", **options)
    assert tree_bytes(first) == tree_bytes(second)
    assert tree_bytes(first)


def test_committed_example_equals_a_fresh_generation(example: Path) -> None:
    assert COMMITTED_EXAMPLE.is_dir(), (
        "run: auditor example fixtures/example_study"
    )
    committed, fresh = tree_bytes(COMMITTED_EXAMPLE), tree_bytes(example)
    assert sorted(committed) == sorted(fresh)
    drifted = [name for name in fresh if committed[name] != fresh[name]]
    assert not drifted, f"regenerate fixtures/example_study; drifted: {drifted[:5]}"
    assert sum(len(data) for data in committed.values()) < 400_000


# --------------------------------------------------------------------------- integrity


@pytest.mark.parametrize("study", ["example", "mixed"])
def test_every_manifest_hash_and_size_matches_and_nothing_is_unlisted(
    study: str, request: pytest.FixtureRequest
) -> None:
    root: Path = request.getfixturevalue(study)
    listed: set[Path] = set()
    for record in period_records(root).values():
        for attempt in attempts(record):
            for item in attempt["evidence"]:
                assert not item["path"].startswith("/") and ".." not in item["path"]
                path = root / attempt["attempt_dir"] / item["path"]
                data = path.read_bytes()
                assert hashlib.sha256(data).hexdigest() == item["sha256"], path
                assert len(data) == item["size"], path
                listed.add(path)
    on_disk = {
        path
        for path in root.rglob("*")
        if path.is_file() and path.relative_to(root).parts[0].endswith("gpu")
    }
    assert on_disk == listed


@pytest.mark.parametrize("study", ["example", "mixed"])
def test_identities_agree_across_files(study: str, request: pytest.FixtureRequest) -> None:
    root: Path = request.getfixturevalue(study)
    for record in period_records(root).values():
        for attempt in attempts(record):
            job = attempt["job_id"]
            assert attempt["attempt_dir"] == f"{record['pair']}-{record['gpus']}gpu/attempt-{job}"
            workers = attempt["workers"]
            assert [w["rank"] for w in workers] == list(range(record["gpus"]))
            uuids = set()
            for worker in workers:
                rank, pid = worker["rank"], worker["pid"]
                assert worker["role"] == "actor_rollout"
                device = load_json(
                    root
                    / attempt["attempt_dir"]
                    / "device-evidence"
                    / f"worker-actor_rollout-{rank}-{pid}.json"
                )
                assert (device["rank"], device["pid"], device["job_id"]) == (rank, pid, job)
                assert device["gpu"]["memory_total_mib"] == 40960
                assert device["gpu"]["name"] == "NVIDIA A100-SXM4-40GB"
                uuids.add(device["gpu"]["uuid"])
                trace = (
                    root / attempt["attempt_dir"] / "allocator-traces" / f"allocator-{pid}.jsonl"
                )
                lines = trace_lines(trace)
                assert all(line["pid"] == pid for line in lines)
                assert all(line["rank"] == rank for line in lines if "phase" in line)
                assert [line["seq"] for line in lines] == list(range(len(lines)))
            assert len(uuids) == record["gpus"], "one GPU per rank"


@pytest.mark.parametrize("study", ["example", "mixed"])
def test_times_nest_records_in_invocation_in_sacct_window(
    study: str, request: pytest.FixtureRequest
) -> None:
    root: Path = request.getfixturevalue(study)
    rows = outer_rows(root)
    for record in period_records(root).values():
        for attempt in attempts(record):
            row = rows[attempt["job_id"]]
            start, end = sacct_ns(row[5]), sacct_ns(row[6])
            assert int(row[7]) * NS == end - start
            trials = evidence_of(root, attempt, "trial")
            if trials:
                invocation = load_json(trials[0])["invocation"]
                low, high = invocation["started_ns"], invocation["finished_ns"]
                assert start <= low < high <= end
            else:
                low, high = start, end
            for trace in evidence_of(root, attempt, "allocator_trace"):
                for line in trace_lines(trace):
                    if "phase" in line:
                        assert low <= line["started_ns"] < line["finished_ns"] <= high
                    else:
                        assert low <= line["sample_ns"] <= high
            check = attempt.get("idle_check", record.get("idle_check"))
            if check is not None:
                assert high < check["checked_ns"] < end and check["passed"] is True


# --------------------------------------------------------------------------- the seed study


def test_example_has_the_seed_shape(example: Path) -> None:
    records = period_records(example)
    assert len(records) == 18
    rows = outer_rows(example)
    assert len(rows) == 9
    assert all(row[3:5] == ["FAILED", "2:0"] for row in rows.values())
    assert all("gres/gpu=4" in row[8] and "gres/gpu:a100=4" in row[8] for row in rows.values())
    assert sum(int(row[7]) * 4 for row in rows.values()) == 20828
    last = rows["5055845"]
    assert last[0] == "5055845_8" and last[6] == "2026-09-15T19:27:18"
    assert max(row[6] for row in rows.values()) == "2026-09-15T19:27:18"
    assert {row[0]: row[1] for row in rows.values()} == {
        f"5055845_{index}": SEED_TABLE[index][2] for index in range(9)
    }
    commits = load_json(example / "execution_commits.json")
    assert len(commits) == 9 and set(commits.values()) == {gen.SEED_COMMIT}
    assert {record["commit"] for record in records.values()} == {gen.SEED_COMMIT}
    protocol = load_json(example / "protocol.json")
    assert "anchors" not in protocol
    assert {(c["workload"], c["gpus"]): c["seeds"] for c in protocol["configurations"]} == {
        (w, g): [161, 162, 163] for w in ("gsm8k", "math", "code_heavy_tail") for g in (2, 4)
    }
    steps = [row for row in sacct_rows(example) if "." in row[0]]
    assert {row[0].split(".", 1)[1] for row in steps} == {"batch", "extern", "0", "1"}


def test_example_accounting_scopes_match_the_seed(example: Path) -> None:
    task = reservation = 0
    for record in period_records(example).values():
        for attempt in attempts(record):
            trial = load_json(evidence_of(example, attempt, "trial")[0])
            span = trial["invocation"]["finished_ns"] - trial["invocation"]["started_ns"]
            task += span * record["gpus"]
            reservation += span * 4
    assert task / NS == pytest.approx(17605.783111, abs=1e-6)
    assert reservation / NS == pytest.approx(20199.935106, abs=1e-6)
    assert task == 17_605_783_111_000 and reservation == 20_199_935_106_000


@pytest.mark.parametrize("index", range(9))
def test_example_element_matches_the_seed_table(example: Path, index: int) -> None:
    workload, seed, job, period4, update, sync, peak, pids = SEED_TABLE[index]
    pair = f"host-qwen25-7b-{workload}-c2-s{seed}"
    records = period_records(example)
    four, two = records[(pair, period4)], records[(pair, 3 - period4)]
    assert (four["gpus"], two["gpus"]) == (4, 2)
    assert four["job_id"] == two["job_id"] == job
    assert four["array_task_id"] == index
    assert [w["pid"] for w in four["workers"]] == pids
    assert four["idle_check"]["passed"] and two["idle_check"]["passed"]

    trial = load_json(evidence_of(example, four, "trial")[0])
    assert trial["dispatch"] == {
        "TOTAL_TRAINING_STEPS": "1",
        "TRAINER_LOGGER": '["console"]',
        "RESUME_MODE": "disable",
    }
    assert trial["invocation"]["exit_code"] == 0
    assert trial["status"] == "infrastructure_invalid"
    assert trial["validation_error"] == (
        "ValueError: Successful exit lacks the exact one-step terminal event"
    )
    assert trial["peak_mib"] == peak
    devices = [load_json(path) for path in evidence_of(example, four, "device_evidence")]
    assert max(device["peak_reserved_mib"] for device in devices) == peak

    update_ends, sync_ends = [], []
    for trace in evidence_of(example, four, "allocator_trace"):
        assert phases(trace) == [
            ("init_model", 0, ""),
            ("rollout_init", 0, ""),
            ("weight_sync", 0, ""),
            ("rollout_generate", 1, ""),
            ("actor_update", 1, ""),
            ("weight_sync", 1, ""),
            ("idle", 1, ""),
        ]
        records_by_key = {(r["phase"], r["step"]): r for r in trace_lines(trace) if "phase" in r}
        update_ends.append(records_by_key[("actor_update", 1)]["finished_ns"])
        sync_ends.append(records_by_key[("weight_sync", 1)]["finished_ns"])
        assert records_by_key[("weight_sync", 1)]["started_ns"] > update_ends[-1]
    assert max(update_ends) == update_ends[3] == seed_clock(update)
    assert max(sync_ends) == sync_ends[3] == seed_clock(sync)
    log = evidence_of(example, four, "training_log")[0].read_text()
    assert "step:" not in log and "training/global_step:" not in log
    assert "(TaskRunner pid=" in log

    oom_trial = load_json(evidence_of(example, two, "trial")[0])
    assert oom_trial["invocation"]["exit_code"] != 0
    oom_traces = evidence_of(example, two, "allocator_trace")
    assert phases(oom_traces[0]) == [
        ("init_model", 0, ""),
        ("rollout_init", 0, "torch.OutOfMemoryError"),
    ]
    oom_log = evidence_of(example, two, "training_log")[0].read_text()
    assert "torch.OutOfMemoryError: CUDA out of memory" in oom_log
    assert "Traceback (most recent call last):" in oom_log

    # Periods run in launch order inside the element.
    first, second = (four, two) if period4 == 1 else (two, four)
    first_trial = load_json(evidence_of(example, first, "trial")[0])["invocation"]
    second_trial = load_json(evidence_of(example, second, "trial")[0])["invocation"]
    assert first_trial["finished_ns"] < first["idle_check"]["checked_ns"]
    assert first["idle_check"]["checked_ns"] < second_trial["started_ns"]


# --------------------------------------------------------------------------- mixed outcomes


def mixed_attempt(root: Path, outcome: str) -> tuple[dict[str, Any], dict[str, Any]]:
    workload, seed = {row[0]: (row[1], row[2]) for row in presets._MIXED_TABLE}[outcome]
    pair = f"host-qwen25-7b-{workload}-c2-s{seed}"
    record = load_json(root / "pairs" / pair / "period-1.json")
    return record, attempts(record)[0]


def mixed_evidence(root: Path, outcome: str) -> dict[str, Any]:
    record, attempt = mixed_attempt(root, outcome)
    trials = evidence_of(root, attempt, "trial")
    return {
        "record": record,
        "trial": load_json(trials[0]) if trials else None,
        "log": evidence_of(root, attempt, "training_log")[0].read_text(),
        "phases": [phases(path) for path in evidence_of(root, attempt, "allocator_trace")],
        "sacct": outer_rows(root)[attempt["job_id"]],
        "steps": [row for row in sacct_rows(root) if row[1].startswith(attempt["job_id"] + ".")],
    }


FULL = [
    ("init_model", 0, ""),
    ("rollout_init", 0, ""),
    ("weight_sync", 0, ""),
    ("rollout_generate", 1, ""),
    ("actor_update", 1, ""),
    ("weight_sync", 1, ""),
    ("idle", 1, ""),
]
PARTIAL = FULL[:4]


def has_terminal(log: str) -> bool:
    return any("step:1 " in line and "training/global_step:" in line for line in log.splitlines())


def test_mixed_covers_every_outcome(mixed: Path) -> None:
    assert [row[0] for row in presets._MIXED_TABLE] == list(gen.OUTCOMES)
    protocol = load_json(mixed / "protocol.json")
    seeds = {(c["workload"], c["gpus"]): c["seeds"] for c in protocol["configurations"]}
    assert seeds[("code_heavy_tail", 4)] == [161, 162, 163, 164]


def test_mixed_completed(mixed: Path) -> None:
    found = mixed_evidence(mixed, "completed")
    assert found["trial"]["invocation"] == {
        **found["trial"]["invocation"],
        "exit_code": 0,
        "received_signal": None,
    }
    assert found["trial"]["status"] == "completed"
    assert has_terminal(found["log"]) and "\x1b[36m(TaskRunner pid=" in found["log"]
    assert found["phases"] == [FULL] * 4
    assert found["sacct"][3:5] == ["COMPLETED", "0:0"]


def test_mixed_terminal_missing(mixed: Path) -> None:
    found = mixed_evidence(mixed, "terminal_missing")
    assert found["trial"]["invocation"]["exit_code"] == 0
    assert found["trial"]["validation_error"] == gen.TERMINAL_MISSING_ERROR
    assert "step:" not in found["log"] and found["phases"] == [FULL] * 4
    assert found["sacct"][3:5] == ["FAILED", "2:0"]


def test_mixed_rollout_init_oom(mixed: Path) -> None:
    found = mixed_evidence(mixed, "rollout_init_oom")
    assert found["record"]["gpus"] == 2
    assert found["trial"]["invocation"]["exit_code"] == 1
    assert found["phases"][0] == [
        ("init_model", 0, ""),
        ("rollout_init", 0, "torch.OutOfMemoryError"),
    ]
    assert found["phases"][1] == [("init_model", 0, ""), ("rollout_init", 0, "")]
    assert "torch.OutOfMemoryError: CUDA out of memory" in found["log"]
    assert ["FAILED", "1:0"] in [row[3:5] for row in found["steps"]]


@pytest.mark.parametrize(
    ("outcome", "flag", "controller", "signal", "sacct"),
    [
        ("coordinated_shutdown", "1", 143, None, ["FAILED", "15:0"]),
        ("flag_off_143", "0", 143, None, ["FAILED", "15:0"]),
        ("scancel_sigusr1", "1", 143, "SIGUSR1", ["FAILED", "15:0"]),
        ("sigkill_137", "1", 137, None, ["FAILED", "9:0"]),
    ],
)
def test_mixed_exit_classification_cases(
    mixed: Path,
    outcome: str,
    flag: str,
    controller: int,
    signal: str | None,
    sacct: list[str],
) -> None:
    found = mixed_evidence(mixed, outcome)
    trial = found["trial"]
    assert trial["env"]["COSMOS_SHUTDOWN_ON_NO_POLICY_REPLICAS"] == flag
    assert trial["invocation"]["exit_code"] == controller
    assert trial["invocation"]["received_signal"] == signal
    roles = {process["role"]: process["exit_code"] for process in trial["processes"]}
    assert roles["controller"] == controller
    assert has_terminal(found["log"]) and found["phases"] == [FULL] * 4
    assert ("coordinated shutdown" in found["log"]) is (outcome == "coordinated_shutdown")
    assert found["sacct"][3:5] == sacct
    if outcome == "coordinated_shutdown":
        assert "training/global_step:np.int64(1)" in found["log"]


def test_mixed_cancelled(mixed: Path) -> None:
    found = mixed_evidence(mixed, "cancelled")
    assert found["trial"]["invocation"]["received_signal"] == "SIGTERM"
    assert found["trial"]["invocation"]["exit_code"] == 143
    assert not has_terminal(found["log"]) and found["phases"] == [PARTIAL] * 4
    job = found["record"]["job_id"]
    assert f"slurmstepd: error: *** JOB {job} ON " in found["log"]
    assert "DUE TO TIME LIMIT" not in found["log"]
    assert found["sacct"][3:5] == ["CANCELLED by 1234", "0:15"]
    assert [row[3:5] for row in found["steps"] if row[0].endswith(".batch")] == [
        ["CANCELLED", "0:15"]
    ]


def test_mixed_timed_out(mixed: Path) -> None:
    found = mixed_evidence(mixed, "timed_out")
    invocation = found["trial"]["invocation"]
    assert invocation["exit_code"] == 143 and invocation["received_signal"] is None
    assert found["trial"]["env"]["COSMOS_SHUTDOWN_ON_NO_POLICY_REPLICAS"] == "1"
    assert not has_terminal(found["log"]) and found["phases"] == [PARTIAL] * 4
    job = found["record"]["job_id"]
    assert any(
        line.startswith(f"slurmstepd: error: *** JOB {job} ON ")
        and line.endswith("DUE TO TIME LIMIT ***")
        for line in found["log"].splitlines()
    )
    assert found["sacct"][3:5] == ["TIMEOUT", "0:0"]
    batch = [row for row in found["steps"] if row[0].endswith(".batch")]
    assert [row[3:5] for row in batch] == [["CANCELLED", "0:15"]]


def test_mixed_node_failure(mixed: Path) -> None:
    found = mixed_evidence(mixed, "node_failure")
    assert found["trial"] is None and "idle_check" not in found["record"]
    assert found["phases"] == [PARTIAL] * 4 and not has_terminal(found["log"])
    assert found["sacct"][3:5] == ["NODE_FAIL", "1:0"]


def test_mixed_retried_lists_two_completed_attempts(mixed: Path) -> None:
    record, _ = mixed_attempt(mixed, "retried")
    assert "job_id" not in record and "evidence" not in record
    listed = record["attempts"]
    assert len(listed) == 2 and listed[0]["job_id"] != listed[1]["job_id"]
    trials = [load_json(evidence_of(mixed, attempt, "trial")[0]) for attempt in listed]
    assert [trial["attempt"] for trial in trials] == [1, 2]
    assert all(trial["invocation"]["exit_code"] == 0 for trial in trials)
    assert trials[0]["invocation"]["finished_ns"] < trials[1]["invocation"]["started_ns"]
    for attempt in listed:
        log = evidence_of(mixed, attempt, "training_log")[0].read_text()
        assert "training/global_step:1.000" in log and "step:2 - val-core" in log
        assert [phases(p) for p in evidence_of(mixed, attempt, "allocator_trace")] == [FULL] * 4
        assert outer_rows(mixed)[attempt["job_id"]][3] == "COMPLETED"


def test_mixed_pending_has_only_a_sacct_row(mixed: Path) -> None:
    workload, seed = "code_heavy_tail", 164
    pair = f"host-qwen25-7b-{workload}-c2-s{seed}"
    assert not (mixed / "pairs" / pair).exists()
    assert not list(mixed.glob(f"{pair}-*"))
    pending = [row for row in sacct_rows(mixed) if row[3] == "PENDING"]
    assert pending == [
        [
            "5061000_[12]",
            "5061000",
            "host-capacity",
            "PENDING",
            "0:0",
            "Unknown",
            "Unknown",
            "0",
            "",
            "None assigned",
            "Priority",
        ]
    ]
    assert pair in load_json(mixed / "execution_commits.json")


# --------------------------------------------------------------------------- API and CLI


def test_scale_preset_sizes(tmp_path: Path) -> None:
    root = gen.generate("scale", tmp_path / "s", elements=5, trace_samples=50, log_lines=40)
    assert len(outer_rows(root)) == 5
    records = period_records(root)
    assert len(records) == 10
    some = next(iter(records.values()))
    trace = evidence_of(root, some, "allocator_trace")[0]
    assert sum("sample_ns" in line for line in trace_lines(trace)) == 50
    small = gen.generate("scale", tmp_path / "t", elements=5, trace_samples=50, log_lines=0)
    log_big = evidence_of(root, some, "training_log")[0].read_text().splitlines()
    small_some = period_records(small)[(some["pair"], some["period"])]
    log_small = evidence_of(small, small_some, "training_log")[0].read_text().splitlines()
    assert len(log_big) - len(log_small) == 40


def test_write_study_refuses_a_non_empty_root(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("x")
    with pytest.raises(FileExistsError, match="non-empty"):
        gen.write_study(gen.mixed_spec(), tmp_path)
    assert [path.name for path in tmp_path.iterdir()] == ["keep.txt"]


def test_cli_writes_and_refuses_non_empty_out(tmp_path: Path) -> None:
    out = tmp_path / "out"
    command = [sys.executable, "-m", "fixtures.generate", "mixed", str(out)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert (out / "accounting" / "sacct-raw.psv").is_file()
    again = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
    assert again.returncode == 2 and "non-empty" in again.stderr
    assert shim.main(["example", str(out)]) == 2


def test_protocol_inputs_are_written_and_anchored(tmp_path: Path) -> None:
    spec = gen.mixed_spec()
    spec.protocol_inputs = {"protocol": b"frozen rules\n", "freeze": b"freeze\n"}
    root = gen.write_study(spec, tmp_path / "p")
    anchors = load_json(root / "protocol.json")["anchors"]
    assert anchors == {
        name: hashlib.sha256((root / "protocol-inputs" / name).read_bytes()).hexdigest()
        for name in ("freeze", "protocol")
    }


def test_inconsistent_spec_is_refused(tmp_path: Path) -> None:
    spec = gen.example_spec()
    spec.elements[8].elapsed_s = 60  # the element would end before its periods
    with pytest.raises(ValueError, match="sacct End"):
        gen.write_study(spec, tmp_path / "bad")
    spec = gen.mixed_spec()
    spec.elements[0].periods[0].worker_pids = [1, 1, 2, 3]
    with pytest.raises(ValueError, match="distinct worker pids"):
        gen.write_study(spec, tmp_path / "bad2")


def test_unknown_preset_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown preset"):
        gen.generate("nope", tmp_path / "x")
