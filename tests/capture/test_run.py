"""``auditor run`` end to end with real child processes: seed ``000``'s cases and the rest.

Each case runs a real command (the example trainer, or a shell) under the wrapper and reads
the trial record and exit status it leaves. The wrapper itself is signalled in a child
process of its own, as scancel and ``--signal=B:SIGUSR1@...`` signal a batch script.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from auditor._cli import main
from tests.capture.support import (
    EXAMPLE,
    FLAG,
    attempt_of,
    clean_env,
    lines,
    load,
    run_args,
    schema_errors,
    start_auditor,
    wait_for,
)

pytestmark = pytest.mark.slow  # (real child processes, signals)


@pytest.fixture(autouse=True)
def _no_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith(("SLURM_", "AUDITOR_")) or key == FLAG:
            monkeypatch.delenv(key)


def _trial(root: Path, job: str = "5001", restart: int = 0) -> dict[str, Any]:
    return load(attempt_of(root, job, restart=restart) / f"trial-{job}.json")


@pytest.mark.parametrize("value", ["1", "true", "YES"])
def test_controller_self_sigterm_with_the_flag_on_exits_0(tmp_path: Path, value: str) -> None:
    code = main([*run_args(tmp_path, "5001", "--role", "controller", "--dispatch",
                           f"{FLAG}={value}", "--"), *EXAMPLE, "--mode", "coordinated"])
    assert code == 0
    trial = _trial(tmp_path)
    assert trial["processes"][0]["role"] == "controller"
    assert trial["processes"][0]["exit_code"] == 143
    assert trial["invocation"] == {**trial["invocation"], "exit_code": 0,
                                   "received_signal": None}
    assert trial["env"] == {FLAG: value}
    assert trial["status"] == "completed"
    assert "coordinated shutdown" in trial["status_detail"]
    assert schema_errors("trial", trial) == []
    log = (attempt_of(tmp_path) / "training-5001.log").read_text()
    assert "step:1 - training/global_step:1" in log


@pytest.mark.parametrize("flag", [None, "0", "false", ""])
def test_controller_sigterm_with_the_flag_off_passes_143_on(tmp_path: Path,
                                                            flag: str | None) -> None:
    dispatch = [] if flag is None else ["--dispatch", f"{FLAG}={flag}"]
    code = main([*run_args(tmp_path, "5002", "--role", "controller", *dispatch, "--"),
                 *EXAMPLE, "--mode", "coordinated"])
    assert code == 143
    trial = _trial(tmp_path, "5002")
    assert trial["invocation"]["exit_code"] == 143
    assert trial["status"] == "sigterm"
    assert trial["env"] == ({} if flag is None else {FLAG: flag})


def test_only_the_controller_is_excused(tmp_path: Path) -> None:
    code = main([*run_args(tmp_path, "5003", "--dispatch", f"{FLAG}=1", "--"), *EXAMPLE,
                 "--mode", "coordinated"])
    assert code == 143
    assert _trial(tmp_path, "5003")["processes"][0]["role"] == "driver"


def test_the_flag_is_read_from_the_environment_and_named_by_flag(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    monkeypatch.setenv("MY_FLAG", "1")
    code = main([*run_args(tmp_path, "5004", "--role", "controller", "--flag", "MY_FLAG",
                           "--"), *EXAMPLE, "--mode", "coordinated"])
    assert code == 0
    assert _trial(tmp_path, "5004")["env"] == {"MY_FLAG": "1"}


def _started(root: Path, job: str) -> bool:
    traces = attempt_of(root, job) / "allocator-traces"
    return traces.is_dir() and len(list(traces.iterdir())) == 2 and all(
        any(r.get("phase") == "rollout_init" for r in lines(t)) for t in traces.iterdir())


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, 143), (signal.SIGUSR1, 138),
                                                (signal.SIGINT, 130)])
def test_the_wrapper_signalled_records_it_and_never_succeeds(tmp_path: Path, signum: int,
                                                             status: int) -> None:
    env = clean_env(**{FLAG: "1"})
    wrapper = start_auditor([*run_args(tmp_path, "5005", "--role", "controller", "--grace",
                                       "5", "--"), *EXAMPLE, "--mode", "hang"], env)
    try:
        wait_for(lambda: _started(tmp_path, "5005"))
        wrapper.send_signal(signum)
        _, err = wrapper.communicate(timeout=30)
    finally:
        wrapper.kill()
    assert wrapper.returncode == status, err
    trial = _trial(tmp_path, "5005")
    name = signal.Signals(signum).name
    assert trial["invocation"]["received_signal"] == name
    assert trial["invocation"]["exit_code"] == status
    assert trial["processes"][0]["exit_code"] == status  # forwarded to the group: it died
    assert trial["status"] == "signalled"
    assert not trial["killed_after_grace"]
    log = (attempt_of(tmp_path, "5005") / "training-5005.log").read_text()
    assert f"received {name}; forwarded to process group" in log
    # the ranks got the signal too (one group): their traces end with whole lines
    for trace in (attempt_of(tmp_path, "5005") / "allocator-traces").iterdir():
        assert trace.read_bytes().endswith(b"\n")
        if signum == signal.SIGINT:  # KeyboardInterrupt in the hanging phase: its record
            assert lines(trace)[-1]["error_type"] == "KeyboardInterrupt"


def test_a_signalled_wrapper_whose_command_exits_0_still_fails(tmp_path: Path) -> None:
    script = "trap 'exit 0' USR1; echo ready; while :; do sleep 0.05; done"
    wrapper = start_auditor([*run_args(tmp_path, "5006", "--"), "sh", "-c", script],
                            clean_env())
    log = attempt_of(tmp_path, "5006") / "training-5006.log"
    try:
        wait_for(lambda: log.exists() and "\nready\n" in log.read_text())
        wrapper.send_signal(signal.SIGUSR1)
        wrapper.communicate(timeout=30)
    finally:
        wrapper.kill()
    assert wrapper.returncode == 138
    trial = _trial(tmp_path, "5006")
    assert trial["processes"][0]["exit_code"] == 0
    assert trial["invocation"]["exit_code"] == 138
    assert trial["invocation"]["received_signal"] == "SIGUSR1"


def test_a_command_ignoring_sigterm_is_sigkilled_after_the_grace(tmp_path: Path) -> None:
    code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(60)")
    wrapper = start_auditor([*run_args(tmp_path, "5007", "--grace", "0.5", "--"),
                             sys.executable, "-c", code], clean_env())
    log = attempt_of(tmp_path, "5007") / "training-5007.log"
    try:
        wait_for(lambda: log.exists() and "\nready\n" in log.read_text())
        started = time.monotonic()
        wrapper.send_signal(signal.SIGTERM)
        wrapper.communicate(timeout=30)
        took = time.monotonic() - started
    finally:
        wrapper.kill()
    assert wrapper.returncode == 137
    assert took < 10
    trial = _trial(tmp_path, "5007")
    assert trial["killed_after_grace"] is True
    assert trial["invocation"]["received_signal"] == "SIGTERM"
    assert "grace over: SIGKILL" in log.read_text()


def test_a_sigkilled_child_is_137_never_a_success(tmp_path: Path) -> None:
    code = main([*run_args(tmp_path, "5008", "--role", "controller", "--dispatch",
                           f"{FLAG}=1", "--"), "sh", "-c", "kill -9 $$"])
    assert code == 137
    trial = _trial(tmp_path, "5008")
    assert trial["status"] == "sigkill"
    assert trial["processes"][0]["exit_code"] == 137


def test_an_ordinary_crash_passes_its_code_on(tmp_path: Path) -> None:
    code = main([*run_args(tmp_path, "5009", "--role", "controller", "--dispatch",
                           f"{FLAG}=1", "--"), *EXAMPLE, "--mode", "crash"])
    assert code == 1
    trial = _trial(tmp_path, "5009")
    assert (trial["status"], trial["invocation"]["exit_code"]) == ("failure", 1)
    crashed = [r for t in (attempt_of(tmp_path, "5009") / "allocator-traces").iterdir()
               for r in lines(t) if r.get("error_type")]
    assert [(r["rank"], r["phase"], r["step"], r["error_type"]) for r in crashed] == [
        (1, "actor_update", 1, "RuntimeError")]
    log = (attempt_of(tmp_path, "5009") / "training-5009.log").read_text()
    assert "RuntimeError: example crash in actor_update" in log


def test_the_oom_mode_leaves_an_eligible_failure_record(tmp_path: Path) -> None:
    assert main([*run_args(tmp_path, "5010", "--"), *EXAMPLE, "--mode", "oom"]) == 1
    failed = [r for t in (attempt_of(tmp_path, "5010") / "allocator-traces").iterdir()
              for r in lines(t) if r.get("error_type")]
    assert [(r["rank"], r["phase"], r["error_type"]) for r in failed] == [
        (0, "rollout_init", "torch.OutOfMemoryError")]
    assert "CUDA out of memory" in failed[0]["error_message"]


def test_a_grandchild_holding_the_pipe_does_not_hang_run(tmp_path: Path) -> None:
    started = time.monotonic()
    code = main([*run_args(tmp_path, "5011", "--drain", "0.5", "--"), "sh", "-c",
                 "sleep 60 & echo started $!"])
    assert time.monotonic() - started < 20
    assert code == 0
    trial = _trial(tmp_path, "5011")
    assert trial["pipe_held_open"] is True
    log = (attempt_of(tmp_path, "5011") / "training-5011.log").read_text()
    pid = int(log.rsplit("started ", 1)[1].split()[0])  # (the first is the command line)
    assert "1 of the command's processes outlived it" in log
    assert trial["outlived"] == [{"pid": pid, "signal": "SIGTERM"}]
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie counts as gone: it only waits to be
    reaped, and the wrapper reaps what it adopted)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def test_a_grandchild_in_a_session_of_its_own_is_ended_and_reaped(tmp_path: Path) -> None:
    """torchrun's agent starts each rank in a session of its own: when the command that
    started it exits, it is re-parented to the wrapper (a child subreaper), which ends it
    (SIGTERM, SIGKILL after --drain) and reaps it; none outlives the wrapper."""
    code = ("import subprocess, sys; p = subprocess.Popen(['sh', '-c', 'trap \"\" TERM; "
            "sleep 60'], start_new_session=True); print('grandchild', p.pid, flush=True)")
    started = time.monotonic()
    assert main([*run_args(tmp_path, "5012", "--drain", "0.5", "--"), sys.executable, "-c",
                 code]) == 0
    assert time.monotonic() - started < 20
    log = (attempt_of(tmp_path, "5012") / "training-5012.log").read_text()
    pid = int(log.rsplit("grandchild ", 1)[1].split()[0])
    assert not _alive(pid), log
    assert {"pid": pid, "signal": "SIGKILL"} in _trial(tmp_path, "5012")["outlived"]
    assert "SIGKILL" in log


def test_slurm_identity_restart_count_and_attempt_directory(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "7001")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "7000")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    argv = ["run", "--pair", "p", "--period", "2", "--gpus", "4", "--root", str(tmp_path),
            "--dispatch", "TOTAL_TRAINING_STEPS=1", "--", "true"]
    assert main(argv) == 0
    first = load(tmp_path / "p-4gpu" / "attempt-7001" / "trial-7001.json")
    assert (first["attempt"], first["restart_count"], first["array_job_id"],
            first["array_task_id"], first["dispatch"]) == (1, 0, "7000", 3,
                                                           {"TOTAL_TRAINING_STEPS": "1"})
    assert main(argv) == 2  # the same attempt again: never overwritten
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert main(argv) == 0
    second = load(tmp_path / "p-4gpu" / "attempt-7001-r1" / "trial-7001.json")
    assert (second["job_id"], second["attempt"], second["restart_count"]) == ("7001", 2, 1)
    assert schema_errors("trial", second) == []


def test_dispatch_values_reach_the_command(tmp_path: Path) -> None:
    target = tmp_path / "exact"
    assert main(["run", "--pair", "p", "--period", "1", "--gpus", "1", "--attempt-dir",
                 str(target), "--job-id", "42", "--dispatch", "A_B=x=y", "--", "sh", "-c",
                 'echo "A_B=$A_B job=$AUDITOR_JOB_ID dir=$AUDITOR_ATTEMPT_DIR"']) == 0
    log = (target / "training-42.log").read_text()
    assert f"A_B=x=y job=42 dir={target.resolve()}" in log


@pytest.mark.parametrize(("argv", "message"), [
    (["--job-id", "x1"], "no job id"),
    ([], "no job id"),
    (["--job-id", "1", "--dispatch", "novalue"], "expected NAME=VALUE"),
    (["--job-id", "1", "--grace", "-1"], "--grace must be"),
])
def test_usage_errors_are_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          argv: list[str], message: str) -> None:
    code = main(["run", "--pair", "p", "--period", "1", "--gpus", "1", "--root",
                 str(tmp_path), *argv, "--", "true"])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "p-1gpu").exists()


def test_no_command_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--pair", "p", "--period", "1", "--gpus", "1", "--job-id", "1"]) == 2
    assert "no command given" in capsys.readouterr().err


def test_a_command_that_cannot_start_is_127(tmp_path: Path) -> None:
    assert main([*run_args(tmp_path, "5013", "--"), str(tmp_path / "no-such-program")]) == 127
    assert _trial(tmp_path, "5013")["invocation"]["exit_code"] == 127


def test_a_signal_that_reaches_the_wrapper_after_its_command_died_is_recorded(
        tmp_path: Path) -> None:
    """scancel signals every process of the job: the command may die of its SIGTERM before
    the wrapper's own arrives. The command here exits 143 and the wrapper is signalled
    (by this test, from outside it) just after; the record still says SIGTERM was
    received."""
    marker = tmp_path / "exiting"
    code = f"import os, pathlib; pathlib.Path({str(marker)!r}).touch(); os._exit(143)"
    wrapper = start_auditor([*run_args(tmp_path, "5011", "--"), sys.executable, "-c", code],
                            clean_env())
    try:
        wait_for(marker.exists, 30)
        time.sleep(0.05)
        wrapper.send_signal(signal.SIGTERM)
        wrapper.communicate(timeout=30)
    finally:
        wrapper.kill()
    assert wrapper.returncode == 143
    trial = _trial(tmp_path, "5011")
    assert trial["invocation"]["received_signal"] == "SIGTERM"
    assert trial["status"] == "signalled"


_LATE_SIGNAL = """
import os, signal, sys
from pathlib import Path
from auditor.capture.launch import RunSpec, run
child = "import os, signal; os.kill(os.getppid(), signal.SIGTERM)"
spec = RunSpec("pair", 1, 2, (sys.executable, "-c", child), attempt_dir=Path(sys.argv[1]),
               job_id="5101")
