"""The package's layers, enforced: import-linter's contracts in ``.importlinter``.

No cycles between stages, and imports only downward: the CLI > the audit > report and the
producer kit > reason > validate > collect > model (``TYPE_CHECKING`` imports count);
reporters see only the model; the producer kit imports only the model and the exit rules,
never pandas or pyarrow; the model imports no stage.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # (lint-imports over the tree, twice)

ROOT = Path(__file__).resolve().parents[1]


def _lint_imports() -> subprocess.CompletedProcess[str]:
    command = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if command is None:
        pytest.fail("lint-imports is not installed (pip install -e '.[test]')")
    return subprocess.run([command, "--config", str(ROOT / ".importlinter"), "--no-cache"],
                          cwd=ROOT, capture_output=True, text=True, check=False, timeout=300)


def test_the_layers_hold() -> None:
    done = _lint_imports()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_an_upward_import_breaks_the_layers(tmp_path: Path) -> None:
    """The contracts are not vacuous: a copy of the package whose model imports the audit
    (an arrow running back up) breaks them."""
    copy = tmp_path / "tree"
    shutil.copytree(ROOT / "auditor", copy / "auditor",
                    ignore=shutil.ignore_patterns("__pycache__", "_example_study"))
    shutil.copy(ROOT / ".importlinter", copy / ".importlinter")
    core = copy / "auditor" / "model" / "core.py"
    core.write_text(core.read_text() + "\nfrom auditor.pipeline.audit import Auditor  # noqa\n")
    command = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert command is not None
    done = subprocess.run([command, "--config", str(copy / ".importlinter"), "--no-cache"],
                          cwd=copy, capture_output=True, text=True, check=False, timeout=300,
                          env={"PYTHONPATH": str(copy), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "BROKEN" in done.stdout and "auditor.model.core -> auditor.pipeline.audit" in done.stdout


def test_what_a_worker_runs_imports_no_pyarrow() -> None:
    """The modules a reading worker runs (the pool, the reading and judging of a batch,
    the scheduler dump's parse) import no pyarrow, numpy or pandas: a worker started
    afresh (macOS's spawn, a Dask worker) would otherwise import pyarrow for nothing, about
    45 MB of RSS each (the phase and device rows it makes are plain tuples)."""
    import sys

    code = ("import sys, auditor.pipeline.pool, auditor.pipeline.worker, auditor.collect.inputs; "
            "print(sorted(m for m in ('pyarrow', 'numpy', 'pandas') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
