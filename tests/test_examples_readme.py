"""The README's multi-node example is the one the real-Slurm test runs: each of
``examples/multinode/``'s files appears in the README verbatim, as a ``bash`` block."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BLOCKS = re.findall(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S)


@pytest.mark.parametrize("name", ["launcher.sh", "study.sbatch"])
def test_the_readme_shows_the_example_the_cluster_test_runs(name: str) -> None:
    assert (REPO / "examples" / "multinode" / name).read_text() in BLOCKS


def test_no_script_the_project_ships_requeues_a_whole_array() -> None:
    """``scontrol requeue "$SLURM_JOB_ID"`` in the element whose job id is the array's
    requeues every element (seed 000's failure): the README and the examples requeue
    ``${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}``."""
    shipped = [REPO / "README.md", *sorted((REPO / "examples").rglob("*"))]
    for path in (p for p in shipped if p.is_file()):
        for line in path.read_text().splitlines():
            if "scontrol requeue" in line and not line.lstrip().startswith("#"):
                assert "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}" in line, (path, line)


def test_the_readmes_library_example_runs_as_written(tmp_path: Path) -> None:
    """A newcomer pastes the README's library block into Python, in a clone's root: it runs,
    and the repr its comment shows is the one it gives."""
    import subprocess
    import sys

    block = next(text for text in re.findall(r"```python\n(.*?)```", (REPO / "README.md")
                                              .read_text(), re.S)
                 if "run_audit(" in text)
    (tmp_path / "fixtures").symlink_to(REPO / "fixtures")
    shown = block.replace("\nresult          #", "\nprint(repr(result))  #", 1)
    done = subprocess.run([sys.executable, "-c", shown], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    said = re.search(r"# (<AuditResult[^>]*?);\s*\n\s*#\s*(.*?>)", block)
    assert said is not None
    assert f"{said[1]}; {said[2]}" in done.stdout
    assert (tmp_path / "audit-out" / "diagnostic.md").is_file()
