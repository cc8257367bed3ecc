"""Exit classification after the fact (seed ``000``), driven through whole audits.

The seed's lesson: predicate tests alone passed with the fix reverted. These
tests build real studies, run the CLI, and assert on verdicts, so deleting the
coordinated-shutdown rule (or loosening it) fails them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from auditor.model import ProcessExit, TrialRecord
from auditor.reason.exits import classify_exit, flag_is_on, is_coordinated_controller_exit
from tests.helpers import (
    audit,
    edit_json,
    edit_record,
    find,
    outcome_study,
    period_records,
    rewrite,
    verdicts,
)

S = "host-qwen25-7b-gsm8k-c2-s{}/period-1"
FLAG = "COSMOS_SHUTDOWN_ON_NO_POLICY_REPLICAS"

OUTCOMES = ["completed", "coordinated_shutdown", "flag_off_143", "scancel_sigusr1",
            "sigkill_137", "cancelled", "timed_out", "node_failure", "rollout_init_oom",
            "terminal_missing", "retried"]
EXPECTED = {
    "completed": ("resolved", "completed"),
    "coordinated_shutdown": ("resolved", "completed"),
    "flag_off_143": ("unresolved", "killed"),
    "scancel_sigusr1": ("unresolved", "time_limit"),
    "sigkill_137": ("unresolved", "killed"),
    "cancelled": ("unresolved", "cancelled"),
    "timed_out": ("unresolved", "time_limit"),
    "node_failure": ("unresolved", "infrastructure_failure"),
    "rollout_init_oom": ("failed", "eligible_failure"),
    "terminal_missing": ("unresolved", "terminal_event_missing"),
    "retried": ("resolved", "completed"),
}


@pytest.fixture(scope="module")
def every_outcome(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    base = tmp_path_factory.mktemp("outcomes")
    root = outcome_study(base / "study", OUTCOMES)
    return root, audit(root, base / "out")


@pytest.mark.parametrize("outcome", OUTCOMES)
def test_every_exit_case_gets_its_verdict(every_outcome: tuple[Path, dict], outcome: str) -> None:
    _, summary = every_outcome
    subject = S.format(161 + OUTCOMES.index(outcome))
    assert verdicts(summary)[subject] == EXPECTED[outcome]


def test_retried_after_completion_is_wasted(every_outcome: tuple[Path, dict]) -> None:
    root, summary = every_outcome
    out = root.parent / "out"
    attempts = pd.read_parquet(out / "attempts.parquet")
    retried = attempts[attempts["subject"] == S.format(161 + OUTCOMES.index("retried"))]
    assert list(retried["counted"]) == [True, False]
    assert list(retried["wasted"]) == [False, True]
    wasted = retried[retried["wasted"]]["task_gpu_seconds"].sum()
    assert summary["accounting"]["wasted_gpu_seconds"] == pytest.approx(wasted)
    assert wasted > 0
    assert "Wasted attempts (retried after a completed attempt): 1" in (
        out / "diagnostic.md").read_text()


def test_the_timeline_plot_draws_the_attempt_a_verdict_rests_on(
        every_outcome: tuple[Path, dict]) -> None:
    """A retried period's timeline draws both attempts: the one its verdict rests on in
    full, the wasted retry faded and labelled not counted."""
    from auditor.pipeline.audit import AuditOptions, run_audit
    from auditor.report.plots import plot_data

    root, _ = every_outcome
    result = run_audit(root, AuditOptions(jobs=1))
    period = next(p for p in result.collected.periods
                  if p.subject == S.format(161 + OUTCOMES.index("retried")))
    counted, wasted = (a.spec.job_id for a in period.attempts)
    rows = [row for row in plot_data(result).timeline if row.label]
    assert any(row.label.startswith(f"{counted} / 1 ") and row.counted for row in rows)
    assert any(row.label.startswith(f"{wasted} / 1 ") and not row.counted
               and "not counted" in row.label for row in rows)


def test_launcher_disagreement_is_reported(every_outcome: tuple[Path, dict]) -> None:
    _, summary = every_outcome
    coordinated = S.format(161 + OUTCOMES.index("coordinated_shutdown"))
    row = next(d for d in summary["disagreements"] if d["subject"] == coordinated)
    assert row["launcher_status"] == "failed" and row["auditor_verdict"] == "resolved"


def _coordinated(tmp_path: Path) -> tuple[Path, str]:
    root = outcome_study(tmp_path / "study", ["coordinated_shutdown"])
    return root, find(root, "*/attempt-*/trial-*.json")


@pytest.mark.parametrize(("value", "clean"), [
    ("1", True), ("true", True), ("TRUE", True), ("yes", True), ("Yes", True),
    ("0", False), ("false", False), ("", False), ("no", False), ("2", False), (None, False),
    # (the launcher's own truthiness strips nothing: " 1" leaves the shutdown off there)
    (" 1", False), ("1 ", False), ('"1"', False),
])
def test_flag_truthiness(tmp_path: Path, value: str | None, clean: bool) -> None:
    root, trial = _coordinated(tmp_path)

    def set_flag(doc: dict) -> None:
        if value is None:
            doc["env"].pop(FLAG)
        else:
            doc["env"][FLAG] = value

    edit_json(root, trial, set_flag)
    summary = audit(root, tmp_path / "out")
    expected = ("resolved", "completed") if clean else ("unresolved", "killed")
    assert verdicts(summary)[S.format(161)] == expected


@pytest.mark.parametrize(("signal", "reason"), [("SIGTERM", "cancelled"),
                                                ("SIGUSR1", "time_limit")])
def test_a_signalled_script_is_never_a_success(tmp_path: Path, signal: str, reason: str) -> None:
    root, trial = _coordinated(tmp_path)

    def signalled(doc: dict) -> None:
        doc["invocation"]["received_signal"] = signal

    edit_json(root, trial, signalled)
    summary = audit(root, tmp_path / "out")
    assert verdicts(summary)[S.format(161)] == ("unresolved", reason)


def _with_records(root: Path, trial: str, others: list[dict]) -> None:
    """The attempt's controller's own process record (its 143, a second before the command
    returned) and ``others`` (each ending two seconds before it), listed in its period
    record as process records."""
    doc = json.loads((root / trial).read_text())
    attempt = trial.rsplit("/", 1)[0]
    started, finished = doc["invocation"]["started_ns"], doc["invocation"]["finished_ns"]
    controller = {"role": "controller", "host": "gpu-node-10", "pid": doc["processes"][0]["pid"],
                  "rank": None, "started_ns": started, "ended_ns": finished - 10**9,
                  "exit_code": 143, "signal": "SIGTERM", "received_signal": None}
    records = [controller, *({"host": "gpu-node-10", "rank": None, "started_ns": started,
                              "ended_ns": finished - 2 * 10**9, "signal": None,
                              "received_signal": None, **other} for other in others)]
    entries = []
    for record in records:
        rel = f"processes/{record['host']}-{record['role']}-{record['pid']}.json"
        data = json.dumps(record).encode()
        (root / attempt / rel).parent.mkdir(exist_ok=True)
        (root / attempt / rel).write_bytes(data)
        entries.append({"path": rel, "kind": "process_record", "size": len(data),
                        "sha256": hashlib.sha256(data).hexdigest()})
    (record_path,) = period_records(root)
    edit_record(record_path, lambda period: period["evidence"].extend(entries))


@pytest.mark.parametrize(("role", "code", "expected"), [
    # (a process record in the launcher's role is a process: its failure before the
    # controller's end is what the controller's 143 may be the knock-on of)
    ("launcher", 1, ("unresolved", "unclean_exit")),
    ("launcher", 137, ("unresolved", "killed")),
    ("rank", 137, ("unresolved", "killed")),
    ("launcher", 0, ("resolved", "completed")),
    # (a record that says no exit may be the failure the shutdown followed: never excused)
    ("policy", None, ("unresolved", "killed")),
])
def test_a_process_record_in_any_role_may_take_the_excuse_away(
        tmp_path: Path, role: str, code: int | None, expected: tuple[str, str]) -> None:
    root, trial = _coordinated(tmp_path)
    _with_records(root, trial, [{"role": role, "pid": 4242, "exit_code": code}])
    assert verdicts(audit(root, tmp_path / "out"))[S.format(161)] == expected


def test_only_the_controller_may_exit_143(tmp_path: Path) -> None:
    root, trial = _coordinated(tmp_path)

    def policy_exits(doc: dict) -> None:
        for process in doc["processes"]:
            process["role"] = "policy" if process["role"] == "controller" else process["role"]

    edit_json(root, trial, policy_exits)
    summary = audit(root, tmp_path / "out")
    assert verdicts(summary)[S.format(161)] == ("unresolved", "killed")


@pytest.mark.parametrize(("where", "expected"), [
    ("before the shutdown", ("unresolved", "killed")),
    # (the controller announced its shutdown, but has not exited: the policy's 143 may be
    # what took its replicas away, as the launcher reports it late: never excused)
    ("after the shutdown line", ("unresolved", "killed")),
    # (after the controller's own exit, as its monitor saw it: the launcher reaping its
    # peers, which seed 000's template does on every path)
    ("after the controller's exit", ("resolved", "completed")),
])
def test_a_launchers_line_naming_the_policys_143_before_the_controllers_exit(
        tmp_path: Path, where: str, expected: tuple[str, str]) -> None:
    """Contract v1.2: a 143 that a launcher's own line (``policy exited with code 143``)
    attributes to another process is never excused, wherever the controller's shutdown
    announcement falls; the kit's own check reads the same lines."""
    root, _ = _coordinated(tmp_path)
    log = find(root, "*-s161-4gpu/attempt-*/training-*.log")
    said = b"[launcher] policy exited with code 143\n"

    def insert(data: bytes) -> bytes:
        lines = data.splitlines(keepends=True)
        shutdown = next(i for i, line in enumerate(lines) if b"coordinated shutdown" in line)
        loop = next(i for i, line in enumerate(lines) if b"Main loop exited" in line)
        at = {"before the shutdown": shutdown, "after the shutdown line": shutdown + 1,
              "after the controller's exit": loop + 1}[where]
        return b"".join([*lines[:at], said, *lines[at:]])
    rewrite(root, log, insert)
    assert verdicts(audit(root, tmp_path / "out"))[S.format(161)] == expected


