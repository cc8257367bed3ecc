"""Benchmark ``auditor audit`` against the floor of reading, hashing and parsing the bytes.

Usage (from the repository root, with the project's virtualenv)::

    python benchmarks/run.py [--sizes small,medium,large,many] [--workdir DIR] [--keep]
                             [--jobs N] [--repeat R] [--profile N] [--timeout S]
                             [--shards N] [--bagit]

``--profile N`` also runs ``python -m cProfile -m auditor audit ... --jobs 1`` on the first
selected study and prints the top N functions by own time.

For each selected study this script

1. generates the study with :mod:`auditor._studygen` (``scale_spec`` + ``write_study``) into
   ``WORKDIR/<size>/evidence``, or reuses it when ``WORKDIR/<size>/params.json`` records the
   same parameters and the same generator source. The sizes are

   * ``small``, ``medium``, ``large``: about 100 MB, 1 GB and 4 GB of evidence, all with the
     same per-element mix (allocator traces of 5,000 memory samples, training logs of 20,000
     filler lines, and the small trial / device / period JSON files); the element count is
     chosen by generating a 3-element calibration study and measuring its bytes per element,
     so the three sizes differ only in the number of elements;
   * ``many``: 2,000 elements with tiny traces and logs, about 36k small files, for files/s;
   * ``many-4x`` (not run by default): the same with 8,000 elements, about 144k files, to
     see how time and memory grow with the number of files;
   * ``million`` (not run by default): the same with 55,556 elements, 1,000,011 files
     (about 1.3 GB; generating it takes a few minutes), for the peak memory at a million;

2. reads every file once (warm page cache), then measures, ``--repeat`` times keeping the
   fastest run:

   * ``auditor audit ROOT --out OUT --quiet --no-plots [--jobs N]``: wall time (including
     interpreter start), CPU time and peak RSS. The auditor runs in a small wrapper that,
     when the audit returns, records ``getrusage(RUSAGE_SELF)`` (the parent's exact peak) and
     ``getrusage(RUSAGE_CHILDREN)`` (the largest single reaped worker, exact); ``os.wait4``
     gives the same whole-tree maximum ``/usr/bin/time -v`` reports, and a sampler thread
     sums PSS over the process tree every 50 ms (approximate, may miss short spikes);
   * the floor: walk the tree, then a ``multiprocessing.Pool`` of ``--jobs`` workers reads
     every file once in 1 MiB chunks, feeding SHA-256 and a line splitter from the same
     buffers, ``orjson``-parsing every JSONL line and every ``.json`` document;
   * ``sha256sum`` over the same files (``xargs -0 -P1 sha256sum``, one core);
   * with ``--shards N``: ``audit --shard I/N --out PART`` for each I (one after another;
     a SLURM array would run them side by side), then ``merge PART... --out DIR``, and
     whether the merged files are byte-identical to the single audit's, then the same
     merge with ``--trust-inputs``;
   * with ``--bagit``: bagit-python's ``--validate`` of a bag of the same files (hard
     links in a scratch folder; SHA-256 only; ``--jobs`` processes);

3. prints a markdown table and writes every measurement to ``WORKDIR/results.json``.

Studies are deleted after they are measured unless ``--keep``. A failed audit (non-zero exit
or timeout) prints its stderr and marks its row ``failed``; the script still exits 0.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import pstats
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing import Pool
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[1]
MIB = 1 << 20
MB = 1_000_000
GB = 1_000_000_000

DEFAULT_WORKDIR = Path(tempfile.gettempdir()) / "auditor-bench"
CALIBRATION_ELEMENTS = 3
"""One whole cycle of :func:`auditor._studygen.scale_spec`'s outcomes."""


@dataclass(frozen=True)
class Plan:
    """How to generate one benchmark study."""

    name: str
    trace_samples: int
    log_lines: int
    target_bytes: int | None = None
    """Pick the element count so the study holds about this many bytes."""
    elements: int | None = None
    """A fixed element count (when ``target_bytes`` is ``None``)."""


