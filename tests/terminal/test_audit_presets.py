"""A protocol's terminal-event matcher in a whole audit (issue 42): a study whose protocol
names a framework's preset resolves on that framework's end line and on nothing of verl's;
its trap leaves the period unresolved; an MLPerf abort is ``unclean_exit``, cause
``aborted``, even on exit 0; a metrics file's record can be the event."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import orjson
import pandas as pd
import pytest

from tests.helpers import audit, find, outcome_study, period_records, rewrite
from tests.terminal.test_presets import mllog, titan_info, titan_step


def _study(tmp_path: Path, terminal_event: dict[str, Any]) -> tuple[Path, str]:
    root = outcome_study(tmp_path / "study", ["completed"])
    protocol = json.loads((root / "protocol.json").read_text())
    protocol["terminal_event"].update(terminal_event)
    (root / "protocol.json").write_text(json.dumps(protocol))
    return root, find(root, "*/attempt-*/training-*.log")


def _without_verl(lines: list[str]) -> Any:
    def change(data: bytes) -> bytes:
        kept = [line for line in data.decode().splitlines() if "global_step" not in line]
        return ("\n".join(kept + lines) + "\n").encode()
    return change


def _period(out: Path) -> dict[str, Any]:
    summary = orjson.loads((out / "summary.json").read_bytes())
    (period,) = summary["periods"]
    assert isinstance(period, dict)
    return period


def test_a_torchtitan_study_resolves_on_its_own_line_and_not_on_verls(tmp_path: Path) -> None:
    root, log = _study(tmp_path, {"preset": "torchtitan"})
    audit(root, tmp_path / "verl-line")  # (verl's line alone: this protocol's is missing)
    assert _period(tmp_path / "verl-line")["reason"] == "terminal_event_missing"
    rewrite(root, log, _without_verl([titan_step(1), titan_info("Training completed")]))
    audit(root, tmp_path / "out")
    assert _period(tmp_path / "out")["verdict"] == "resolved"
    rewrite(root, log, lambda data: data + titan_info(
        "Ran out of data; last step was canceled.", "WARNING").encode() + b"\n")
    audit(root, tmp_path / "vetoed")
    assert _period(tmp_path / "vetoed")["reason"] == "terminal_event_missing"


def test_an_mlperf_abort_is_an_unclean_exit_caused_aborted(tmp_path: Path) -> None:
    root, log = _study(tmp_path, {"preset": "mllog"})
    rewrite(root, log, _without_verl([mllog("run_start"), mllog("run_stop", "aborted")]))
    audit(root, tmp_path / "out")
    period = _period(tmp_path / "out")
    assert (period["verdict"], period["reason"], period["cause"]) == \
        ("unresolved", "unclean_exit", "aborted")
    rewrite(root, log, lambda data: data.replace(b'"aborted"', b'"success"'))
    audit(root, tmp_path / "success")
    assert _period(tmp_path / "success")["verdict"] == "resolved"


def _with_trainer_state(root: Path, log: str, state: bytes,
                        name: str = "trainer_state.json") -> None:
    """``state`` as the attempt's ``metrics/<name>``, listed in its record."""
    attempt = root / log.rsplit("/", 1)[0]
    (attempt / "metrics").mkdir()
    (attempt / "metrics" / name).write_bytes(state)
    for record_path in period_records(root):
        record = orjson.loads(record_path.read_bytes())
        for spec in record.get("attempts") or [record]:
            spec["evidence"].append({"path": f"metrics/{name}",
                                     "kind": "metrics_log",
                                     "sha256": hashlib.sha256(state).hexdigest(),
                                     "size": len(state)})
        record_path.write_bytes(orjson.dumps(record, option=orjson.OPT_INDENT_2))


def test_a_metrics_file_record_is_the_event(tmp_path: Path) -> None:
    """The HF Trainer prints no step at its end; its ``trainer_state.json`` (copied under
    ``metrics/``) says ``global_step == max_steps``, the dispatched count."""
    root, log = _study(tmp_path, {"preset": "hf-trainer"})
    rewrite(root, log, _without_verl([str({"train_runtime": 30.17, "epoch": 1.0})]))
    _with_trainer_state(root, log, json.dumps(
        {"global_step": 1, "max_steps": 1, "log_history": []}).encode())
    audit(root, tmp_path / "out")
    assert _period(tmp_path / "out")["verdict"] == "resolved"
    diagnostic = (tmp_path / "out" / "diagnostic.md").read_text()
    assert "metrics/trainer_state.json" in diagnostic
    rel = f"{log.rsplit('/', 1)[0]}/metrics/trainer_state.json"
    rewrite(root, rel, lambda data: data.replace(b'"max_steps": 1', b'"max_steps": 5'))
    audit(root, tmp_path / "short")
    assert _period(tmp_path / "short")["reason"] == "terminal_event_missing"