@pytest.mark.parametrize("said", [
    b"[launcher] policy exited with return code 143",
    b"[launcher] policy terminated with exit code 143",
    b"[launcher] policy exited, rc=143",
    b"[launcher] policy exited with non-zero status 143",
])
def test_other_wordings_of_the_launchers_line_take_the_excuse_away(tmp_path: Path,
                                                                   said: bytes) -> None:
    """The contract's ``policy exited with code 143`` is one wording ("such as"): the others
    launchers print say the same, and the 143 stays unexcused."""
    root = _said_before_the_shutdown(tmp_path, said)
    assert verdicts(audit(root, tmp_path / "out"))[S.format(161)] == ("unresolved", "killed")


def _said_before_the_shutdown(tmp_path: Path, said: bytes) -> Path:
    """The coordinated study, its excused period's log given ``said`` just before the
    controller's shutdown line."""
    root, _ = _coordinated(tmp_path)
    log = find(root, "*-s161-4gpu/attempt-*/training-*.log")

    def insert(data: bytes) -> bytes:
        lines = data.splitlines(keepends=True)
        shutdown = next(i for i, line in enumerate(lines) if b"coordinated shutdown" in line)
        return b"".join([*lines[:shutdown], said + b"\n", *lines[shutdown:]])
    rewrite(root, log, insert)
    return root


