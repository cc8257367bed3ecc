"""The diagnosis's sentence for a training log that lacks the terminal event names what the
protocol's own matcher looks for (contract v1.2, "Terminal-event matchers"): a preset's end
line in its framework's words, the protocol's pattern, its JSON predicates, its markers;
never verl's ``step:N``/``training/global_step:N`` for another framework's log. A copy of
the end line quoted inside another line (which never counts) is said, so a reader who greps
the log for it finds the sentence true. verl's own sentence is unchanged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from tests.helpers import audit, find, outcome_study, rewrite
from tests.terminal.test_audit_presets import _with_trainer_state
from tests.terminal.test_presets import titan_info, titan_step


def _diagnosis(tmp_path: Path, terminal_event: dict[str, Any] | None,
               lines: list[str]) -> tuple[str, Path]:
    """The one period's diagnosis after the log's verl lines are replaced by ``lines``
    (the protocol's ``terminal_event`` updated with ``terminal_event``), and the output."""
    root = outcome_study(tmp_path / "study", ["completed"])
    protocol = json.loads((root / "protocol.json").read_text())
    protocol["terminal_event"].update(terminal_event or {})
    (root / "protocol.json").write_text(json.dumps(protocol))
    log = find(root, "*/attempt-*/training-*.log")

    def change(data: bytes) -> bytes:
        kept = [line for line in data.decode().splitlines() if "global_step" not in line]
        return ("\n".join(kept + lines) + "\n").encode()
    rewrite(root, log, change)
    out = tmp_path / "out"
    summary = audit(root, out)
    (period,) = summary["periods"]
    assert period["reason"] == "terminal_event_missing", period
    (diagnosis,) = pd.read_parquet(out / "periods.parquet")["diagnosis"]
    assert isinstance(diagnosis, str)
    return diagnosis, out


# (the generated log's 17 lines kept: an added line is line 18 onwards)
@pytest.mark.parametrize(("terminal_event", "lines", "said"), [
    ({"preset": "openrlhf"}, ["(PPOTrainer pid=88) ✨ Global step 0: {'policy_loss': 0.01}"],
     "The training log holds no line matching the openrlhf preset's end of training for step "
     "1 (`Global step 1:`); the last step the log shows is 0."),
    ({"preset": "lightning"}, [],
     "The training log holds no line matching the lightning preset's end of training for "
     "step 1 (`` `Trainer.fit` stopped: `max_steps=1` reached. ``); no such line appears for "
     "any step."),
    ({"preset": "nemo"}, ["Training epoch 0, iteration 0/9 | lr: 3e-05"],
     "The training log holds no line matching the nemo preset's end of training for step 1 "
     "(`Training epoch E, iteration 0/0` or `| global_step: 0`); the last step the log shows "
     "is 1 (the logger's 0, counted from 0)."),
    ({"preset": "hf-trainer", "marker": True}, [],
     "The training log holds no marker of the end of training (`{'train_runtime': ...}`)."),
    ({"preset": "mllog"}, [],
     "The training log holds no `:::MLLOG` record matching the mllog preset's end of training "
     '(`key` equal to `"run_stop"` and `metadata.status` equal to `"success"`).'),
    ({"pattern": r"DONE step=(?P<step>[0-9]+)"}, ["DONE step=0"],
     "The training log holds no line matching the protocol's pattern "
     "`DONE step=(?P<step>[0-9]+)` for step 1; the last step the log shows is 0."),
    ({"preset": "openrlhf", "patterns": [r"FIN (?P<step>[0-9]+)", "E`(?P<step>[0-9]+)`"]}, [],
     "The training log holds no line matching the openrlhf preset's end of training for step "
     "1 (`Global step 1:`) or the protocol's patterns `FIN (?P<step>[0-9]+)` or "
     "`` E`(?P<step>[0-9]+)` `` for step 1; no such line appears for any step."),
    ({"preset": "verl", "marker": ["ALL DONE"]}, [],
     "The training log holds no line with `step:1` followed by `training/global_step:1` nor "
     "a line matching the protocol's marker `ALL DONE`; no `step:` metric line appears at "
     "all."),
    ({"preset": "torchtitan"}, [titan_step(1), titan_info(
        "Ran out of data; last step was canceled.", "WARNING"), titan_info("Training completed")],
     "The training log holds no line matching the torchtitan preset's end of training for "
     "step 1 (`step: 1  loss:`) that counts; the last step the log shows is 1. Line 19 of the "
     "training log (`[rank0]:[titan] 2026-05-18 16:06:51,630 - root - WARNING - Ran out of "
     "data; last step was canceled.`) voids every end line of the file"),
], ids=["openrlhf", "lightning", "nemo-0-based", "hf-trainer-json-marker", "mllog",
        "v1-pattern", "preset-and-patterns", "verl-marker", "torchtitan-veto"])
def test_the_missing_end_is_named_as_the_protocols_matcher_reads_it(
        tmp_path: Path, terminal_event: dict[str, Any], lines: list[str], said: str) -> None:
    diagnosis, out = _diagnosis(tmp_path, terminal_event, lines)
    assert said in diagnosis, diagnosis
    if "training/global_step" not in said:  # (verl's words only for verl's matcher)
        assert "global_step:1" not in diagnosis and "`step:` metric line" not in diagnosis
    assert said.split(";")[0] in (out / "diagnostic.md").read_text()


@pytest.mark.parametrize(("terminal_event", "line", "said"), [
    (None, "ValueError: the log lacks the terminal event "
           "'step:1 - training/global_step:1 - actor/loss:0.3'",
     "The training log holds no line with `step:1` followed by `training/global_step:1`, only "
     "a copy quoted inside another line (line 18), which does not count; no `step:` metric "
     "line appears at all."),
    ({"preset": "openrlhf"}, "launcher: the log lacks its end line 'Global step 1: {...}'",
     "The training log holds no line matching the openrlhf preset's end of training for step "
     "1 (`Global step 1:`), only a copy quoted inside another line (line 18), which does not "
     "count; no such line appears for any step."),
], ids=["verl", "openrlhf"])
def test_a_quoted_copy_of_the_end_line_is_said_not_to_count(
        tmp_path: Path, terminal_event: dict[str, Any] | None, line: str, said: str) -> None:
    """A launcher's message quoting the end line it lacks never counts; the sentence says the
    copy is there (a grep finds it), and the evidence cites its line."""
    diagnosis, out = _diagnosis(tmp_path, terminal_event, [line])
    assert said in diagnosis, diagnosis
    assert "training-7000001.log:18` (" in (out / "evidence.md").read_text()


def test_verls_own_sentence_is_unchanged(tmp_path: Path) -> None:
    """The default matcher's sentence, word for word (reports and tools rely on it)."""
    diagnosis, _ = _diagnosis(tmp_path, None, ["step:1 - val/score:0.5"])
    assert "The training log holds no line with `step:1` followed by "  \
        "`training/global_step:1`; `step:` lines appear (the last at line 18, step 1) but " \
        "none with `training/global_step`." in diagnosis


def test_a_metrics_record_in_place_of_the_log_names_no_verl_line(tmp_path: Path) -> None:
    """The HF Trainer's end found in ``trainer_state.json``: the sentence saying where names
    what the driver's log lacks as the end of training, not verl's ``step:1``."""
    root = outcome_study(tmp_path / "study", ["completed"])
    protocol = json.loads((root / "protocol.json").read_text())
    protocol["terminal_event"].update({"preset": "hf-trainer"})
    (root / "protocol.json").write_text(json.dumps(protocol))
    log = find(root, "*/attempt-*/training-*.log")
    rewrite(root, log, lambda data: b"".join(
        line for line in data.splitlines(keepends=True) if b"global_step" not in line))
    _with_trainer_state(root, log, json.dumps(
        {"global_step": 1, "max_steps": 1, "log_history": []}).encode())
    summary = audit(root, tmp_path / "out")
    (period,) = summary["periods"]
    assert period["verdict"] == "resolved"
    (diagnosis,) = pd.read_parquet(tmp_path / "out" / "periods.parquet")["diagnosis"]
    assert "The terminal event is the framework's own record: the driver's log lacks the end " \
        "of training for step 1; the metrics file `" in diagnosis
    assert "`step:1`" not in diagnosis


def test_a_tuners_trial_fit_end_line_is_said_forgotten_not_absent(tmp_path: Path) -> None:
    """Review: Lightning's ``lr_find`` trial fit prints its own ``max_steps=100 reached``,
    then the restore of the state it began from forgets it; the real fit died. The sentence
    said the log held no such line "for any step", which a grep contradicts (the class of
    the quoted copy). It now says the line after which none counts, and why, citing it."""
    restore = "Restoring states from the checkpoint path at /ckpt/.lr_find_0b1c.ckpt"
    diagnosis, out = _diagnosis(tmp_path, {"preset": "lightning"}, [
        "`Trainer.fit` stopped: `max_steps=100` reached.", restore, "Epoch 0:   0%| | 0/10"])
    assert "no such line appears for any step after line 19. Line 19 of the training log " \
        f"(`{restore}`) restores the state a tuner's trial fits began from" in diagnosis, \
        diagnosis
    assert "line matching the lightning preset's end of training for step 1 (" in diagnosis
    assert f"`training-7000001.log:19` (`{restore}`)" in (out / "evidence.md").read_text()