@pytest.mark.parametrize(("steps", "resolves"), [
    ([0, 1], True),
    ([0, 1, 0], False),  # (a resumed run appended to the file, short of its end)
    ([0, 1, 0, 1], True),  # (and ending: its own record is the end)
])
def test_a_json_lines_end_a_later_run_appended_to_is_no_end(
        tmp_path: Path, steps: list[int], resolves: bool) -> None:
    """LlamaFactory appends to ``trainer_log.jsonl`` and keeps it across a resume from a
    checkpoint: an earlier run's ``1/1`` record, then the resumed run's record short of it,
    is no end of the resumed run; the file's last run's own ``1/1`` is."""
    root, log = _study(tmp_path, {"preset": "llamafactory"})
    rewrite(root, log, _without_verl([]))
    records = "".join(json.dumps({"current_steps": n, "total_steps": 1, "loss": 0.5}) + "\n"
                      for n in steps)
    _with_trainer_state(root, log, records.encode(), "trainer_log.jsonl")
    audit(root, tmp_path / "out")
    period = _period(tmp_path / "out")
    assert (period["verdict"] == "resolved") is resolves, period
    if not resolves:
        assert period["reason"] == "terminal_event_missing"
        # (the file holds a record meeting the predicates: the diagnosis says why it is none)
        assert "metrics/trainer_log.jsonl` holds no end of this run: the records go back to " \
            "step 0 after the end at line 2 (a later run appended to the file) (line 3)." \
            in (tmp_path / "out" / "diagnostic.md").read_text()


@pytest.mark.parametrize("state", [
    b'{"global_step": 1, "max_steps": 1, "log_hist',  # (cut as it was written)
    b"not json at all",
    b"[" * 100_000 + b"]" * 100_000,
    '{"global_step": 1, "max_steps": 1}'.encode("utf-16"),
])
def test_a_metrics_document_that_cannot_be_read_is_named(tmp_path: Path,
                                                         state: bytes) -> None:
    """The metrics file the protocol reads for the end, unreadable as JSON: the period
    stays unresolved, and now a finding names the file (none did; the report spoke of the
    training log alone)."""
    root, log = _study(tmp_path, {"preset": "hf-trainer"})
    rewrite(root, log, _without_verl([str({"train_runtime": 30.17, "epoch": 1.0})]))
    _with_trainer_state(root, log, state)
    audit(root, tmp_path / "out")
    assert _period(tmp_path / "out")["reason"] == "terminal_event_missing"
    findings = pd.read_parquet(tmp_path / "out" / "findings.parquet")
    said = findings[(findings["rule_id"] == "AUD003")
                    & findings["path"].str.endswith("metrics/trainer_state.json")]
    assert len(said) == 1 and "not a JSON document" in said["message"].iloc[0]


@pytest.mark.parametrize(("steps", "resolves"), [
    ('"global_step": 1, "max_steps": 1', True),
    ('"global_step": 3, "max_steps": 3', False),  # (another step count)
    ('"global_step": "1", "max_steps": "1"', True),  # (a count written as text)
    ('"global_step": "3", "max_steps": "3"', False),  # (another, as text)
    ('"global_step": null, "max_steps": null', False),  # (nothing equal to nothing)
    ('"global_step": true, "max_steps": true', False),  # (two flags)
    # (a float is an epoch's kind of number: the contract's predicates need no step)
    ('"global_step": 3.0, "max_steps": 3.0', True),
])
def test_two_fields_equal_are_the_event_only_as_the_dispatched_count(
        tmp_path: Path, steps: str, resolves: bool) -> None:
    """The HF Trainer's predicate (``global_step`` equal to ``max_steps``): two equal
    values, never two nulls or two flags, and two counts (integers, or digits as text) only
    when they are the dispatched step count."""
    root, log = _study(tmp_path, {"preset": "hf-trainer"})
    rewrite(root, log, _without_verl([str({"train_runtime": 30.17, "epoch": 1.0})]))
    _with_trainer_state(root, log, ("{" + steps + ', "log_history": []}').encode())
    audit(root, tmp_path / "out")
    assert (_period(tmp_path / "out")["verdict"] == "resolved") is resolves


@pytest.mark.parametrize(("state", "resolves"), [
    ('"global_step": 1, "max_steps": 1', True),
    ('"global_step": 0, "max_steps": 5', False),  # (an early stop: the same final record)
    ('"global_step": 3, "max_steps": 3', False),  # (another run's count)
    ('"global_step": null, "max_steps": 5', True),  # (says nothing of where it stopped)
])
def test_the_frameworks_own_state_short_of_its_end_refutes_a_marker(
        tmp_path: Path, state: str, resolves: bool) -> None:
    """The HF Trainer prints its final metrics record (the marker) after any stop, an early
    stopping callback's too: where the attempt's own ``trainer_state.json`` shows the run
    short of its end, the marker is not taken; a state that says nothing of it decides
    nothing."""
    root, log = _study(tmp_path, {"preset": "hf-trainer", "marker": True})
    rewrite(root, log, _without_verl([str({"train_runtime": 30.17, "epoch": 1.0})]))
    _with_trainer_state(root, log, ("{" + state + ', "log_history": []}').encode())
    audit(root, tmp_path / "out")
    period = _period(tmp_path / "out")
    assert (period["verdict"] == "resolved") is resolves, period
    if not resolves:
        assert period["reason"] == "terminal_event_missing"
        assert "shows the run short of its end" in (tmp_path / "out" / "diagnostic.md"
                                                    ).read_text()


