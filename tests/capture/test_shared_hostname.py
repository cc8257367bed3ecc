"""Nodes that report one hostname, each running its command in a pid namespace of its own
(containers with a fixed hostname, ``localhost``): their processes have equal hosts and pids,
so the kit's names (``<host>-<pid>``, contract v1.2) coincide. The kit never appends to,
replaces or renames over another process's file of its own name (it says so in one line), and
``auditor seal`` never lists one of two such workers and drops the other unsaid."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import textwrap
from pathlib import Path

import pytest

from auditor._cli import main
from auditor.capture import Trace, record_exit, write_device_evidence
from auditor.capture.trace import trace_path
from tests.capture.support import (
    COMMIT,
    EXAMPLE,
    attempt_of,
    auditor,
    clean_env,
    lines,
    load,
    namespaces,
    python,
    run_args,
)

pytestmark = pytest.mark.slow  # (real child processes)

HOST = socket.gethostname().split(".", 1)[0]
PAIR = "host-m-gsm8k-c2-s1"
TAKEN = "written by another process of the same host name and pid"


@pytest.fixture(autouse=True)
def _no_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith(("SLURM_", "AUDITOR_")):
            monkeypatch.delenv(key)


def _other_nodes(path: Path, text: str) -> bytes:
    """Put the file another node (same hostname, same pid) wrote at ``path``; its bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path.read_bytes()


def test_a_trace_of_another_process_of_this_host_and_pid_is_never_appended_to(
        tmp_path: Path) -> None:
    path = trace_path(tmp_path, os.getpid())
    before = _other_nodes(path, json.dumps({"pid": os.getpid(), "rank": 0, "host": HOST,
                                            "role": "rank", "seq": 0, "phase": "init_model"})
                          + "\n")
    with pytest.raises(FileExistsError, match=TAKEN):
        Trace(tmp_path, rank=1, role="rank")
    assert path.read_bytes() == before
    mine = tmp_path / "mine"
    with Trace(mine, rank=1) as trace:  # (its own trace, reopened by itself: appended to)
        trace.sample()
    with Trace(mine, rank=1) as trace:
        trace.sample()
    assert len(lines(trace_path(mine, os.getpid()))) == 2


def test_a_device_file_of_another_process_of_this_host_and_pid_is_never_replaced(
        tmp_path: Path) -> None:
    path = tmp_path / "device-evidence" / f"worker-rank-0-{HOST}-{os.getpid()}.json"
    before = _other_nodes(path, json.dumps({"role": "rank", "rank": 0, "pid": os.getpid(),
                                            "hostname": HOST}))
    with pytest.raises(FileExistsError, match=TAKEN):
        write_device_evidence(tmp_path, rank=0, role="rank")
    assert path.read_bytes() == before
    assert not [p for p in path.parent.iterdir() if p != path]  # (no temporary left)


def test_another_nodes_provisional_process_record_is_never_replaced(tmp_path: Path) -> None:
    """A wrapper told to end writes a provisional record; another node's wrapper of the same
    hostname, role and pid ending then must not replace it with its own."""
    done = python(f"""
        from auditor.capture import record_exit
        print(record_exit("rank", 4242, None, host="trainer", attempt_dir={str(tmp_path)!r},
                          received_signal="SIGTERM", provisional=True))
    """, clean_env())
    assert done.returncode == 0, done.stderr
    path = Path(done.stdout.strip())
    before = path.read_bytes()
    with pytest.raises(FileExistsError, match=TAKEN):
        record_exit("rank", 4242, 0, host="trainer", attempt_dir=tmp_path)
    assert path.read_bytes() == before
    record_exit("rank", 4243, None, host="trainer", attempt_dir=tmp_path,
                provisional=True)  # (its own provisional one: still replaced)
    assert load(record_exit("rank", 4243, 0, host="trainer", attempt_dir=tmp_path)
                )["exit_code"] == 0