@pytest.mark.parametrize(("said", "expected"), [
    (b"[launcher] rollout replica 1 exited with status 1", ("unclean_exit", "child_failed")),
    (b"[launcher] rollout replica 1 exited with status 137", ("killed", "signal")),
    (b"[launcher] rollout replica 1 exited with code -9", ("killed", "signal")),  # (Python's)
])
def test_the_launchers_line_ends_the_shutdown_as_the_failure_it_names(
        tmp_path: Path, said: bytes, expected: tuple[str, str]) -> None:
    """Contract v1.2 (as a process record says it): a shutdown another process's failure
    caused ends as that failure did, a crash ``unclean_exit`` caused by the failed child,
    a kill ``killed``; the controller's 143 is its knock-on."""
    audit(_said_before_the_shutdown(tmp_path, said), tmp_path / "out")
    (period,) = [p for p in pq.read_table(tmp_path / "out" / "periods.parquet").to_pylist()
                 if p["subject"] == S.format(161)]
    assert (period["verdict"], period["reason"], period["cause"]) == ("unresolved", *expected)
    assert "the launcher's log says rollout exited with code" in period["cause_detail"]


def test_wall_clock_timeout_overrides_an_excused_143(tmp_path: Path) -> None:
    root, _ = _coordinated(tmp_path)
    rewrite(root, "accounting/sacct-raw.psv",
            lambda b: b.replace(b"|FAILED|15:0|", b"|TIMEOUT|0:0|", 1), update_manifest=False)
    summary = audit(root, tmp_path / "out")
    assert verdicts(summary)[S.format(161)] == ("unresolved", "time_limit")


@pytest.mark.parametrize(("state", "reason", "rule"), [
    ("CANCELLED by 1977600432", "cancelled", "AUD206"),
    ("NODE_FAIL", "infrastructure_failure", "AUD208"),
])
def test_scheduler_states_on_an_unclean_exit(tmp_path: Path, state: str, reason: str,
                                             rule: str) -> None:
    root = outcome_study(tmp_path / "study", ["sigkill_137"])
    rewrite(root, "accounting/sacct-raw.psv",
            lambda b: b.replace(b"|FAILED|9:0|", f"|{state}|0:9|".encode(), 1),
            update_manifest=False)
    summary = audit(root, tmp_path / "out")
    period = summary["periods"][0]
    assert (period["verdict"], period["reason"]) == ("unresolved", reason)
    assert rule in period["rule_ids"]


def test_out_of_memory_on_a_step_row_only(tmp_path: Path) -> None:
    root = outcome_study(tmp_path / "study", ["sigkill_137"])

    def step_oom(data: bytes) -> bytes:
        lines = data.decode().splitlines(keepends=True)
        lines = [line.replace("|FAILED|9:0|", "|OUT_OF_MEMORY|0:125|")
                 if line.split("|")[0].endswith(".0") else line for line in lines]
        return "".join(lines).encode()

    rewrite(root, "accounting/sacct-raw.psv", step_oom, update_manifest=False)
    summary = audit(root, tmp_path / "out")
    period = summary["periods"][0]
    assert (period["verdict"], period["reason"]) == ("unresolved", "infrastructure_failure")
    assert "AUD209" in period["rule_ids"]
    # the step's own row is cited, with what it says (the job's row says FAILED)
    dump = (root / "accounting/sacct-raw.psv").read_text().splitlines()
    step_line = next(n for n, line in enumerate(dump, 1) if "|OUT_OF_MEMORY|" in line)
    rows = pd.read_parquet(tmp_path / "out" / "periods.parquet")
    assert rows["cause_detail"][0] == "sacct reports OUT_OF_MEMORY for step 0 of job 7000000_0"
    findings = pd.read_parquet(tmp_path / "out" / "findings.parquet")
    oom = findings[findings["rule_id"] == "AUD209"]
    assert oom["line"].tolist() == [step_line] and "OUT_OF_MEMORY" in oom["message"].iloc[0]


def test_pending_element_makes_the_array_partial(tmp_path: Path) -> None:
    root = outcome_study(tmp_path / "study", ["completed"])
    rewrite(root, "accounting/sacct-raw.psv",
            lambda b: b + b"7000000_[1-3%2]|7000000|host-capacity|PENDING|0:0|Unknown|Unknown|"
                          b"0||None assigned|(JobArrayTaskLimit)\n", update_manifest=False)
    record = root / "pairs" / "host-qwen25-7b-gsm8k-c2-s161" / "period-1.json"
    assert record.exists()
    summary = audit(root, tmp_path / "out")
    findings = pd.read_parquet(tmp_path / "out" / "findings.parquet")
    assert "AUD210" in set(findings["rule_id"])
    assert summary["periods"][0]["verdict"] == "resolved"


@pytest.mark.parametrize("state", [
    "RUNNING",
    # (flags sacct shows in a base state's place: the job is between states, not ended)
    "STOPPED", "SIGNALING", "SPECIAL_EXIT", "RESV_DEL_HOLD", "STAGE_OUT", "POWER_UP_NODE",
    "REVOKED", "UPDATE_DB",
])
def test_running_element_is_never_passed(tmp_path: Path, state: str) -> None:
    root = outcome_study(tmp_path / "study", ["completed"])
    rewrite(root, "accounting/sacct-raw.psv",
            lambda b: b.replace(b"|COMPLETED|0:0|", f"|{state}|0:0|".encode(), 1),
            update_manifest=False)
    summary = audit(root, tmp_path / "out")
    assert (summary["periods"][0]["verdict"], summary["periods"][0]["reason"]) == (
        "unresolved", "array_partial")
    assert summary["gate"]["passed"] is False


