"""``diagnostic.md`` written by a forked helper while the other outputs are written
(:mod:`auditor.report.beside`): the same bytes whether it runs, fails, dies or is never
asked for; a helper left running when the writing fails is killed and reaped; the command
asks for one from its own process only."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest

import auditor._cli as cli
import auditor.report.markdown as markdown
import auditor.report.tables as tables
from auditor import AuditOptions, run_audit, write_outputs
from auditor._cli import main
from auditor.model import AuditResult
from tests.helpers import copy_example


@pytest.fixture(scope="module")
def example_result(tmp_path_factory: pytest.TempPathFactory) -> AuditResult:
    return run_audit(copy_example(tmp_path_factory.mktemp("beside")), AuditOptions(jobs=1))


def _outputs(out: Path) -> dict[str, bytes]:
    """Every output's bytes, the manifest's time of making left out."""
    files = {path.relative_to(out).as_posix(): path.read_bytes()
             for path in sorted(out.rglob("*")) if path.is_file()}
    manifest = orjson.loads(files.pop("output_manifest.json"))
    manifest.pop("created_utc")
    files["output_manifest.json"] = orjson.dumps(manifest, option=orjson.OPT_SORT_KEYS)
    return files


def _recorded(monkeypatch: pytest.MonkeyPatch, note: Path,
              misbehave: Callable[[], None] | None = None) -> None:
    """The report's text, written down by the process that makes it (and, in a child
    only, ``misbehave`` first)."""
    parent = os.getpid()
    original = markdown.markdown_chunks

    def chunks(result: AuditResult, outputs: Sequence[str] = ()) -> Iterator[str]:
        with open(note, "a") as handle:
            handle.write(f"{os.getpid()}\n")
        if misbehave is not None and os.getpid() != parent:
            misbehave()
        yield from original(result, outputs)

    monkeypatch.setattr(markdown, "markdown_chunks", chunks)


def _makers(note: Path) -> list[int]:
    return [int(line) for line in note.read_text().split()] if note.exists() else []


def _no_child_left(pids: list[int]) -> None:
    for pid in pids:
        if pid != os.getpid():
            with pytest.raises(ChildProcessError):  # (reaped: not even a zombie)
                os.waitpid(pid, os.WNOHANG)


@pytest.mark.parametrize("plots", [False, True], ids=["no-plots", "plots"])
def test_a_helper_writes_the_report_and_every_output_is_the_same(
        example_result: AuditResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        plots: bool) -> None:
    write_outputs(example_result, tmp_path / "alone", plots=plots)
    _recorded(monkeypatch, tmp_path / "note")
    write_outputs(example_result, tmp_path / "beside", plots=plots, helper=True)
    makers = _makers(tmp_path / "note")
    assert len(makers) == 1 and makers[0] != os.getpid()  # (the child made them)
    _no_child_left(makers)
    assert _outputs(tmp_path / "beside") == _outputs(tmp_path / "alone")
    assert main(["verify", str(tmp_path / "beside")]) == 0


def _raise() -> None:
    raise RuntimeError("the helper failed")


def _killed() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _silent_exit() -> None:
    os._exit(0)  # (no report sent: the file may be half written)


@pytest.mark.parametrize("misbehave", [_raise, _killed, _silent_exit],
                         ids=["raises", "killed", "exits-silently"])
def test_a_failing_helper_leaves_the_file_to_the_writer(
        example_result: AuditResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        misbehave: Callable[[], None]) -> None:
    write_outputs(example_result, tmp_path / "alone", plots=False)
    _recorded(monkeypatch, tmp_path / "note", misbehave)
    write_outputs(example_result, tmp_path / "beside", plots=False, helper=True)
    makers = _makers(tmp_path / "note")
    assert makers[-1] == os.getpid() and len(makers) == 2  # (tried there, then made here)
    _no_child_left(makers)
    assert _outputs(tmp_path / "beside") == _outputs(tmp_path / "alone")
    assert main(["verify", str(tmp_path / "beside")]) == 0


def test_a_helper_still_writing_when_the_writing_fails_is_ended(
        example_result: AuditResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _recorded(monkeypatch, tmp_path / "note", lambda: time.sleep(120))

    def interrupted(*_: Any) -> None:
        deadline = time.monotonic() + 30  # (the child has begun: it wrote its pid)
        while not _makers(tmp_path / "note") and time.monotonic() < deadline:
            time.sleep(0.01)
        raise KeyboardInterrupt

    monkeypatch.setattr(tables, "write_table", interrupted)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        write_outputs(example_result, tmp_path / "out", plots=False, helper=True)
    assert time.monotonic() - started < 60  # (killed, not waited for)
    makers = _makers(tmp_path / "note")
    assert len(makers) == 1 and makers[0] != os.getpid()
    _no_child_left(makers)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["note"]  # (no output, no staging)


def test_a_spilled_result_reads_the_same_in_the_helper(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the child reads the spilled records from the parent's unnamed files, whose offsets
    # the two processes share: only positional reads keep them apart
    monkeypatch.setenv("AUDITOR_SPILL_FROM", "0")
    result = run_audit(copy_example(tmp_path), AuditOptions(jobs=1))
    write_outputs(result, tmp_path / "alone", plots=False)
    _recorded(monkeypatch, tmp_path / "note")
    write_outputs(result, tmp_path / "beside", plots=False, helper=True)
    makers = _makers(tmp_path / "note")
    assert len(makers) == 1 and makers[0] != os.getpid()
    assert _outputs(tmp_path / "beside") == _outputs(tmp_path / "alone")


def test_a_helper_nobody_can_wait_for_leaves_the_file_to_the_writer(
        example_result: AuditResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # (a launcher that ignores SIGCHLD leaves it ignored for what it runs: the system then
    # reaps the helper itself, and its exit status cannot be known)
    write_outputs(example_result, tmp_path / "alone", plots=False)
    _recorded(monkeypatch, tmp_path / "note")
    before = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    try:
        write_outputs(example_result, tmp_path / "beside", plots=False, helper=True)
    finally:
        signal.signal(signal.SIGCHLD, before)
    makers = _makers(tmp_path / "note")
    assert len(makers) == 2 and makers[0] != os.getpid() == makers[1]
    assert _outputs(tmp_path / "beside") == _outputs(tmp_path / "alone")


def test_an_interrupt_as_the_helper_is_forked_ends_it(
        example_result: AuditResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # (the fork holds SIGINT till it is done, then raises it: the child is there by then)
    _recorded(monkeypatch, tmp_path / "note", lambda: time.sleep(120))
    forked: list[int] = []
    fork = os.fork

    def interrupted_fork() -> int:
        pid = fork()
        if pid:
            forked.append(pid)
            os.kill(os.getpid(), signal.SIGINT)
        return pid

    monkeypatch.setattr(os, "fork", interrupted_fork)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        write_outputs(example_result, tmp_path / "out", plots=False, helper=True)
    assert time.monotonic() - started < 60 and len(forked) == 1
    _no_child_left(forked)
    assert sorted(p.name for p in tmp_path.iterdir()) in (["note"], [])  # (no staging left)


def test_the_kept_tables_are_finished_before_the_helper_is_forked(
        example_result: AuditResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # (the report reads the devices table too: a helper that found rows still to write
    # would write them into the file the tables are read from, beside this process)
    kept = example_result.collected.tables
    finished: list[str] = []
    for name, rows in kept.items():
        original = rows.finish

        def finish(name: str = name, original: Callable[[], None] = original) -> None:
            finished.append(name)
            original()

        monkeypatch.setattr(rows, "finish", finish)
    _recorded(monkeypatch, tmp_path / "note",
              lambda: None if set(finished) >= set(kept) else os._exit(3))
    write_outputs(example_result, tmp_path / "beside", plots=False, helper=True)
    makers = _makers(tmp_path / "note")
    assert len(makers) == 1 and makers[0] != os.getpid()  # (the child wrote the report)


def test_the_command_asks_for_a_helper_from_its_own_process_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = copy_example(tmp_path)
    note = tmp_path / "note"
    _recorded(monkeypatch, note)
    monkeypatch.setattr(cli, "HELPER_FROM", 1)  # (the example's 18 periods would not pay)
    # (a test worker that ran others first may hold more than the command's own bound: what
    # is tested here is whose process forks, the bound is tested below)
    monkeypatch.setattr(cli, "HELPER_MOST_RSS", 1 << 40)

    def audit(out: str, *extra: str) -> list[int]:
        note.unlink(missing_ok=True)
        assert main(["audit", str(root), "--out", str(tmp_path / out), "--quiet",
                     "--no-plots", *extra]) in (0, 1)
        return _makers(note)

    assert audit("called") == [os.getpid()]  # (a caller of main: never forked)
    monkeypatch.setattr(cli, "_ONLY_EXITING", True)  # (as the command's entry point sets)
    makers = audit("command")
    assert len(makers) == 1 and makers[0] != os.getpid()
    _no_child_left(makers)
    assert audit("one-job", "--jobs", "1") == [os.getpid()]  # (asked for one process)
    monkeypatch.setattr(cli, "HELPER_FROM", 19)
    assert audit("few", "--jobs", "2") == [os.getpid()]  # (18 periods: too few to pay)
    monkeypatch.setattr(cli, "HELPER_FROM", 1)
    monkeypatch.setattr(cli, "HELPER_MOST_RSS", 1 << 20)  # (this process holds more)
    assert audit("full", "--jobs", "2") == [os.getpid()]
    assert _outputs(tmp_path / "command") == _outputs(tmp_path / "called")


_KILLED_WRITER = """
import os, signal, sys, time
from pathlib import Path

