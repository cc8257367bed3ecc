"""Contract v1.2 "More causes" (issue 43 item 1): the new words and what they do to a
period's verdict, first in time across a rank's own files by the times their lines state,
and the near-misses that must never be read as a cause.

The real public logs of each new word are named by it in ``tests/reason/test_causes.py``
(``fixtures/causes``, their sources in its ``SOURCES.md``); here they are audited in a
study, where the word decides the reason.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pandas as pd
import pytest

from auditor._cli import main
from tests.helpers import failed_with_log, find, outcome_study, rewrite

CAUSES = Path(__file__).resolve().parents[2] / "fixtures" / "causes"

REASONS = {  # (contract v1.2: each new word's verdict effect)
    "gpu_error__pytorch-issue113128-default0-rank12-watchdog-uncorrectable-ecc.log":
        ("gpu_error", "infrastructure_failure"),
    "rendezvous__pytorch-issue107021-c10d-client-timeout-rdzv-connection-error.log":
        ("rendezvous", "infrastructure_failure"),
    "ray_system__tinyzero-issue75-driver-gcs-connect-timeout.log":
        ("ray_system", "infrastructure_failure"),
    "storage__dolly-issue139-metaflow-prefix-errno28-torch-save.log":
        ("storage", "infrastructure_failure"),
    "network__ip-adapter-issue209-diffusers-oserror-couldnt-connect.log":
        ("network", "infrastructure_failure"),
    "nan_loss__lemma-issue5-check-nan-losses-runtimeerror.log": ("nan_loss", "unclean_exit"),
    "engine_dead__verl-issue4308-taskrunner-raytaskerror-enginedeaderror.log":
        ("engine_dead", "unclean_exit"),
}


def _periods(root: Path, out: Path) -> pd.DataFrame:
    assert main(["audit", str(root), "--out", str(out), "--quiet", "--no-plots"]) == 0
    return pd.read_parquet(out / "periods.parquet").set_index("seed")


def test_each_new_word_decides_its_periods_reason(tmp_path: Path) -> None:
    root = outcome_study(tmp_path / "study", ["terminal_missing"] * len(REASONS))
    for index, name in enumerate(REASONS):
        failed_with_log(root, index, (CAUSES / name).read_bytes())
    periods = _periods(root, tmp_path / "out")
    for index, (name, (word, reason)) in enumerate(REASONS.items()):
        row = periods.loc[161 + index]
        assert (row["cause"], row["reason"], row["verdict"]) == (word, reason, "unresolved"), \
            (name, row["cause"], row["reason"], row["cause_detail"])


KNOCK_ONS = {  # (a real log each: whether its NCCL timeouts only follow another failure)
    "gpu_oom__funasr-issue2006-rank2-oom-knockon-peer-nccl-timeouts.log":
        ("gpu_oom", "unclean_exit"),  # rank 2 out of memory, then its peers' timeouts
    "gpu_error__sd-scripts-issue1434-runtimeerror-ecc-then-nccl-watchdog.log":
        ("gpu_error", "infrastructure_failure"),  # an ECC fault first: the machine's
    "nccl__llamafactory-issue7396-watchdog-allreduce-numbered-prefix.log":
        ("nccl", "infrastructure_failure"),  # the collective's own timeout
    "host_oom__trinity-notes-exceeded-memory-limit-job-cancelled.log":
        ("host_oom", "infrastructure_failure"),  # slurmstepd's kill for memory, then its
    # "*** JOB ... CANCELLED" (a knock-on: never the reason `cancelled`)
    "cancelled__spank-plugins-pr17-scancel-step-and-job.log":
        ("cancelled", "cancelled"),  # a cancellation with nothing before it stays one
    # (the NCCL timeout inside a RuntimeError on its own line: the exception is it, never a
    # failure before it)
    "nccl__glm130b132-runtimeerror-communicator-aborted.log":
        ("nccl", "infrastructure_failure"),
    "nccl__mmdet12392-traceback-communicator-aborted-then-peers.log":
        ("nccl", "infrastructure_failure"),
    # (Ray's legacy memory monitor: the host's memory)
    "host_oom__ray-pr3323-legacy-rayoutofmemoryerror.log": ("host_oom", "infrastructure_failure"),
}


def test_peers_timing_out_after_a_ranks_failure_take_that_failures_reason(
        tmp_path: Path) -> None:
    """The reason follows the root cause: an out-of-memory rank's peers timing out in their
    collective is the configuration's unclean exit (a rerun of it runs out of memory
    again), not an infrastructure failure."""
    root = outcome_study(tmp_path / "study", ["terminal_missing"] * len(KNOCK_ONS))
    for index, name in enumerate(KNOCK_ONS):
        failed_with_log(root, index, (CAUSES / name).read_bytes())
    periods = _periods(root, tmp_path / "out")
    for index, (name, expected) in enumerate(KNOCK_ONS.items()):
        row = periods.loc[161 + index]
        assert (row["cause"], row["reason"]) == expected, (name, row["cause_detail"])


TEARDOWN = (  # (torch's elastic agent closing its rendezvous after the head node's agent has
    # gone: dynamic_rendezvous.py's shutdown() warning, with exc_info, as real runs print it)
    b"WARNING:torch.distributed.elastic.rendezvous.dynamic_rendezvous:The node "
    b"'gpu-node-11_3140_0' has failed to shutdown the rendezvous '4711' due to an error of "
    b"type RendezvousConnectionError.\n"
    b"Traceback (most recent call last):\n"
    b'  File "/opt/conda/lib/python3.10/site-packages/torch/distributed/elastic/rendezvous/'
    b'c10d_rendezvous_backend.py", line 113, in _call_store\n'
    b"    return getattr(self._store, store_op)(*args, **kwargs)\n"
    b"RuntimeError: Connection reset by peer\n"
    b"torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to "
    b"the C10d store has failed. See inner exception for details.\n")


def test_a_completed_run_outlives_its_agents_rendezvous_teardown(tmp_path: Path) -> None:
    """A run that exited 0 with its terminal line and every completion phase stays resolved
    when its log ends with the store's teardown error (contract v1.2: the words name what
    ended an attempt that did not complete); the same lines where the run exited 1 are its
    infrastructure failure."""
    root = outcome_study(tmp_path / "study", ["completed", "completed"])
    for index in (0, 1):
        log = find(root, f"*-s{161 + index}-4gpu/attempt-*/training-*.log")
        rewrite(root, log, lambda data: data + TEARDOWN)
    failed_with_log(root, 1, (root / find(root, "*-s162-4gpu/attempt-*/training-*.log"))
                    .read_bytes())
    periods = _periods(root, tmp_path / "out")
    assert tuple(periods.loc[161, ["verdict", "reason"]]) == ("resolved", "completed")
    assert tuple(periods.loc[162, ["verdict", "reason", "cause"]]) == (
        "unresolved", "infrastructure_failure", "rendezvous")


def test_an_engines_death_names_the_error_inside_it_as_its_root(
        capsys: pytest.CaptureFixture[str]) -> None:
    """SGLang's scheduler hit an illegal memory access, then the engine died (SIGQUIT from
    its child): ``engine_dead``, its detail the first error before it (contract v1.2)."""
    log = CAUSES / "engine_dead__verl-issue1611-sglang-illegal-memory-access-sigquit.log"
    assert main(["causes", str(log), "--json"]) == 0
    cause = json.loads(capsys.readouterr().out)["cause"]
    assert cause["cause"] == "engine_dead"
    assert "the first error before it: gpu_error, CUDA error: an illegal memory access" \
        in cause["detail"]


NEAR_MISSES = {  # (a line each, in a log of a run that went on; none is what ended it)
    "CUDA out of memory is gpu_oom, never gpu_error":
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n",
    "a collective timeout after the watchdog's prefix stays nccl":
        "[rank0]:[E ProcessGroupNCCL.cpp:1575] [PG 0 Rank 0] Process group watchdog thread "
        "terminated with exception: [Rank 0] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=9, OpType=ALLREDUCE) ran for 600081 milliseconds before timing out.\n",
    "a NaN in a progress line": "step:12 - training/global_step:12 - actor/loss:nan - "
                                "actor/grad_norm:nan\n",
    "a grad norm warning": "[2024-03-01 10:00:00] WARNING grad norm: nan, skipping step\n",
    "a rate limit the hub retried": "Rate limited. Waiting 196.0s before retry [Retry 1/5].\n",
    "wandb retrying": "wandb: Network error (ReadTimeout), entering retry loop.\n",
    "a raylet's heartbeat warning": "(raylet) node_manager.cc:158: Last heartbeat was sent "
                                    "8987 ms ago. There might be resource pressure on this node. "
                                    "If heartbeat keeps lagging, this node can be marked as dead "
                                    "mistakenly.\n",
    "Ray's list of what might have happened": "(raylet) A worker died or was killed while "
                                              "executing a task. There are some potential root "
                                              "causes. (1) The process is killed by SIGKILL by "
                                              "OOM killer due to high memory usage. (2) ray stop "
                                              "--force is called. (3) The worker is crashed "
                                              "unexpectedly due to SIGSEGV or other unexpected "
                                              "errors. GCS may have been killed\n",
    "a source line quoting the check": '  File "train.py", line 9, in step\n'
                                       '    raise FloatingPointError("Loss is nan")\n',
}
NEAR_MISSES["a raylet's summary counting no memory kill"] = (
    "[2024-01-05 10:00:00,000 I 88 88] (raylet) node_manager.cc:3069: 0 Workers (tasks / "
    "actors) killed due to memory pressure (OOM), 2 Workers crashed due to other reasons at "
    "node (ID: 5f2e, IP: 10.0.0.2) over the last time period.\n")
NOT = {"CUDA out of memory is gpu_oom, never gpu_error": "gpu_error",
       "a collective timeout after the watchdog's prefix stays nccl": "gpu_error",
       "Ray's list of what might have happened": "ray_system"}


@pytest.mark.parametrize("name", list(NEAR_MISSES))
def test_a_near_miss_is_never_a_new_cause(name: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "training.log"
    log.write_text("step:1 - training/global_step:1 - actor/loss:0.5\n" + NEAR_MISSES[name])
    assert main(["causes", str(log), "--json"]) == 0
    cause = json.loads(capsys.readouterr().out)["cause"]
    new = {"gpu_error", "rendezvous", "ray_system", "storage", "nan_loss", "engine_dead",
           "network", "node_failure", "host_oom"}
    named = cause["cause"] if cause else None
    if name in NOT:
        assert named != NOT[name], cause
    else:
        assert named not in new, cause


HEDGED = {  # (Ray's list of what might have happened, over several lines: never evidence)
    "one item a line": "There are some potential root causes.\n"
                       "(1) The process is killed by SIGKILL by OOM killer due to high memory "
                       "usage.\n(2) ray stop --force is called.\n"
                       "(3) The worker is crashed unexpectedly due to SIGSEGV or other "
                       "unexpected errors.\n",
    "hard-wrapped": "Some common causes include: (1) the process was killed by the OOM killer "
                    "due to high\nmemory usage, (2) ray stop --force was called, or (3) the "
                    "worker crashed unexpectedly due to\nSIGSEGV or another unexpected "
                    "error.\n",
}


@pytest.mark.parametrize("name", list(HEDGED))
def test_a_hedge_over_several_lines_is_never_evidence(name: str, tmp_path: Path) -> None:
    """The lines after a hedge are its list (the audit's prefilter sees the hedge itself, so
    that its list is known as one), and a real failure after them is still read."""
    root = outcome_study(tmp_path / "study", ["terminal_missing"] * 3)
    died = ("(TaskRunner pid=42) ray.exceptions.ActorDiedError: The actor died unexpectedly "
            "before finishing this task.\n")
    failed_with_log(root, 0, (died + HEDGED[name]).encode())
    failed_with_log(root, 1, (HEDGED[name] + "\n" * 5 + "Segmentation fault (core dumped)\n")
                    .encode())
    # (a crash report of its own on the very next line: never the hedge's list)
    failed_with_log(root, 2, (HEDGED[name] + "Fatal Python error: Segmentation fault\n")
                    .encode())
    periods = _periods(root, tmp_path / "out")
    assert periods.loc[161, "cause"] == "actor_died", periods.loc[161, "cause_detail"]
    assert periods.loc[162, "cause"] == "segfault", periods.loc[162, "cause_detail"]
    assert periods.loc[163, "cause"] == "segfault", periods.loc[163, "cause_detail"]


def test_a_rank_that_failed_first_by_its_own_clock_is_the_root(tmp_path: Path) -> None:
    """Two ranks' own files (contract v1.2 worker logs): rank 0's error is on its file's
    line 2, rank 1's on its line 5, but rank 1's line states the earlier time: rank 1's is
    the cause, rank 0's its knock-on (by line numbers in separate files it was rank 0)."""
    root = outcome_study(tmp_path / "study", ["terminal_missing"])
    failed_with_log(root, 0, b"starting\n")
    logs = {
        "worker-logs/gpu-node-10-rank0.err":
            b"[rank0]:[W1206 10:00:05.100000 11 init.cpp:1] waiting\n"
            b"[rank0]:[E1206 10:00:09.660000 11 ProcessGroupGloo.cpp:144] RuntimeError: "
            b"Connection closed by peer [10.0.0.2]:29500\n",
        "worker-logs/gpu-node-10-rank1.err":
            b"[rank1]:[W1206 10:00:05.200000 12 init.cpp:1] waiting\n"
            b"[rank1]:[W1206 10:00:06.000000 12 init.cpp:1] still waiting\n"
            b"[rank1]:[W1206 10:00:07.000000 12 init.cpp:1] still waiting\n"
            b"[rank1]:[W1206 10:00:08.000000 12 init.cpp:1] still waiting\n"
            b"[rank1]:[E1206 10:00:09.000000 12 train.py:40] ValueError: bad batch at step 3\n",
    }
    _worker_logs(root, logs)
    row = _periods(root, tmp_path / "out").loc[161]
    assert row["cause"] == "python_exception", row["cause_detail"]
    assert row["cause_detail"] == "ValueError (gpu-node-10-rank1.err line 5)"
    assert row["cause_at"].endswith("worker-logs/gpu-node-10-rank1.err:5"), row["cause_at"]


