"""What ``auditor.capture`` costs a training process: no pandas, no pyarrow, no stage."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.capture.support import REPO, clean_env, python

pytestmark = pytest.mark.slow  # (real child processes, signals)

ALLOWED = {"auditor", "auditor.model", "auditor.reason", "auditor.reason.exits", "auditor._text"}


def _allowed(module: str) -> bool:
    """The package itself, the model (a package: its submodules too), the exit rules, and
    the text helpers (a record's text that is not UTF-8 is written printable, as the
    audit's outputs write it)."""
    return module in ALLOWED or module.startswith("auditor.model.")


def test_capture_imports_neither_pandas_nor_pyarrow_nor_other_stages() -> None:
    done = python("""
        import sys
        import auditor.capture, auditor.capture.launch, auditor.capture.seal
        import auditor.capture.example
        assert 'pandas' not in sys.modules and 'pyarrow' not in sys.modules, 'heavy'
        assert 'torch' not in sys.modules
        print(sorted(m for m in sys.modules if m.startswith('auditor')
                     and not m.startswith('auditor.capture')))
        """, clean_env())
    assert done.returncode == 0, done.stderr
    imported = eval(done.stdout)  # noqa: S307 - a list literal the child printed
    assert [m for m in imported if not _allowed(m)] == []


CHECK_IMPORTS = {"auditor.collect.training_log", "auditor.collect.terminal",
                 "auditor.collect.metrics", "auditor.collect.protocol"}
"""What the launcher's own check imports, and only it (``check.py``, imported at the
command's end, and for the protocol's shutdown flag at its start): the audit's training-log
scanner, its terminal-event matchers and its protocol reader (``.importlinter`` says the
same)."""


def test_capture_sources_import_only_model_and_exits_and_never_print() -> None:
    for path in sorted((REPO / "auditor" / "capture").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                if name.startswith("auditor") and not name.startswith("auditor.capture"):
                    assert _allowed(name) or (path.name == "check.py"
                                              and name in CHECK_IMPORTS), \
                        f"{path.name} imports {name}"
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                raise AssertionError(f"{path.name}:{node.lineno} prints")
    assert Path(REPO / "auditor" / "capture" / "__init__.py").exists()