# the predicate itself, both directions (kept next to the end-to-end cases above)

def _trial(code: int, role: str = "controller", flag: str | None = "1",
           received: str | None = None) -> TrialRecord:
    env = () if flag is None else ((FLAG, flag),)
    return TrialRecord(path="t.json", env=env, exit_code=code, received_signal=received,
                       processes=(ProcessExit(role, 1, code, "/processes/0"),))


def test_predicate_both_directions() -> None:
    assert is_coordinated_controller_exit("controller", 143, "yes", None)
    assert not is_coordinated_controller_exit("controller", 143, "0", None)
    assert not is_coordinated_controller_exit("controller", 137, "1", None)
    assert not is_coordinated_controller_exit("policy", 143, "1", None)
    assert not is_coordinated_controller_exit("controller", 143, "1", "SIGTERM")
    assert flag_is_on("True") and not flag_is_on("off")
    assert not flag_is_on(" 1") and not flag_is_on("1 ") and not flag_is_on('"1"')
    assert classify_exit(_trial(143), FLAG).kind == "coordinated_shutdown"
    assert classify_exit(_trial(143, flag="0"), FLAG).kind == "sigterm"
    assert classify_exit(_trial(137), FLAG).kind == "sigkill"
    assert classify_exit(_trial(143, received="SIGUSR1"), FLAG).kind == "signalled"
    assert classify_exit(_trial(1), FLAG).kind == "failure"
    assert classify_exit(_trial(0), FLAG).clean


def test_a_controllers_143_under_an_exit_0_says_why_it_is_not_excused() -> None:
    """The kit's path (its wrapper exits 0 for an excused shutdown): a controller record's
    143 that is not excused says why, as the v1 form does (the flag off by name and value;
    the wrapper's signal), and an excused one says no signal was received."""
    controller = ProcessExit("controller", 7, 143, "", path="processes/n1-controller-7.json",
                             host="n1")
    trial = TrialRecord(path="t.json", env=((FLAG, "0"),), exit_code=0)
    said = classify_exit(trial, FLAG, (controller,))
    assert said.kind == "process_failure"
    assert said.detail.endswith(f"exited 143: {FLAG} is off (`0`)"), said.detail
    signalled = replace(controller, received_signal="SIGTERM")
    said = classify_exit(replace(trial, env=((FLAG, "1"),)), FLAG, (signalled,))
    assert said.detail.endswith("exited 143: the controller's wrapper received SIGTERM")
    said = classify_exit(replace(trial, env=((FLAG, "1"),)), FLAG, (controller,))
    assert said.clean and said.detail.endswith("and no signal was received")


@pytest.mark.parametrize(("bad", "rule"), [(b"this is not json {", "AUD003")])
def test_a_trace_line_that_is_not_json_leaves_the_records_before_it_counting(
        tmp_path: Path, bad: bytes, rule: str) -> None:
    """The contract: a line that is not JSON is a finding naming the file and line; the
    records before it still count. An out-of-memory record followed by a broken line is
    still the eligible failure it records (the period was made unresolved); a trace with
    no record left is unusable. (A record of the wrong shape still voids its trace: its
    values may be kept out of range, and a pid of 1e30 once counted as a completion.)"""
    import glob

    root = outcome_study(tmp_path / "study", ["rollout_init_oom", "rollout_init_oom"])
    traces = [Path(path) for path in glob.glob(str(root / "*/attempt-*/allocator-traces/*"))]
    [oom] = [path for path in traces if b"OutOfMemoryError" in path.read_bytes()
             and "s161" in str(path)]
    rel = oom.relative_to(root).as_posix()
    rewrite(root, rel, lambda b: b + bad + b"\n")
    lines = (root / rel).read_bytes().count(b"\n")
    [garbage] = [path for path in traces if b"OutOfMemoryError" not in path.read_bytes()
                 and "s162" in str(path)]
    rewrite(root, garbage.relative_to(root).as_posix(), lambda b: b"\x00\xff garbage\n" * 3)
    summary = audit(root, tmp_path / "out")
    assert verdicts(summary)[S.format(161)] == ("failed", "eligible_failure")
    assert verdicts(summary)[S.format(162)] == ("unresolved", "evidence_invalid")
    findings = pd.read_parquet(tmp_path / "out" / "findings.parquet")
    broken = findings[(findings["rule_id"] == rule) & (findings["path"] == rel)]
    assert list(broken["line"]) == [lines]


@pytest.mark.parametrize("field", ["pid", "finished_ns"])
def test_a_trace_record_of_the_wrong_shape_never_counts_as_a_completion(
        tmp_path: Path, field: str) -> None:
    """A completed period whose rank-0 trace holds a value out of range (1e30): the record
    is AUD002 and the period cannot resolve on it."""
    import glob
    import json

    root = outcome_study(tmp_path / "study", ["completed"])
    trace = sorted(glob.glob(str(root / "*/attempt-*/allocator-traces/*.jsonl")))[0]

    def out_of_range(data: bytes) -> bytes:
        records = [json.loads(line) for line in data.splitlines()]
        for record in records:
            if field == "pid" or record.get("phase") == "actor_update":
                record[field] = 10**30
        return b"".join(json.dumps(record).encode() + b"\n" for record in records)

    rewrite(root, Path(trace).relative_to(root).as_posix(), out_of_range)
    summary = audit(root, tmp_path / "out")
    assert verdicts(summary)[S.format(161)] == ("unresolved", "evidence_invalid")


NCCL_LINE = (b"(TaskRunner pid=3443269) torch.distributed.DistBackendError: NCCL error in: "
             b"../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled system error "
             b"(run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5\n")