PLANS: dict[str, Plan] = {
    "small": Plan("small", trace_samples=5_000, log_lines=20_000, target_bytes=100 * MB),
    "medium": Plan("medium", trace_samples=5_000, log_lines=20_000, target_bytes=1 * GB),
    "large": Plan("large", trace_samples=5_000, log_lines=20_000, target_bytes=4 * GB),
    "many": Plan("many", trace_samples=2, log_lines=0, elements=2_000),
    "many-4x": Plan("many-4x", trace_samples=2, log_lines=0, elements=8_000),
    "million": Plan("million", trace_samples=2, log_lines=0, elements=55_556),
}


@dataclass
class Study:
    """A generated study on disk."""

    name: str
    root: Path
    params: dict[str, Any]
    files: list[str] = field(default_factory=list)
    total_bytes: int = 0
    generation_s: float | None = None
    """Seconds spent generating; ``None`` when the study was reused."""


@dataclass
class AuditRun:
    """One ``auditor audit`` run."""

    ok: bool
    wall_s: float
    returncode: int | None
    cpu_s: float | None = None
    tree_max_rss_mb: float | None = None
    parent_rss_mb: float | None = None
    worker_rss_mb: float | None = None
    tree_pss_mb: float | None = None
    stderr: str = ""


@dataclass
class Row:
    """Every measurement of one study."""

    size: str
    files: int
    bytes: int
    elements: int
    trace_samples: int
    log_lines: int
    generation_s: float | None
    status: str = "ok"
    audit: AuditRun | None = None
    floor_s: float | None = None
    floor_lines: int | None = None
    floor_records: int | None = None
    sha256sum_s: float | None = None
    shards: list[AuditRun] = field(default_factory=list)
    """``--shards N``: each ``audit --shard I/N`` run one after another (a SLURM array runs
    them side by side on N machines)."""
    merge: AuditRun | None = None
    bagit_s: float | None = None
    """``--bagit``: ``bagit.py --validate --processes J`` of a bag of the same files."""
    merge_trusted: AuditRun | None = None
    """``merge --trust-inputs`` (the parts verified, the evidence not re-hashed)."""
    merge_identical: bool | None = None
    """Whether the merged output's files are byte-identical to the single audit's."""
    load_before: list[float] = field(default_factory=list)
    """1/5/15-minute load averages before the timed runs (other work skews every number)."""
    error: str | None = None


# --------------------------------------------------------------------------- generation


