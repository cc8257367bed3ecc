"""The library API the README shows: ``run_audit``, a short ``repr``, the outputs as
DataFrames, and ``import auditor`` costing nothing of the audit's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
            "heavy = [m for m in ('auditor.audit', 'pandas', 'pyarrow', 'auditor.collect') "
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