def test_an_nccl_error_before_an_unclean_exit_is_an_infrastructure_failure(
        tmp_path: Path) -> None:
    """The contract lists an NCCL error among the infrastructure failures: an attempt that
    failed (exit 1) after one is 'infrastructure_failure', not a bare 'unclean_exit'. Not
    when a memory failure came first (the peers' NCCL errors are its knock-on), nor for a
    completed run that prints one in its teardown."""
    import glob

    root = outcome_study(tmp_path / "study", ["rollout_init_oom", "completed",
                                              "rollout_init_oom"])
    for seed in (161, 163):  # (the error no longer an eligible one)
        [trace] = [path for path in glob.glob(str(root / f"*s{seed}-*/attempt-*/allocator-"
                                                         "traces/*.jsonl"))
                   if b"OutOfMemoryError" in Path(path).read_bytes()]
        rewrite(root, Path(trace).relative_to(root).as_posix(),
                lambda b: b.replace(b"torch.OutOfMemoryError",
                                    b"torch.distributed.DistBackendError"))
    before = audit(root, tmp_path / "before")
    assert verdicts(before)[S.format(161)] == ("unresolved", "unclean_exit")
    for seed in (161, 162, 163):
        log = find(root, f"host-qwen25-7b-gsm8k-c2-s{seed}-*gpu/attempt-*/training-*.log")
        if seed == 161:  # (only the NCCL error: no out-of-memory line before it)
            rewrite(root, log, lambda b: b"".join(
                line for line in b.splitlines(keepends=True) if b"OutOfMemory" not in line))
        rewrite(root, log, lambda b: b + NCCL_LINE)
    summary = audit(root, tmp_path / "out")
    assert verdicts(summary)[S.format(161)] == ("unresolved", "infrastructure_failure")
    assert verdicts(summary)[S.format(162)] == ("resolved", "completed")
    assert verdicts(summary)[S.format(163)] == ("unresolved", "unclean_exit")
    findings = pd.read_parquet(tmp_path / "out" / "findings.parquet")
    said = findings[(findings["rule_id"] == "AUD209") & (findings["subject"] == S.format(161))]
    assert said["message"].iloc[0].startswith(f"{S.format(161)}: NCCL error (log line ")
    text = (tmp_path / "out" / "diagnostic.md").read_text()
    assert "The training log shows an NCCL communication failure at line " in text


def test_exit_255_is_an_unclean_exit_not_a_signal() -> None:
    """A batch script's ``exit 255`` (sacct prints ``127:0``) is no signal: none has number
    127. It is an unclean exit; 137 is SIGKILL, 143 SIGTERM."""
    from auditor.model import TrialRecord
    from auditor.reason.exits import classify_exit

    def kind(code: int) -> str:
        trial = TrialRecord(path="trial-1.json", exit_code=code)
        return classify_exit(trial, "COSMOS_SHUTDOWN_ON_NO_POLICY_REPLICAS").kind

    assert kind(255) == "failure" and kind(137) == "sigkill" and kind(143) == "sigterm"
    assert kind(134) == "killed"  # SIGABRT


def test_a_steps_output_without_its_record_is_a_process_of_unknown_end() -> None:
    """Only a ``--step``'s own name (``<host>-<role>-<pid>``, a role with a letter, a host
    the attempt names) stands for a process: the logs the kit copies from Ray and torchrun
    (``<host>-<pid>``, ``<host>-rank<r>``) never do, nor one whose record is there."""
    from auditor.reason.exits import unrecorded_steps

    recorded = ProcessExit("controller", 7, 143, "", path="a/processes/vm-controller-7.json",
                           host="vm")
    logs = ["a/worker-logs/vm-policy-9.out", "a/worker-logs/vm-policy-9.err",
            "a/worker-logs/vm-controller-7.out", "a/worker-logs/vm-12345.out",
            "a/worker-logs/gpu-node-17-4711.out", "a/worker-logs/vm-rank0.out",
            "a/worker-logs/other-host-policy-3.out"]
    (found,) = unrecorded_steps([recorded], logs, {"vm"})
    assert (found.role, found.pid, found.host, found.exit_code) == ("policy", 9, "vm", None)
    trial = TrialRecord(path="t.json", env=((FLAG, "1"),), exit_code=0)
    said = classify_exit(trial, FLAG, (recorded, found))
    assert not said.clean and "left no process record, only its output" in said.detail


def test_a_step_lost_with_a_node_nothing_else_names_is_weighed_where_the_run_says_what_it_kept(
        ) -> None:
    """A replica lost with its node (its wrapper gone: no record), on a node no trace,
    device file or record names (a CPU-only replica), leaves only its output: where the
    trial record says which worker logs the run kept itself (``worker_logs.kept``), every
    other log of a step's name is a step's, whatever its host, so the controller's 143 is
    not excused; a kept log that reads as one (``della-l01g3-4242.out``) never is, and
    without the list a host the attempt never names still stands for nothing."""
    from auditor.reason.exits import unrecorded_steps

    controller = ProcessExit("controller", 7, 143, "", path="a/processes/n1-controller-7.json",
                             host="n1")
    trial = TrialRecord(path="t.json", env=((FLAG, "1"),), exit_code=0)
    lost, ray = "a/worker-logs/n9-rollout-31.out", "a/worker-logs/della-l01g3-4242.out"
    (found,) = unrecorded_steps([controller], [lost, ray], {"n1"}, None,
                                kept=("worker-logs/della-l01g3-4242.out",))
    assert (found.role, found.pid, found.host, found.path) == ("rollout", 31, "n9", lost)
    said = classify_exit(trial, FLAG, (controller, found))
    assert not said.clean and "rollout process (pid 31 on n9) left no process record" \
        in said.detail
    assert unrecorded_steps([controller], [ray], {"n1"}, None,
                            kept=("worker-logs/della-l01g3-4242.out",)) == ()
    assert unrecorded_steps([controller], [lost, ray], {"n1"}) == ()  # (the run said nothing)


