"""Packaging: the wheel installs ``auditor`` only (no top-level ``fixtures``) with the example
study inside it, and an editable install imports the real package even from a folder that
holds a directory named ``auditor`` (a clone's parent folder)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import auditor
from tests.helpers import EXAMPLE, REPO


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {path.relative_to(root).as_posix(): path.read_bytes()
            for path in sorted(root.rglob("*")) if path.is_file()}


def copy_sources(clone: Path) -> Path:
    """What a build reads of the working tree (the package and the example study its link
    names), copied to ``clone``."""
    clone.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, clone / name)
    shutil.copytree(REPO / "auditor", clone / "auditor", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(EXAMPLE, clone / "fixtures" / "example_study", symlinks=True)
    return clone


def import_from(python: str, cwd: Path) -> str:
    """What ``python -c 'import auditor, auditor.model'`` run in ``cwd`` imports."""
    done = subprocess.run(
        [python, "-c", "import auditor, auditor.model; print(auditor.__file__, "
         "auditor.__version__)"],
        cwd=cwd, capture_output=True, text=True, check=False, timeout=120,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_directory_named_auditor_in_the_working_directory_does_not_shadow_the_package(
    tmp_path: Path,
) -> None:
    # the clone's parent folder: a directory named auditor without __init__.py, which
    # Python's path search takes for a namespace package unless the real package lies on
    # sys.path (an editable install's .pth line), not behind an import hook tried after it
    (tmp_path / "auditor" / "auditor").mkdir(parents=True)
    printed = import_from(sys.executable, tmp_path)
    assert printed == f"{auditor.__file__} {auditor.__version__}"


@pytest.mark.slow
def test_the_wheel_installs_auditor_only_with_the_example_study(tmp_path: Path) -> None:
    source = copy_sources(tmp_path / "auditor")  # (a build/ left in the clone would leak in)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "-w", str(tmp_path / "wheel"),
         "--no-deps", "-q"], capture_output=True, text=True, check=False, timeout=600)
    assert done.returncode == 0, done.stderr
    [wheel] = (tmp_path / "wheel").glob("auditor-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        tops = {name.split("/")[0] for name in names}
        dist_info = next(top for top in tops if top.endswith(".dist-info"))
        assert tops == {"auditor", dist_info}
        assert archive.read(f"{dist_info}/top_level.txt").decode().split() == ["auditor"]
        prefix = "auditor/_example_study/"
        bundled = {name.removeprefix(prefix): archive.read(name)
                   for name in names if name.startswith(prefix) and not name.endswith("/")}
        assert {"auditor/_studygen/__init__.py", "auditor/_cli/example.py",
                "auditor/schemas/summary.schema.json"} <= set(names)
    assert bundled == tree_bytes(EXAMPLE)


@pytest.mark.slow
def test_an_editable_install_imports_from_the_clones_parent_folder(tmp_path: Path) -> None:
    clone = copy_sources(tmp_path / "auditor")  # a clone named as the package
    venv = clone / ".venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    # the README's install step, without the dependencies (the test venv's serve instead)
    done = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "-e", "."],
                          cwd=clone, capture_output=True, text=True, check=False, timeout=600)
    assert done.returncode == 0, done.stderr
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], capture_output=True, text=True, check=True)
    Path(site.stdout.strip(), "zz_test_dependencies.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n")
    printed = import_from(python, tmp_path)
    assert printed == f"{clone / 'auditor' / '__init__.py'} {auditor.__version__}"
    example = subprocess.run(
        [python, "-c", "import importlib.resources as r; print((r.files('auditor') / "
         "'_example_study' / 'protocol.json').is_file())"],
        cwd=tmp_path, capture_output=True, text=True, check=True)
    assert example.stdout.strip() == "True"
