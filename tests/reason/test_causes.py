"""A failure cause for every period that did not complete (issue 20 item 1; contract v1.1).

End to end on generated studies, one period per outcome: the word in ``summary.json``, the
``AUD218`` finding that cites what it rests on, null for a clean exit.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from tests.helpers import audit, outcome_study, rewrite

OUTCOMES = ["completed", "terminal_missing", "rollout_init_oom", "coordinated_shutdown",
            "flag_off_143", "scancel_sigusr1", "sigkill_137", "cancelled", "timed_out",
            "node_failure"]
EXPECTED = {
    "completed": None, "terminal_missing": None, "coordinated_shutdown": None,
    "rollout_init_oom": "gpu_oom", "flag_off_143": "signal", "scancel_sigusr1": "time_limit",
    "sigkill_137": "signal", "cancelled": "cancelled", "timed_out": "time_limit",
    "node_failure": "node_failure",
}


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return outcome_study(tmp_path_factory.mktemp("causes") / "study", OUTCOMES)


def _causes(summary: dict[str, object]) -> dict[str, object]:
    periods = summary["periods"]
    assert isinstance(periods, list)
    return {OUTCOMES[int(p["seed"]) - 161]: p["cause"] for p in periods}


def test_every_period_that_did_not_complete_has_its_cause(study: Path, tmp_path: Path) -> None:
    summary = audit(study, tmp_path / "out")
    assert _causes(summary) == EXPECTED
    findings = pd.read_parquet(tmp_path / "out" / "findings.parquet")
    ended = findings[findings["rule_id"] == "AUD218"]
    assert len(ended) == sum(1 for word in EXPECTED.values() if word)
    oom = ended[ended["message"].str.contains("ended by gpu_oom")]["message"].iloc[0]
    assert "rollout_init raised torch.OutOfMemoryError" in oom
    kill = ended[ended["message"].str.contains("SIGKILL")]["message"].iloc[0]
    assert "ended by signal: exit 137" in kill


def test_sacct_preempted_is_its_own_reason_and_cause(study: Path, tmp_path: Path) -> None:
    root = tmp_path / "study"
    shutil.copytree(study, root)
    rewrite(root, "accounting/sacct-raw.psv",
            lambda b: b.replace(b"|CANCELLED by 1234|", b"|PREEMPTED|", 1), update_manifest=False)
    summary = audit(root, tmp_path / "out")
    period = next(p for p in summary["periods"] if p["seed"] == 161 + OUTCOMES.index("cancelled"))
    assert (period["reason"], period["cause"]) == ("preempted", "preempted")
    assert "AUD219" in period["rule_ids"]


CAUSE_LOGS = sorted((Path(__file__).resolve().parents[2] / "fixtures" / "causes").glob("*.log"))


@pytest.mark.parametrize("log", CAUSE_LOGS, ids=[p.name.split("__")[1][:40] for p in CAUSE_LOGS])
def test_each_real_log_is_named_by_its_cause(log: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Real public logs of each ending (fixtures/causes/SOURCES.md names each source): the
    file name's prefix is the cause the log alone shows; `auditor causes LOG` names it."""
    from auditor._cli import main

    expected = log.name.split("__")[0]
    assert main(["causes", str(log)]) == 0
    last = capsys.readouterr().out.rstrip("\n").rsplit("\n", 1)[-1]
    assert last.startswith(f"cause: {expected}:"), last