result = run(spec, {}, keep_trapped=sys.argv[2] == "keep")
os.kill(os.getpid(), signal.SIGTERM)  # (a late one: the batch script's, forwarded)
print(result.exit_status, flush=True)
sys.exit(result.exit_status)
"""


def test_a_signal_after_the_trial_record_leaves_the_exit_status_the_records(
        tmp_path: Path) -> None:
    """Under Slurm a second SIGTERM (the batch script's forwarded one) may reach the
    wrapper after its trial record is written; with the trapped signals kept (the
    command's own process), it is ignored and the process exits with the status its
    record states. Given back their handlers (a library caller's: here the default), the
    same signal ends the process, as it made the command exit 130 where its record said
    143 (seen in a real-Slurm run: sacct 2:0 for the time-limited element)."""
    import subprocess

    import orjson

    kept = subprocess.run([sys.executable, "-c", _LATE_SIGNAL, str(tmp_path / "kept"), "keep"],
                          capture_output=True, text=True, timeout=60)
    record = orjson.loads((tmp_path / "kept" / "trial-5101.json").read_bytes())
    assert record["signals_received"] == ["SIGTERM"]
    assert kept.returncode == record["invocation"]["exit_code"] == int(kept.stdout), kept
    given_back = subprocess.run([sys.executable, "-c", _LATE_SIGNAL, str(tmp_path / "back"),
                                 "restore"], capture_output=True, text=True, timeout=60)
    assert given_back.returncode == -15 and given_back.stdout == ""


def test_the_command_keeps_its_trapped_signals_and_a_library_caller_gets_them_back(
        tmp_path: Path) -> None:
    """``auditor run`` as its own process (the console entry) keeps the signals trapped
    to its exit; ``main([...])`` in a caller's process gives them back."""
    import subprocess

    spy = ("import sys, auditor.capture.launch as launch\n"
           "from auditor import _cli\n"
           "real = launch.run\n"
           "def run(spec, environ=None, keep_trapped=False):\n"
           "    print('keep_trapped', keep_trapped, file=sys.stderr)\n"
           "    return real(spec, environ, keep_trapped)\n"
           "launch.run = run\n"
           "sys.argv = ['auditor', *sys.argv[1:]]\n"
           "_cli.entry()\n")
    command = subprocess.run([sys.executable, "-c", spy, *run_args(tmp_path, "5102"), "--",
                              "true"], capture_output=True, text=True, timeout=60)
    assert command.returncode == 0 and "keep_trapped True" in command.stderr, command
    before = signal.getsignal(signal.SIGTERM)
    assert main([*run_args(tmp_path, "5103"), "--", "true"]) == 0
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize(("script", "protocol", "where"), [
    ("echo training finished", None, None),
    ("echo 'step:1 - training/global_step:1 - actor/loss:0.1'", None, "training-{job}.log:2"),
    ("echo 'done with step 1'", {"terminal_event": {"pattern": r"done with step (?P<step>\d+)"}},
     "training-{job}.log:2"),
    ('mkdir -p "$AUDITOR_ATTEMPT_DIR/worker-logs" && echo "step:1 - training/global_step:1" '
     '> "$AUDITOR_ATTEMPT_DIR/worker-logs/h1-rank0.out"', None, "worker-logs/h1-rank0.out:1"),
    # contract v1.2: a preset, its veto, and a metrics file's record
    ("echo '[rank0]:[titan] t - root - INFO - step:  1  loss:  2.89959'",
     {"terminal_event": {"preset": "torchtitan"}}, "training-{job}.log:2"),
    ("echo '[rank0]:[titan] t - root - INFO - step:  1  loss:  2.89959'; "
     "echo 'Ran out of data; last step was canceled.'",
     {"terminal_event": {"preset": "torchtitan"}}, None),
    ('mkdir -p "$AUDITOR_ATTEMPT_DIR/metrics" && echo \'{"global_step": 1, "max_steps": 1}\' '
     '> "$AUDITOR_ATTEMPT_DIR/metrics/trainer_state.json"',
     {"terminal_event": {"preset": "hf-trainer"}}, "metrics/trainer_state.json:1"),
    ('mkdir -p "$AUDITOR_ATTEMPT_DIR/metrics" && echo \'{"global_step": 1, "max_steps": 9}\' '
     '> "$AUDITOR_ATTEMPT_DIR/metrics/trainer_state.json"',
     {"terminal_event": {"preset": "hf-trainer"}}, None),
    # (the final metrics record, a marker, after an early stop the state shows: not taken)
    ("echo \"{'train_runtime': 30.17, 'epoch': 1.0}\"",
     {"terminal_event": {"preset": "hf-trainer", "marker": True}}, "training-{job}.log:2"),
    ('mkdir -p "$AUDITOR_ATTEMPT_DIR/metrics" && echo \'{"global_step": 0, "max_steps": 9}\' '
     "> \"$AUDITOR_ATTEMPT_DIR/metrics/trainer_state.json\"; "
     "echo \"{'train_runtime': 30.17, 'epoch': 1.0}\"",
     {"terminal_event": {"preset": "hf-trainer", "marker": True}}, None),
])
def test_the_launcher_checks_a_clean_exit_for_its_terminal_event(
        tmp_path: Path, script: str, protocol: dict[str, Any] | None, where: str | None) -> None:
    """Contract v1.2: at the command's end ``auditor run`` looks for the terminal event with
    the audit's own matcher (the root's protocol's pattern when it gives one), in its log,
    the worker logs and the traces; a clean exit without it is recorded as seed 002's
    launcher recorded it. The exit code stays the command's."""
    if protocol is not None:
        (tmp_path / "protocol.json").write_text(json.dumps(protocol))
    job = "5201"
    assert main([*run_args(tmp_path, job, "--dispatch", "TOTAL_TRAINING_STEPS=1", "--"),
                 "sh", "-c", script]) == 0
    trial = _trial(tmp_path, job)
    if where is None:
        assert (trial["status"], trial["validation_error"]) == (
            "infrastructure_invalid",
            "ValueError: Successful exit lacks the exact 1-step terminal event")
        assert trial["terminal_event"] is None
    else:
        assert (trial["status"], trial["validation_error"]) == ("completed", None)
        assert trial["terminal_event"] == where.format(job=job)
    assert trial["invocation"]["exit_code"] == 0


def test_only_the_ray_session_this_run_started_is_kept(tmp_path: Path) -> None:
    """Contract v1.2: ``auditor run`` copies the worker logs of the Ray session its command
    started (Ray names a session for the process that started it) and nothing of another
    job's session on the node; without one, a note in the trial record, not a failure."""
    base = tmp_path / "rt"
    other = base / "ray" / "session_2026-12-06_00-00-00_000001_999999" / "logs"
    other.mkdir(parents=True)
    (other / "worker-aa11-ffffffff-4242.out").write_text("another job's worker\n")
    script = ('d="$RAY_TMPDIR/ray/session_2026-12-06_00-00-01_000002_$$/logs"; mkdir -p "$d"; '
              'echo "step:1 - training/global_step:1" > "$d/worker-bb22-01000000-777.out"; '
              'echo warn > "$d/worker-bb22-01000000-777.err"')
    env = {"RAY_TMPDIR": str(base), "PATH": os.environ["PATH"]}
    from auditor.capture.launch import RunSpec, run

    result = run(RunSpec("p", 1, 1, ("sh", "-c", script), root=tmp_path / "study",
                         dispatch=(("TOTAL_TRAINING_STEPS", "1"),), job_id="5302"), env)
    trial = load(result.trial_path)
    host = trial["hostname"]
    assert trial["worker_logs"]["kept"] == [f"worker-logs/{host}-777.err",
                                            f"worker-logs/{host}-777.out"]
    assert trial["status"] == "completed"  # (the worker's line is the terminal event)
    assert trial["terminal_event"] == f"worker-logs/{host}-777.out:1"
    quiet = run(RunSpec("p", 1, 1, ("true",), root=tmp_path / "study", job_id="5303"), env)
    assert load(quiet.trial_path)["worker_logs"] == {
        "kept": [], "notes": [f"no worker logs: no Ray session of this run under {base / 'ray'}, "
                              "no torchrun --log-dir"]}


def test_the_example_trainer_starts_a_rank_per_gpu(tmp_path: Path) -> None:
    """``auditor run --gpus 3`` exports ``AUDITOR_GPUS``: the example trainer starts three
    ranks (it started two whatever ``--gpus`` said), each with its trace and device file."""
    assert main([*run_args(tmp_path, "5401", "--dispatch", "TOTAL_TRAINING_STEPS=1", "--",
                           gpus=3), *EXAMPLE, "--mode", "completed"]) == 0
    attempt = attempt_of(tmp_path, "5401", gpus=3)
    assert len(list((attempt / "allocator-traces").glob("*.jsonl"))) == 3
    assert len(list((attempt / "device-evidence").glob("*.json"))) == 3



def _hopper(beat: Path, *, every_session: bool = False, pause: float = 0.002) -> str:
    """A program that ignores SIGTERM, leaves its session and moves to a new pid every few
    milliseconds (each fork's parent exits), beating ``beat`` at each fork; it ends itself
    20 s later, should it escape. ``every_session``: each new pid leaves its session too
    (a process group of its own each time: no group's signal reaches the next)."""
    return ("import os, signal, sys, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "end = time.monotonic() + 20\n"
            "if os.fork(): sys.exit(0)\n"
            "os.setsid()\n"
            "while time.monotonic() < end:\n"
            "    if os.fork(): os._exit(0)\n"
            + ("    os.setsid()\n" if every_session else "")
            + f"    with open({str(beat)!r}, 'a') as f: f.write('.')\n"
            f"    time.sleep({pause})\n")


@pytest.mark.parametrize("drain", [("--drain", "0.3"), ()], ids=["drain-0.3", "drain-default"])
def test_a_grandchild_that_keeps_forking_is_ended_all_the_same(tmp_path: Path,
                                                               drain: tuple[str, ...]) -> None:
    """A descendant that ignores SIGTERM and moves to a new pid every few milliseconds (each
    fork's parent exits) is not outrun by the end of the command: it is ended, though no
    look at ``/proc`` may find it, through its process group. (It beats a file at each
    fork, which shows whether it lives on; should it escape, it ends itself 20 s later.)"""
    beat = tmp_path / "beat"
    hop = _hopper(beat)
    code = ("import os, subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
            f"{hop!r}]); end = time.monotonic() + 10\n"
            f"while not os.path.exists({str(beat)!r}) and time.monotonic() < end: "
            "time.sleep(0.01)\n"
            "print('started', flush=True)")
    assert main([*run_args(tmp_path, "5013", *drain, "--"), sys.executable, "-c", code]) == 0
    assert beat.stat().st_size > 0  # (it was hopping)
    time.sleep(0.2)
    size = beat.stat().st_size
    time.sleep(0.5)
    assert beat.stat().st_size == size, "a descendant of the command outlived the wrapper"
    log = (attempt_of(tmp_path, "5013") / "training-5013.log").read_text()
    assert "SIGKILL" in log


@pytest.mark.parametrize("pause", [0.002, 0.0], ids=["every-2ms", "at-once"])
def test_a_descendant_that_leaves_its_session_at_every_fork_is_ended(tmp_path: Path,
                                                                     pause: float) -> None:
    """A descendant that moves to a new pid and a new session (so a new process group) at
    every fork, as fast as it can or every 2 ms: no group's signal reaches its next pid, and
    a look over all of ``/proc`` takes longer than its hop. Each orphaned pid is the
    wrapper's child (a subreaper's), and the wrapper's own list of children is read and
    SIGKILLed faster than it hops: it is ended all the same."""
    beat = tmp_path / "beat"
    hop = _hopper(beat, every_session=True, pause=pause)
    code = ("import os, subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
            f"{hop!r}]); end = time.monotonic() + 10\n"
            f"while not os.path.exists({str(beat)!r}) and time.monotonic() < end: "
            "time.sleep(0.01)\n"
            "print('started', flush=True)")
    assert main([*run_args(tmp_path, "5018", "--drain", "0.3", "--"), sys.executable, "-c",
                 code]) == 0
    assert beat.stat().st_size > 0  # (it was hopping)
    time.sleep(0.2)
    size = beat.stat().st_size
    time.sleep(0.5)
    assert beat.stat().st_size == size, "a descendant of the command outlived the wrapper"


def test_a_last_line_without_its_newline_keeps_a_line_of_its_own(tmp_path: Path) -> None:
    """The wrapper's closing note follows the command's unfinished last line on a line of
    its own (glued to it before)."""
    assert main([*run_args(tmp_path, "5014", "--"), "printf", "step:1 - last"]) == 0
    log = (attempt_of(tmp_path, "5014") / "training-5014.log").read_text().splitlines()
    assert log[-2:] == ["step:1 - last", "[auditor run] command exited 0"], log


def test_a_command_that_closes_its_output_mid_line_holds_no_note_back(tmp_path: Path) -> None:
    """Notes wait for the end of a line of the command's only while its output may still
    bring one: once it closed its output, the grace's note is written as it happens."""
    code = ("import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "sys.stdout.write('half'); sys.stdout.flush(); os.close(1); os.close(2); "
            "time.sleep(10)")
    wrapper = start_auditor([*run_args(tmp_path, "5015", "--grace", "3", "--"),
                             sys.executable, "-c", code], clean_env())
    log_path = attempt_of(tmp_path, "5015") / "training-5015.log"
    wait_for(lambda: log_path.exists() and b"half" in log_path.read_bytes(), 30)
    time.sleep(0.3)
    wrapper.send_signal(signal.SIGTERM)
    wait_for(lambda: b"received SIGTERM" in log_path.read_bytes(), 1.5)  # (not at the kill)
    wrapper.communicate(timeout=60)
    assert log_path.read_text().splitlines()[1:3] == [
        "half", "[auditor run] received SIGTERM; forwarded to process group "
        + log_path.read_text().split("forwarded to process group ", 1)[1].split("\n")[0]]


def test_a_group_seen_once_is_ended_however_long_the_drain(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """The forking descendant is seen while the command runs, and never again (every later
    look at ``/proc`` misses it, as one that keeps forking may): its process group is still
    signalled at the end of a drain longer than any freshness (a group is let go only once a
    look finds it empty)."""
    from auditor.capture import supervise

    beat = tmp_path / "beat"
    real, started, command = supervise._processes, time.monotonic(), [0]

    def hiding() -> dict[int, tuple[int, str, int, int]]:
        table = real()
        if time.monotonic() - started < 2.2:
            return table
        return {pid: value for pid, value in table.items()
                if value[2] in (os.getpgrp(), command[0])}

    real_start = supervise.start

    def start(*args: Any) -> Any:
        process = real_start(*args)
        command[0] = process.pid
        return process

    monkeypatch.setattr(supervise, "_processes", hiding)
    monkeypatch.setattr(supervise, "start", start)
    hop = _hopper(beat)
    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
            f"{hop!r}]); time.sleep(2.5); print('started', flush=True)")
    assert main([*run_args(tmp_path, "5016", "--drain", "6", "--"), sys.executable, "-c",
                 code]) == 0
    time.sleep(0.2)
    size = beat.stat().st_size
    time.sleep(0.5)
    assert beat.stat().st_size == size, "a descendant of the command outlived the wrapper"


def test_a_group_a_descendant_joined_is_not_the_commands(tmp_path: Path) -> None:
    """A descendant that joins another process group of the wrapper's session (one this
    test made, standing for the batch script's other work) is ended on its own; that group
    is never signalled: its other member lives on."""
    import subprocess

    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                 process_group=0)
    try:
        code = ("import os, signal, subprocess, sys; subprocess.Popen([sys.executable, '-c', "
                "'import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                f"os.setpgid(0, {bystander.pid}); time.sleep(60)']); print('started')")
        assert main([*run_args(tmp_path, "5017", "--drain", "0.3", "--"), sys.executable, "-c",
                     code]) == 0
        time.sleep(0.2)
        assert bystander.poll() is None, "the wrapper signalled a group that is not the command's"
    finally:
        bystander.kill()
        bystander.wait()


def test_the_protocols_flag_is_the_runs_as_it_is_the_audits(tmp_path: Path) -> None:
    """The audit classifies the controller's 143 by the protocol's coordinated_shutdown_flag;
    ``auditor run`` read only its own default: a run the audit resolves exited 143, which
    the batch script takes as a reason to requeue finished training (seed 000)."""
    (tmp_path / "protocol.json").write_text(json.dumps(
        {"schema": "run-evidence/protocol/v1", "coordinated_shutdown_flag": "MY_FLAG"}))
    code = main([*run_args(tmp_path, "5011", "--role", "controller", "--dispatch",
                           "MY_FLAG=1", "--"), *EXAMPLE, "--mode", "coordinated"])
    assert code == 0
    assert _trial(tmp_path, "5011")["env"] == {"MY_FLAG": "1"}
    code = main([*run_args(tmp_path, "5012", "--role", "controller", "--dispatch",
                           f"{FLAG}=1", "--"), *EXAMPLE, "--mode", "coordinated"])
    assert code == 143  # (the default's name is not this protocol's flag)
    # (read by the audit's own reader: a protocol it cannot use, with a byte-order mark, gives
    # the default flag; an empty name is a flag never on)
    (tmp_path / "protocol.json").write_bytes(b"\xef\xbb\xbf" + json.dumps(
        {"schema": "run-evidence/protocol/v1", "coordinated_shutdown_flag": "MY_FLAG"}).encode())
    code = main([*run_args(tmp_path, "5013", "--role", "controller", "--dispatch",
                           "MY_FLAG=1", "--"), *EXAMPLE, "--mode", "coordinated"])
    assert code == 143
    (tmp_path / "protocol.json").write_text(json.dumps(
        {"schema": "run-evidence/protocol/v1", "coordinated_shutdown_flag": ""}))
    code = main([*run_args(tmp_path, "5014", "--role", "controller", "--dispatch",
                           f"{FLAG}=1", "--"), *EXAMPLE, "--mode", "coordinated"])
    assert code == 143


def test_a_log_that_cannot_take_the_output_never_ends_the_run(tmp_path: Path) -> None:
    """A full disk (here: the wrapper's file-size limit, which makes each write past 24 KiB
    fail as a full disk would) drops output, counted and said; the command runs to its end
    and the trial record is written (the wrapper exited 2 and its guardian killed a healthy
    trainer)."""
    import resource
    import subprocess

    script = ('import sys; [print("step line", i, "y" * 5000, flush=True) for i in range(12)]; '
              f'open({str(tmp_path / "finished")!r}, "w").write("yes")')

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # (EFBIG, as ENOSPC, not a signal)
        resource.setrlimit(resource.RLIMIT_FSIZE, (24 << 10, 24 << 10))

    run = subprocess.run([sys.executable, "-m", "auditor", *run_args(tmp_path, "5301"), "--",
                          sys.executable, "-c", script], env=clean_env(),
                         capture_output=True, text=True, timeout=120, preexec_fn=limited,
                         check=False)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "finished").read_text() == "yes"
    trial = _trial(tmp_path, "5301")
    assert trial["log_lost"]["bytes"] > 0 and trial["log_lost"]["error"]
    assert trial["invocation"]["exit_code"] == 0


def test_a_trial_record_the_disk_cannot_take_goes_to_the_batch_log_and_the_run_ends_as_its_command(
        tmp_path: Path) -> None:
    """A full disk as the run ends (here: a file-size limit the log's few bytes are under and
    the record is over): the record was lost whole and the run exited 2, which a batch
    script's retry reads as a failure (a finished run requeued). The record now goes to
    stderr (the batch log), one JSON line, and the run exits as its command did."""
    import resource
    import subprocess

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # (EFBIG, as ENOSPC, not a signal)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 10, 1 << 10))

    run = subprocess.run([sys.executable, "-m", "auditor", *run_args(tmp_path, "5305"), "--",
                          "sh", "-c", "echo trained"], env=clean_env(), capture_output=True,
                         text=True, timeout=120, preexec_fn=limited, check=False)
    assert run.returncode == 0, run.stderr
    said = run.stderr.splitlines()
    at = next(i for i, line in enumerate(said) if "trial record could not be written" in line)
    assert "the command's own exit, 0, is passed on" in said[at]
    record = json.loads(said[at + 1])
    assert record["schema"] == "run-evidence/trial/v1" and record["job_id"] == "5305"
    assert record["invocation"]["exit_code"] == 0
    assert not (attempt_of(tmp_path, "5305") / "trial-5305.json").exists()


def test_a_worker_log_that_cannot_be_copied_leaves_no_piece_and_the_record(
        tmp_path: Path) -> None:
    """A Ray worker log larger than the attempt's disk takes (here: a file-size limit): the
    copy cut short is removed (it was left, and its room was the trial record's), a note
    says why, and the trial record is written."""
    import resource
    import subprocess

    script = ('ulimit -f unlimited; '  # (the worker writes its log whole: the limit is the kit's)
              'd="$RAY_TMPDIR/ray/session_2026-12-06_00-00-01_000002_$$/logs"; mkdir -p "$d"; '
              'head -c 200000 /dev/zero | tr "\\0" x > "$d/worker-bb22-01000000-777.out"; '
              'echo "step:1 - training/global_step:1"')

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, resource.RLIM_INFINITY))

    run = subprocess.run([sys.executable, "-m", "auditor", *run_args(tmp_path, "5304"),
                          "--dispatch", "TOTAL_TRAINING_STEPS=1", "--", "sh", "-c", script],
                         env=clean_env(RAY_TMPDIR=str(tmp_path / "rt")), capture_output=True,
                         text=True, timeout=120, preexec_fn=limited, check=False)
    assert run.returncode == 0, run.stderr
    trial = _trial(tmp_path, "5304")
    assert trial["worker_logs"]["kept"] == []
    assert "not kept as worker-logs/" in trial["worker_logs"]["notes"][0]
    assert not list((attempt_of(tmp_path, "5304") / "worker-logs").glob("*"))