def test_a_step_slurm_cancelled_after_the_controllers_end_was_reaped() -> None:
    """On a real multi-node Slurm the launcher's reaping of a replica after the controller's
    exit is srun's cancellation of its step, which SIGKILLs its wrapper at once: no record,
    but the batch log's ``*** STEP 2.1 ON n3 CANCELLED AT ... ***`` line comes after the
    controller's wrapper's own line. After it: reaped, the shutdown stays excused; before
    it, or with no such line: never excused. The log's order decides, never the time the
    line states: slurmstepd prints its local time in whole seconds, so a reaping within the
    controller's last second, or any on a site at UTC-5, read as before its end (the
    finished run refused, seed 000's bug), and at UTC+1 a replica cancelled before the
    controller's end read as after it (excused)."""
    from datetime import UTC, datetime

    from auditor.model.lines import CONTROLLER_ENDED
    from auditor.reason.exits import steps_cancelled, unrecorded_steps

    end = int(datetime(2026, 12, 7, 9, 11, 47, tzinfo=UTC).timestamp()) * 10**9 + 600_000_000
    controller = ProcessExit("controller", 7, 143, "", path="a/processes/n1-controller-7.json",
                             host="n1", ended_ns=end)
    trial = TrialRecord(path="t.json", env=((FLAG, "1"),), exit_code=0)
    ended = f"{CONTROLLER_ENDED} 143; coordinated_shutdown: exit 143 is a coordinated shutdown"

    def cancel(at: str) -> str:
        return f"slurmstepd-n3: error: *** STEP 2.1 ON n3 CANCELLED AT 2026-12-07T{at} ***"

    for lines, excused in (([ended, cancel("09:11:47")], True),  # (its last second)
                           ([ended, cancel("04:11:48")], True),  # (local time at UTC-5)
                           ([cancel("10:11:40"), ended], False),  # (at UTC+1, before it)
                           ([cancel("09:11:48")], False)):  # (no line of the controller's)
        (rollout,) = unrecorded_steps([controller], ["a/worker-logs/n3-rollout-9.out"],
                                      {"n1", "n3"}, steps_cancelled(lines))
        assert classify_exit(trial, FLAG, (controller, rollout)).clean is excused, lines
    (vanished,) = unrecorded_steps([controller], ["a/worker-logs/n3-rollout-9.out"], {"n3"})
    assert not classify_exit(trial, FLAG, (controller, vanished)).clean


def test_a_step_cancelled_before_the_controllers_end_is_not_reaped_by_its_nodes_later_one(
        ) -> None:
    """A worker log names its node, never its step: two steps on ``n3`` without records,
    one cancelled before the controller's end (lost), the other reaped after it. The node's
    last line decided, so the lost one read as reaped too and the 143 was excused; a node
    is reaped only where every line of it comes after the controller's."""
    from auditor.model.lines import CONTROLLER_ENDED
    from auditor.reason.exits import steps_cancelled, unrecorded_steps

    controller = ProcessExit("controller", 7, 143, "", path="a/processes/n1-controller-7.json",
                             host="n1", ended_ns=10**18)
    trial = TrialRecord(path="t.json", env=((FLAG, "1"),), exit_code=0)
    lines = ["slurmstepd: error: *** STEP 2.1 ON n3 CANCELLED AT 2026-12-07T09:11:40 ***",
             f"{CONTROLLER_ENDED} 143; coordinated_shutdown: exit 143 is a coordinated shutdown",
             "slurmstepd: error: *** STEP 2.2 ON n3 CANCELLED AT 2026-12-07T09:11:48 ***"]
    assert steps_cancelled(lines) == {"n3": False}
    steps = unrecorded_steps([controller], ["a/worker-logs/n3-policy-8.out",
                                            "a/worker-logs/n3-rollout-9.out"],
                             {"n1", "n3"}, steps_cancelled(lines), kept=())
    assert not classify_exit(trial, FLAG, (controller, *steps)).clean
    assert steps_cancelled(lines[1:]) == {"n3": True}  # (every line after it: reaped)


def test_only_a_steps_own_cancellation_is_its_reaping() -> None:
    """The kit reads every ``CANCELLED AT`` line of its log and the audit its scan's: both
    take a step's plain cancellation (and Slurm 25.05's ``DUE to SIGNAL Killed``) as a
    reaping after the controller's line, never a ``JOB`` line nor a step ended ``DUE TO``
    a node failure, a time limit or the like (the kit excused a replica whose node failed
    after the controller's line; the audit refused it)."""
    from auditor.model.lines import CONTROLLER_ENDED
    from auditor.reason.exits import steps_cancelled

    ended = f"{CONTROLLER_ENDED} 143; coordinated_shutdown: exit 143 is a coordinated shutdown"
    at = "CANCELLED AT 2026-12-07T09:11:48"
    for line, reaped in ((f"slurmstepd: error: *** STEP 2.1 ON n3 {at} ***", True),
                         (f"slurmstepd: error: *** STEP 2.1 ON n3 {at} DUE to SIGNAL Killed ***",
                          True),
                         (f"slurmstepd: error: *** STEP 2.1 ON n3 {at} DUE TO NODE FAILURE, SEE "
                          "SLURMCTLD LOG FOR DETAILS ***", False),
                         (f"slurmstepd: error: *** STEP 2.1 ON n3 {at} DUE TO TIME LIMIT ***",
                          False),
                         (f"slurmstepd: error: *** JOB 2 ON n3 {at} ***", False)):
        assert steps_cancelled([ended, line]).get("n3", False) is reaped, line