def test_a_protocols_matcher_crosses_a_shard_part(tmp_path: Path) -> None:
    """A part carries the protocol's matcher (preset, markers, JSON predicates) as data:
    the merge judges as the single audit does."""
    from auditor._cli import main

    root, log = _study(tmp_path, {"preset": "hf-trainer", "marker": True,
                                  "json": {"global_step": {"field": "max_steps"}}})
    rewrite(root, log, _without_verl([str({"train_runtime": 30.17, "epoch": 1.0})]))
    audit(root, tmp_path / "single")
    assert _period(tmp_path / "single")["verdict"] == "resolved"  # (on the marker)
    assert main(["audit", str(root), "--shard", "1/1", "--out", str(tmp_path / "part"),
                 "--quiet"]) == 0
    assert main(["merge", str(tmp_path / "part"), "--out", str(tmp_path / "merged"),
                 "--quiet", "--no-plots"]) == 0
    for name in ("diagnostic.md", "summary.json"):
        assert (tmp_path / "single" / name).read_bytes() == \
            (tmp_path / "merged" / name).read_bytes(), name


@pytest.mark.parametrize(("traced", "resolves"), [
    ("+ grep -q 'step:1 - training/global_step:1' training.log", False),
    ("++ echo step:1 - training/global_step:1", False),
    ("+++ test -n 'step:1 - training/global_step:1'", False),
    ("step:1 - training/global_step:1 - + not a trace", True),  # (the trainer's own line)
])
def test_a_shell_trace_quoting_the_terminal_line_is_no_event(tmp_path: Path, traced: str,
                                                             resolves: bool) -> None:
    """Seed 002's case (a clean exit, every phase done, the terminal line lost) with the
    batch script's ``set -x`` trace of a command that holds the line's text: the shell
    echoing a command is not the trainer printing its last step."""
    root = outcome_study(tmp_path / "study", ["terminal_missing"])
    log = find(root, "*/attempt-*/training-*.log")
    rewrite(root, log, lambda data: data + traced.encode() + b"\n")
    summary = audit(root, tmp_path / "out")
    (period,) = summary["periods"]
    assert (period["verdict"] == "resolved") is resolves, period


@pytest.mark.parametrize(("line", "resolves"), [
    ('[launcher] status: infrastructure_invalid (ValueError: lacks the terminal event '
     '"step:1 - train/loss:0.41")', False),
    ("AssertionError: {'line': 'step:1 - train/loss:0.41'}", False),
    ("[step:1 - train/loss:0.41]", False),
    # (rank 0's tqdm bar glued to the step line, as one file holds stderr and stdout)
    ("Epoch 1/1: 100%|##########| 1/1 [00:06<00:00,  6.10s/it]step:1 - train/loss:0.41",
     True),
])
def test_a_verl_sft_line_a_message_quotes_is_no_event(tmp_path: Path, line: str,
                                                      resolves: bool) -> None:
    """verl-sft's step line, admitted after a progress bar's ``]``, is not admitted after a
    quote or a bracket that opens one: a launcher's error message or an exception's repr that
    quotes the line is no step that ran (as for verl's own line)."""
    root, log = _study(tmp_path, {"preset": "verl-sft"})
    rewrite(root, log, _without_verl([line]))
    audit(root, tmp_path / "out")
    assert (_period(tmp_path / "out")["verdict"] == "resolved") is resolves


@pytest.mark.parametrize("line", [
    '{"level": "info", "msg": "step:1 - train/loss:0.41"}',  # (a JSON forwarder's record)
    '{"log":"step:1 - train/loss:0.41\\n","stream":"stdout"}',  # (Docker's json-file)
    'level=info msg="step:1 - train/loss:0.41"',  # (logfmt)
])
def test_a_forwarders_record_of_the_verl_sft_line_still_ends_the_run(tmp_path: Path,
                                                                     line: str) -> None:
    """A forwarder's record of verl-sft's own step line (its value opened by ``"msg": "``,
    ``"log":"`` or ``msg="``) is the line itself, as for verl's and every preset's: the
    preset's look-behind refused any double quote before ``step:``, so the run went
    unresolved (``terminal_event_missing``)."""
    root, log = _study(tmp_path, {"preset": "verl-sft"})
    rewrite(root, log, _without_verl([line]))
    audit(root, tmp_path / "out")
    assert _period(tmp_path / "out")["verdict"] == "resolved"
