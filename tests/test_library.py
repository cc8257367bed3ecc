"""The library API the README shows: ``run_audit``, a short ``repr``, the outputs as
DataFrames, and ``import auditor`` costing nothing of the audit's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import FrameType

import pandas as pd

import auditor
from auditor import AuditOptions, run_audit, write_outputs
from tests.helpers import copy_example


def test_run_audit_gives_a_result_with_a_one_line_repr(tmp_path: Path) -> None:
    result = run_audit(str(copy_example(tmp_path)), AuditOptions(jobs=1))
    text = repr(result)
    assert "\n" not in text and len(text) < 200
    assert "18 periods (0 resolved, 9 failed, 9 unresolved)" in text
    assert "gate failed, --allow-partial passed" in text
    write_outputs(result, tmp_path / "out", plots=False)
    periods = pd.read_parquet(tmp_path / "out" / "periods.parquet")
    assert len(periods) == 18 and set(periods["verdict"]) == {"failed", "unresolved"}


def test_import_auditor_loads_no_stage_and_names_its_api() -> None:
    code = ("import sys, auditor; assert auditor.__version__; "
            "heavy = [m for m in ('auditor.pipeline', 'pandas', 'pyarrow', 'auditor.collect') "
            "if m in sys.modules]; print(heavy)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]"
    assert set(auditor.__all__) >= {"run_audit", "AuditOptions", "write_outputs",
                                    "verify_outputs", "AuditResult"}
    try:
        auditor.no_such_name  # noqa: B018
    except AttributeError as error:
        assert "no_such_name" in str(error)
    else:  # pragma: no cover
        raise AssertionError("an unknown name must raise AttributeError")


def test_write_outputs_pauses_the_garbage_collector_and_restores_it(tmp_path: Path) -> None:
    """A library caller's collector is on after ``run_audit``; writing the report runs no
    cyclic collection (each would scan every object of a large study's result, 16-18 s
    against 13.6 s of writing on 144k files) and leaves the collector as it found it."""
    import gc

    result = run_audit(str(copy_example(tmp_path)), AuditOptions(jobs=1))
    collections: list[int] = []
    # (the package's own files: a checkout's folder may be named auditor too)
    package = str(Path(auditor.__file__).parent) + os.sep

    def count(phase: str, info: dict[str, int]) -> None:
        # (one started by the work of writing, not by entering or leaving the pause)
        if phase != "start":
            return
        frame: FrameType | None = sys._getframe(1)
        while frame is not None:
            code = frame.f_code
            if code.co_filename.startswith(package) and code.co_name not in ("write_outputs",
                                                                             "paused_gc"):
                collections.append(info["generation"])
                return
            frame = frame.f_back

    thresholds = gc.get_threshold()
    was_enabled = gc.isenabled()
    gc.enable()
    gc.set_threshold(1, 1, 1)  # (any allocation would start one)
    gc.callbacks.append(count)
    try:
        write_outputs(result, tmp_path / "out", plots=False)
        assert gc.isenabled()
    finally:
        gc.callbacks.remove(count)
        gc.set_threshold(*thresholds)
        if not was_enabled:
            gc.disable()
    assert collections == []
    assert (tmp_path / "out" / "diagnostic.md").is_file()


def test_an_audit_read_in_this_process_keeps_no_study_context_after(tmp_path: Path) -> None:
    """Read inline, the audit judged its periods here, on its study's context (the
    scheduler's dump, the study-level findings): once the result is made, nothing holds
    that context, so a caller auditing study after study keeps none of them."""
    import gc

    from auditor.reason.engine import JudgeContext

    result = run_audit(copy_example(tmp_path))
    assert result.verdicts
    gc.collect()
    assert [item for item in gc.get_objects() if isinstance(item, JudgeContext)] == []