def test_only_this_attempts_controller_line_marks_its_end() -> None:
    """The wrapper's line names its controller's process record; a copy of an earlier
    attempt's (a launcher printing that attempt's log) names another and marks nothing."""
    from auditor.model.lines import CONTROLLER_ENDED
    from auditor.reason.exits import steps_cancelled

    def ended(record: str) -> str:
        return (f"{CONTROLLER_ENDED} with 143; coordinated_shutdown: ...; exit 0; process "
                f"record /s/p-2gpu/attempt-9/processes/{record}")

    cancel = "slurmstepd: error: *** STEP 9.2 ON n3 CANCELLED AT 2026-12-07T09:11:48 ***"
    lines = [ended("n1-controller-4242.json"), cancel, ended("n1-controller-7.json")]
    assert steps_cancelled(lines, {"n1-controller-7.json"}) == {"n3": False}
    assert steps_cancelled(lines[1:] + [cancel], {"n1-controller-7.json"}) == {"n3": False}
    assert steps_cancelled([lines[2], cancel], {"n1-controller-7.json"}) == {"n3": True}
    assert steps_cancelled(lines) == {"n3": True}  # (no records known: any such line)


def test_a_kill_on_another_node_just_after_the_controllers_end_is_not_its_reaping() -> None:
    """Two nodes' clocks may disagree: a replica on another node SIGKILLed by no signal of
    its wrapper's (not the launcher's stopping of it) whose record ends seconds after the
    controller's may have died before it (its node's clock ahead: review R, a replica
    killed at the start passed for the shutdown's knock-on, the period resolved). It is
    excused as reaped only more than a minute after, or when its wrapper received the
    launcher's signal, or on the controller's own node (one clock)."""
    end = 1_800_000_000 * 10**9
    controller = ProcessExit("controller", 7, 143, "", path="a/processes/n1-controller-7.json",
                             host="n1", ended_ns=end)
    trial = TrialRecord(path="t.json", env=((FLAG, "1"),), exit_code=0)

    def excused(host: str, after_s: float, received: str | None) -> bool:
        rollout = ProcessExit("rollout", 9, 137, "", path=f"a/processes/{host}-rollout-9.json",
                              host=host, signal="SIGKILL", received_signal=received,
                              ended_ns=end + int(after_s * 10**9))
        return classify_exit(trial, FLAG, (controller, rollout)).clean

    assert not excused("n2", 3, None)
    assert not excused("n2", 59, None)
    assert excused("n2", 61, None)
    assert excused("n2", 3, "SIGTERM")
    assert excused("n1", 3, None)


