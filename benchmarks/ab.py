"""A/B: ``auditor audit`` of this checkout against another commit, interleaved in one run.

One-off runs on a shared machine vary by 20-40%; only runs interleaved in time compare two
versions fairly. For each study (the sizes of :mod:`run`), this alternates an audit by the
working tree's sources (A) and one by ``--against REV``'s (B, a temporary ``git worktree``
put first on ``PYTHONPATH``; the venv's libraries serve both), ``--repeat`` times each, and
prints the best wall time of each and B / A::

    .venv/bin/python benchmarks/ab.py --against 353eefe --sizes many,large --repeat 5

The studies are generated (and cached) as ``run.py`` does, by this checkout's generator.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run as bench  # noqa: E402  (this folder's run.py)

REPO = Path(__file__).resolve().parents[1]


def _worktree(rev: str, where: Path) -> Path:
    target = where / "b-tree"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(target), rev],
                   check=True, capture_output=True)
    return target


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--against", required=True, help="the commit to compare with (B)")
    parser.add_argument("--sizes", default="many,large",
                        help=f"comma-separated studies, from {', '.join(bench.PLANS)}")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each, best kept")
    parser.add_argument("--workdir", type=Path, default=bench.DEFAULT_WORKDIR)
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=3600.0)
    args = parser.parse_args(argv)
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in sizes if s not in bench.PLANS]
    if unknown or args.repeat < 1:
        parser.error(f"unknown size(s) {unknown}" if unknown else "--repeat must be >= 1")
    args.workdir = args.workdir.resolve()  # (the audits run elsewhere: run.run_cli)
    args.workdir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=args.workdir, prefix="ab-"))
    tree = _worktree(args.against, scratch)
    env_b = {**os.environ, "PYTHONPATH": str(tree)}
    env_a = {**os.environ, "PYTHONPATH": str(REPO)}
    for sources in (REPO, tree):
        bench.compile_sources(sources)
    results = []
    try:
        for size in sizes:
            study = bench.prepare(bench.PLANS[size], args.workdir)
            bench._warm(study.files)
            best = {"A": float("inf"), "B": float("inf")}
            for attempt in range(args.repeat):
                for label, env in (("A", env_a), ("B", env_b)) if attempt % 2 == 0 \
                        else (("B", env_b), ("A", env_a)):
                    run = bench.run_audit(study, scratch / f"out-{label}", args.jobs,
                                          args.timeout, env=env)
                    if not run.ok:
                        print(f"[{size}] {label} failed:\n{run.stderr[-2000:]}",
                              file=sys.stderr)
                        return 1
                    best[label] = min(best[label], run.wall_s)
                    print(f"[{size}] {label} run {attempt + 1}: {run.wall_s:.2f} s", flush=True)
            results.append({"size": size, "files": len(study.files), "A_s": best["A"],
                            "B_s": best["B"], "B_over_A": best["B"] / best["A"]})
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)],
                       check=False, capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"\nA = working tree ({REPO}), B = {args.against}; best of {args.repeat} each, "
          "interleaved\n")
    print("| study | files | A s | B s | A / B |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for row in results:
        print(f"| {row['size']} | {row['files']:,} | {row['A_s']:.2f} | {row['B_s']:.2f} | "
              f"{row['A_s'] / row['B_s']:.3f} |")
    (args.workdir / "ab-results.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