def _generator_digest() -> str:
    """The generator's source (``auditor/_studygen``): a cached study is reused only when
    it would be generated the same."""
    digest = hashlib.sha256()
    for path in sorted((REPO / "auditor" / "_studygen").glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _import_generator() -> Any:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    import auditor._studygen as generator

    return generator


def usable_cpus() -> int:
    """The auditor's default number of workers (the CPUs this process may use)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from auditor.pipeline.pool import usable_cpus as auditors

    return auditors()


def _tree_sizes(root: Path) -> list[tuple[str, int]]:
    """Every regular file under ``root`` with its size, in walk order."""
    found: list[tuple[str, int]] = []
    stack = [str(root)]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    found.append((entry.path, entry.stat(follow_symlinks=False).st_size))
    return found


def _tree(root: Path) -> tuple[list[str], int]:
    """Every regular file under ``root`` (sorted) and their total size."""
    found = _tree_sizes(root)
    return sorted(path for path, _ in found), sum(size for _, size in found)


def _calibrate(plan: Plan, scratch: Path) -> int:
    """Bytes per element of ``plan``'s mix, from a small study written under ``scratch``."""
    generator = _import_generator()
    root = scratch / f"calibrate-{plan.name}"
    shutil.rmtree(root, ignore_errors=True)
    spec = generator.scale_spec(CALIBRATION_ELEMENTS, plan.trace_samples, plan.log_lines)
    generator.write_study(spec, root)
    _, total = _tree(root)
    shutil.rmtree(root)
    return max(1, total // CALIBRATION_ELEMENTS)


def _wanted_params(plan: Plan) -> dict[str, Any]:
    return {
        "plan": plan.name,
        "trace_samples": plan.trace_samples,
        "log_lines": plan.log_lines,
        "target_bytes": plan.target_bytes,
        "fixed_elements": plan.elements,
        "generator_sha256": _generator_digest(),
    }


def prepare(plan: Plan, workdir: Path) -> Study:
    """Generate ``plan`` under ``workdir`` or reuse an identical earlier study."""
    base = workdir / plan.name
    root = base / "evidence"
    marker = base / "params.json"
    wanted = _wanted_params(plan)
    if marker.is_file() and root.is_dir():
        recorded = json.loads(marker.read_text())
        if {key: recorded.get(key) for key in wanted} == wanted:
            files, total = _tree(root)
            if len(files) == recorded.get("files") and total == recorded.get("bytes"):
                print(f"[{plan.name}] reusing {root}", flush=True)
                return Study(plan.name, root, recorded, files, total)
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    generator = _import_generator()
    started = time.perf_counter()
    if plan.elements is not None:
        elements = plan.elements
        per_element = None
    else:
        assert plan.target_bytes is not None
        per_element = _calibrate(plan, base)
        elements = max(1, round(plan.target_bytes / per_element))
    print(
        f"[{plan.name}] generating {elements} elements (trace samples {plan.trace_samples}, "
        f"log lines {plan.log_lines}) into {root}",
        flush=True,
    )
    spec = generator.scale_spec(elements, plan.trace_samples, plan.log_lines)
    generator.write_study(spec, root)
    generation_s = time.perf_counter() - started
    files, total = _tree(root)
    params = {
        **wanted,
        "elements": elements,
        "bytes_per_element": per_element,
        "files": len(files),
        "bytes": total,
        "generation_s": round(generation_s, 3),
    }
    marker.write_text(json.dumps(params, indent=2) + "\n")
    print(
        f"[{plan.name}] {len(files)} files, {total / GB:.3f} GB in {generation_s:.1f} s "
        f"({total / MB / generation_s:.0f} MB/s)",
        flush=True,
    )
    return Study(plan.name, root, params, files, total, generation_s)


# --------------------------------------------------------------------------- floor


def _warm(files: Sequence[str]) -> None:
    """Read every file once so all timed runs see a warm page cache."""
    buffer = bytearray(MIB)
    for path in files:
        with open(path, "rb", buffering=0) as handle:
            while handle.readinto(buffer):
                pass


def _floor_batch(paths: Sequence[str]) -> tuple[int, int, int]:
    """Hash, split and parse ``paths``; return (bytes, lines, parsed JSON values)."""
    loads = orjson.loads
    size = lines = records = 0
    for path in paths:
        digest = hashlib.sha256()
        jsonl = path.endswith(".jsonl")
        document = path.endswith(".json")
        parts: list[bytes] = []
        carry = b""
        with open(path, "rb", buffering=0) as handle:
            while chunk := handle.read(MIB):
                digest.update(chunk)
                size += len(chunk)
                if document:
                    parts.append(chunk)
                    continue
                split = (carry + chunk).split(b"\n") if carry else chunk.split(b"\n")
                carry = split.pop()
                lines += len(split)
                if jsonl:
                    for line in split:
                        if line:
                            loads(line)
                    records += len(split)
        if carry:
            lines += 1
            if jsonl:
                loads(carry)
                records += 1
        if document:
            loads(b"".join(parts))
            records += 1
        digest.hexdigest()
    return size, lines, records


def _batches(root: Path) -> Iterator[list[str]]:
    """Walk ``root`` and group its files, largest first, into tasks of <= 64 files or 8 MiB."""
    batch: list[str] = []
    weight = 0
    for path, size in sorted(_tree_sizes(root), key=lambda item: item[1], reverse=True):
        batch.append(path)
        weight += size
        if len(batch) >= 64 or weight >= 8 * MIB:
            yield batch
            batch, weight = [], 0
    if batch:
        yield batch


def measure_floor(root: Path, jobs: int) -> tuple[float, int, int, int]:
    """Seconds to walk, hash and parse ``root`` with ``jobs`` processes; bytes, lines, values."""
    started = time.perf_counter()
    size = lines = records = 0
    with Pool(jobs) as pool:
        for got_size, got_lines, got_records in pool.imap_unordered(_floor_batch, _batches(root)):
            size += got_size
            lines += got_lines
            records += got_records
    return time.perf_counter() - started, size, lines, records


def measure_sha256sum(files: Sequence[str], listing: Path) -> float | None:
    """Seconds for ``xargs -0 -P1 sha256sum`` over ``files``; ``None`` when unavailable."""
    if shutil.which("sha256sum") is None or shutil.which("xargs") is None:
        return None
    listing.write_bytes(b"".join(os.fsencode(path) + b"\0" for path in files))
    with listing.open("rb") as names:
        started = time.perf_counter()
        done = subprocess.run(
            ["xargs", "-0", "-P1", "sha256sum"],
            stdin=names,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            check=False,
        )
        elapsed = time.perf_counter() - started
    listing.unlink()
    if done.returncode != 0:
        print(f"sha256sum failed: {done.stderr.decode(errors='replace')[-2000:]}", file=sys.stderr)
        return None
    return elapsed


# --------------------------------------------------------------------------- audit

_WRAPPER = """\
import json, resource, sys
usage_path = sys.argv[1]
sys.argv = ["auditor", *sys.argv[2:]]
try:
    from auditor._cli import entry
    entry()
finally:
    with open("/proc/self/status") as status:
        own = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    with open(usage_path, "w") as handle:
        json.dump({
            "self_kb": own,
            "children_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
        }, handle)
"""
"""Runs the console script's ``entry()`` and records the parent's and largest child's peaks.
The parent's is the kernel's high-water mark of its own memory (``VmHWM``), not
``getrusage``'s: a process started by ``subprocess`` is forked (vfork) from this one, and
Linux keeps the larger of the pre-exec and the new image's peaks, so ``ru_maxrss`` said this
harness's own RSS (810 MB with a million files' paths listed) whatever the audit used."""


def _descendants(pid: int) -> list[int]:
    found = [pid]
    index = 0
    while index < len(found):
        current = found[index]
        index += 1
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{current}/task/{task}/children") as handle:
                    found.extend(int(child) for child in handle.read().split())
            except OSError:
                continue
    return found


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as handle:
            for line in handle:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _kill_group(pid: int) -> None:
    """SIGKILL the session this script started for one audit (used on timeout)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class TreeSampler(threading.Thread):
    """Sum PSS over a process tree every ``interval`` seconds; keep the peak."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.interval = interval
        self.peak_kb = 0
        self.stop = threading.Event()

    def run(self) -> None:
        if not os.path.isdir(f"/proc/{self.pid}"):
            return
        while not self.stop.is_set():
            total = sum(_pss_kb(pid) for pid in _descendants(self.pid))
            self.peak_kb = max(self.peak_kb, total)
            self.stop.wait(self.interval)


def compile_sources(tree: Path) -> None:
    """Compile ``tree``'s package to bytecode, as ``pip install`` does and a checkout's
    first import would: the timings are of the command a user runs, not of compiling its
    sources, which a shell with ``PYTHONDONTWRITEBYTECODE`` set (this machine's is) would
    otherwise do in every run (0.1 s of each at 2d865e7, whose sources are three times
    353eefe's)."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "auditor")],
                   check=True, stdout=subprocess.DEVNULL)


def run_audit(study: Study, out: Path, jobs: int | None, timeout: float,
              env: dict[str, str] | None = None, extra: Sequence[str] = ()) -> AuditRun:
    """Run ``auditor audit`` once on ``study`` and measure it (``env``: the process's
    environment, e.g. a ``PYTHONPATH`` naming another checkout's sources; ``extra``: more
    audit options, e.g. ``--shard 1/2``)."""
    arguments = ["audit", str(study.root), "--out", str(out), "--quiet", "--no-plots", *extra]
    if jobs is not None:
        arguments += ["--jobs", str(jobs)]
    return run_cli(arguments, out, timeout, env)


def run_cli(arguments: Sequence[str], out: Path, timeout: float,
            env: dict[str, str] | None = None) -> AuditRun:
    """Run ``auditor ARGUMENTS`` (writing ``out``, removed first) and measure it."""
    shutil.rmtree(out, ignore_errors=True)
    usage_path = out.parent / f"{out.name}-usage.json"
    usage_path.unlink(missing_ok=True)
    command = [sys.executable, "-c", _WRAPPER, str(usage_path), *arguments]
    with tempfile.TemporaryFile() as stderr:
        started = time.perf_counter()
        process = subprocess.Popen(  # (not run from the checkout: "python -c" puts the
            # working directory first on sys.path, before a PYTHONPATH naming other sources)
            command, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True,
            env=env, cwd=out.parent,
        )
        sampler = TreeSampler(process.pid)
        sampler.start()
        timer = threading.Timer(timeout, _kill_group, (process.pid,))
        timer.start()
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - started
        timer.cancel()
        sampler.stop.set()
        sampler.join()
        process.returncode = os.waitstatus_to_exitcode(status)
        stderr.seek(0)
        error_text = stderr.read().decode(errors="replace")[-8000:]
    run = AuditRun(
        ok=process.returncode == 0,
        wall_s=wall,
        returncode=process.returncode,
        cpu_s=usage.ru_utime + usage.ru_stime,
        tree_max_rss_mb=usage.ru_maxrss * 1024 / MB,
        tree_pss_mb=sampler.peak_kb * 1024 / MB or None,
        stderr=error_text,
    )
    if process.returncode == -signal.SIGKILL:
        run.stderr += f"\n(killed after the {timeout:.0f} s timeout)"
    if usage_path.is_file():
        peaks = json.loads(usage_path.read_text())
        run.parent_rss_mb = peaks["self_kb"] * 1024 / MB
        run.worker_rss_mb = peaks["children_kb"] * 1024 / MB or None
        # (wait4's figure is at least this harness's own RSS: see _WRAPPER)
        run.tree_max_rss_mb = max(run.parent_rss_mb, run.worker_rss_mb or 0)
        usage_path.unlink()
    return run


def profile_audit(study: Study, out: Path, top: int) -> str:
    """cProfile ``auditor audit --jobs 1`` on ``study``; the ``top`` entries by tottime."""
    shutil.rmtree(out, ignore_errors=True)
    stats_path = out.parent / "audit.prof"
    command = [
        sys.executable,
        "-m",
        "cProfile",
        "-o",
        str(stats_path),
        "-m",
        "auditor",
        "audit",
        str(study.root),
        "--out",
        str(out),
        "--quiet",
        "--no-plots",
        "--jobs",
        "1",
    ]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, check=False)
    elapsed = time.perf_counter() - started
    shutil.rmtree(out, ignore_errors=True)
    if done.returncode != 0 or not stats_path.is_file():
        return f"profile failed (exit {done.returncode}):\n{done.stderr.decode()[-2000:]}"
    stream = _Capture()
    stats = pstats.Stats(str(stats_path), stream=stream)  # type: ignore[arg-type]
    stats.strip_dirs().sort_stats("tottime").print_stats(top)
    stats_path.unlink()
    return f"cProfile of audit --jobs 1 on {study.name} ({elapsed:.1f} s wall):\n{stream.text}"


class _Capture:
    """A minimal text stream for :class:`pstats.Stats`."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        self.parts.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    @property
    def text(self) -> str:
        return "".join(self.parts)


# --------------------------------------------------------------------------- report


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ratio(top: float | None, bottom: float | None) -> float | None:
    return None if top is None or not bottom else top / bottom


def table(rows: Sequence[Row]) -> str:
    """The markdown results table."""
    header = (
        "| size | files | GB | audit s | audit peak RSS MB (parent / worker / tree PSS) "
        "| audit CPU s | floor s | sha256sum s | audit/floor | audit/sha256sum "
        "| files/s | MB/s | status |"
    )
    lines = [header, "|" + " --- |" * 13]
    for row in rows:
        audit = row.audit
        wall = audit.wall_s if audit and audit.ok else None
        if audit and audit.ok:
            rss = (
                f"{_fmt(audit.tree_max_rss_mb, 0)} ({_fmt(audit.parent_rss_mb, 0)} / "
                f"{_fmt(audit.worker_rss_mb, 0)} / {_fmt(audit.tree_pss_mb, 0)})"
            )
        else:
            rss = "-"
        lines.append(
            f"| {row.size} | {row.files} | {row.bytes / GB:.3f} | {_fmt(wall)} | {rss} "
            f"| {_fmt(audit.cpu_s if audit and audit.ok else None, 1)} "
            f"| {_fmt(row.floor_s)} | {_fmt(row.sha256sum_s)} "
            f"| {_fmt(_ratio(wall, row.floor_s))} | {_fmt(_ratio(wall, row.sha256sum_s))} "
            f"| {_fmt(_ratio(row.files, wall), 0)} | {_fmt(_ratio(row.bytes / MB, wall), 0)} "
            f"| {row.status} |"
        )
    return "\n".join(lines)


def _output_digests(out: Path) -> dict[str, str]:
    """SHA-256 of every output file but the manifest (whose audit time differs per run)."""
    return {
        str(path.relative_to(out)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(out.rglob("*"))
        if path.is_file() and path.name != "output_manifest.json"
    }


def measure_bagit(study: Study, row: Row, jobs: int) -> None:
    """Time bagit-python's ``--validate`` of the study's files made into a bag (hard links
    of the evidence in a scratch folder, so the study itself is untouched), SHA-256 only,
    ``jobs`` processes, the best of ``repeat``."""
    try:
        import bagit  # noqa: F401  (only to say it is missing)
    except ImportError:
        row.error = "bagit-python is not installed (pip install bagit)"
        return
    bag = study.root.parent / "bag"
    shutil.rmtree(bag, ignore_errors=True)
    subprocess.run(["cp", "-al", str(study.root), str(bag)], check=True)
    try:
        print(f"[{study.name}] bagit: making the bag", flush=True)
        subprocess.run(
            [sys.executable, "-m", "bagit", "--quiet", "--sha256", "--processes", str(jobs),
             str(bag)], check=True,
        )
        _warm([str(path) for path in bag.rglob("*") if path.is_file()])
        print(f"[{study.name}] bagit --validate", flush=True)
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "bagit", "--quiet", "--validate", "--processes", str(jobs),
             str(bag)], check=True,
        )
        row.bagit_s = time.perf_counter() - started
    except subprocess.CalledProcessError as error:
        row.error = f"bagit failed: {error}"
    finally:
        shutil.rmtree(bag, ignore_errors=True)


def measure_sharded(study: Study, row: Row, out: Path, shards: int, jobs: int | None,
                    timeout: float) -> None:
    """``audit --shard I/N`` for every I, then ``merge``; compare with the single audit in
    ``out`` (its last run)."""
    single = _output_digests(out)
    parts = []
    for index in range(1, shards + 1):
        part = out.parent / f"part-{index}"
        print(f"[{study.name}] audit --shard {index}/{shards}", flush=True)
        run = run_audit(study, part, jobs, timeout, extra=["--shard", f"{index}/{shards}"])
        row.shards.append(run)
        if not run.ok:
            row.error = f"shard {index}/{shards} failed: {run.stderr[-2000:]}"
            return
        print(f"[{study.name}]   {run.wall_s:.2f} s", flush=True)
        parts.append(str(part))
    merged = out.parent / "merged"
    print(f"[{study.name}] merge of {shards} parts", flush=True)
    row.merge = run_cli(["merge", *parts, "--out", str(merged), "--no-plots"], merged, timeout)
    if not row.merge.ok:
        row.error = f"merge failed: {row.merge.stderr[-2000:]}"
        return
    print(f"[{study.name}]   {row.merge.wall_s:.2f} s", flush=True)
    row.merge_identical = _output_digests(merged) == single
    print(f"[{study.name}] merge --trust-inputs", flush=True)
    row.merge_trusted = run_cli(["merge", *parts, "--out", str(merged), "--no-plots",
                                 "--trust-inputs"], merged, timeout)
    if row.merge_trusted.ok:
        print(f"[{study.name}]   {row.merge_trusted.wall_s:.2f} s", flush=True)
        row.merge_identical = row.merge_identical and _output_digests(merged) == single


def sharded_table(rows: Sequence[Row]) -> str:
    """The sharded-audit table (only rows measured with ``--shards``)."""
    lines = [
        "| size | audit s | shards s (each) | longest shard + merge s | merge s "
        "| merge --trust-inputs s | shards' sum + merge s | merge peak RSS MB | identical |",
        "|" + " --- |" * 9,
    ]
    for row in rows:
        if not row.shards or row.audit is None:
            continue
        each = ", ".join(_fmt(run.wall_s) for run in row.shards)
        merge = row.merge.wall_s if row.merge and row.merge.ok else None
        trusted = row.merge_trusted.wall_s if row.merge_trusted and row.merge_trusted.ok \
            else None
        longest = max(run.wall_s for run in row.shards)
        total = sum(run.wall_s for run in row.shards)
        lines.append(
            f"| {row.size} | {_fmt(row.audit.wall_s)} | {each} "
            f"| {_fmt(None if merge is None else longest + merge)} | {_fmt(merge)} "
            f"| {_fmt(trusted)} | {_fmt(None if merge is None else total + merge)} "
            f"| {_fmt(row.merge.tree_max_rss_mb if row.merge else None, 0)} "
            f"| {row.merge_identical} |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- driver


def measure(
    study: Study, jobs: int | None, repeat: int, timeout: float, profile: int,
    shards: int = 0, bagit: bool = False,
) -> tuple[Row, str | None]:
    """All measurements of one study (best of ``repeat`` for each timing)."""
    params = study.params
    row = Row(
        size=study.name,
        files=len(study.files),
        bytes=study.total_bytes,
        elements=params["elements"],
        trace_samples=params["trace_samples"],
        log_lines=params["log_lines"],
        generation_s=study.generation_s,
    )
    base = study.root.parent
    out = base / "audit-out"
    pool_jobs = jobs or usable_cpus()
    print(f"[{study.name}] warming the page cache", flush=True)
    _warm(study.files)
    row.load_before = [round(value, 2) for value in os.getloadavg()]
    if row.load_before[0] > 0.5:
        print(
            f"[{study.name}] warning: load average {row.load_before[0]:.2f} before timing; "
            "other processes share the cores",
            flush=True,
        )
    for attempt in range(repeat):
        print(f"[{study.name}] audit run {attempt + 1}/{repeat}", flush=True)
        run = run_audit(study, out, jobs, timeout)
        if not run.ok:
            row.status = "failed"
            row.audit = run
            print(
                f"[{study.name}] auditor failed (exit {run.returncode}):\n{run.stderr[-4000:]}",
                file=sys.stderr,
                flush=True,
            )
            break
        if row.audit is None or run.wall_s < row.audit.wall_s:
            row.audit = run
        print(
            f"[{study.name}]   {run.wall_s:.2f} s, peak RSS {_fmt(run.tree_max_rss_mb, 0)} MB",
            flush=True,
        )
    for _ in range(repeat):
        print(f"[{study.name}] floor ({pool_jobs} processes)", flush=True)
        elapsed, size, lines, records = measure_floor(study.root, pool_jobs)
        if size != study.total_bytes:
            row.error = f"floor read {size} bytes, expected {study.total_bytes}"
        row.floor_s = elapsed if row.floor_s is None else min(row.floor_s, elapsed)
        row.floor_lines, row.floor_records = lines, records
        print(f"[{study.name}] sha256sum", flush=True)
        elapsed_sum = measure_sha256sum(study.files, base / "files.lst")
        if elapsed_sum is not None:
            row.sha256sum_s = (
                elapsed_sum if row.sha256sum_s is None else min(row.sha256sum_s, elapsed_sum)
            )
    if bagit:
        measure_bagit(study, row, pool_jobs)
    if shards > 1 and row.status == "ok":
        measure_sharded(study, row, out, shards, jobs, timeout)
    profile_text = None
    if profile > 0:
        print(f"[{study.name}] profiling audit --jobs 1", flush=True)
        profile_text = profile_audit(study, out, profile)
    return row, profile_text


def _source_state() -> dict[str, Any]:
    """The commit under test and whether the auditor's sources differ from it."""

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False
        )
        return done.stdout.strip() if done.returncode == 0 else ""

    return {
        "commit": git("rev-parse", "HEAD") or None,
        "auditor_modified": git("status", "--porcelain", "--", "auditor") or None,
    }


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--sizes",
        default="small,many,medium,large",
        help=f"comma-separated studies to run, from {', '.join(PLANS)} "
             "(default: small,many,medium,large)",
    )
    parser.add_argument(
        "--workdir", type=Path, default=DEFAULT_WORKDIR, help=f"default {DEFAULT_WORKDIR}"
    )
    parser.add_argument("--keep", action="store_true", help="keep the studies and audit outputs")
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="auditor --jobs and floor processes "
        "(default: the auditor's, the CPUs this process may use)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs per timing, keep the best")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per audit run")
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="also cProfile 'audit --jobs 1' on the first study and print the top N by tottime",
    )
    parser.add_argument(
        "--shards",
        type=int,
        default=0,
        metavar="N",
        help="also audit each study as N shards (--shard I/N, one after another) and merge "
             "them, checking the merged output is byte-identical to the single audit",
    )
    parser.add_argument(
        "--bagit",
        action="store_true",
        help="also time bagit-python's --validate of the same files (pip install bagit)",
    )
    args = parser.parse_args(argv)
    sizes = [size.strip() for size in args.sizes.split(",") if size.strip()]
    unknown = [size for size in sizes if size not in PLANS]
    if unknown or not sizes:
        parser.error(f"unknown size(s) {unknown}; choose from {', '.join(PLANS)}")
    if args.repeat < 1 or (args.jobs is not None and args.jobs < 1):
        parser.error("--repeat and --jobs must be >= 1")
    args.sizes = sizes
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; always returns 0 once the arguments parse."""
    args = _parse_args(argv)
    workdir: Path = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    source = _source_state()  # before the runs: other work may change the tree meanwhile
    compile_sources(REPO)
    rows: list[Row] = []
    profiles: list[str] = []
    for name in args.sizes:
        plan = PLANS[name]
        try:
            study = prepare(plan, workdir)
        except Exception as error:  # keep going with the other sizes
            print(f"[{name}] generation failed: {error!r}", file=sys.stderr)
            rows.append(Row(name, 0, 0, 0, plan.trace_samples, plan.log_lines, None, "failed"))
            rows[-1].error = f"generation failed: {error!r}"
            continue
        try:
            top = args.profile if name == args.sizes[0] else 0
            row, profile_text = measure(
                study, args.jobs, args.repeat, args.timeout, top, args.shards, args.bagit
            )
        except Exception as error:
            print(f"[{name}] measurement failed: {error!r}", file=sys.stderr)
            row = Row(
                name,
                len(study.files),
                study.total_bytes,
                study.params["elements"],
                plan.trace_samples,
                plan.log_lines,
                study.generation_s,
                "failed",
                error=f"measurement failed: {error!r}",
            )
            profile_text = None
        rows.append(row)
        if profile_text:
            profiles.append(profile_text)
        if not args.keep:
            shutil.rmtree(study.root.parent, ignore_errors=True)
    results = {
        "machine": {
            "cpus": os.cpu_count(),
            "usable_cpus": usable_cpus(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "max_rss_unit": "MB (10^6 bytes)",
        },
        "source": source,
        "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
        "jobs": args.jobs,
        "repeat": args.repeat,
        "rows": [asdict(row) for row in rows],
    }
    results_path = workdir / "results.json"
    results_path.write_text(json.dumps(results, indent=2) + "\n")
    print()
    print(table(rows))
    print()
    if args.shards > 1:
        print(sharded_table(rows))
        print()
    for row in rows:
        if row.bagit_s is not None and row.audit is not None:
            print(
                f"{row.size}: bagit --validate {row.bagit_s:.2f} s, audit {row.audit.wall_s:.2f} s "
                f"({_fmt(_ratio(row.audit.wall_s, row.bagit_s))}x), floor {_fmt(row.floor_s)} s"
            )
    for text in profiles:
        print(text)
    print(f"results: {results_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