def test_a_log_removed_while_the_command_ran_is_said(tmp_path: Path) -> None:
    """The training log removed mid-run: its lines are gone, and the trial record says so
    (it said only that the terminal event was missing)."""
    script = 'rm -f "$AUDITOR_ATTEMPT_DIR"/training-*.log; echo "step:1 - training/global_step:1"'
    assert main([*run_args(tmp_path, "5305", "--dispatch", "TOTAL_TRAINING_STEPS=1", "--"),
                 "sh", "-c", script]) == 0
    assert _trial(tmp_path, "5305")["log_removed"] is True
    assert "log_removed" not in _trial_of_a_clean_run(tmp_path)


def _trial_of_a_clean_run(tmp_path: Path) -> dict[str, Any]:
    assert main([*run_args(tmp_path, "5306", "--"), "true"]) == 0
    return _trial(tmp_path, "5306")


def test_the_launchers_check_reads_the_protocol_as_the_audit_does(tmp_path: Path) -> None:
    """A protocol the audit cannot use (a byte-order mark: the audit's reader refuses it and
    applies its defaults) gives the kit's check the defaults too: verl's line is the end,
    not the unusable file's torchtitan matcher (its own json.loads took the file)."""
    (tmp_path / "protocol.json").write_bytes(b"\xef\xbb\xbf" + json.dumps(
        {"schema": "run-evidence/protocol/v1",
         "terminal_event": {"preset": "torchtitan"}}).encode())
    assert main([*run_args(tmp_path, "5307", "--dispatch", "TOTAL_TRAINING_STEPS=1", "--"),
                 "sh", "-c", "echo 'step:1 - training/global_step:1'"]) == 0
    trial = _trial(tmp_path, "5307")
    assert (trial["status"], trial["terminal_event"]) == ("completed", "training-5307.log:2")


