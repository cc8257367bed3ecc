"""``auditor example OUT [--kind example|mixed|scale]``: write a synthetic study.

The default kind writes the bundled example study (the seed's nine-element, eighteen-launch
job array), byte for byte as the package ships it; ``mixed`` has one period per outcome and
``scale`` builds large studies (``--elements``, ``--trace-samples``, ``--log-lines``). The
study is written into a temporary directory beside ``OUT`` and renamed into place, so an
interrupted or failed command leaves nothing half-written. ``OUT`` must not exist or be an
empty directory (exit 2 otherwise, one line).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from auditor.errors import OutputError, UsageError

KINDS = ("example", "mixed", "scale")
"""The generator's presets (:data:`auditor._studygen.PRESETS`, checked by a test), written
out here so ``auditor --help`` does not import the generator."""


def add_parsers(commands: Any) -> None:
    """Add the ``example`` sub-command to ``commands`` (an argparse sub-parsers action)."""
    example = commands.add_parser(
        "example", help="write a synthetic study (default: the bundled example study)",
        description="Write a synthetic run-evidence study (run-evidence contract v1.2, in "
        "its v1 forms). The default kind is the bundled example study, byte for byte.")
    example.add_argument("out", type=Path, help="output directory; must not exist or be empty")
    example.add_argument("--kind", choices=KINDS, default="example",
                         help="example: the seed study (default); mixed: one period per "
                         "outcome; scale: a large study for benchmarks")
    example.add_argument("--elements", type=int, default=None,
                         help="scale: array elements (default 100)")
    example.add_argument("--trace-samples", type=int, default=None,
                         help="scale: memory samples per allocator trace (default 1000)")
    example.add_argument("--log-lines", type=int, default=None,
                         help="scale: filler lines per training log (default 1000)")


MOST = 10_000_000
"""The most elements, trace samples or log lines a generated study is asked for (a million
files is 55,556 elements)."""


SCALE_DEFAULTS = {"elements": 100, "trace_samples": 1000, "log_lines": 1000}


def _example(args: argparse.Namespace) -> int:
    out: Path = args.out
    given = [name for name in SCALE_DEFAULTS if getattr(args, name) is not None]
    if given and args.kind != "scale":  # (the other kinds are fixed studies: never ignored)
        raise UsageError(f"example: --{given[0].replace('_', '-')} goes with --kind scale "
                         f"(the {args.kind} study is fixed)")
    for name, default in SCALE_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    if min(args.elements, args.trace_samples + 1, args.log_lines + 1) < 1:
        raise UsageError("example: --elements must be at least 1, --trace-samples and "
                         "--log-lines at least 0")
    for flag, value in (("--elements", args.elements), ("--trace-samples", args.trace_samples),
                        ("--log-lines", args.log_lines)):
        if value > MOST:  # (a study of 10^20 elements is a machine's memory spent, not one)
            raise UsageError(f"example: {flag} at most {MOST:,} (got {value:,})")
    _check_out(out)
    from auditor._signals import signals_deferred

    with signals_deferred():  # (orjson interrupted while it initialises can crash)
        from auditor._studygen import generate
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as error:
        raise OutputError(f"example: cannot write beside {out}: {error.strerror or error}") \
            from None
    try:
        generate(args.kind, staging / "study", elements=args.elements,
                 trace_samples=args.trace_samples, log_lines=args.log_lines)
        _check_out(out)  # (it may have been made meanwhile)
        os.replace(staging / "study", out)  # (onto an empty directory too, on POSIX)
    except OSError as error:
        raise OutputError(f"example: cannot write {out}: {error.strerror or error}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(out)
    return 0


def _check_out(out: Path) -> None:
    """Refuse an ``OUT`` that exists and is not an empty directory."""
    try:
        if out.is_symlink():
            raise OutputError(f"example: refusing to write through the link {out} (name a "
                              "new or empty directory)")
        if out.exists() and not out.is_dir():
            raise OutputError(f"example: refusing to write over the file {out} (name a new "
                              "or empty directory)")
        if out.exists() and any(out.iterdir()):
            raise OutputError(f"example: refusing to write into non-empty {out} (name a new "
                              "or empty directory)")
    except OSError as error:
        raise OutputError(f"example: cannot read {out}: {error.strerror or error}") from None


HANDLERS = {"example": _example}