import auditor.report.markdown as markdown
import auditor.report.tables as tables
from auditor import AuditOptions, run_audit, write_outputs

root, out, note = sys.argv[1:4]
result = run_audit(root, AuditOptions(jobs=1))
parent, original = os.getpid(), markdown.markdown_chunks


def chunks(result, outputs=()):
    if os.getpid() != parent:  # (the helper: says who it is, then takes its time)
        Path(note).write_text(str(os.getpid()))
        time.sleep(120)
    yield from original(result, outputs)


def write_table(*_):  # (the writer, once the helper is there: killed outright)
    while not Path(note).exists():
        time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGKILL)


markdown.markdown_chunks, tables.write_table = chunks, write_table
write_outputs(result, Path(out), plots=False, helper=True)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="a lifeline is for forked helpers")
def test_a_helper_ends_with_a_writer_killed_outright(tmp_path: Path) -> None:
    # (the out-of-memory killer, a job's time limit: nothing else would end the helper,
    # which leaves ^C and SIGTERM to its parent)
    note = tmp_path / "note"
    done = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(copy_example(tmp_path)),
                           str(tmp_path / "out"), str(note)], timeout=120, check=False)
    assert done.returncode == -signal.SIGKILL
    helper = int(note.read_text())
    deadline = time.monotonic() + 30
    try:
        while _running(helper):
            assert time.monotonic() < deadline, "the helper outlived its killed writer"
            time.sleep(0.05)
    finally:
        if _running(helper):  # (this test's own stray: never left behind)
            os.kill(helper, signal.SIGKILL)


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie no one has reaped yet is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")