def test_a_kept_ray_log_of_a_host_ending_in_letters_is_no_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review U: on a node named ``della-l01g3`` the Ray log the run keeps,
    ``della-l01g3-777.out``, reads as a ``--step``'s output (host ``della``, role ``l01g3``)
    without its record; the batch run then exited 1, ``process_failure``, for a run that
    completed. The logs the run kept itself are never steps, and a step's host must be one
    the attempt names (this node's among them)."""
    import socket

    monkeypatch.setattr(socket, "gethostname", lambda: "della-l01g3")
    base = tmp_path / "rt"
    script = ('d="$RAY_TMPDIR/ray/session_2026-12-06_00-00-01_000002_$$/logs"; mkdir -p "$d"; '
              'echo "step:1 - training/global_step:1" > "$d/worker-bb22-01000000-777.out"')
    env = {"RAY_TMPDIR": str(base), "PATH": os.environ["PATH"]}
    from auditor.capture.launch import RunSpec, run

    result = run(RunSpec("p", 1, 1, ("sh", "-c", script), root=tmp_path / "study",
                         dispatch=(("TOTAL_TRAINING_STEPS", "1"),), job_id="5304"), env)
    trial = load(result.trial_path)
    assert trial["worker_logs"]["kept"] == ["worker-logs/della-l01g3-777.out"]
    assert (trial["status"], trial["invocation"]["exit_code"]) == ("completed", 0), trial


def test_a_library_callers_own_child_is_left_alone(tmp_path: Path) -> None:
    """Review V: ``auditor run`` called in-process while the caller starts a child of its
    own (another thread, after the command started): the wrapper took that child for an
    orphan of the command's, SIGTERMed it, reaped it (the caller's ``poll()`` then said 0)
    and recorded it as outlived. Only the command's own are the wrapper's to end."""
    import subprocess
    import threading

    mine: list[subprocess.Popen[bytes]] = []

    def helper() -> None:
        time.sleep(0.5)  # (the command runs by now)
        mine.append(subprocess.Popen(["sleep", "30"]))

    thread = threading.Thread(target=helper)
    thread.start()
    try:
        assert main([*run_args(tmp_path, "5019", "--drain", "0.3", "--"), "sh", "-c",
                     "sleep 1.5; echo done"]) == 0
        thread.join()
        assert mine[0].poll() is None, "the caller's child was ended"
        assert _trial(tmp_path, "5019")["outlived"] == []
    finally:
        thread.join()
        for child in mine:
            child.kill()
            child.wait()
