"""The command line end to end through ``main([...])``: exit codes, one-line errors, outputs."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from auditor._cli import main
from auditor.model import AuditOptions, Finding
from tests.helpers import EXAMPLE, REAL_EVIDENCE, audit, copy_example


def _one_line_error(capsys: pytest.CaptureFixture[str], needle: str) -> None:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    assert needle in err


@pytest.mark.parametrize(("argv", "needle"), [
    (["audit"], "the following arguments are required"),
    (["audit", "/nonexistent/study", "--out", "x"], "does not exist"),
    (["frobnicate"], "invalid choice"),
    (["audit", str(EXAMPLE), "--jobs", "-1"], "--jobs"),
    (["audit", str(EXAMPLE), "--jobs", "99999"], "to 256"),
    (["audit", "/nonexistent/\x1b[31mred"], "/nonexistent/\\x1b[31mred: evidence root"),
    (["--bogus"], "auditor: error: unrecognized arguments: --bogus"),
    (["audit", str(EXAMPLE), "--waive", "AUD201:x"], "needs its own --reason"),
    (["audit", str(EXAMPLE), "--reason", "r"], "--reason TEXT without its --waive"),
    (["audit", str(EXAMPLE), "--waive", "AUD999:x", "--reason", "r"], "unknown rule"),
    (["audit", str(EXAMPLE), "--anchor", "freeze"], "NAME=VALUE"),
    (["audit", str(EXAMPLE), "--anchor", "freeze=abc"], "64 hex"),
    (["audit", str(EXAMPLE), "--source", "x.py"], "--source-root"),
    (["gate", "/nonexistent"], "not found"),
    (["sacct", "/nonexistent.psv"], "cannot read"),
    (["validate", "mystery.bin"], "pass --kind"),
    # (a device such as /dev/zero would be read for ever; /dev/null stands in for it)
    (["validate", "/dev/null", "--kind", "trial"], "not a regular file"),
    (["sacct", "/dev/null"], "not a regular file"),
])
def test_usage_errors_exit_2_with_one_line(argv: list[str], needle: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    _one_line_error(capsys, needle)


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_refused_sacct_dump_is_one_line_whoever_parses_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], jobs: str) -> None:
    """A dump named by --sacct that cannot be read safely stops the audit with one line,
    parsed in this process or (with a pool) in a reader beside the walk."""
    dump = tmp_path / "fixed.txt"
    dump.write_text(
        "       JobID    JobName      State ExitCode \n"
        "------------ ---------- ---------- -------- \n"
        "6001650           train  COMPLETED      0:0 \n")
    assert main(["audit", str(EXAMPLE), "--sacct", str(dump), "--jobs", jobs,
                 "--quiet", "--no-plots"]) == 2
    _one_line_error(capsys, "sacct")


def test_not_a_study_root(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                          monkeypatch: pytest.MonkeyPatch) -> None:
    import auditor.report.plots

    def no_helper() -> None:  # the refusal is at once: no plot helper to start and wait for
        raise AssertionError("a plot helper was started for a root that is not a study")

    monkeypatch.setattr(auditor.report.plots, "Plotter", no_helper)
    (tmp_path / "empty").mkdir()
    assert main(["audit", str(tmp_path / "empty")]) == 2
    _one_line_error(capsys, "no period records")
    (tmp_path / "empty-pairs" / "pairs").mkdir(parents=True)
    (tmp_path / "linked-pairs").mkdir()
    (tmp_path / "linked-pairs" / "pairs").symlink_to(EXAMPLE / "pairs")
    for root in ("empty", "empty-pairs", "linked-pairs"):
        assert main(["audit", str(tmp_path / root), "--out", str(tmp_path / "out")]) == 2
        _one_line_error(capsys, "no period records")
    (tmp_path / "file").write_text("x")
    assert main(["audit", str(tmp_path / "file")]) == 2
    _one_line_error(capsys, "not a directory")


def test_output_directory_rules(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = copy_example(tmp_path)
    other = tmp_path / "busy"
    other.mkdir()
    (other / "thesis.tex").write_text("precious")
    # (a file of the manifest's name that this auditor did not write proves nothing)
    for manifest in (None, b"{}", b'{"schema": "something/else", "outputs": []}', b"\xff"):
        if manifest is not None:
            (other / "output_manifest.json").write_bytes(manifest)
        for force in ([], ["--force"]):
            assert main(["audit", str(root), "--out", str(other), "--quiet", *force]) == 2
            _one_line_error(capsys, "not empty and not an earlier audit")
            assert (other / "thesis.tex").read_text() == "precious"
    assert main(["audit", str(root), "--out", str(root / "report"), "--quiet"]) == 2
    _one_line_error(capsys, "inside the evidence root")
    assert not (root / "report").exists()
    # the output directory is replaced whole: never the one the user is in, nor a link
    here = tmp_path / "here"
    (here / "deeper").mkdir(parents=True)
    (tmp_path / "link").symlink_to(here / "deeper")
    with contextlib.chdir(here / "deeper"):
        for given in (".", "..", str(here)):
            assert main(["audit", str(root), "--out", given, "--quiet"]) == 2
            _one_line_error(capsys, "is the current directory or holds it")
    assert main(["audit", str(root), "--out", str(tmp_path / "link"), "--quiet"]) == 2
    _one_line_error(capsys, "is a symbolic link")
    assert sorted(p.name for p in here.rglob("*")) == ["deeper"]
    # ".." is the directory it names, even after one that does not exist (else that one
    # would be checked, and the other replaced)
    for dotted in (here / "deeper" / "..", here / "deeper" / "new" / ".."):
        (here / "deeper" / "notes.txt").write_text("precious")
        assert main(["audit", str(root), "--out", str(dotted), "--quiet", "--force"]) == 2
        _one_line_error(capsys, "not empty and not an earlier audit")
        assert (here / "deeper" / "notes.txt").read_text() == "precious"
    (here / "deeper" / "notes.txt").unlink()  # ...and written to, once it may be
    assert main(["audit", str(root), "--out", str(here / "deeper" / "new" / ".."), "--quiet",
                 "--no-plots"]) == 0
    assert (here / "deeper" / "diagnostic.md").is_file() and not (here / "deeper" / "new").exists()
    # a relative --out where the working directory is gone: one line, exit 2 (not a bug's 3)
    gone = tmp_path / "gone"
    gone.mkdir()
    with contextlib.chdir(gone):
        gone.rmdir()
        assert main(["audit", str(root), "--out", "relative", "--quiet"]) == 2
        _one_line_error(capsys, "cannot check the output directory")

    out = tmp_path / "out"
    out.mkdir()  # an empty directory is fine
    audit(root, out)
    first = (out / "output_manifest.json").read_bytes()
    assert main(["audit", str(root), "--out", str(out), "--quiet"]) == 2
    _one_line_error(capsys, "--force")
    # --force replaces an earlier audit whole: never one holding what it did not write
    for extra in ("notes.txt", "drafts/thesis.tex"):
        (out / extra).parent.mkdir(exist_ok=True)
        (out / extra).write_text("precious")
        assert main(["audit", str(root), "--out", str(out), "--quiet", "--force"]) == 2
        _one_line_error(capsys, f"holds {extra.split('/')[0]}")
        assert (out / extra).read_text() == "precious"
        assert (out / "output_manifest.json").read_bytes() == first
        shutil.rmtree(out / "drafts") if "/" in extra else (out / extra).unlink()
    # ...nor one whose outputs were changed since (notes added to the report)
    report = (out / "diagnostic.md").read_bytes()
    (out / "diagnostic.md").write_bytes(report + b"\nMy notes.\n")
    assert main(["audit", str(root), "--out", str(out), "--quiet", "--force"]) == 2
    _one_line_error(capsys, "holds diagnostic.md, changed since the earlier audit wrote it")
    assert (out / "diagnostic.md").read_bytes().endswith(b"My notes.\n")
    (out / "diagnostic.md").write_bytes(report)
    assert main(["audit", str(root), "--out", str(out), "--quiet", "--force", "--no-plots"]) == 0
    assert (out / "output_manifest.json").read_bytes() != first
    assert main(["audit", str(root), "--out", str(out), "--quiet", "--force"]) == 0
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.")]
    assert leftovers == []


def test_gate_exit_codes_and_reasons(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    audit(copy_example(tmp_path), out)
    capsys.readouterr()
    assert main(["gate", str(out)]) == 1
    printed = capsys.readouterr().out
    assert "gate: FAIL" in printed
    assert printed.count("reason: configuration") == 9
    assert main(["gate", str(out), "--allow-partial"]) == 0
    printed = capsys.readouterr().out
    assert "PASS" in printed and "gsm8k@2" in printed and "math@4" not in printed
    # a summary edited after the audit (its gate flipped to a pass) is not the audit's
    summary = out / "summary.json"
    document = orjson.loads(summary.read_bytes())
    document["gate"]["passed"] = True
    summary.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2) + b"\n")
    assert main(["gate", str(out)]) == 2
    _one_line_error(capsys, "does not match")
    assert capsys.readouterr().out == ""
    # re-pinned (anyone who may write the directory can): still read as a gate, or refused
    # before a word is printed, never a truthy "false" passed nor a crash after a PASS
    import hashlib
    manifest = orjson.loads((out / "output_manifest.json").read_bytes())
    for gate in ({"passed": "false"}, {"passed": True, "included_configurations": 5},
                 {"passed": True, "reasons": [1]}, None):
        document["gate"] = gate
        data = orjson.dumps(document)
        summary.write_bytes(data)
        for entry in manifest["outputs"]:
            if entry["path"] == "summary.json":
                entry["sha256"], entry["size"] = hashlib.sha256(data).hexdigest(), len(data)
        (out / "output_manifest.json").write_bytes(orjson.dumps(manifest))
        assert main(["gate", str(out)]) == 2, gate
        said = capsys.readouterr()
        assert said.out == "" and said.err.count("\n") == 1
        assert "is not a gate" in said.err and "Traceback" not in said.err
    (out / "output_manifest.json").unlink()  # (nor is one no manifest pins)
    assert main(["gate", str(out), "--allow-partial"]) == 2
    _one_line_error(capsys, "run 'auditor verify")


def test_waivers_are_recorded_never_silent(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    root = copy_example(tmp_path)
    subjects = [f"host-qwen25-7b-{w}-c2-s{s}/period-{p}" for w, s, p in (
        ("gsm8k", 161, 2), ("gsm8k", 162, 1), ("gsm8k", 163, 2))]
    waive: list[str] = []
    for subject in subjects:
        waive += ["--waive", f"AUD201:{subject}", "--reason", "log loss confirmed by hand"]
    summary = audit(root, tmp_path / "out", *waive)
    assert "gsm8k@4" in summary["gate"]["included_configurations"]
    assert len(summary["gate"]["waived"]) == 3
    assert [w["matched"] for w in summary["waivers"]] == [1, 1, 1]
    assert summary["gate"]["passed"] is False  # math@4 and code_heavy_tail@4 remain
    # included, and said to be so only by waiver: its status stays unresolved everywhere
    status = {f"{c['workload']}@{c['gpus']}": c["status"] for c in summary["configurations"]}
    assert status["gsm8k@4"] == "unresolved"
    for gate in ("gate", "gate_allow_partial"):
        assert summary[gate]["included_by_waiver"] == ["gsm8k@4"]
    text = (tmp_path / "out" / "diagnostic.md").read_text()
    assert "## Waivers" in text and "log loss confirmed by hand" in text
    assert ("Evaluation is restricted to that resolved subset: `code_heavy_tail@2`, `gsm8k@2`, "
            "`math@2`. The reviewer's waivers (see Waivers) add the unresolved `gsm8k@4`."
            in text)
    capsys.readouterr()
    assert main(["gate", str(tmp_path / "out"), "--allow-partial"]) == 0
    assert "unresolved, included by waiver: gsm8k@4" in capsys.readouterr().out
    assert main(["audit", str(root), "--out", str(tmp_path / "shown"), "--no-plots",
                 *waive]) == 0
    shown = " ".join(capsys.readouterr().out.split())  # (as the terminal wrapped it)
    assert "included: code_heavy_tail@2, gsm8k@2, math@2, gsm8k@4 (unresolved, by waiver: " \
           "gsm8k@4)" in shown


def test_rules_lists_the_catalogue(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rules"]) == 0
    out = capsys.readouterr().out
    for rule_id in ("AUD001", "AUD102", "AUD201", "AUD205", "AUD212"):
        assert rule_id in out


def test_validate_single_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trial = next(EXAMPLE.glob("*/attempt-*/trial-*.json"))
    assert main(["validate", str(trial)]) == 0
    assert "ok (trial)" in capsys.readouterr().out
    bad = tmp_path / "trial-1.json"
    doc = orjson.loads(trial.read_bytes())
    doc["invocation"]["exit_code"] = "zero"
    bad.write_bytes(orjson.dumps(doc))
    assert main(["validate", str(bad)]) == 1
    assert "/invocation/exit_code" in capsys.readouterr().out
    trace = next(EXAMPLE.glob("*/attempt-*/allocator-traces/*.jsonl"))
    broken = tmp_path / "allocator-1.jsonl"
    broken.write_bytes(trace.read_bytes() + b'{"pid": 1, "seq"')
    assert main(["validate", str(broken)]) == 1
    assert "AUD004" in capsys.readouterr().out


@pytest.mark.parametrize(("name", "limit"), [("protocol.json", 1 << 20),
                                           ("trial-1.json", 16 << 20)])
def test_validate_refuses_what_the_audit_refuses_as_too_large(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, limit: int) -> None:
    """A protocol past 1 MiB and a trial record past 16 MiB, each valid JSON: the audit
    refuses them (AUD012; the protocol's built-in defaults then apply), and validate said
    "ok" (it read every kind to 64 MiB). Now it says what the audit says."""
    path = tmp_path / name
    padding = "x" * (limit + 1)
    path.write_text(json.dumps({"schema": "run-evidence/protocol/v1", "pad": padding})
                    if name == "protocol.json" else json.dumps({"pad": padding}))
    assert main(["validate", str(path)]) == 1
    out = capsys.readouterr().out
    kind = "protocol" if name == "protocol.json" else "trial record"
    assert f"AUD012 {path}:" in out and f"{limit}-byte limit for {kind}" in out, out


def test_validate_tells_a_process_record_and_an_idle_file_by_their_folder(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``processes/<host>-<role>-<pid>.json`` and ``idle/<host>.json`` are told by their
    folder (their names alone could be any JSON): given by path, or from inside it."""
    processes, idle = tmp_path / "processes", tmp_path / "idle"
    processes.mkdir()
    idle.mkdir()
    (processes / "n1-policy-42.json").write_text(json.dumps(
        {"schema": "run-evidence/process/v1", "role": "policy", "host": "n1", "pid": 42,
         "rank": 0, "started_ns": 1, "ended_ns": 2, "exit_code": 0, "signal": None,
         "received_signal": None, "job_id": "7"}))
    (idle / "n1.json").write_text(json.dumps(
        {"schema": "run-evidence/idle-check/v1", "host": "n1", "passed": True,
         "unavailable": None, "checked_ns": 1}))
    assert main(["validate", str(processes / "n1-policy-42.json"), str(idle / "n1.json")]) \
        == 0
    assert capsys.readouterr().out.count(": ok (") == 2
    monkeypatch.chdir(idle)
    assert main(["validate", "n1.json"]) == 0
    assert "ok (idle-check)" in capsys.readouterr().out


def test_validate_takes_the_manifest_s_kind_words_and_says_what_has_no_schema(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A period record's own kinds (device_evidence, allocator_trace) name their schemas;
    a log or a dump is told apart from a file of unknown kind."""
    device = next(EXAMPLE.glob("*/attempt-*/device-evidence/*.json"))
    trace = next(EXAMPLE.glob("*/attempt-*/allocator-traces/*.jsonl"))
    assert main(["validate", str(device), "--kind", "device_evidence"]) == 0
    assert main(["validate", str(trace), "--kind", "allocator_trace"]) == 0
    assert capsys.readouterr().out.count(": ok (") == 2
    log = next(EXAMPLE.glob("*/attempt-*/training-*.log"))
    assert main(["validate", str(log)]) == 2
    _one_line_error(capsys, "a training log is plain text, with no schema")
    assert main(["validate", str(EXAMPLE / "accounting/sacct-raw.psv")]) == 2
    _one_line_error(capsys, "'auditor sacct FILE' reads one")
    assert main(["validate", str(device), "--kind", "training_log"]) == 2
    _one_line_error(capsys, "a training log is plain text")


@pytest.mark.parametrize("content", [b"", b"JobID|JobIDRaw|State\n", b"\n# only a comment\n"])
def test_sacct_command_refuses_a_dump_without_records_as_the_audit_does(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes) -> None:
    """An empty dump (or a header alone) is AUD009 in an audit: 'auditor sacct' said exit 0
    and a table of nothing."""
    dump = tmp_path / "empty.psv"
    dump.write_bytes(content)
    assert main(["sacct", str(dump), "--json"]) == 2
    _one_line_error(capsys, "no job rows" if content else "the dump is empty")


def test_sacct_command_on_the_example_dump(capsys: pytest.CaptureFixture[str]) -> None:
    dump = EXAMPLE / "accounting" / "sacct-raw.psv"
    assert main(["sacct", str(dump), "--json"]) == 0
    summary = orjson.loads(capsys.readouterr().out)
    assert summary["totals"]["gpu_seconds"] == 20828
    assert summary["totals"]["jobs"] == 9
    assert summary["totals"]["states"] == {"FAILED": 9}
    assert all(job["gpus"] == 4 and job["state"] == "FAILED" for job in summary["jobs"])
    assert main(["sacct", str(dump)]) == 0
    assert "20,828 GPU-seconds" in capsys.readouterr().out


def test_sacct_table_at_80_columns_folds_its_notes_and_loses_no_word(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Output that is no terminal is 80 columns wide: the notes column is folded, never cut
    ("exit 2 or 130; batch FAILED ..." came out as "exit 2 / 130; ba / FAILED")."""
    monkeypatch.setenv("COLUMNS", "80")
    dump = tmp_path / "sacct-raw.psv"  # (sacct -D: element 3 preempted once, its name wider)
    rows = (EXAMPLE / "accounting" / "sacct-raw.psv").read_text().splitlines(keepends=True)
    third = next(i for i, row in enumerate(rows) if row.startswith("5055845_3|"))
    earlier = rows[third].split("|")
    earlier[3:8] = ["PREEMPTED", "0:0", "2026-09-15T18:40:00", "2026-09-15T18:43:20", "200"]
    dump.write_text("".join([*rows[:third], "|".join(earlier), *rows[third:]]))
    assert main(["sacct", str(dump)]) == 0
    out = capsys.readouterr().out
    words = out.split()
    for word in ("or", "130;", "batch", "FAILED", "2:0;"):
        assert word in words, out
    # (a row too wide to leave the notes room: rich dropped the column, words and all; its
    # notes go under the table, by row)
    tres = "billing=32,cpu=32,gres/gpu=8,node=1"
    dump.write_text(
        f"50558451_1020|50559946|x|OUT_OF_MEMORY|0:125|2026-09-15T18:55:15|"
        f"2026-09-15T19:05:00|172800|{tres}|gpu-node-03|None\n"
        f"50558451_1020.batch|50559946.batch|batch|FAILED|2:0|2026-09-15T18:55:15|"
        f"2026-09-15T19:05:00|585|{tres}|gpu-node-03|\n")
    assert main(["sacct", str(dump)]) == 0
    assert "50558451_1020: batch FAILED 2:0" in capsys.readouterr().out


def test_sacct_command_on_real_dumps(capsys: pytest.CaptureFixture[str]) -> None:
    folder = REAL_EVIDENCE / "sacct"
    assert main(["sacct", str(folder / "nextflow__issue5276_node_fail_fixedwidth.txt")]) == 2
    _one_line_error(capsys, "sacct -P")
    assert main(["sacct", str(folder / "jobstats__issue6_alloctres_exclusive_4gpu.psv"),
                 "--format", "AllocTRES", "--json"]) in (0, 2)
    capsys.readouterr()
    for path in sorted(folder.iterdir()):
        if path.suffix not in (".psv", ".txt"):
            continue
        code = main(["sacct", str(path), "--json"])
        captured = capsys.readouterr()
        assert code in (0, 2), path
        assert "Traceback" not in captured.err
        if code == 2:
            assert captured.err.count("\n") == 1


def test_internal_error_is_one_line_exit_3(monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from auditor.reason.engine import StudyJudge  # (the study's reasoning)

    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(StudyJudge, "finish", boom)
    assert main(["audit", str(EXAMPLE), "--quiet"]) == 3
    _one_line_error(capsys, "internal error: RuntimeError: simulated bug")
    assert main(["audit", str(EXAMPLE), "--quiet", "--debug"]) == 3
    assert "Traceback" in capsys.readouterr().err


def test_an_interrupt_wrapped_in_another_error_is_an_interrupt(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C while Python makes a class comes out as a RuntimeError caused by the
    KeyboardInterrupt: still exit 130, not an internal error."""
    from auditor.reason.engine import StudyJudge  # (the study's reasoning)

    def interrupted(*args: object, **kwargs: object) -> None:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as error:
            raise RuntimeError("Error calling __set_name__ on 'Field' instance") from error

    monkeypatch.setattr(StudyJudge, "finish", interrupted)
    assert main(["audit", str(EXAMPLE), "--quiet"]) == 130
    _one_line_error(capsys, "interrupted")


def _audit_example_customised(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``python -m auditor audit`` of the example, quiet and without plots, in a process
    that runs ``tmp_path/sitecustomize.py`` first."""
    import auditor

    # (the checkout under test first: site-customisation runs before ``-m`` adds the cwd)
    path = os.pathsep.join([str(tmp_path), str(Path(auditor.__file__).parents[1])])
    return subprocess.run([sys.executable, "-m", "auditor", "audit", str(EXAMPLE), "--quiet",
                           "--no-plots"], capture_output=True, text=True, check=False,
                          timeout=120, env={**os.environ, "PYTHONPATH": path})


@pytest.mark.slow
def test_ctrl_c_pressed_again_while_the_command_exits_changes_nothing(tmp_path: Path) -> None:
    """Impatient users press Ctrl-C again: one that lands while the interpreter shuts down
    (joining a helper's thread) printed a traceback and killed the process by the signal.
    Once the interrupt is reported, the command only exits: one line, exit 130."""
    (tmp_path / "sitecustomize.py").write_text(
        "import os, signal, threading, time\n"
        "import auditor.reason.engine as engine\n"
        "def again():  # (joined as the interpreter exits: the second Ctrl-C lands then)\n"
        "    time.sleep(1.0)\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    time.sleep(0.5)\n"
        "def reason(*args, **kwargs):\n"
        "    threading.Thread(target=again).start()\n"
        "    raise KeyboardInterrupt\n"
        "engine.StudyJudge.finish = reason\n")
    done = _audit_example_customised(tmp_path)
    assert done.returncode == 130, done.stderr
    assert done.stderr == "auditor: interrupted; no output was left half-written\n"


@pytest.mark.slow
def test_ctrl_c_after_a_finished_audit_changes_nothing(tmp_path: Path) -> None:
    """A Ctrl-C that lands as a finished command shuts down (joining a helper's thread)
    neither prints a traceback nor turns its exit code into death by the signal."""
    (tmp_path / "sitecustomize.py").write_text(
        "import os, signal, threading, time\n"
        "import auditor._cli as cli\n"
        "finished = cli.main\n"
        "def late():  # (joined as the interpreter exits: the Ctrl-C lands then)\n"
        "    time.sleep(0.3)\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    time.sleep(0.5)\n"
        "def main(*args):\n"
        "    code = finished(*args)\n"
        "    threading.Thread(target=late).start()\n"
        "    return code\n"
        "cli.main = main\n")
    done = _audit_example_customised(tmp_path)
    assert (done.returncode, done.stderr) == (0, "")


@pytest.mark.slow
def test_interrupted_under_python_m_exits_130(tmp_path: Path) -> None:
    """An interrupt that left an exec() of a string (a schema compiler's, a dataclass's)
    made ``python -m auditor`` kill itself with SIGINT after printing its one line."""
    (tmp_path / "sitecustomize.py").write_text(
        "import auditor.reason.engine as engine\n"
        "def reason(*args, **kwargs):\n"
        "    exec('raise KeyboardInterrupt')\n"
        "engine.StudyJudge.finish = reason\n")
    done = _audit_example_customised(tmp_path)
    assert done.returncode == 130, done.stderr
    assert done.stderr.count("\n") == 1 and "interrupted" in done.stderr


@pytest.mark.slow
def test_a_signal_never_cuts_a_commands_imports_short() -> None:
    """A compiled extension interrupted while it initialises can crash the process (orjson
    does): a Ctrl-C during a command's imports takes effect once they are all in."""
    code = """
import os, signal, sys
class Interrupt:  # Ctrl-C as the second module the audit needs starts to load
    def find_spec(self, name, path=None, target=None):
        if name == "auditor.validate.checks":
            os.kill(os.getpid(), signal.SIGINT)
sys.meta_path.insert(0, Interrupt())
from auditor._cli import PRELOAD, main
code = main(["audit", sys.argv[1], "--quiet", "--no-plots"])
print(code, all(name in sys.modules for name in PRELOAD["audit"]))
"""
    done = subprocess.run([sys.executable, "-c", code, str(EXAMPLE)], capture_output=True,
                          text=True, check=False, timeout=120,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert done.stdout.split() == ["130", "True"], done.stderr
    assert done.stderr.count("\n") == 1 and "interrupted" in done.stderr


@pytest.mark.slow
def test_module_entry_point(tmp_path: Path) -> None:
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "auditor", "--version"], capture_output=True,
                            text=True, check=False, env={**os.environ, "NO_COLOR": "1"})
    assert result.returncode == 0 and result.stdout.startswith("auditor ")


def test_findings_caps_make_the_audit_partial(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    root = copy_example(tmp_path)
    trace = next(root.glob("*/attempt-*/allocator-traces/*.jsonl"))
    trace.write_bytes(trace.read_bytes() + b"not json\n" * 50)
    summary = audit(root, tmp_path / "capped", "--max-findings-per-file", "5",
                    "--max-findings", "16", "--max-quote", "20")
    assert summary["partial"] is True
    assert pq.read_schema(tmp_path / "capped" / "findings.parquet").metadata[
        b"auditor.partial"] == b"true"
    text = (tmp_path / "capped" / "diagnostic.md").read_text()
    findings = pq.read_table(tmp_path / "capped" / "findings.parquet").to_pandas()
    assert len(findings) == 16 + 1
    capped = findings[findings["rule_id"] == "AUD013"]
    # both caps are summed up, each kept: the file's and the study's
    assert sorted(capped["subject"]) == sorted(["study", trace.relative_to(root).as_posix()])
    dropped = [int(m.split(": ")[1].split()[0]) for m in capped["message"]]
    not_kept = summary["findings"]["not_kept"]
    assert not_kept == sum(dropped) and summary["findings"]["total"] == len(findings)
    # the report says how many were not kept, and never that every finding is in the table
    assert f"**Partial audit:** {not_kept} findings counted but not kept" in text
    assert (f"{len(findings)} findings kept: " in text
            and f"; {not_kept} more findings were counted but not kept" in text)
    assert "Every finding, with all its citations" not in text
    full = audit(root, tmp_path / "full")
    assert full["partial"] is False and full["findings"]["not_kept"] == 0
    assert full["findings"]["total"] > summary["findings"]["total"]


def test_element_lookup_matches_the_collectors_job_for() -> None:
    from auditor._io import HashingReader
    from auditor.collect.sacct import job_for, parse_sacct
    from auditor.validate.checks import element_for
    from tests.collect.test_sacct import REAL_ARGS

    folder = REAL_EVIDENCE / "sacct"
    dumps = [EXAMPLE / "accounting" / "sacct-raw.psv"]
    if folder.is_dir():
        dumps += [folder / "reportseff__array_energy_jobidraw.psv",
                  folder / "snakemake__pr2036_array_task_jobid_vs_jobidraw.psv"]
    for path in dumps:
        fields, delimiter = REAL_ARGS.get(path.name, (None, None))
        with open(path, "rb") as handle:
            dump = parse_sacct(HashingReader(handle), path.name,
                               fields.split(",") if fields else None, delimiter)
        for job in dump.jobs:
            for key in filter(None, (job.job_id_raw, job.job_id, " " + job.job_id + " ")):
                assert element_for(dump, key) is job_for(dump, key)


def test_unwritable_output_location_is_one_line(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["audit", str(EXAMPLE), "--out", str(blocker / "out"), "--quiet"]) == 2
    _one_line_error(capsys, "is not a directory")


@pytest.mark.slow
def test_the_command_imports_neither_pandas_nor_jsonschema_yet_writes_every_table(
        tmp_path: Path) -> None:
    """pyarrow would import pandas (0.3-0.5 s) on its first array; the console entry
    point refuses it, and the tables are still written and verify. jsonschema (80 ms)
    is imported only to explain a document that fails validation: none does here. The
    cyclic collector is off in the command's process (nothing it could free), and pyarrow
    allocates from the C heap (its own pool keeps what the tables took)."""
    import subprocess
    import sys

    out = tmp_path / "out"
    script = ("import atexit, runpy, sys\n"
              "import gc\n"
              "atexit.register(lambda: print('collector on:', gc.isenabled(),\n"
              "    'pool:', sys.modules['pyarrow'].default_memory_pool().backend_name,\n"
              "    'loaded:',\n"
              "                              *sorted(sys.modules), file=sys.stderr))\n"
              "runpy.run_module('auditor', run_name='__main__')\n")
    done = subprocess.run(
        [sys.executable, "-c", script, "audit", str(EXAMPLE), "--out", str(out), "--quiet",
         "--no-plots"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "collector on: False pool: system loaded:" in done.stderr
    loaded = done.stderr.rsplit("loaded:", 1)[-1].split()
    assert "pyarrow.parquet" in loaded
    assert not [name for name in loaded if name.split(".")[0] in ("pandas", "jsonschema")]
    assert main(["verify", str(out)]) == 0
    import pandas as pd

    assert len(pd.read_parquet(out / "phases.parquet")) > 0


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here")
def test_default_workers_are_the_cpus_the_process_may_use(tmp_path: Path) -> None:
    """Inside a SLURM job (a cgroup cpuset), under taskset or in a pinned container, the
    audit may use a few of the node's CPUs: by default it starts a reader per CPU it may
    use, not per CPU of the node. Pinned to one, it reads in-process and forks nothing."""
    code = """
import os, sys
cpus, log = int(sys.argv[1]), sys.argv[3]
os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:cpus])
os.register_at_fork(after_in_child=lambda: open(log, "a").write("forked\\n"))
import auditor.pipeline.pool
auditor.pipeline.pool.SMALL_STUDY_TASKS = 0  # (the example is read as a large study would be)
from auditor._cli import main
sys.exit(main(["audit", sys.argv[2], "--quiet", "--no-plots"]))
"""
    usable = len(os.sched_getaffinity(0))
    for cpus in sorted({1, min(usable, 2)}):
        log = tmp_path / f"forks-{cpus}"
        log.touch()
        done = subprocess.run([sys.executable, "-c", code, str(cpus), str(EXAMPLE), str(log)],
                              capture_output=True, text=True, check=False, timeout=120)
        assert done.returncode == 0, done.stderr
        assert log.read_text().count("forked") == (0 if cpus == 1 else cpus), cpus


def test_default_workers_respect_a_containers_cpu_quota(tmp_path: Path) -> None:
    """A container given half a CPU (``docker --cpus 0.5``: a cgroup quota, in either
    cgroup version) gets one reader whatever the node has; no quota, or one that cannot
    be read, leaves the CPUs the process may run on."""
    from auditor.pipeline.pool import usable_cpus

    may_run_on = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else os.cpu_count()
    v2, v1, garbled = tmp_path / "v2", tmp_path / "v1" / "cpu", tmp_path / "garbled"
    for folder in (v2, v1, garbled):
        folder.mkdir(parents=True)
    (v2 / "cpu.max").write_text("50000 100000\n")
    (v1 / "cpu.cfs_quota_us").write_text("50000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    (garbled / "cpu.max").write_bytes(b"\xff\x00 0\n")
    assert usable_cpus(str(v2)) == usable_cpus(str(v1.parent)) == 1
    (v2 / "cpu.max").write_text(f"{100000 * 64} 100000\n")  # more than it may run on
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")  # no quota
    assert usable_cpus(str(v2)) == usable_cpus(str(v1.parent)) == may_run_on
    assert usable_cpus(str(garbled)) == usable_cpus(str(tmp_path / "none")) == may_run_on
    # cgroup v2 without a namespace: the process's own group, or any group above it
    own = tmp_path / "own"
    own.write_text("1:name=systemd:/x\n0::/system.slice/job_7/step_0\n")
    tree = tmp_path / "tree"
    (tree / "system.slice" / "job_7" / "step_0").mkdir(parents=True)
    (tree / "cpu.max").write_text("max 100000\n")
    assert usable_cpus(str(tree), str(own)) == may_run_on
    for group in ("system.slice/job_7/step_0", "system.slice"):
        (tree / group / "cpu.max").write_text("50000 100000\n")
        assert usable_cpus(str(tree), str(own)) == 1
        (tree / group / "cpu.max").unlink()
    # (a group named outside the namespace: its path is never followed up and out)
    own.write_text("0::/../elsewhere\n")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "cpu.max").write_text("50000 100000\n")
    assert usable_cpus(str(tree), str(own)) == may_run_on


def test_terminal_summary_says_what_the_report_would_hide(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The summary printed at the end says what the findings mean for the gate (by
    severity), a partial audit and
    what it did not keep, and a waiver that matched nothing (a typo lifts no gate reason);
    the integrity table fits 80 columns."""
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["audit", str(EXAMPLE), "--out", str(tmp_path / "out"), "--no-plots",
                 "--max-findings", "3", "--waive", "AUD201:nonexistent/period-9",
                 "--reason", "typo"]) == 0
    shown = capsys.readouterr().out
    summary = orjson.loads((tmp_path / "out" / "summary.json").read_bytes())
    counts = summary["findings"]
    said = " ".join(shown.split())  # (what the findings mean for the gate, wrapped at 80)
    assert f"{counts['error']} error findings: " in said and "the gate fails on them" in said
    assert (f"{counts['warning']} warning{'' if counts['warning'] == 1 else 's'} and "
            f"{counts['info']} informational findings block nothing") in said
    assert f"partial audit: {counts['not_kept']} findings counted but not kept" in shown
    assert "waiver matched nothing: AUD201:nonexistent/period-9" in shown
    assert "…" not in shown.split("Integrity", 1)[1].split("gate:", 1)[0]


def test_the_findings_limit_holds_however_many_files_reach_their_own() -> None:
    """Each file past its cap is summed up in an AUD013: thousands of such files must not
    carry thousands of findings past --max-findings (the study's cap counts them too)."""
    from auditor.model import Citation
    from auditor.pipeline.audit import AuditOptions, apply_limits
    from auditor.rules import finding

    found = [finding("AUD101", f"f{n}.json", [Citation(f"f{n}.json")], manifest="m")
             for n in range(3000) for _ in range(2)]
    kept, not_kept = apply_limits(found, AuditOptions(max_findings=10, max_findings_per_file=1))
    assert len(kept) == 10 + 1 and kept[-1].subject == "study"
    assert [f.rule_id for f in kept[:10]] == ["AUD101"] * 10  # (errors before the summaries)
    assert not_kept == 3000 + (3000 + 3000 - 10)


def _limits_as_one_sort(findings: list[Finding], options: AuditOptions
                        ) -> tuple[tuple[Finding, ...], int]:
    """The limits as first written: every finding held and sorted by severity (the
    reading a severity at a time that replaced it must keep the same, in the same order)."""
    from collections import Counter
    from dataclasses import replace

    from auditor._text import clip
    from auditor.model import Citation
    from auditor.pipeline.study import CAP_SUMMARIES
    from auditor.rules import finding

    order = {"error": 0, "warning": 1, "info": 2}
    per_file: Counter[str] = Counter()
    dropped_per_file: Counter[str] = Counter()
    kept = []
    for item in sorted(findings, key=lambda f: order[f.severity.value]):
        path = item.citations[0].path if item.citations else item.subject
        if item.rule_id not in CAP_SUMMARIES and per_file[path] >= options.max_findings_per_file:
            dropped_per_file[path] += 1
            continue
        per_file[path] += 1
        if any(len(c.quote) > options.max_quote for c in item.citations):
            item = replace(item, citations=tuple(
                replace(c, quote=clip(c.quote, options.max_quote)) for c in item.citations))
        kept.append(item)
    kept = sorted([*kept, *(finding("AUD013", path, [Citation(path)], dropped=dropped,
                                    cap=options.max_findings_per_file)
                            for path, dropped in sorted(dropped_per_file.items()))],
                  key=lambda f: order[f.severity.value])
    not_kept = sum(dropped_per_file.values())
    if len(kept) > options.max_findings:
        dropped = len(kept) - options.max_findings
        kept = kept[: options.max_findings]
        kept.append(finding("AUD013", "study", [], path="all files", dropped=dropped,
                            cap=options.max_findings))
        not_kept += dropped
    return tuple(kept), not_kept


@pytest.mark.parametrize("seed", range(6))
def test_the_limits_keep_what_one_sort_of_every_finding_kept(seed: int) -> None:
    """The limits read the findings a severity at a time and hold at most the study's cap
    of each (a million-file study's were all held, then sorted): what they keep, in what
    order, and how many they count but do not keep are one stable sort's, for every cap,
    errors, warnings and infos interleaved, quotes to clip, files past their own cap."""
    import random

    from auditor.model import Citation
    from auditor.pipeline.audit import AuditOptions, apply_limits
    from auditor.rules import finding

    draw = random.Random(seed)
    rules = ["AUD101", "AUD102", "AUD203", "AUD218", "AUD013", "AUD016", "AUD201"]
    found = []
    for _ in range(400):
        path = f"f{draw.randrange(12)}.json"
        rule = draw.choice(rules)
        made = finding(rule, path, [Citation(path, quote="q" * draw.randrange(0, 30))],
                       manifest="m", detail="d", dropped=1, cap=1, path=path, verdict="v",
                       status="s", error="", word="w")
        found.append(made)
    for max_findings, per_file in [(5, 3), (50, 10), (1000, 1000), (120, 2), (1, 1)]:
        options = AuditOptions(max_findings=max_findings, max_findings_per_file=per_file,
                               max_quote=12)
        expected = _limits_as_one_sort(found, options)
        assert apply_limits(found, options) == expected
        assert apply_limits(lambda: iter(found), options) == expected


def test_sacct_table_of_a_long_dump_shows_its_first_rows(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A dump of thousands of allocations prints the first few in its table (rich took
    seconds a thousand rows to lay them out) and says so; --json gives every one."""
    dump = tmp_path / "long.psv"
    dump.write_text("".join(
        f"900_{n}|{1000 + n}|train|COMPLETED|0:0|2026-09-15T18:00:00|2026-09-15T18:01:00|60|"
        "billing=8,cpu=8,gres/gpu=1,node=1|n1|None\n" for n in range(250)))
    assert main(["sacct", str(dump)]) == 0
    shown = capsys.readouterr().out
    assert "the first 200 of 250 allocations are shown; --json gives them all" in shown
    assert "900_199" in shown and "900_200" not in shown
    assert "250 allocations; 15,000 GPU-seconds" in shown
    assert main(["sacct", str(dump), "--json"]) == 0
    assert len(orjson.loads(capsys.readouterr().out)["jobs"]) == 250


def test_sacct_table_without_exit_codes_shows_no_none(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A dump captured without ExitCode shows a failing step by its state alone."""
    dump = tmp_path / "states.psv"
    dump.write_text("900_1|1001|train|FAILED\n900_1.0|1001.0|python|FAILED\n")
    assert main(["sacct", str(dump), "--format", "JobID,JobIDRaw,JobName,State"]) == 0
    shown = capsys.readouterr().out
    assert "0 FAILED" in shown and "None" not in shown


def test_findings_a_collector_counted_are_counted_as_not_kept(tmp_path: Path) -> None:
    """A trace whose bad lines pass the reader's own cap is summed up in an AUD013 as it is
    read; summary.json's not_kept counts those findings too (it said 0)."""
    from auditor.collect.allocator_trace import FINDINGS_CAP

    root = copy_example(tmp_path)
    trace = next(root.glob("*/attempt-*/allocator-traces/*.jsonl"))
    trace.write_bytes(trace.read_bytes() + b"not json\n" * (FINDINGS_CAP + 50))
    summary = audit(root, tmp_path / "out", "--max-findings-per-file", "1000")
    assert summary["partial"] is True
    assert summary["findings"]["not_kept"] == 50


def test_verify_finds_an_output_turned_link_and_a_folder_added(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An output replaced by a link (to an identical copy) is no longer the output written,
    and a folder or a link to one added beside the outputs is added, as a file is; the
    report's own plots folder is none of them."""
    out = tmp_path / "out"
    assert main(["audit", str(copy_example(tmp_path)), "--out", str(out), "--quiet"]) == 0
    assert (out / "plots").is_dir()
    assert main(["verify", str(out), "--quiet"]) == 0
    copy = tmp_path / "summary-copy.json"
    shutil.copy(out / "summary.json", copy)
    (out / "summary.json").unlink()
    (out / "summary.json").symlink_to(copy)
    (out / "extra").mkdir()
    (out / "linked").symlink_to(tmp_path)
    capsys.readouterr()
    assert main(["verify", str(out)]) == 1
    said = capsys.readouterr().out
    assert "changed: outputs/summary.json (a link in its place; not read)" in said
    assert "added: outputs/extra" in said and "added: outputs/linked" in said
    assert "plots" not in said


def test_verify_finds_a_relative_sacct_path_from_any_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--sacct dump.psv`` given relative to the working directory is pinned by its absolute
    path: verify run elsewhere found it 'missing' though nothing had changed."""
    shutil.copy(EXAMPLE / "accounting/sacct-raw.psv", tmp_path / "dump.psv")
    monkeypatch.chdir(tmp_path)
    assert main(["audit", str(EXAMPLE), "--out", str(tmp_path / "out"), "--sacct", "dump.psv",
                 "--quiet", "--no-plots"]) == 0
    manifest = orjson.loads((tmp_path / "out" / "output_manifest.json").read_bytes())
    [entry] = [e for e in manifest["source_inputs"] if e["path"] == str(tmp_path / "dump.psv")]
    assert entry["absolute"] == str(tmp_path / "dump.psv")  # (named by it, however typed)
    monkeypatch.chdir("/")
    assert main(["verify", str(tmp_path / "out")]) == 0


def test_no_command_is_a_one_line_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """Bare ``auditor``: exit 2 with one line on stderr, as every usage error (the contract);
    it printed the whole help to stdout."""
    assert main([]) == 2
    _one_line_error(capsys, "no command given: one of audit, verify, gate")


def test_an_audit_that_finished_meanwhile_in_the_same_out_is_never_replaced(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two audits started on one absent --out without --force: the second to finish is
    refused (exit 2) and the first's outputs stay (it replaced them whole, silently). The
    other audit finishing is simulated while this one writes its tables."""
    import auditor.report.tables as tables

    out = tmp_path / "out"
    real = tables.write_table

    def meanwhile(*args: object, **kwargs: object) -> object:
        if not out.exists():  # (the other audit renames its finished output into place)
            out.mkdir()
            (out / "diagnostic.md").write_text("the other audit's report\n")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(tables, "write_table", meanwhile)
    assert main(["audit", str(EXAMPLE), "--out", str(out), "--quiet", "--no-plots"]) == 2
    _one_line_error(capsys, "written to by something else while this audit ran")
    assert [p.name for p in out.iterdir()] == ["diagnostic.md"]
    assert (out / "diagnostic.md").read_text() == "the other audit's report\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # (no staging left)



def test_a_shards_out_inside_the_root_is_refused_before_anything_is_made(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Review Q: ``--shard`` made its spill folder beside ``--out`` (inside the root) and
    read the whole shard before ``--out`` was checked; it is checked first, as an audit's
    is, and nothing is made under the root. A file as ``--out`` is refused at once too."""
    from tests.helpers import snapshot

    root = copy_example(tmp_path)
    before = snapshot(root), sorted(p.name for p in root.iterdir()), root.stat().st_mtime_ns
    assert main(["audit", str(root), "--shard", "1/2", "--out", str(root / "part"),
                 "--quiet"]) == 2
    _one_line_error(capsys, "inside the evidence root")
    assert (snapshot(root), sorted(p.name for p in root.iterdir()),
            root.stat().st_mtime_ns) == before
    (tmp_path / "a-file").write_text("x")
    assert main(["audit", str(root), "--shard", "1/2", "--out", str(tmp_path / "a-file"),
                 "--quiet"]) == 2
    _one_line_error(capsys, "exists and is not a directory")


def test_the_root_reached_through_another_mount_is_still_the_root(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Review Q: ``--out`` under a bind mount of the root (one file system mounted at two
    paths, as clusters do) passed the check by path, and the audit wrote into the root."""
    root = copy_example(tmp_path)
    alias = tmp_path / "alias"
    alias.mkdir()
    if subprocess.run(["mount", "--bind", str(root), str(alias)],
                      capture_output=True).returncode != 0:
        pytest.skip("mount --bind needs privileges this run lacks")
    try:
        assert main(["audit", str(root), "--out", str(alias / "audit-out"), "--quiet"]) == 2
        _one_line_error(capsys, "inside the evidence root")
        assert not (root / "audit-out").exists()
    finally:
        subprocess.run(["umount", str(alias)], check=True)


def test_matplotlibs_own_directory_is_never_made_in_a_tmpdir_under_the_root(
        tmp_path: Path) -> None:
    """Review Q: with HOME inside the study (matplotlib's font list would go there) and
    TMPDIR inside it too, the audit (``--out`` outside) made matplotlib's own directory in
    TMPDIR, under the root, and wrote the font list there; it goes beside ``--out``."""
    pytest.importorskip("matplotlib")
    root = copy_example(tmp_path)
    (root / "tmp").mkdir()
    stamp = (root / "tmp").stat().st_mtime_ns, root.stat().st_mtime_ns
    env = {key: value for key, value in os.environ.items()
           if key not in ("MPLCONFIGDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "TEMP", "TMP")}
    env.update(HOME=str(root / "home"), TMPDIR=str(root / "tmp"))
    done = subprocess.run([sys.executable, "-m", "auditor", "audit", str(root), "--out",
                           str(tmp_path / "out"), "--quiet"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert ((root / "tmp").stat().st_mtime_ns, root.stat().st_mtime_ns) == stamp
    assert not (root / "home").exists() and list((root / "tmp").iterdir()) == []
    assert list((tmp_path / "out" / "plots").glob("*.png"))


def test_the_roots_own_dump_named_by_sacct_is_read_as_the_roots(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Review Q: ``--sacct ROOT/accounting/sacct-raw.psv``, a link to a forged dump outside,
    was followed (an element of 28,800 GPU-seconds added, no finding), where the audit
    without ``--sacct`` refuses that link. A file under the root is the root's own."""
    root = copy_example(tmp_path)
    dump = root / "accounting" / "sacct-raw.psv"
    forged = tmp_path / "forged.psv"
    forged.write_bytes(dump.read_bytes())
    dump.unlink()
    dump.symlink_to(forged)
    import pandas as pd

    odd = root / "..dumps" / "sacct.psv"  # (a folder whose name starts with "..": the root's)
    odd.parent.mkdir()
    odd.symlink_to(forged)
    for named, out in ((dump, tmp_path / "out"), (odd, tmp_path / "odd")):
        summary = audit(root, out, "--sacct", str(named))
        assert summary["accounting"]["allocation_gpu_seconds"] is None, named
        findings = pd.read_parquet(out / "findings.parquet")
        assert "AUD009" in set(findings["rule_id"])


def test_a_dump_named_outside_the_root_is_one_input_however_it_is_typed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review Q: ``--sacct dump.psv``, its absolute path and ``../dump.psv`` gave three
    reports and three inputs digests for one dump (shards run from other directories could
    not be merged). The dump is named by its absolute path."""
    root = copy_example(tmp_path)
    dump = tmp_path / "dump.psv"
    shutil.move(root / "accounting" / "sacct-raw.psv", dump)
    (tmp_path / "sub").mkdir()
    reports: list[tuple[bytes, bytes]] = []
    for where, typed in ((tmp_path, "dump.psv"), (tmp_path, str(dump)),
                         (tmp_path / "sub", "../dump.psv")):
        monkeypatch.chdir(where)
        out = tmp_path / f"out-{len(reports)}"
        audit(root, out, "--sacct", typed)
        reports.append(((out / "diagnostic.md").read_bytes(),
                        (out / "evidence.md").read_bytes()))
    assert reports[0] == reports[1] == reports[2]
    assert str(dump) in reports[0][0].decode()


def test_pairs_as_a_link_is_said_to_be_one(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Review Q: ``pairs/`` as a link (even to a folder inside the root) gave "no period
    records found; is this a study root?", not why."""
    root = copy_example(tmp_path)
    (root / "pairs").rename(root / "real-pairs")
    (root / "pairs").symlink_to("real-pairs")
    assert main(["audit", str(root), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    _one_line_error(capsys, "(pairs is a link, never followed)")