@pytest.mark.parametrize("line", [
    # (vLLM at the clean end of a script: its engine process ends with the client)
    "(EngineCore_DP0 pid=123) Engine core proc EngineCore_DP0 died unexpectedly, shutting "
    "down client.",
    # (urllib3 will try again: a notice, not the run's end)
    "WARNING:urllib3.connectionpool:Retrying (Retry(total=4, connect=None, read=None, "
    "redirect=None, status=None)) after connection broken by 'ConnectTimeoutError(<urllib3."
    "connection.HTTPSConnection object at 0x7f>, 'Connection to huggingface.co timed out. "
    "(connect timeout=10)')': /api/models/x",
    "huggingface_hub: Read timed out. Retrying in 1s [Retry 1/5].",
])
def test_near_misses_of_the_new_endings_name_no_cause(
        line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from auditor._cli import main

    log = tmp_path / "training.log"
    log.write_text(line + "\n")
    assert main(["causes", str(log)]) == 0
    assert "cause: none found" in capsys.readouterr().out


def test_causes_json_names_the_knock_ons(capsys: pytest.CaptureFixture[str]) -> None:
    """One rank's GPU running out of memory, then its peers' NCCL watchdog timeouts: the
    out-of-memory error is the cause, the NCCL errors its knock-on."""
    import json

    from auditor._cli import main

    log = next(p for p in CAUSE_LOGS if p.name.startswith("gpu_oom__funasr"))
    assert main(["causes", str(log), "--json"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["cause"]["cause"] == "gpu_oom" and said["cause"]["knock_on"] == ["nccl"]
    assert {f["cause"] for f in said["found"]} == {"gpu_oom", "nccl"}


def test_a_completed_log_has_no_cause_whatever_it_prints(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A completed run's teardown noise (a SIGSEGV after the last step) is no cause."""
    from auditor._cli import main

    text = ("step:2 - training/global_step:2 - loss:0.1\n"
            "*** SIGSEGV received at time=1700000000 on cpu 3 ***\n")
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        log_path = Path(tmp) / "training.log"
        log_path.write_text(text)
        assert main(["causes", str(log_path), "--steps", "2"]) == 0
        out = capsys.readouterr().out
        assert "cause: none (the terminal event for step 2 is at line 1" in out
        # (its last step reached, not a clean end claimed: what follows it is said)
        assert "the run completed" not in out
        assert "after it, segfault at line 2: its exit code and the scheduler's record say " \
            "whether it ended cleanly)" in out
        assert main(["causes", str(log_path)]) == 0
        assert capsys.readouterr().out.rstrip().endswith(
            "cause: segfault: segmentation fault (SIGSEGV) (log line 2)")


def test_causes_of_a_missing_log_is_one_line_and_exit_2(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from auditor._cli import main

    assert main(["causes", str(tmp_path / "none.log")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot read" in err


@pytest.mark.parametrize(("reason_text", "reason", "cause"), [
    (" DUE TO NODE FAILURE", "infrastructure_failure", "node_failure"),
    (" DUE TO PREEMPTION", "preempted", "preempted"),
])
def test_a_node_failure_or_preemption_seen_in_the_log_alone(
        study: Path, tmp_path: Path, reason_text: str, reason: str, cause: str) -> None:
    """A node failure the log alone shows is an infrastructure failure, as sacct's
    NODE_FAIL is; a preemption is reason preempted; the SIGTERM the batch script trapped is
    their knock-on, not a cancellation."""
    from tests.helpers import find

    root = tmp_path / "study"
    shutil.copytree(study, root)
    seed = 161 + OUTCOMES.index("cancelled")
    log = find(root, f"*-s{seed}-4gpu/attempt-*/training-*.log")
    rewrite(root, log, lambda b: b.replace(b" ***\n", reason_text.encode() + b" ***\n"))
    rewrite(root, "accounting/sacct-raw.psv",
            lambda b: b.replace(b"|CANCELLED by 1234|", b"|FAILED|", 1), update_manifest=False)
    summary = audit(root, tmp_path / "out")
    period = next(p for p in summary["periods"] if p["seed"] == seed)
    assert (period["reason"], period["cause"]) == (reason, cause)


def test_the_periods_table_carries_the_cause_and_where_it_rests(study: Path,
                                                                 tmp_path: Path) -> None:
    audit(study, tmp_path / "out")
    periods = pd.read_parquet(tmp_path / "out" / "periods.parquet")
    by_outcome = {OUTCOMES[int(seed) - 161]: row for seed, row in
                  zip(periods["seed"], periods.itertuples(), strict=True)}
    oom = by_outcome["rollout_init_oom"]
    assert oom.cause == "gpu_oom" and "allocator-" in oom.cause_at and ".jsonl:" in oom.cause_at
    assert pd.isna(by_outcome["completed"].cause) and pd.isna(by_outcome["completed"].cause_at)
    assert by_outcome["node_failure"].cause_at.startswith("accounting/sacct-raw.psv:")


def test_a_number_too_long_for_an_exit_code_is_no_crash_and_no_lost_log(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """torchrun-shaped lines holding a 5,000-digit number: auditor causes reads on, and an
    audit still finds the terminal line after them (a ValueError from int() once made the
    scan start over on the rest of the log, and a completed run read as unresolved)."""
    from auditor._cli import main
    from tests.helpers import find

    huge = "9" * 5000
    lines = (f"x failed (exitcode: -{huge}) local_rank: 0 (pid: 1) of binary\n"
             f"Root Cause (first observed failure):\n  rank      : {huge} (local_rank: 0)\n"
             "  exitcode  : -11 (pid: 1)\n====\n").encode()
    log = tmp_path / "huge.log"
    log.write_bytes(lines)
    assert main(["causes", str(log)]) == 0
    assert "exit code -11 (SIGSEGV)" in capsys.readouterr().out
    root = outcome_study(tmp_path / "study", ["completed"])
    training = find(root, "*-4gpu/attempt-*/training-*.log")
    rewrite(root, training, lambda b: lines + b)
    summary = audit(root, tmp_path / "out")
    assert (summary["periods"][0]["verdict"], summary["periods"][0]["reason"]) == \
        ("resolved", "completed")


def test_causes_refuses_what_is_not_a_regular_file(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A FIFO with no writer would be waited on for ever: one line, exit 2."""
    import os

    from auditor._cli import main

    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    assert main(["causes", str(fifo)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a regular file" in err


def test_a_clean_exit_ended_by_what_its_log_shows_names_that_cause(tmp_path: Path) -> None:
    """A driver that caught its worker's end and exited 0: the verdict rests on the log's
    infrastructure line (``AUD209``), and the cause names it (it was null: an unresolved
    period with no word for its end). A clean exit whose log holds only a Python exception
    is unresolved for its missing terminal line, and names no cause (nothing says the
    exception ended it)."""
    from tests.helpers import find

    root = outcome_study(tmp_path / "study", ["completed"] * 3)
    lines = [b"ray.exceptions.OutOfMemoryError: Task was killed due to the node running low "
             b"on memory.\n",
             b"[rank1]:[E314 14:33:45.172185860 ProcessGroupNCCL.cpp:607] [Rank 1] Watchdog "
             b"caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE) ran "
             b"for 600011 milliseconds before timing out.\n",
             b"Traceback (most recent call last):\nValueError: bad batch\n"]
    for seed, line in enumerate(lines, start=161):
        def replaced(_: bytes, text: bytes = line) -> bytes:
            return text
        rewrite(root, find(root, f"*-s{seed}-4gpu/attempt-*/training-*.log"), replaced)
    summary = audit(root, tmp_path / "out")
    got = {p["seed"]: (p["reason"], p["cause"]) for p in summary["periods"]}
    assert got[161] == ("infrastructure_failure", "host_oom")
    assert got[162] == ("infrastructure_failure", "nccl")
    assert got[163][1] is None and got[163][0] != "completed"
    periods = pd.read_parquet(tmp_path / "out" / "periods.parquet")
    assert sorted(periods["cause_at"].dropna().str.rsplit(":", n=1).str[1]) == ["1", "1"]


def test_the_line_a_cause_rests_on_is_among_the_periods_citations(tmp_path: Path) -> None:
    """Review S: ``evidence.md`` holds every period's citations, but the log line a cause
    rests on was cited only for the v1 event kinds (a GPU fault, a segfault, a Python
    exception... were named by the cause and cited nowhere among them)."""
    from tests.helpers import find

    root = outcome_study(tmp_path / "study", ["sigkill_137"])
    log = find(root, "*-s161-4gpu/attempt-*/training-*.log")
    lines = (root / log).read_bytes().count(b"\n")
    rewrite(root, log, lambda data: data + b"RuntimeError: CUDA error: an illegal memory "
                                           b"access was encountered\n")
    summary = audit(root, tmp_path / "out")
    (period,) = summary["periods"]
    assert period["cause"] == "gpu_error"
    periods = pd.read_parquet(tmp_path / "out" / "periods.parquet")
    assert periods["cause_at"].iloc[0] == f"{log}:{lines + 1}"
    evidence = (tmp_path / "out" / "evidence.md").read_text()
    (row,) = [line for line in evidence.splitlines()
              if line.startswith(f"- `{period['pair']}/period-1`")]
    assert f"{log.rsplit('/', 1)[1]}:{lines + 1}" in row or f"`:{lines + 1}`" in row, row


def test_causes_after_a_line_stating_its_own_last_step_names_no_step_none(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without ``--steps``, Lightning's ``max_steps=N`` line is the end on its own: the
    wording said "the terminal event for step None"; and what follows it is named in line
    order (sorted as text, line 10 came before line 9, so the three named were not the
    first three)."""
    from auditor._cli import main

    log = tmp_path / "training-1.log"
    log.write_text("`Trainer.fit` stopped: `max_steps=10` reached.\n"
                   + "".join(f"filler {n}\n" for n in range(2, 9))
                   + "".join("OSError: [Errno 28] No space left on device\n" for _ in range(4)))
    protocol = tmp_path / "protocol.json"
    protocol.write_text('{"terminal_event": {"preset": "lightning"}}')
    assert main(["causes", str(log), "--protocol", str(protocol)]) == 0
    out = capsys.readouterr().out.splitlines()[-1]
    assert out.startswith("cause: none (the terminal event is at line 1: training reached "
                          "its last step; after it, python_exception at line 9, storage at "
                          "line 9, python_exception at line 10 and 5 more: "), out
