"""What a new user of the command line tripped on (issue 20 item 7), through main([...])."""

from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path

import pytest

from auditor import run_audit, verify_outputs, write_outputs
from auditor._cli import main
from tests.helpers import copy_example

EXAMPLE = Path(__file__).resolve().parents[1] / "fixtures" / "example_study"


def test_rules_are_listed_in_id_order(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rules"]) == 0
    ids = re.findall(r"^\W+(AUD\d{3}) ", capsys.readouterr().out, re.MULTILINE)
    assert ids and ids == sorted(ids)


def test_verify_prints_the_output_manifests_own_sha256(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["audit", str(EXAMPLE), "--out", str(out), "--quiet", "--no-plots"]) == 0
    capsys.readouterr()
    assert main(["verify", str(out)]) == 0
    digest = hashlib.sha256((out / "output_manifest.json").read_bytes()).hexdigest()
    assert f"output_manifest.json SHA-256: {digest}" in capsys.readouterr().out


def test_verify_outputs_takes_a_str_path_as_run_audit_does(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    result = run_audit(str(root))
    write_outputs(result, tmp_path / "out", plots=False)
    differences, checked = verify_outputs(str(tmp_path / "out"))
    assert differences == [] and checked > 0


@pytest.mark.parametrize("jobs", ["0", "-1", "257"])
def test_jobs_outside_1_to_256_is_a_usage_error_not_a_silent_default(
        jobs: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``--jobs 0`` was accepted in silence and meant "as many as the CPUs": a number of
    readers is 1 or more; leaving the option out means the CPUs this process may use."""
    assert main(["audit", str(EXAMPLE), "--jobs", jobs, "--quiet", "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--jobs must be 1 to 256" in err


def test_audit_prints_the_output_manifests_own_sha256(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The report cannot hold the manifest's digest (the manifest pins the report): the
    audit's terminal summary and its --json say it."""
    import orjson

    out = tmp_path / "out"
    assert main(["audit", str(EXAMPLE), "--out", str(out), "--no-plots"]) == 0
    digest = hashlib.sha256((out / "output_manifest.json").read_bytes()).hexdigest()
    assert f"output_manifest.json SHA-256: {digest}" in capsys.readouterr().out
    assert main(["audit", str(EXAMPLE), "--out", str(out), "--force", "--no-plots",
                 "--json"]) == 0
    printed = orjson.loads(capsys.readouterr().out)
    digest = hashlib.sha256((out / "output_manifest.json").read_bytes()).hexdigest()
    assert printed["output_manifest_sha256"] == digest
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert "output_manifest_sha256" not in summary  # (the file stays the contract's)


def test_plots_skipped_for_want_of_matplotlib_say_so_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Installed without the ``plots`` extra, the audit writes its report without plots
    and says why in one line (it used to say nothing)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real(name, *a))
    for name in ("matplotlib", "matplotlib.backends.backend_agg", "matplotlib.figure"):
        monkeypatch.setitem(sys.modules, name, None)  # (an import of it fails, as uninstalled)
    root = copy_example(tmp_path)
    assert main(["audit", str(root), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert err.count("plots skipped") == 1 and "auditor[plots]" in err
    assert not (tmp_path / "out" / "plots").exists()