@pytest.mark.parametrize(("after_s", "expected"), [
    # (a node's clock minutes ahead: its record ends after the invocation did, past the
    # minute two nodes' clocks may disagree by: AUD116)
    (180, ("unresolved", "timeline_inconsistent")),
    # (seconds ahead, inside the invocation: a kill no wrapper passed on, on another node,
    # within a minute of the controller's end may have come before it: never excused)
    (0.5, ("unresolved", "killed")),
])
def test_a_replica_killed_on_a_node_whose_clock_runs_ahead(
        tmp_path: Path, after_s: float, expected: tuple[str, str]) -> None:
    """Review R: a rollout SIGKILLed at its start on a node whose clock ran three minutes
    ahead looked reaped after the controller's end (the period resolved, the gate passed);
    its record ended after the invocation had, and nothing said so."""
    root, trial = _coordinated(tmp_path)
    doc = json.loads((root / trial).read_text())
    late = doc["invocation"]["finished_ns"] - 10**9 + int(after_s * 10**9)
    _with_records(root, trial, [])
    attempt = root / trial.rsplit("/", 1)[0]
    data = json.dumps({"role": "rollout", "host": "gpu-node-11", "pid": 9, "rank": 0,
                       "started_ns": late - 10**8, "ended_ns": late, "exit_code": 137,
                       "signal": "SIGKILL", "received_signal": None}).encode()
    (attempt / "processes" / "gpu-node-11-rollout-9.json").write_bytes(data)
    (record_path,) = period_records(root)
    edit_record(record_path, lambda period: period["evidence"].append({
        "path": "processes/gpu-node-11-rollout-9.json", "kind": "process_record",
        "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}))
    summary = audit(root, tmp_path / "out")
    assert verdicts(summary)[S.format(161)] == expected
    rules = next(p["rule_ids"] for p in summary["periods"] if p["seed"] == 161)
    assert ("AUD116" in rules) is (after_s > 1)


def test_a_step_without_its_record_is_never_dropped_without_a_controller() -> None:
    """Review R: a node died after its ranks' steps (their wrappers killed: no records),
    in an attempt with no controller; the unrecorded steps were weighed only in seed 000's
    coordinated case, and the attempt resolved with no finding. Their end is unknown: the
    exit is not clean, and says which. A record that says no exit is weighed alike; every
    record exiting 0 stays clean."""
    from auditor.reason.exits import unrecorded_steps

    ranks = [ProcessExit("rank", pid, 0, "", path=f"a/processes/n1-rank-{pid}.json",
                         host="n1") for pid in (11, 12)]
    trial = TrialRecord(path="t.json", exit_code=0)
    assert classify_exit(trial, FLAG, ranks).clean
    (lost,) = unrecorded_steps(ranks, ["a/worker-logs/n2-rank-13.out"], {"n1", "n2"})
    said = classify_exit(trial, FLAG, (*ranks, lost))
    assert not said.clean and said.kind == "process_failure"
    assert "rank process (pid 13 on n2) left no process record" in said.detail
    silent = ProcessExit("rank", 14, None, "", path="a/processes/n2-rank-14.json", host="n2")
    assert not classify_exit(trial, FLAG, (*ranks, silent)).clean


def test_a_reaped_replica_ending_just_after_the_batch_is_no_timeline_problem(
        tmp_path: Path) -> None:
    """Review U: a replica the launcher reaped (its wrapper received SIGTERM) whose record
    on another node ends 50 ms after the batch's invocation (that node's clock a little
    ahead, or a step outliving the batch by KillWait) was AUD116, the healthy period
    unresolved; a node's clock may disagree by a minute."""
    root, trial = _coordinated(tmp_path)
    doc = json.loads((root / trial).read_text())
    _with_records(root, trial, [])
    attempt = root / trial.rsplit("/", 1)[0]
    late = doc["invocation"]["finished_ns"] + 5 * 10**7
    data = json.dumps({"role": "policy", "host": "gpu-node-11", "pid": 9, "rank": 0,
                       "started_ns": doc["invocation"]["started_ns"], "ended_ns": late,
                       "exit_code": 143, "signal": None,
                       "received_signal": "SIGTERM"}).encode()
    (attempt / "processes" / "gpu-node-11-policy-9.json").write_bytes(data)
    (record_path,) = period_records(root)
    edit_record(record_path, lambda period: period["evidence"].append({
        "path": "processes/gpu-node-11-policy-9.json", "kind": "process_record",
        "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}))
    assert verdicts(audit(root, tmp_path / "out"))[S.format(161)] == ("resolved", "completed")


@pytest.mark.parametrize(("hosts", "expected"), [
    # (two nodes, two clocks: a rank's last record 50 ms after the batch's end is skew)
    (2, ("resolved", "completed")),
    # (one node, one clock: after the invocation it ran is no record of it)
    (1, ("unresolved", "timeline_inconsistent")),
])
def test_a_trace_on_another_nodes_clock_has_the_same_minute(
        tmp_path: Path, hosts: int, expected: tuple[str, str]) -> None:
    """Review V: the minute two nodes' clocks may disagree by was given to process records
    only; a rank's trace on another node whose last record ends 50 ms after the batch's
    invocation made a healthy multi-node period timeline_inconsistent. On one node the
    check stays exact."""
    root, trial = _coordinated(tmp_path)
    doc = json.loads((root / trial).read_text())
    attempt = trial.rsplit("/", 1)[0]
    traces = sorted((root / attempt / "allocator-traces").iterdir())
    lines = traces[-1].read_text().splitlines()
    last = max(i for i, line in enumerate(lines) if '"phase"' in line)
    record = json.loads(lines[last])
    record["finished_ns"] = doc["invocation"]["finished_ns"] + 5 * 10**7
    lines[last] = json.dumps(record)
    rewrite(root, traces[-1].relative_to(root).as_posix(),
            lambda _: ("\n".join(lines) + "\n").encode())
    if hosts == 2:
        device = sorted((root / attempt / "device-evidence").iterdir())[-1]
        edit_json(root, device.relative_to(root).as_posix(),
                  lambda document: document.update(hostname="gpu-node-11"))
    assert verdicts(audit(root, tmp_path / "out"))[S.format(161)] == expected


def _ended(role: str, pid: int, code: int | None, ended_ns: int, signal: str | None = None,
           received: str | None = None) -> ProcessExit:
    """A process record of host n1 (as ``auditor run --step`` writes one)."""
    return ProcessExit(role, pid, code, "", path=f"processes/n1-{role}-{pid}.json", host="n1",
                       ended_ns=ended_ns, signal=signal, received_signal=received)


@pytest.mark.parametrize(("other", "excused"), [
    (_ended("policy", 2, 143, 2_000, "SIGTERM", "SIGTERM"), True),  # (the launcher's stop)
    (_ended("policy", 2, None, 2_000, received="SIGTERM"), True),  # (its provisional record)
    (_ended("policy", 2, 139, 2_000, "SIGSEGV"), False),  # (a crash's signal)
    (_ended("policy", 2, 134, 2_000, "SIGABRT"), False),
    (_ended("policy", 2, None, 2_000), False),  # (no exit, nothing that stopped it)
    (_ended("controller", 3, 137, 2_000, "SIGKILL"), False),  # (another controller)
])
def test_only_the_launchers_reaping_after_a_controllers_exit_0_is_excused(
        other: ProcessExit, excused: bool) -> None:
    """Review of 8f4ea29: after the controller's own exit 0 (pid 1, ended at 1000), a process
    that failed later was excused for any ``signal`` in its record (a SIGSEGV, a SIGABRT),
    for a record saying no exit with no signal received, and for a second controller's
    kill: each read as the launcher's reaping, the attempt clean. Only a reaping signal, or
    a signal its wrapper received, is."""
    trial = TrialRecord(path="trial.json", exit_code=0)
    exit_class = classify_exit(trial, FLAG, (_ended("controller", 1, 0, 1_000), other))
    assert exit_class.clean is excused, exit_class
    if not excused:
        assert exit_class.kind.value == "process_failure", exit_class
        assert f"(pid {other.pid} on n1)" in exit_class.detail, exit_class.detail


def test_a_replica_stopped_before_the_last_controllers_exit_0_is_no_reaping() -> None:
    """Review of 8f4ea29: two controllers exit 0 (pid 100 ended at 1000, pid 99 at 3000);
    the launcher stopped the policy at 2000, while one still ran. The first controller by
    its record's name stood for "the" end, and the policy read as reaped after it. The end
    is the last controller's: ``process_failure``."""
    trial = TrialRecord(path="trial.json", exit_code=0)
    records = (_ended("controller", 100, 0, 1_000), _ended("controller", 99, 0, 3_000),
               _ended("policy", 2, 143, 2_000, "SIGTERM", "SIGTERM"))
    exit_class = classify_exit(trial, FLAG, records)
    assert (exit_class.clean, exit_class.kind.value) == (False, "process_failure"), exit_class
    late = classify_exit(trial, FLAG, (*records[:2], replace(records[2], ended_ns=4_000)))
    assert late.clean and late.reaped == 1, late
