"""The command line: the only module that prints, exits or touches the terminal.

``main(argv) -> int`` computes the exit code in one place:

- 0: the command did its job (``audit`` finished, whatever the verdicts;
  ``gate`` passed; ``verify`` found no difference; ``validate`` found no problem);
- 1: ``gate`` failed, ``verify`` found differences, ``validate`` found problems;
- 2: a usage or unreadable-input error, one line, no traceback;
- 3: the auditor's own failure (a bug), one line; the traceback only with ``--debug``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.abc
import os
import signal
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from auditor import __version__
from auditor.errors import AuditorError, UsageError

EPILOG = "Contract: run-evidence v1.2 (docs/formats.md). Exit codes: 0 ok, 1 gate/verify " \
         "failed, 2 usage or unreadable input, 3 internal error."


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as :class:`UsageError` (exit 2, one line)."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("auditor").strip()  # (the line says "auditor" once)
        raise UsageError(f"{command + ': ' if command else ''}{message} (see --help)")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="auditor", description="Post-hoc run-evidence auditor for GPU job "
                     "arrays on SLURM.", epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"auditor {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of internal errors")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    audit = commands.add_parser("audit", help="audit a study root and write the report")
    audit.add_argument("root", type=Path, help="the evidence root (a study)")
    audit.add_argument("--out", type=Path, help="output directory (must not exist, be empty, "
                       "or hold an earlier audit with --force); without it nothing is written")
    audit.add_argument("--force", action="store_true",
                       help="replace an earlier audit's output directory, whole")
    audit.add_argument("--sacct", type=Path, help="sacct dump to use instead of "
                       "<root>/accounting/sacct-raw.psv (or .json: sacct --json of "
                       "Slurm 23.11 or later)")
    audit.add_argument("--sacct-format", help="the --format the dump was captured with "
                       "(comma-separated field names)")
    audit.add_argument("--sacct-delimiter", help="the --delimiter the dump was captured with")
    audit.add_argument("--jobs", type=int, default=None,
                       help="worker processes (default: the CPUs this process may use: a SLURM "
                       "job's, taskset's or a container quota's, not the whole node's; "
                       "1 reads in-process)")
    audit.add_argument("--executor", metavar="dask://HOST:PORT",
                       help="read on the Dask cluster whose scheduler is at HOST:PORT (needs "
                       "the 'dask' extra and the study at the same path on its workers; "
                       "every task goes to it; a scheduler silent for 10 s is an error)")
    audit.add_argument("--anchor", action="append", default=[], metavar="NAME=SHA256",
                       help="expected SHA-256 of a protocol input (repeatable)")
    audit.add_argument("--protocol-input", action="append", default=[], metavar="NAME=PATH",
                       help="a protocol input to hash and check against its anchor")
    audit.add_argument("--source-root", type=Path, help="root of the pinned source tree")
    audit.add_argument("--source", action="append", default=[], metavar="PATH",
                       help="a source file (relative to --source-root) the reasoning relied on")
    audit.add_argument("--waive", action="append", default=[], metavar="RULE_ID:SUBJECT",
                       help="waive a gate reason (needs a matching --reason)")
    audit.add_argument("--reason", action="append", default=[], metavar="TEXT",
                       help="why the preceding --waive is acceptable (recorded in the outputs)")
    audit.add_argument("--max-findings", type=int, default=10_000,
                       help="findings kept in all; more make the audit partial (default 10000)")
    audit.add_argument("--max-findings-per-file", type=int, default=200,
                       help="findings kept per cited file (default 200)")
    audit.add_argument("--max-quote", type=int, default=300,
                       help="characters of evidence text kept per citation (default 300)")
    audit.add_argument("--no-plots", action="store_true", help="do not render PNG plots")
    audit.add_argument("--quiet", action="store_true", help="no progress bar or summary table")
    audit.add_argument("--json", action="store_true",
                       help="print summary.json to stdout instead of the summary table")
    audit.add_argument("--shard", metavar="I/N",
                       help="audit shard I of N (every N-th period from the I-th) into a "
                       "part for 'auditor merge' (needs --out)")
    audit.add_argument("--key-file", type=Path, metavar="KEY",
                       help="with --shard: sign the part (HMAC-SHA256) with this key, for "
                       "'auditor merge --key-file KEY'")

    verify = commands.add_parser("verify", help="re-hash an audit's outputs and inputs")
    verify.add_argument("out", type=Path, help="an audit's output directory (--out)")
    verify.add_argument("--quiet", action="store_true",
                        help="print only the differences (the exit code says the rest)")

    gate = commands.add_parser("gate", help="exit 0 when the audit's gate passed, else 1")
    gate.add_argument("out", type=Path, help="an audit's output directory (--out)")
    gate.add_argument("--allow-partial", action="store_true",
                      help="pass on intact evidence with the resolved subset")

    sacct = commands.add_parser("sacct", help="summarise a saved sacct -P (or --json) dump")
    sacct.add_argument("file", type=Path)
    sacct.add_argument("--format", dest="sacct_format", help="the dump's --format field list")
    sacct.add_argument("--delimiter", help="the dump's --delimiter")
    sacct.add_argument("--json", action="store_true", help="print the contract's JSON summary")

    validate = commands.add_parser("validate", help="check files against their kind's schema")
    validate.add_argument("files", type=Path, nargs="+")
    validate.add_argument("--kind", help="the kind of every file (default: from its name)")

    commands.add_parser("rules", help="list every rule (id, symbol, severity, what triggers it)")
    for module in _command_modules():
        module.add_parsers(commands)
    return parser


COMMAND_MODULES: tuple[str, ...] = ("example", "capture", "catalog", "causes", "shards")
"""Modules of ``auditor._cli`` that add commands: each has ``add_parsers(commands)`` (adds
its sub-parsers) and ``HANDLERS`` (command name -> ``handler(args) -> int``). They import
what their commands need inside the handlers, so ``auditor --help`` stays fast."""


def _command_modules() -> list[Any]:
    import importlib

    return [importlib.import_module(f"auditor._cli.{name}") for name in COMMAND_MODULES]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args_list
    args_list = [a for a in args_list if a != "--debug"]  # accepted anywhere on the line
    try:
        parser = _parser()
        args = parser.parse_args(args_list)
        from auditor._cli.inspect import _gate, _rules, _sacct, _validate, _verify

        handlers: dict[str, Callable[[argparse.Namespace], int]] = {
            "audit": _audit, "verify": _verify, "gate": _gate, "sacct": _sacct,
            "validate": _validate, "rules": _rules,
        }
        for module in _command_modules():
            handlers.update(module.HANDLERS)
        if args.command is None:  # (a usage error: one line, as every other)
            raise UsageError(f"no command given: one of {', '.join(handlers)} (see "
                             "'auditor --help')")
        handler = handlers[args.command]
        _preload(args.command)
        return handler(args)
    except AuditorError as error:
        print(f"auditor: error: {_inert(error.diagnostics())}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        return _interrupted_exit()
    except BrokenPipeError:
        return 0
    except Exception as error:  # noqa: BLE001 - the one place internal errors are reported
        if _interrupted(error):  # e.g. Python wraps one that hits a class being made
            return _interrupted_exit()
        if debug:
            traceback.print_exc()
        print(f"auditor: internal error: {type(error).__name__}: {_inert(str(error))} (a bug; "
              "rerun with --debug for the traceback)", file=sys.stderr)
        return 3


def _inert(text: str) -> str:
    """``text`` (a path or argument the user gave, or evidence's text) as one line a terminal
    shows as it is: control characters (C0, DEL and C1: escape sequences, newlines, the
    8-bit CSI U+009B) as ``\\xNN``, bidirectional controls as ``\\uNNNN``, a name
    that is not UTF-8 as :func:`auditor._text.printable` writes it."""
    from auditor._text import printable

    return "".join(f"\\x{ord(ch):02x}" if ch < " " or "\x7f" <= ch <= "\x9f"
                   else f"\\u{ord(ch):04x}" if ch in _BIDI else ch for ch in printable(text))


_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
"""The bidirectional controls that reorder what a terminal shows (the report escapes them
too: :mod:`auditor.report.mdformat`)."""


PRELOAD = {
    "audit": ("orjson", "auditor.pipeline.audit", "auditor.report.summary"),
    "verify": ("orjson", "auditor.report.output"),
    "gate": ("orjson", "auditor.report.output"),
    "sacct": ("orjson", "auditor.collect.sacct"),
    "validate": ("orjson", "auditor.schema", "auditor.collect.allocator_trace"),
}
"""The modules each command needs, imported before it starts with Ctrl-C and SIGTERM held:
a compiled extension interrupted while it initialises can crash the process (orjson
does, by a segmentation fault), and Python reports an interrupt that hits a class being
made as a RuntimeError."""


def _preload(command: str) -> None:
    """Import ``command``'s modules (:data:`PRELOAD`); a signal that arrives meanwhile
    takes effect once they are in."""
    import importlib

    from auditor._signals import signals_deferred

    with signals_deferred():
        for name in PRELOAD.get(command, ()):
            importlib.import_module(name)


_ONLY_EXITING = False
"""Set by :func:`entry` (the process is the command's): once an interrupt is reported,
further Ctrl-C and SIGTERM are ignored, the process only exits."""


def _interrupted_exit() -> int:
    """Say the command was interrupted; its exit code, 130."""
    if _ONLY_EXITING:  # (impatient users press Ctrl-C again: it must not cut this short)
        _ignore_signals()
    print("auditor: interrupted; no output was left half-written", file=sys.stderr)
    # CPython remembers a KeyboardInterrupt that left an exec() of a string (a schema
    # compiler's, a dataclass's) and, under ``python -m``, kills itself with SIGINT as it
    # exits, whatever the exit code; running an empty string clears that memory
    exec("")  # noqa: S102 - an empty string, run for that side effect only
    return 130


def _interrupted(error: BaseException) -> bool:
    """Whether a KeyboardInterrupt (Ctrl-C, or SIGTERM) caused ``error``."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def entry() -> NoReturn:
    """Console-script entry point: SIGTERM unwinds like Ctrl-C, so a half-written output
    is removed rather than left behind; pandas is kept out (see :class:`_NoPandas`).

    The cyclic garbage collector stays off for the process's short life: an audit's
    records hold no cycles, and turning it back on after the audit would only make it
    scan them all once more (0.2 s on 36k files) before the process exits.

    pyarrow allocates from the C library's heap, unless the user chose otherwise: its
    default pool (mimalloc) keeps what the tables took, 50 MB of the peak on a study of
    36k files, for nothing faster on tables this size.
    """
    from auditor._signals import interrupt_unraised

    global _ONLY_EXITING
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    signal.signal(signal.SIGTERM, _terminate)
    if signal.getsignal(signal.SIGHUP) is signal.SIG_DFL and sys.argv[1:2] != ["run"]:
        # (a closed terminal: cleaned up as Ctrl-C; under nohup: ignored, as asked; 'auditor
        # run' keeps its own signals, the contract's, and a hangup ends it as it did)
        signal.signal(signal.SIGHUP, _terminate)
    sys.unraisablehook = interrupt_unraised
    sys.meta_path.insert(0, _NoPandas())
    gc.disable()
    _ONLY_EXITING = True
    try:
        code = main()
    except KeyboardInterrupt:  # (a signal before main's own handling is set up)
        code = _interrupted_exit()
    # the command is done: a Ctrl-C now would only break the interpreter's shutdown (which
    # joins helpers' threads) into a traceback, and end the process by the signal
    _ignore_signals()
    sys.exit(code)


def _ignore_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


class _NoPandas(importlib.abc.MetaPathFinder):
    """Refuses to import pandas in the command-line process.

    The auditor never uses pandas, but pyarrow imports it (when installed) on
    the first conversion of Python values to an Arrow array, only to check
    whether they are pandas objects (apache/arrow#34994): 0.3-0.5 s of every
    audit's wall time. Refused, pyarrow carries on without it. Only the
    console entry point installs this: a library caller keeps pandas.
    """

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError("pandas is not used by the auditor CLI", name=name)
        return None


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt



# ------------------------------------------------------------------ commands


def _split_pairs(values: Sequence[str], flag: str) -> list[tuple[str, str]]:
    pairs = []
    for value in values:
        name, sep, rest = value.partition("=")
        if not sep or not name or not rest:
            raise UsageError(f"{flag} expects NAME=VALUE, got {value!r}")
        pairs.append((name, rest))
    return pairs


def waivers_of(args: argparse.Namespace) -> tuple[Any, ...]:
    """``--waive RULE_ID:SUBJECT --reason TEXT`` pairs as :class:`~auditor.model.Waiver`."""
    from auditor.model import Waiver
    from auditor.rules import RULES

    if len(args.waive) != len(args.reason):
        raise UsageError("every --waive RULE_ID:SUBJECT needs its own --reason TEXT"
                         if len(args.waive) > len(args.reason) else
                         "--reason TEXT without its --waive RULE_ID:SUBJECT")
    waivers = []
    for spec, why in zip(args.waive, args.reason, strict=True):
        rule_id, sep, subject = spec.partition(":")
        if not sep or not rule_id or not subject:
            raise UsageError(f"--waive expects RULE_ID:SUBJECT, got {spec!r}")
        if rule_id not in RULES:
            raise UsageError(f"--waive: unknown rule id {rule_id!r} (see 'auditor rules')")
        waivers.append(Waiver(rule_id, subject, why))
    return tuple(waivers)


def anchors_of(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    """``--anchor NAME=SHA256`` values, the digests lower-cased."""
    anchors = []
    for name, sha in _split_pairs(args.anchor, "--anchor"):
        if len(sha) != 64 or any(c not in "0123456789abcdefABCDEF" for c in sha):
            raise UsageError(f"--anchor {name}: expected 64 hex digits")
        anchors.append((name, sha.lower()))
    return tuple(anchors)


def check_limits(args: argparse.Namespace) -> None:
    """``--max-findings``, ``--max-findings-per-file`` and ``--max-quote`` at least 1."""
    for flag, value in (("--max-findings", args.max_findings),
                        ("--max-findings-per-file", args.max_findings_per_file),
                        ("--max-quote", args.max_quote)):
        if value < 1:
            raise UsageError(f"{flag} must be at least 1")


def _check_audit_arguments(args: argparse.Namespace) -> None:
    """Refuse, before any work, what ``audit``'s options cannot mean together (one line)."""
    if args.source and args.source_root is None:
        raise UsageError("--source needs --source-root")
    if args.jobs is not None and not 1 <= args.jobs <= MAX_JOBS:
        raise UsageError(f"--jobs must be 1 to {MAX_JOBS} (each reader holds tens of MB); "
                         "leave it out for the CPUs this process may use")
    check_limits(args)
    if args.sacct_format is not None or args.sacct_delimiter is not None:
        from auditor.collect.sacct import check_options
        from auditor.errors import SacctFormatError

        try:  # (an unusable one was AUD009, exit 0: the audit ran on a dump it never read)
            check_options(args.sacct_format, args.sacct_delimiter, "audit")
        except SacctFormatError as error:
            raise UsageError(str(error).replace("--format", "--sacct-format").replace(
                "--delimiter", "--sacct-delimiter", 1)) from None
    if args.sacct is not None and not args.sacct.is_file():
        what = "is a directory" if args.sacct.is_dir() else "is not a regular file" \
            if os.path.exists(args.sacct) else "no such file"
        raise UsageError(f"--sacct {args.sacct}: {what}")
    if args.key_file is not None and args.shard is None:
        raise UsageError("--key-file signs a shard's part: it needs --shard I/N")
    if args.shard is not None:  # (a part is judged by the merge: these are the merge's)
        from auditor.model import AuditOptions

        plain = AuditOptions()
        given = [flag for flag, value, default in (
            ("--anchor", args.anchor, []), ("--waive", args.waive, []),
            ("--reason", args.reason, []),
            ("--max-findings", args.max_findings, plain.max_findings),
            ("--max-findings-per-file", args.max_findings_per_file,
             plain.max_findings_per_file),
            ("--max-quote", args.max_quote, plain.max_quote)) if value != default]
        if given:
            raise UsageError(f"{', '.join(given)}: the merged audit's, not a shard's part's "
                             "(a part is judged as it is merged): give them to "
                             "'auditor merge'")
    if args.executor is not None:
        from auditor.pipeline.pool import scheduler_address

        if args.jobs:
            raise UsageError("--jobs is this machine's readers; with --executor the "
                             "cluster's workers read (give one or the other)")
        scheduler_address(args.executor)  # (a malformed one refused before any work)


def _audit(args: argparse.Namespace) -> int:
    from auditor.model import AuditOptions
    from auditor.pipeline.audit import Auditor, drive, paused_gc
    from auditor.report.summary import build_summary

    waivers, anchors = waivers_of(args), anchors_of(args)
    inputs = [(name, Path(path)) for name, path in
              _split_pairs(args.protocol_input, "--protocol-input")]
    _check_audit_arguments(args)
    fields = tuple(f.strip() for f in args.sacct_format.split(",")) if args.sacct_format else None
    options = AuditOptions(
        sacct=args.sacct, sacct_format=fields, sacct_delimiter=args.sacct_delimiter,
        jobs=args.jobs or 0, anchors=anchors, protocol_inputs=tuple(inputs),
        source_root=args.source_root, sources=tuple(args.source), waivers=waivers,
        max_findings=args.max_findings, max_findings_per_file=args.max_findings_per_file,
        max_quote=args.max_quote, executor=args.executor,
    )
    if args.shard is not None:  # (a part for 'auditor merge', not a report)
        from auditor._cli.shards import audit_shard

        return audit_shard(args, options)
    if args.out is not None:
        from auditor.report.output import check_output_dir

        if not args.root.is_dir():
            raise UsageError(f"{args.root}: evidence root does not exist or is not a directory")
        check_output_dir(args.out, args.root, args.force)
    # the plot helper starts now, to import matplotlib while this process audits (not for
    # a root that is plainly no study: that audit ends at once, and would wait for it)
    plotter = _plotter(args.root, args.out) if args.out is not None and not args.no_plots \
        and _may_be_a_study(args.root) else None
    try:
        # the collector is held to the writing's end: re-enabled, it would re-scan every record
        with paused_gc(), spill_beside(args.out), \
                _progress(quiet=args.quiet or args.json) as show:
            result = drive(Auditor(args.root, options).run(), show)
            # (what the terminal shows: the periods' entries go to summary.json, a batch at
            # a time, and to --json)
            summary = build_summary(result, periods=False)
            if args.out is not None:
                from auditor.errors import OutputError
                from auditor.model import Progress
                from auditor.report.output import write_outputs

                show(Progress("write", 0, 1))
                if _ONLY_EXITING:  # (the command's own process: a caller of main keeps its)
                    # the outputs' large blocks go back to the system once freed (the
                    # readers are gone: held from the start, it slowed them by a sixth)
                    from auditor.store.heap import lean_heap

                    lean_heap()
                try:
                    write_outputs(result, args.out, force=args.force, plots=not args.no_plots,
                                  plotter=plotter, helper=_helper_pays(result, options))
                except OSError as error:
                    raise OutputError(f"{args.out}: cannot write the outputs "
                                      f"({error.strerror or error})") from None
            if args.json:  # (the whole document, made while the collector still rests)
                summary = build_summary(result)
    finally:
        if plotter is not None:
            plotter.close()
    # the output manifest pins every other output (the report too), so none can hold its own
    # SHA-256: the command says it, as the seed's diagnostic states its own
    manifest = None if args.out is None else _manifest_sha256(args.out)
    if args.json:
        from auditor.report.summary import dumps

        printed = summary if manifest is None else {**summary,
                                                    "output_manifest_sha256": manifest}
        sys.stdout.write(dumps(printed).decode())
    elif not args.quiet:
        from rich.console import Console

        from auditor.report.terminal import summary_view

        console = Console()
        console.print(summary_view(summary, written=args.out is not None))
        if args.out is not None:
            # the path as it is, on one line whatever the width: a path is copied, not read
            console.print(f"report: {args.out / 'diagnostic.md'}\n"
                          f"output_manifest.json SHA-256: {manifest}", highlight=False,
                          markup=False, emoji=False, soft_wrap=True)
    return 0


def _manifest_sha256(out: Path) -> str:
    """The output manifest's own SHA-256 (it pins every other output, so no output can
    hold it: the command line says it, as the seed's diagnostic states its own)."""
    from auditor._io import sha256_file

    # (the directory as the outputs were written to it: "a/new/.." is "a")
    return sha256_file(os.path.join(os.path.abspath(out), "output_manifest.json")).sha256


def _may_be_a_study(root: Path) -> bool:
    """Whether ``root`` has what discovery looks for first: a ``pairs`` directory (not a
    link) holding something."""
    pairs = root / "pairs"
    try:
        if pairs.is_symlink() or not pairs.is_dir():
            return False
        with os.scandir(pairs) as entries:
            return next(entries, None) is not None
    except OSError:
        return False


def _plotter(root: Path, out: Path) -> Any:
    """A :class:`~auditor.report.plots.Plotter`, started now so that matplotlib is imported
    while the audit runs; None when matplotlib is not installed (no plots are drawn, and
    one line on stderr says so)."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        print("auditor: plots skipped: matplotlib is not installed (pip install "
              "'auditor[plots]', or pass --no-plots)", file=sys.stderr)
        return None
    from auditor.report.plots import Plotter

    _keep_matplotlib_files_out(root, out)
    return Plotter()


def _keep_matplotlib_files_out(root: Path, out: Path) -> None:
    """Give matplotlib a configuration and cache directory of its own (``MPLCONFIGDIR``,
    removed at exit) when where it would write them (its font list, under ``~/.cache`` and
    ``~/.config`` or their XDG places) lies under the evidence root, a HOME inside the
    study, or cannot be written (it would warn on stderr): the audit never writes under the
    root. Otherwise matplotlib keeps its own, and its font list is built once, not per
    audit. That directory is made in ``TMPDIR``, or beside ``out`` where ``TMPDIR`` lies
    under the root."""
    import atexit
    import shutil
    import tempfile

    home = Path(os.path.expanduser("~"))
    places: tuple[Path, ...] = (
        Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config") / "matplotlib",
        Path(os.environ.get("XDG_CACHE_HOME") or home / ".cache") / "matplotlib")
    if os.environ.get("MPLCONFIGDIR"):  # (the user's choice: kept unless under the root)
        places = (Path(os.environ["MPLCONFIGDIR"]),)
    try:
        evidence = root.resolve()
        elsewhere = False
        for place in places:
            place = place.resolve()
            existing = next(p for p in (place, *place.parents) if p.exists())
            if place == evidence or evidence in place.parents or (
                    "MPLCONFIGDIR" not in os.environ
                    and not os.access(existing, os.W_OK | os.X_OK)):
                elsewhere = True
    except (OSError, RuntimeError, StopIteration):
        elsewhere = True
    if elsewhere:
        base: str | None = None
        configured = next((os.environ[name] for name in ("TMPDIR", "TEMP", "TMP")
                           if os.environ.get(name)), None)  # (tempfile's own probe of it
        # writes a file there: read from the environment, as tempfile reads it)
        with contextlib.suppress(OSError, RuntimeError):
            temporary, evidence = Path(configured or "/tmp").resolve(), root.resolve()
            if temporary == evidence or evidence in temporary.parents:
                base = os.path.dirname(os.path.abspath(out))  # (checked: not in the root)
        own = tempfile.mkdtemp(prefix="auditor-matplotlib-", dir=base)
        atexit.register(shutil.rmtree, own, True)
        os.environ["MPLCONFIGDIR"] = own


MAX_JOBS = 256
"""The most readers ``--jobs`` may ask for (99999 once started thousands, and the OOM
killer)."""
PROGRESS_EVERY = 30.0
"""Seconds between progress lines when stderr is not a terminal (a batch job's log): a
long audit says how far it has come, a short one prints nothing."""
STAGES = {
    "list": ("listing the study", "arm directories"),
    "periods": ("reading period records", "records"),
    "read": ("reading evidence", "files"),
    "validate": ("validating", ""),
    "reason": ("reasoning", ""),
    "write": ("writing the outputs", ""),
}
"""How each stage of :class:`auditor.model.Progress` is shown: what it does, what it counts
(the stages that count nothing say only that they started)."""


def spill_beside(out: Path | None) -> contextlib.AbstractContextManager[object]:
    """Around an audit that writes ``out``: the store's temporary files go beside it, in a
    directory of this process's own (``.OUT.tmp-PID-spill``: the next audit of ``out``
    removes one a killed audit left), not to ``TMPDIR``. Without ``out``, or when its
    parent is not made yet, ``TMPDIR``'s."""
    from auditor.store import spilling_into

    if out is None:
        return contextlib.nullcontext()
    parent = Path(os.path.abspath(out)).parent
    if not parent.is_dir():
        return contextlib.nullcontext()
    return spilling_into(parent / f".{out.name}.tmp-{os.getpid()}-spill")


HELPER_FROM = 1_000
"""Periods from which the command writes ``diagnostic.md`` in a forked helper while it
writes the other outputs (:mod:`auditor.report.beside`): at 4,000 the report took 0.5 s, a
fork a few ms."""
HELPER_MOST_RSS = 256 << 20
"""The most this process may hold (resident) for a helper to be forked: the helper reads the
whole result, so it comes to hold about as much again, and every process of the audit is to
stay under 512 MiB (a million files' audit, at about 450 MB here, writes without one)."""


def _helper_pays(result: Any, options: Any) -> bool:
    """Whether the outputs are written with a helper: in the command's own process (a caller
    of :func:`main` is never forked), on Linux (where the readers are forked too: macOS's
    system libraries do not survive a fork), with a second CPU it may use (not under
    ``--jobs 1``), periods enough to pay for it and memory to spare
    (:data:`HELPER_MOST_RSS`)."""
    from auditor.pipeline.pool import usable_cpus

    return _ONLY_EXITING and sys.platform == "linux" and (options.jobs or usable_cpus()) >= 2 \
        and len(result.reasoning.verdicts) >= HELPER_FROM and _resident() < HELPER_MOST_RSS


def _resident() -> int:
    """This process's resident bytes now (Linux's ``/proc/self/statm``; unknown: as if
    too many)."""
    try:
        with open("/proc/self/statm", "rb") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 1 << 62


@contextlib.contextmanager
def _progress(quiet: bool) -> Iterator[Callable[[Any], None]]:
    """Where an audit shows how far it has come, for the block: gives the function to call
    with each :class:`auditor.model.Progress` event. A bar on a TTY stderr (taken away when
    the block ends), a line every :data:`PROGRESS_EVERY` seconds on any other, nothing when
    ``quiet``."""
    if quiet:
        yield lambda event: None
    elif not sys.stderr.isatty():
        yield _progress_lines()
    else:
        from rich.console import Console
        from rich.filesize import decimal
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("{task.description}"), BarColumn(),
                      TextColumn("{task.fields[count]}"), TimeElapsedColumn(),
                      console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task(STAGES["list"][0], total=None, count="")
            stage = ""

            def show(event: Any) -> None:
                nonlocal stage
                if event.stage != stage:  # each stage is seen as it ends, however short
                    bar.refresh()
                    stage = event.stage
                what, unit = STAGES.get(event.stage, (event.stage, ""))
                if not unit:  # (a stage that counts nothing: a bar that only moves)
                    bar.update(task, description=what, total=None, completed=0, count="")
                    return
                count = f"{event.done:,}/{event.total:,} {unit}"
                if event.bytes:
                    count += f" {decimal(event.bytes)}"
                bar.update(task, description=what, total=event.total, completed=event.done,
                           count=count)

            yield show


def _progress_lines() -> Callable[[Any], None]:
    """A function writing where the audit is to stderr, at most every
    :data:`PROGRESS_EVERY` seconds (from its first call)."""
    import time

    start = due = 0.0

    def show(event: Any) -> None:
        nonlocal start, due
        now = time.monotonic()
        if not start:
            start, due = now, now + PROGRESS_EVERY
        if now < due:
            return
        due = now + PROGRESS_EVERY
        what, unit = STAGES.get(event.stage, (event.stage, ""))
        if unit:
            what += f": {event.done:,} of {event.total:,} {unit}"
            if event.stage == "read":
                what += f", {event.bytes / 1e9:.2f} GB"
        print(f"auditor: {what} ({now - start:.0f} s)", file=sys.stderr, flush=True)

    return show