def test_a_step_whose_output_name_another_node_holds_says_so_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    attempt = tmp_path / "attempt"
    taken = attempt / "worker-logs" / f"{HOST}-rank-{os.getpid()}.out"
    before = _other_nodes(taken, "the other node's output\n")
    monkeypatch.setenv("AUDITOR_ATTEMPT_DIR", str(attempt))
    assert main(["run", "--step", "rank", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert TAKEN in err and str(taken) in err and len(err.strip().splitlines()) == 1
    assert taken.read_bytes() == before


def _attempt(root: Path) -> Path:
    assert main([*run_args(root, "5001", "--"), *EXAMPLE]) == 0
    return attempt_of(root, "5001")


def _seal(root: Path, attempt: Path) -> int:
    return main(["seal", str(root), "--pair", PAIR, "--period", "1", "--gpus", "2",
                 "--attempt-dir", attempt.relative_to(root).as_posix(), "--commit", COMMIT])


def test_seal_refuses_two_device_files_of_one_host_and_pid_naming_both(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two nodes of one hostname, each with its pid 6 as rank 0 and rank 1: two device files
    for one (host, pid). Listing one worker would drop the other unsaid."""
    attempt = _attempt(tmp_path)
    first = sorted((attempt / "device-evidence").iterdir())[0]
    document = load(first)
    second = first.with_name(first.name.replace("-0-", "-7-", 1))
    second.write_text(json.dumps({**document, "rank": 7}))
    capsys.readouterr()
    assert _seal(tmp_path, attempt) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"device-evidence/{first.name} (role actor_rollout, rank 0)" in err
    assert f"device-evidence/{second.name} (role actor_rollout, rank 7)" in err
    assert f"pid {document['pid']} on host {HOST}" in err and "not sealed" in err
    assert not (tmp_path / "pairs").exists()


def test_one_process_whose_trace_and_device_file_disagree_is_sealed_for_the_audit_to_judge(
        tmp_path: Path) -> None:
    """A trace that kept the default role beside a device file that says ``policy``: one
    process labelled two ways, not two processes; the seal lists it once (as it did), and the
    audit's identity checks judge it (the seal's refusal is for two device files, or one
    trace, naming two)."""
    attempt = _attempt(tmp_path)
    device = sorted((attempt / "device-evidence").iterdir())[0]
    document = load(device)
    device.write_text(json.dumps({**document, "role": "policy"}))
    assert _seal(tmp_path, attempt) == 0
    (record,) = (tmp_path / "pairs").glob("*/period-1.json")
    workers = json.loads(record.read_text())["workers"]
    assert sum(1 for w in workers if w["pid"] == document["pid"]) == 1, workers


def test_seal_refuses_one_trace_two_processes_wrote_naming_both_lines(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    attempt = _attempt(tmp_path)
    trace = sorted((attempt / "allocator-traces").iterdir())[0]
    records = lines(trace)
    first = next(r for r in records if "phase" in r)
    with trace.open("a") as handle:  # (the other node's rank, appending to the same name)
        handle.write(json.dumps({**first, "rank": 7, "seq": 0}) + "\n")
    capsys.readouterr()
    assert _seal(tmp_path, attempt) == 2
    err = capsys.readouterr().err.strip()
    assert f"{trace.name} line {len(records) + 1} (role actor_rollout, rank 7)" in err
    assert "two processes of one hostname and pid" in err and len(err.splitlines()) == 1


TRAINER = """
import sys, time
from auditor.capture import Trace, write_device_evidence
from auditor.capture.memory import Memory
rank = int(sys.argv[1])
with Trace(rank=rank, role="rank", memory=Memory(probe=False)) as trace:
    for phase, step in (("init_model", 0), ("actor_update", 1), ("weight_sync", 1)):
        with trace.phase(phase, step):
            time.sleep(0.05)
    trace.terminal(1)
    write_device_evidence(rank=rank, role="rank", local_device=0, trace=trace)
print(f"step:1 - training/global_step:1 - rank {rank}", flush=True)
"""


def test_two_nodes_of_one_hostname_in_own_pid_namespaces_never_share_a_file(
        tmp_path: Path) -> None:
    """Two "nodes" (own UTS and pid namespace, one file system), both named ``trainer``,
    each ``auditor run --step rank`` around a trainer of the same pid. The second node is
    refused in one line naming the file; no trace holds two processes' records, and the seal
    never lists one worker of two unsaid."""
    unshare = namespaces()
    if unshare is None:
        pytest.skip("no user, UTS and pid namespaces here (unshare)")
    (tmp_path / "trainer.py").write_text(textwrap.dedent(TRAINER))
    node = " ".join([*unshare, "sh", "-c", "'hostname trainer; exec \"$0\" -m auditor run "
                     f"--step rank --rank \"$1\" -- \"$0\" {tmp_path / 'trainer.py'} \"$1\"'"])
    launcher = tmp_path / "launch.sh"
    launcher.write_text(f"""
node() {{ {node} "$PY" "$1"; }}
node 0 & a=$!
sleep 1.5; node 1 & b=$!
wait $a; s0=$?; wait $b; s1=$?
exit $(( s0 | s1 ))
""")
    root = tmp_path / "study"
    done = auditor([*run_args(root, "5001", "--role", "launcher", pair=PAIR), "--", "bash",
                    str(launcher)], env=clean_env(PY=sys.executable), timeout=120)
    attempt = attempt_of(root, "5001")
    log = (attempt / "training-5001.log").read_text()
    assert done.returncode != 0, (done.stderr, log)
    assert TAKEN in log, log
    for trace in (attempt / "allocator-traces").iterdir():
        writers = {(r.get("host"), r.get("role"), r.get("rank")) for r in lines(trace)
                   if "phase" in r}
        assert len(writers) == 1, (trace.name, writers)
    for device in (attempt / "device-evidence").iterdir():  # (none replaced by another's)
        assert f"-{load(device)['rank']}-trainer-" in device.name
    sealed = main(["seal", str(root), "--pair", PAIR, "--period", "1", "--gpus", "2",
                   "--attempt-dir", attempt.relative_to(root).as_posix(), "--commit", COMMIT])
    if sealed == 0:
        record = load(root / "pairs" / PAIR / "period-1.json")
        ranks = {load(d)["rank"] for d in (attempt / "device-evidence").iterdir()}
        assert {w["rank"] for w in record["workers"]} == ranks


PHASE = {"pid": 4242, "rank": 0, "role": "rank", "host": HOST, "seq": 0,
         "phase": "actor_update", "step": 1, "started_ns": 1796556141787839185,
         "finished_ns": 1796556143517034887, "error_type": ""}
"""A phase record of pid 4242's trace on this host."""


def _trace_of_4242(root: Path) -> tuple[Path, Path]:
    """A run's attempt (no trace of its own) and the path of pid 4242's trace in it."""
    assert main([*run_args(root, "5001", "--"), sys.executable, "-c", "pass"]) == 0
    attempt = attempt_of(root, "5001")
    trace = attempt / "allocator-traces" / f"allocator-{HOST}-4242.jsonl"
    trace.parent.mkdir(exist_ok=True)
    return attempt, trace


def _sealed_in_a_child(root: Path, attempt: Path) -> int:
    """Seal ``attempt`` in a child process; its own peak memory (KB, ``VmHWM``: ru_maxrss
    counts the forking test worker's too). The seal must succeed, listing pid 4242 alone."""
    seal = ["seal", str(root), "--pair", PAIR, "--period", "1", "--gpus", "2",
            "--attempt-dir", attempt.relative_to(root).as_posix(), "--commit", COMMIT]
    done = python(f"""
        import sys
        from auditor._cli import main
        code = main({seal!r})
        with open("/proc/self/status") as status:
            peak = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
        print(code, peak, file=sys.stderr)
    """, clean_env())
    code, peak_kb = map(int, done.stderr.strip().splitlines()[-1].split())
    assert code == 0, done.stderr
    record = load(root / "pairs" / PAIR / "period-1.json")
    assert [(w["role"], w["rank"], w["pid"]) for w in record["workers"]] == [("rank", 0, 4242)]
    return peak_kb


def test_seal_of_a_long_trace_keeps_a_few_phase_records_not_every_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The seal looks at every phase record of a trace for a second (role, rank) of its
    (host, pid), but keeps only what can change its answer: it held each record, parsed,
    at once (here 40,000 among samples, a 16 MB trace: the seal's peak 102 MB, 26 MB before
    it read them all; a 100,000-step run of 64 ranks, gigabytes on the batch node). A second
    rank after them is still refused, naming its line."""
    root = tmp_path / "study"
    attempt, trace = _trace_of_4242(root)
    sample = json.dumps({"pid": 4242, "seq": 0, "sample_ns": 1796556143517034887,
                         "allocated_bytes": None, "reserved_bytes": None,
                         "device_used_bytes": None})
    count = 40_000
    with trace.open("w") as handle:
        for step in range(count):
            handle.write(json.dumps({**PHASE, "seq": step, "step": step}) + "\n" + sample + "\n")
    peak_kb = _sealed_in_a_child(root, attempt)
    assert peak_kb < 60_000, peak_kb  # (the interpreter and the kit: about 30 MB)
    shutil.rmtree(root / "pairs")
    with trace.open("a") as handle:  # (another process's rank 7 after them: still said)
        handle.write(json.dumps({**PHASE, "rank": 7}) + "\n")
    capsys.readouterr()
    assert _seal(root, attempt) == 2
    err = capsys.readouterr().err
    assert f"{trace.name} line 1 (role rank, rank 0)" in err, err
    assert f"{trace.name} line {2 * count + 1} (role rank, rank 7)" in err, err


def test_its_own_files_are_its_own_however_their_directory_is_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process's own device file and trace, written again with the attempt directory named
    otherwise (relative, then absolute as ``auditor run`` exports it, or through ``..``), are
    its own: replaced and appended to, never refused as another process's."""
    monkeypatch.chdir(tmp_path)
    first = write_device_evidence("attempt", rank=0, role="rank")
    again = write_device_evidence(tmp_path / "attempt", rank=0, role="rank")
    assert again.resolve() == first.resolve() and load(again)["rank"] == 0
    with Trace("attempt", rank=0, role="rank") as trace:
        trace.sample()
    with Trace(tmp_path / "attempt" / ".." / "attempt", rank=0, role="rank") as trace:
        trace.sample()
    assert len(lines(trace_path(tmp_path / "attempt", os.getpid()))) == 2


def test_threads_of_one_process_opening_its_trace_at_once_share_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A threaded actor's methods each opening the process's trace at once: every thread gets
    it (the name is this process's), none is refused as another process's. The look at the
    name is slowed, so without the lock both threads find it free and the second's ``O_EXCL``
    fails."""
    import threading
    import time

    from auditor.capture import _files
    from auditor.capture.memory import Memory

    looked = _files.claim_own

    def slowly(path: Path, what: str = "") -> bool:
        mine = looked(path, what)
        time.sleep(0.05)
        return mine

    monkeypatch.setattr(_files, "claim_own", slowly)
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def open_it(step: int) -> None:
        start.wait()
        try:
            with Trace(tmp_path, rank=0, memory=Memory(probe=False)) as trace, \
                    trace.phase("actor_update", step):
                pass
        except BaseException as error:  # (reported below, not lost in the thread)
            errors.append(error)

    threads = [threading.Thread(target=open_it, args=(step,)) for step in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    phases = [r for r in lines(trace_path(tmp_path, os.getpid())) if "phase" in r]
    assert sorted(r["step"] for r in phases) == [0, 1, 2, 3]


def test_seal_of_a_trace_with_a_line_of_no_newline_stops_at_it(tmp_path: Path) -> None:
    """A trace whose second line runs 48 MB without a newline (a writer cut short, a file
    clobbered): the look at its phase records stops at it (no record the audit could read),
    where the line was carried whole from block to block, copied again with each MB read."""
    root = tmp_path / "study"
    attempt, trace = _trace_of_4242(root)
    with trace.open("w") as handle:
        handle.write(json.dumps(PHASE) + "\n")
        for _ in range(48):
            handle.write("x" * (1 << 20))
    peak_kb = _sealed_in_a_child(root, attempt)
    assert peak_kb < 60_000, peak_kb  # (the interpreter and the kit: about 30 MB)


def test_a_write_in_progress_of_another_process_of_this_pid_is_never_written_into(
        tmp_path: Path) -> None:
    """Two writers of one pid (another node of this hostname, or another thread) writing one
    name at once: each writes a temporary of its own, never the other's (which it would
    truncate, fill with its bytes, then rename away from under its writer)."""
    path = tmp_path / "device-evidence" / f"worker-rank-0-{HOST}-{os.getpid()}.json"
    theirs = path.with_name(f".{path.name}.tmp-{os.getpid()}")  # (mid-write, as named before)
    _other_nodes(theirs, '{"role": "rank", "ra')
    written = write_device_evidence(tmp_path, rank=0, role="rank")
    assert theirs.read_text() == '{"role": "rank", "ra'
    assert json.loads(written.read_text())["rank"] == 0
    assert sorted(p.name for p in path.parent.iterdir()) == sorted([path.name, theirs.name])
