"""The package and its tests stay ruff and mypy clean (run as part of the suite, so CI
enforces it)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # (ruff and mypy over the tree)

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("tool", [["ruff", "check", "."], ["mypy"]])
def test_static_checks(tool: list[str]) -> None:
    if shutil.which(tool[0]) is None and not (Path(sys.executable).parent / tool[0]).exists():
        pytest.skip(f"{tool[0]} not installed")
    executable = str(Path(sys.executable).parent / tool[0])
    if not Path(executable).exists():
        executable = tool[0]
    result = subprocess.run([executable, *tool[1:]], cwd=REPO, capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0, result.stdout + result.stderr
