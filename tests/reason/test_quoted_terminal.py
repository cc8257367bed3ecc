"""A terminal line's text that a message, a traceback or an echoed command quotes is never the
event (contract v1.2: the framework's own end-of-training output); the run's own line, or a
JSON forwarder's record of it, still is. End to end, through ``auditor audit``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import audit, find, outcome_study, rewrite, verdicts

SUBJECT = "host-qwen25-7b-gsm8k-c2-s161/period-1"
QUOTED = {
    "the launcher's error message, double-quoted": [
        '[launcher] status: infrastructure_invalid (ValueError: Successful exit lacks the '
        'exact one-step terminal event "step:1 - training/global_step:1")'],
    "a traceback's exception line": [
        "Traceback (most recent call last):",
        '  File "/opt/launch.py", line 10, in <module>',
        "    check(log)",
        "ValueError: Successful exit lacks the terminal event: step:1 - training/global_step:1"],
    "a traceback's source line": [
        "(TaskRunner pid=7) Traceback (most recent call last):",
        '(TaskRunner pid=7)   File "/opt/check.py", line 3, in <module>',
        '(TaskRunner pid=7)     assert "step:1 - training/global_step:1" in text',
        "(TaskRunner pid=7) AssertionError"],
    "the launcher's error message, double-quoted after a colon": [
        '[launcher] error: the log lacks the terminal event: "step:1 - training/global_step:1"'],
    "an echoed command's double-quoted argument": [
        '[launcher] running: grep -c "step:1 - training/global_step:1" training.log'],
}
OWN = {
    "the trainer's own line": ["(TaskRunner pid=7) step:1 - training/global_step:1 - loss:0.2"],
    "a JSON forwarder's record of it": [
        '{"level": "info", "msg": "step:1 - training/global_step:1 - loss:0.2"}'],
    "Docker's json-file record of it": [
        '{"log":"step:1 - training/global_step:1 - loss:0.2\\n","stream":"stdout"}'],
    "the trainer's line after a finished traceback": [
        "(TaskRunner pid=7) Traceback (most recent call last):",
        '(TaskRunner pid=7)   File "/opt/warn.py", line 3, in <module>',
        "(TaskRunner pid=7)     warn()",
        "(TaskRunner pid=7) UserWarning: slow tokenizer",
        "(TaskRunner pid=7) step:1 - training/global_step:1 - loss:0.2"],
}


def _audited(tmp_path: Path, lines: list[str]) -> tuple[str, str]:
    """The verdict of a clean exit with every completion phase and no terminal line, once
    ``lines`` are appended to its training log (its manifest entry kept consistent)."""
    root = outcome_study(tmp_path / "study", ["terminal_missing"])
    rewrite(root, find(root, "*/attempt-*/training-*.log"),
            lambda data: data + "".join(f"{line}\n" for line in lines).encode())
    return verdicts(audit(root, tmp_path / "out"))[SUBJECT]


@pytest.mark.parametrize("where", sorted(QUOTED))
def test_a_terminal_line_quoted_about_the_run_never_resolves_it(tmp_path: Path,
                                                                 where: str) -> None:
    assert _audited(tmp_path, QUOTED[where]) == ("unresolved", "terminal_event_missing")


@pytest.mark.parametrize("where", sorted(OWN))
def test_the_runs_own_terminal_line_still_resolves_it(tmp_path: Path, where: str) -> None:
    assert _audited(tmp_path, OWN[where]) == ("resolved", "completed")
