"""What the commands print of evidence's text, a terminal shows and never obeys: C1 control
characters (the 8-bit CSI U+009B starts an escape sequence on many terminals) and the
bidirectional controls (U+202E reverses what follows) as ESC and the other C0 characters
are: written as escapes, or removed from the rich tables."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from auditor._cli import main

CSI8 = "\u009b"  # (C1 CSI: `CSI 2 J` clears the screen where the terminal takes 8-bit C1)
RLO = "\u202e"  # (right-to-left override)
OSC8 = "\u009d"


def _obeyed(text: str) -> list[str]:
    return [ch for ch in (CSI8, RLO, OSC8, "\x1b") if ch in text]


def test_causes_prints_a_logs_c1_and_bidi_controls_as_escapes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "training-1.log"
    log.write_text("step:1 - loss 2\n"
                   f"RuntimeError: CUDA out of memory {CSI8}2J{OSC8}0;t\x07 {RLO}gnp.exe\n",
                   encoding="utf-8")
    assert main(["causes", str(log)]) == 0
    out = capsys.readouterr().out
    assert "gpu_oom" in out
    assert _obeyed(out) == []
    assert "\\x9b2J" in out and "\\x9d0;t" in out and "\\u202egnp.exe" in out


def test_validate_prints_a_records_c1_and_bidi_controls_as_escapes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "allocator-1.jsonl"
    trace.write_text(json.dumps({"pid": 1, "seq": f"{CSI8}2J{RLO}x"}) + "\n", encoding="utf-8")
    assert main(["validate", str(trace)]) == 1
    out = capsys.readouterr().out
    assert "/seq: expected integer" in out
    assert _obeyed(out) == []
    assert "\\x9b2J\\u202ex" in out


def test_audit_and_gate_print_a_configurations_controls_inert(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, out = tmp_path / "study", tmp_path / "out"
    assert main(["example", str(root)]) == 0
    named = f"gsm{CSI8}2J{RLO}8k"
    for path in (root / "pairs").glob("*/period-*.json"):
        record = json.loads(path.read_text(encoding="utf-8"))
        if record["workload"] == "gsm8k":
            record["workload"] = named
            path.write_text(json.dumps(record), encoding="utf-8")
    capsys.readouterr()
    main(["audit", str(root), "--out", str(out), "--no-plots"])
    said = capsys.readouterr()
    assert "gsm" in said.out and _obeyed(said.out + said.err) == []
    assert main(["gate", str(out)]) == 1
    gate = capsys.readouterr().out
    assert "configuration gsm\\x9b2J\\u202e8k@4 unresolved" in gate
    assert _obeyed(gate) == []
