"""Same outputs: does this checkout audit studies byte for byte as another commit does?

For a refactoring that must change no behaviour. The studies are written by this checkout's
generator (``auditor example``: the example, mixed and scale kinds, and the benchmarks'
many-file study, smaller) and audited by the working tree (A) and by ``--against REV`` (B, a
temporary ``git worktree`` first on ``PYTHONPATH``); every output but
``output_manifest.json`` (which holds the audit's time) is compared byte for byte::

    .venv/bin/python benchmarks/same_outputs.py --against 08978f8

Each audit runs in the scratch folder, never in the checkout: ``python -m`` puts the working
directory first on ``sys.path``, so run from the checkout both sides would be its code. Exits
0 when every output is the same, 1 otherwise (the differing files listed).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STUDIES: dict[str, list[str]] = {
    "example": ["--kind", "example"],
    "mixed": ["--kind", "mixed"],
    "scale": ["--kind", "scale", "--elements", "40", "--trace-samples", "50", "--log-lines", "50"],
    "many": ["--kind", "scale", "--elements", "300", "--trace-samples", "2", "--log-lines", "0"],
}
"""The studies compared, as ``auditor example`` arguments."""


def _auditor(source: Path, arguments: Sequence[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``auditor ARGUMENTS`` with the package of ``source`` (run in ``cwd``, not the checkout)."""
    env = {**os.environ, "PYTHONPATH": str(source)}
    return subprocess.run([sys.executable, "-m", "auditor", *arguments], cwd=cwd, env=env,
                          capture_output=True, text=True, check=False)


def _outputs(out: Path) -> dict[str, bytes]:
    return {path.relative_to(out).as_posix(): path.read_bytes()
            for path in sorted(out.rglob("*")) if path.is_file()
            and path.name != "output_manifest.json"}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--against", required=True, help="the commit to compare with (B)")
    parser.add_argument("--studies", default=",".join(STUDIES),
                        help=f"comma-separated, from {', '.join(STUDIES)}")
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.studies.split(",") if name.strip()]
    if not names or any(name not in STUDIES for name in names):
        parser.error(f"--studies: choose from {', '.join(STUDIES)}")
    with tempfile.TemporaryDirectory(prefix="same-outputs-") as scratch_name:
        scratch = Path(scratch_name)
        tree = scratch / "b-tree"
        added = subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach",
                                str(tree), args.against], capture_output=True, text=True,
                               check=False)
        if added.returncode != 0:
            print(f"same_outputs: cannot check out {args.against}: {added.stderr.strip()}",
                  file=sys.stderr)
            return 2
        try:
            return _compare(names, scratch, tree, args.against)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                            str(tree)], check=False, capture_output=True)


def _compare(names: Sequence[str], scratch: Path, tree: Path, against: str) -> int:
    probe = subprocess.run([sys.executable, "-c", "import auditor; print(auditor.__file__)"],
                           cwd=scratch, env={**os.environ, "PYTHONPATH": str(tree)},
                           capture_output=True, text=True, check=False)
    found = probe.stdout.strip()
    if not found.startswith(str(tree)):  # (else both sides would be one tree's code)
        print(f"same_outputs: side B imports {found or probe.stderr.strip()!r}, not {tree}",
              file=sys.stderr)
        return 2
    print(f"A = {REPO} (working tree), B = {against} (imported from {found})")
    different = 0
    for name in names:
        study = scratch / f"study-{name}"
        made = _auditor(REPO, ["example", str(study), *STUDIES[name]], scratch)
        if made.returncode != 0:
            print(f"{name}: the generator failed: {made.stderr.strip()[-400:]}")
            return 2
        outputs = {}
        for label, source in (("A", REPO), ("B", tree)):
            out = scratch / f"out-{name}-{label}"
            done = _auditor(source, ["audit", str(study), "--out", str(out), "--quiet"],
                            scratch)
            outputs[label] = (done.returncode, _outputs(out) if out.is_dir() else {})
        (code_a, a), (code_b, b) = outputs["A"], outputs["B"]
        changed = sorted(path for path in a.keys() | b.keys() if a.get(path) != b.get(path))
        if changed or code_a != code_b:
            different += 1
            print(f"{name}: DIFFERENT (exit {code_a} against {code_b}): {', '.join(changed)}")
        else:
            print(f"{name}: same ({len(a)} outputs, exit {code_a})")
    return 1 if different else 0


if __name__ == "__main__":
    raise SystemExit(main())