def _worker_logs(root: Path, logs: dict[str, bytes]) -> None:
    """The first period's attempt keeps ``logs`` (path -> text) as its worker logs, each
    listed in its period record."""
    record_path = next((root / "pairs").glob("*/period-1.json"))
    record = json.loads(record_path.read_text())
    for name, text in logs.items():
        target = root / record["attempt_dir"] / name
        target.parent.mkdir(exist_ok=True)
        target.write_bytes(text)
        record["evidence"].append({"path": name, "kind": "worker_log",
                                   "sha256": hashlib.sha256(text).hexdigest(),
                                   "size": len(text)})
    record_path.write_text(json.dumps(record, indent=2))


DRIVER = (b"(TaskRunner pid=4242) ray.exceptions.ActorDiedError: The actor died unexpectedly "
          b"before finishing this task.\n")
WORKERS = {  # (what the workers' own files say -> the period's cause and reason)
    "a GPU fault in a worker's own file": (
        {"worker-logs/gpu-node-11-rank1.err":
         b"[2024-05-01 10:00:02] step 3\n"
         b"[2024-05-01 10:00:04] RuntimeError: CUDA error: an illegal memory access was "
         b"encountered\n"},
        ("gpu_error", "infrastructure_failure", "gpu-node-11-rank1.err")),
    "a peer's timeout after a worker ran out of memory, by their times": (
        {"worker-logs/gpu-node-10-rank0.err":  # (its timeout on its file's first line)
         b"[rank0]:[E1206 10:10:00.000000 11 ProcessGroupNCCL.cpp:563] [Rank 0] Watchdog "
         b"caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE) ran for "
         b"600081 milliseconds before timing out.\n",
         "worker-logs/gpu-node-11-rank1.err":
         b"[rank1]:[W1206 09:59:00.000000 12 init.cpp:1] step 3\n"
         b"[rank1]:[E1206 10:00:00.000000 12 train.py:40] torch.OutOfMemoryError: CUDA out of "
         b"memory. Tried to allocate 2.00 GiB\n"},
        ("gpu_oom", "unclean_exit", "gpu-node-11-rank1.err")),
    "a worker's own collective timeout, nothing before it": (  # (the driver's log: no word)
        {"training": b"starting\n", "worker-logs/gpu-node-10-rank0.err":
         b"[rank0]:[E1206 10:10:00.000000 11 ProcessGroupNCCL.cpp:563] [Rank 0] Watchdog "
         b"caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE) ran for "
         b"600081 milliseconds before timing out.\n"},
        ("nccl", "infrastructure_failure", "gpu-node-10-rank0.err")),
}


@pytest.mark.parametrize("name", list(WORKERS))
def test_a_worker_logs_failure_decides_the_reason_as_it_does_the_cause(
        name: str, tmp_path: Path) -> None:
    """The driver's log says only that an actor died (or nothing); the worker logs the kit
    kept say why. The reason follows the cause they show (a GPU fault is the machine's; a timeout
    that only follows a worker's out-of-memory error is that error's unclean exit)."""
    logs, (word, reason, where) = WORKERS[name]
    logs = dict(logs)  # (the table stays whole for the next case)
    root = outcome_study(tmp_path / "study", ["terminal_missing"])
    failed_with_log(root, 0, logs.pop("training", DRIVER))
    _worker_logs(root, logs)
    row = _periods(root, tmp_path / "out").loc[161]
    assert (row["cause"], row["reason"]) == (word, reason), row["cause_detail"]
    assert where in row["cause_at"], row["cause_at"]


READ = {  # (a reader fault each: what the log's own exception line says, under its prefix)
    "python_exception__anlp-lora-ft-tqdm-glued-traceback-indented.log":
        "RuntimeError (log line 31)",  # a progress bar glued to it, the log indented whole
    "python_exception__metaflow-dcdl-week4-raise-source-line-json-typeerror.log":
        "TypeError (log line 13)",  # Metaflow's prefix, frames unindented, `raise` above
    "python_exception__mozmlops-metaflow-kubernetes-pod-prefix-keyerror.log":
        "KeyError (log line 5)",  # Metaflow's and the pod's prefixes
    "python_exception__pytorch-pr61803-64-rank-interleaved-tracebacks-typeerror.log":
        "TypeError (log line 4)",  # 64 ranks' tracebacks interleaved
    "signal__bigscience-jz-torchelastic-error-file-json-signalexception-15.log":
        "SIGTERM, received by torchrun's elastic agent (sender not in the log) (log line 1)",
    # (the elastic error handler's JSON, its traceback escaped; the agent's SignalException)
    "time_limit__gnn-4-io-delta-gcn-epoch5-of-20.log":
        "slurmstepd: job 9274167 cancelled at its time limit (log line 20)",
}


@pytest.mark.parametrize("name", list(READ))
def test_the_cause_detail_is_the_root_events_own(name: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["causes", str(CAUSES / name), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cause"]["detail"] == READ[name]


@pytest.mark.parametrize(("line", "word", "detail"), [
    ("Exception: Capture cuda graph failed: see above\n", "python_exception", "Exception"),
    ("<Signals.SIGUSR1: 10>\n", "signal", "SIGUSR1"),  # (a time limit only where the kit
    # recorded it or sacct says TIMEOUT: contract v1.2)
    ("Received 10 death signal, shutting down workers\n", "signal", "SIGUSR1, received by "
     "torchrun's elastic agent (sender not in the log)"),
    # (torch's agent under Python 3.10 and before prints the Signals member)
    ("W0616 00:44:57.731000 4026234 torch/distributed/elastic/agent/server/api.py:719] "
     "Received Signals.SIGTERM death signal, shutting down workers\n", "signal",
     "SIGTERM, received by torchrun's elastic agent (sender not in the log)"),
    # (raised by the agent's own signal handler: the agent received it)
    ("torch.distributed.elastic.multiprocessing.api.SignalException: Process 2345 got "
     "signal: 15\n", "signal",
     "SIGTERM, received by torchrun's elastic agent (sender not in the log)"),
    # (DETR, DeiT and MAE print Python's own spelling, then sys.exit(1))
    ("Loss is nan, stopping training\n", "nan_loss", "Loss is nan"),
    # (the node's raylet told so as it exits: ray-project/ray#28562)
    ("[2022-09-20 10:00:00,000 C 123 123] (raylet) node_manager.cc:999: [Timeout] Exiting "
     "because this node manager has mistakenly been marked as dead by the GCS: GCS didn't "
     "receive heartbeats from this node for 30000 ms.\n", "node_failure",
     "Ray marked a node dead (missed heartbeats)"),
])
def test_a_line_alone(line: str, word: str, detail: str, tmp_path: Path,
                      capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "training.log"
    log.write_text("step:1 - training/global_step:1 - actor/loss:0.5\n" + line)
    assert main(["causes", str(log), "--json"]) == 0
    cause = json.loads(capsys.readouterr().out)["cause"]
    assert (cause["cause"], cause["detail"]) == (word, f"{detail} (log line 2)")


def test_a_traceback_in_a_log_indented_whole_is_read_by_its_frames_indentation(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A log a wrapper indented by four spaces: the frames at six, their source at eight,
    the exception line at four (less than the frames: the traceback's end)."""
    log = tmp_path / "training.log"
    log.write_text("    step:1 - training/global_step:1\n"
                   "    Traceback (most recent call last):\n"
                   '      File "train.py", line 3, in <module>\n'
                   "        main()\n"
                   '      File "train.py", line 2, in main\n'
                   "        raise ValueError('bad batch')\n"
                   "    ValueError: bad batch\n")
    assert main(["causes", str(log), "--json"]) == 0
    cause = json.loads(capsys.readouterr().out)["cause"]
    assert (cause["cause"], cause["detail"]) == ("python_exception", "ValueError (log line 7)")


@pytest.mark.parametrize("before", [
    b"",
    b"[2026-01-01 00:00:00] torch.distributed.elastic.agent: Received Signals.SIGTERM death "
    b"signal, shutting down workers\n",
    b"Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
    b"RuntimeError: worker interrupted\n",
])
def test_a_jobs_cancellation_after_a_trainers_own_lines_is_the_cancellation(
        before: bytes, tmp_path: Path) -> None:
    """A coordinated shutdown (controller 143, flag on, no signal recorded) whose log holds
    the job's '*** JOB ... CANCELLED' line: scancel reached the batch script, so the 143 is
    no success, whatever the trainer printed as it went down (a SIGTERM, a traceback). Only
    the machine's end before it (slurmstepd's memory kill) makes that line a knock-on."""
    root = outcome_study(tmp_path / "study", ["coordinated_shutdown"])
    log = find(root, "*-s161-4gpu/attempt-*/training-*.log")
    cancel = b"slurmstepd: error: *** JOB 7000001 ON gpu-node-10 CANCELLED AT " \
             b"2026-09-15T18:07:16 ***\n"
    rewrite(root, log, lambda data: data + before + cancel)
    periods = _periods(root, tmp_path / "out")
    assert (periods.loc[161, "verdict"], periods.loc[161, "reason"]) == (
        "unresolved", "cancelled")
