"""Write an audit's outputs atomically, and verify them later.

Outputs are written into a fresh temporary directory beside the target, then
renamed into place, so an interrupted audit leaves either no output directory
or a complete one. The target must not exist, or be empty, or hold an earlier
audit (it has an ``output_manifest.json``) and ``force`` be given; it is then
replaced whole. Nothing is ever written under the evidence root.

``output_manifest.json`` lists the SHA-256 and size of every other output and
of every input read (raw evidence, source inputs, protocol inputs), with the
absolute locations needed to re-hash them; it is the one file holding
run-specific values (the time of the audit, the absolute paths).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import BrokenExecutor, Future
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import orjson

from auditor import __version__
from auditor._io import Beneath, HashingReader, open_reason, regular_bytes, sha256_file
from auditor._signals import signals_deferred
from auditor._text import printable, printable_json, unprintable
from auditor.errors import OutputError, VerifyError
from auditor.model.paths import join_text
from auditor.model.results import TABLES
from auditor.report.beside import Beside
from auditor.store.heap import paused_gc, release_free_memory

if TYPE_CHECKING:
    from auditor.model import AuditResult, Collected, FileDigest
    from auditor.report.plots import Plotter

MANIFEST = "output_manifest.json"
MANIFEST_SCHEMA = "run-evidence/output-manifest/v1"


def _same_directory_above(out: Path, root: Path) -> bool:
    """Whether ``out`` or a folder above it is the root's own directory by device and inode:
    the root reached by another path (a bind mount, one file system mounted twice), which a
    comparison of paths misses."""
    try:
        found = os.stat(root)
    except OSError:
        return False
    for place in (out, *out.parents):
        try:
            info = os.stat(place)
        except OSError:
            continue  # (not made yet)
        if (info.st_dev, info.st_ino) == (found.st_dev, found.st_ino):
            return True
    return False


def check_output_dir(out: Path, root: Path, force: bool) -> None:
    """Refuse an output directory that would touch evidence or clobber unrelated files."""
    try:
        _check_output_dir(Path(os.path.abspath(out)), root, force)  # (checked as written
        # to: "a/missing/.." is "a")
    except OSError as error:  # (a directory that cannot be looked into is not replaced)
        where = f": {error.filename}" if error.filename else ""
        raise OutputError(f"{out}: cannot check the output directory "
                          f"({error.strerror or error}{where})") from None


def _check_output_dir(out: Path, root: Path, force: bool) -> None:
    out_resolved = out.resolve()
    root_resolved = root.resolve()
    if out_resolved == root_resolved or root_resolved in out_resolved.parents \
            or _same_directory_above(out_resolved, root_resolved):
        raise OutputError(f"{out}: the output directory must not be inside the evidence root")
    if out_resolved in root_resolved.parents:
        raise OutputError(f"{out}: the output directory must not contain the evidence root")
    if out.is_symlink():
        raise OutputError(f"{out}: is a symbolic link (the output directory is replaced "
                          "whole); give the directory itself")
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out}: exists and is not a directory")
    try:
        here = Path.cwd().resolve()
    except OSError:  # (a working directory since removed holds nothing to protect)
        here = None
    if here is not None and (out_resolved == here or out_resolved in here.parents):
        raise OutputError(f"{out}: is the current directory or holds it (the output "
                          "directory is replaced whole); give another, e.g. --out audit-out")
    ancestor = out_resolved.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputError(f"{out}: {ancestor} is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise OutputError(f"{out}: cannot write in {ancestor}")
    if out.is_dir() and any(out.iterdir()):
        written = manifest_outputs(out)
        if written is None:
            raise OutputError(f"{out}: not empty and not an earlier audit's output; "
                              "choose another --out")
        stranger = _first_stranger(out, written)
        if stranger is not None:  # (replacing the audit "whole" would delete it)
            raise OutputError(f"{out}: holds {stranger}; move it away or choose another "
                              "--out")
        if not force:
            raise OutputError(f"{out}: holds an earlier audit; pass --force to replace it")


MANIFEST_HEAD = 1 << 20
"""Bytes of an earlier audit's manifest read to learn its outputs (they come first)."""


def manifest_outputs(out: Path) -> dict[str, tuple[str, int]] | None:
    """The outputs the manifest in ``out`` lists, with their SHA-256 and size; None when
    ``out`` holds no manifest this auditor wrote. Only the manifest's head is read: the
    outputs come before the (long) input lists."""
    try:
        head = regular_bytes(out / MANIFEST, limit=MANIFEST_HEAD, follow=False)  # (nor a FIFO)
    except OSError:
        return None
    cut = head.find(b',\n  "raw_evidence": [')  # (the head, closed where the inputs start)
    try:
        doc = orjson.loads(head[:cut] + b"\n}" if cut >= 0 else head)
        if doc.get("schema") != MANIFEST_SCHEMA:
            return None
        return {str(item["path"]): (str(item["sha256"]), int(item["size"]))
                for item in doc["outputs"]}
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError,
            RecursionError):  # (str() of a value nested past Python's limit: orjson's is deeper)
        return None


def _first_stranger(out: Path, written: dict[str, tuple[str, int]]) -> str | None:
    """What ``out`` holds (first, in sorted order) that the earlier audit did not write as
    it is: an entry its manifest does not list (and not a directory holding some that it
    does), or a listed one changed since. Links are never followed; a directory that
    cannot be read raises."""
    folders = {parent.as_posix() for name in written for parent in Path(name).parents}

    def unreadable(error: OSError) -> None:
        raise error

    for current, dirs, files in os.walk(out, onerror=unreadable):
        dirs.sort()
        base = Path(current).relative_to(out)
        for name in sorted(files + [d for d in dirs if os.path.islink(Path(current, d))]):
            rel = (base / name).as_posix()
            if rel == MANIFEST:
                continue
            if rel not in written:
                return f"{rel}, which the earlier audit there did not write"
            sha256, size = written[rel]
            path = Path(current, name)
            if path.is_symlink() or path.stat().st_size != size \
                    or sha256_file(str(path)).sha256 != sha256:
                return f"{rel}, changed since the earlier audit wrote it"
        for name in list(dirs):
            if (base / name).as_posix() not in folders:
                return f"{(base / name).as_posix()}/, which the earlier audit there did not write"
    return None


def write_outputs(result: AuditResult, out: Path, force: bool = False,
                  plots: bool = True, summary: dict[str, Any] | None = None,
                  plotter: Plotter | None = None, helper: bool = False) -> None:
    """Write every output of ``result`` to ``out`` atomically.

    ``summary``, when given, is written as ``summary.json`` (:func:`auditor.report.summary.
    build_summary` of ``result``); else that is written from ``result``, its periods a
    batch at a time. ``plotter``, when given, draws the
    plots in its helper process while the tables are written (else they are drawn here,
    after them). The cyclic garbage collector is paused while they are written
    (:func:`~auditor.store.heap.paused_gc`): a result of a large study is millions of objects
    without cycles, which each of its collections would scan. ``helper``: ``diagnostic.md``
    is written by a forked copy of this process while this one writes the others
    (:mod:`auditor.report.beside`; the command asks for one where a second CPU is free)."""
    with paused_gc():
        _write_outputs(result, out, force, plots, summary, plotter, helper)


def _write_outputs(result: AuditResult, out: Path, force: bool, plots: bool,
                   summary: dict[str, Any] | None, plotter: Plotter | None,
                   helper: bool) -> None:
    with signals_deferred():  # (pyarrow, a compiled extension, is not to be cut short)
        from auditor.report.markdown import evidence_md_lines, markdown_chunks
        from auditor.report.summary import dumps, summary_chunks
        from auditor.report.tables import write_table

    with StagedOutput(out, result.collected.root, force) as staged:

        def put(name: str, data: bytes | Callable[[io.RawIOBase], object]) -> None:
            staged.put(name, data)
            release_free_memory()  # (what making it freed is not held through the next)

        release_free_memory()  # (what the reading freed is not held through the writing)
        drawing = None
        if plots:
            from auditor.report.plots import draw_plots, plot_data

            drawn = plot_data(result)
            drawing = plotter.draw(drawn) if plotter is not None else None
        files: list[tuple[str, bytes | Callable[[io.RawIOBase], object]]] = [
            (f"{name}.parquet", partial(write_table, name, result)) for name in TABLES]
        files.append(("summary.json", dumps(summary) if summary is not None
                      else lambda sink: sink.writelines(summary_chunks(result))))
        if plots:  # (their names are known once they are drawn)
            for name, data in files:
                put(name, data)
            files = list(_drawn(drawing) or draw_plots(drawn))
        files.append(("evidence.md", partial(_write_lines, evidence_md_lines(result))))
        if helper:  # (it reads the kept tables too: it must find nothing of them to write)
            for kept in result.collected.tables.values():
                kept.finish()
        # the report needs the other outputs' names only: from here it can be written (by
        # the helper, when there is one) while this process writes the rest
        names = [name for name, _, _ in staged.written] + [name for name, _ in files]
        report = partial(_write_lines, markdown_chunks(result, names))
        with staged.beside("diagnostic.md", report) if helper \
                else contextlib.nullcontext() as beside:
            for name, data in files:
                put(name, data)
            staged.take("diagnostic.md", beside, report)
        staged.seal(result)


class StagedOutput:
    """An output directory written atomically: a context manager whose files are written
    into a staging directory beside ``out`` (:meth:`put`), pinned by an output manifest
    (:meth:`seal`), and renamed into place when the block ends without an exception; on
    one, the staging directory is removed and ``out`` is left as it was. ``root``: the
    evidence root, which ``out`` must not be inside (nor it inside ``out``); ``force``: an
    earlier audit in ``out`` is replaced. An audit's outputs and a shard's part are both
    written so."""

    def __init__(self, out: Path, root: Path, force: bool, private: bool = False) -> None:
        check_output_dir(out, root, force)
        self.private = private
        """Files and directory writable by their owner alone, whatever the umask (a
        shard's part: ``auditor merge`` refuses one that others may write)."""
        self.out = Path(os.path.abspath(out))  # (named and swapped by its own name: never "..")
        self.force = force
        self.written: list[tuple[str, str, int]] = []
        """(name, sha256, size) of each file put, in the order put."""
        self.path: Path | None = None
        """The staging directory (made on entering)."""
        self._sealed = False

    def __enter__(self) -> StagedOutput:
        parent = self.out.resolve().parent
        parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_staging(parent, self.out.name)
        self.path = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.tmp-{os.getpid()}-",
                                          dir=parent))
        try:
            os.chmod(self.path, 0o777 & ~self._mask())  # mkdtemp's 0700 would hide it
        except BaseException:
            self._remove()
            raise
        return self

    def put(self, name: str, data: bytes | Callable[[io.RawIOBase], object]) -> None:
        """Write ``data`` (bytes, or a function writing to a stream) as ``name``, hashed
        as it is written."""
        self.written.append((name, *self._write(name, data)))

    def beside(self, name: str, data: Callable[[io.RawIOBase], object]) -> Beside:
        """Begin writing ``name`` in a forked child (:mod:`auditor.report.beside`) while
        this process goes on; :meth:`take` it, with the same ``data``, where :meth:`put`
        would have written it. The child is forked as the result is entered (a context
        manager around both)."""
        return Beside(lambda: "{} {}".format(*self._write(name, data, make_parents=False)))

    def take(self, name: str, beside: Beside | None,
             data: Callable[[io.RawIOBase], object]) -> None:
        """Record ``name`` as the child begun by :meth:`beside` wrote it, or, where it did
        not (it failed, or never started, or there was none), write it here: the same
        bytes either way."""
        digest, _, size = ((beside.result() if beside is not None else None) or "").partition(" ")
        if len(digest) == 64 and size.isdigit() and _size(self.path, name) == int(size):
            self.written.append((name, digest, int(size)))
        else:
            self.put(name, data)

    def _write(self, name: str, data: bytes | Callable[[io.RawIOBase], object],
               make_parents: bool = True) -> tuple[str, int]:
        assert self.path is not None
        if self._sealed:  # (a file put after the manifest would be one it does not pin)
            raise RuntimeError(f"{self.out}: {name} put after the output manifest was written")
        target = self.path / name
        if make_parents:  # (not a helper's: the staging directory it writes in may be gone)
            target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as handle:
            if self.private:
                os.fchmod(handle.fileno(), 0o666 & ~self._mask())
            sink = _HashingWriter(handle)
            if isinstance(data, bytes):
                sink.write(data)
            else:
                data(sink)
            handle.flush()
            os.fsync(handle.fileno())
        return sink.hash.hexdigest(), sink.size

    def seal(self, source: AuditResult | Collected) -> None:
        """Write the output manifest: every file put, and the inputs ``source`` read."""
        assert self.path is not None
        with open(self.path / MANIFEST, "wb") as handle:
            if self.private:
                os.fchmod(handle.fileno(), 0o666 & ~self._mask())
            write_manifest(source, self.written, handle)
            handle.flush()
            os.fsync(handle.fileno())
        self._sealed = True

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        assert self.path is not None
        if kind is not None or not self._sealed:
            self._remove()
            if kind is None:
                raise RuntimeError(f"{self.out}: staged output left without a manifest")
            return
        with signals_deferred():  # the swap is a few renames: never leave it half done
            try:
                _swap_into_place(self.path, self.out, self.force)
            except BaseException:
                shutil.rmtree(self.path, ignore_errors=True)
                raise

    def _mask(self) -> int:
        return _umask() | (0o022 if self.private else 0)

    def _remove(self) -> None:
        if self.path is not None:
            with signals_deferred():
                shutil.rmtree(self.path, ignore_errors=True)


def _size(directory: Path | None, name: str) -> int | None:
    """The size of ``directory/name``; None when there is no such file."""
    try:
        return None if directory is None else (directory / name).stat().st_size
    except OSError:
        return None


def _write_lines(lines: Iterator[str], sink: io.RawIOBase, batch: int = 4096) -> None:
    """Write text a batch of lines at a time, :func:`auditor._text.printable` (a long
    report's text is never held whole: nor as text, nor as its bytes)."""
    while chunk := "".join(islice(lines, batch)):
        sink.write(printable(chunk).encode("utf-8"))


def _drawn(drawing: Future[list[tuple[str, bytes]]] | None) -> list[tuple[str, bytes]] | None:
    """The plots a :class:`Plotter` drew; None when it drew none (no helper, or the
    helper died: the caller then draws them itself)."""
    if drawing is None:
        return None
    try:
        return drawing.result()
    except BrokenExecutor:
        return None


def _umask() -> int:
    """The process's file-creation mask: from ``/proc/self/status`` where Linux gives it,
    else by setting it and setting it straight back (a moment in which another thread
    creating a file would get the wrong mode)."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class _HashingWriter(io.RawIOBase):
    """A write-only stream into ``handle`` that hashes and counts every byte it passes
    on: an output streamed to disk (a Parquet table) is hashed without being held whole."""

    def __init__(self, handle: BinaryIO) -> None:
        super().__init__()
        self._handle = handle
        self.hash = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._handle.write(view)
        self.hash.update(view)
        self.size += len(view)
        return len(view)

    def tell(self) -> int:
        return self.size


def _remove_stale_staging(parent: Path, name: str) -> None:
    """Remove staging directories an earlier audit of ``name`` left when it was killed
    (SIGKILL cannot be caught); only those whose writing process is gone."""
    prefix = f".{name}.tmp-"
    for entry in parent.iterdir():
        if not entry.name.startswith(prefix) or not entry.is_dir() or entry.is_symlink():
            continue
        pid_text = entry.name[len(prefix):].split("-", 1)[0]
        if not pid_text.isdigit():
            continue
        try:
            os.kill(int(pid_text), 0)
        except ProcessLookupError:
            shutil.rmtree(entry, ignore_errors=True)
        except PermissionError:
            continue  # alive, another user's


def _swap_into_place(staging: Path, out: Path, force: bool) -> None:
    """Rename ``staging`` to ``out``. With ``force``, an earlier audit there is moved aside,
    then removed (put back if the rename fails). Without, the rename itself refuses a
    directory that is no longer empty: another audit that wrote there since this one
    started is never replaced."""
    if force and out.is_dir() and any(out.iterdir()):
        trash = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.resolve().parent))
        try:
            os.rename(out, trash / "old")
        except OSError:
            trash.rmdir()
            raise
        try:
            os.rename(staging, out)
        except OSError:
            with contextlib.suppress(OSError):  # (the earlier audit back in its place; if
                os.rename(trash / "old", out)   # even that fails, it stays in the trash)
                trash.rmdir()
            raise
        shutil.rmtree(trash, ignore_errors=True)
        return
    try:
        os.rename(staging, out)  # (over an empty directory, or none)
    except OSError as error:
        if error.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        raise OutputError(f"{out}: written to by something else while this audit ran; left "
                          "as it is (nothing of this audit was kept)") from None


MANIFEST_GROUPS = ("raw_evidence", "source_inputs", "protocol_inputs")
MANIFEST_CHUNK = 4096
"""Input entries serialised at a time."""


def write_manifest(result: AuditResult | Collected, written: list[tuple[str, str, int]],
                   handle: BinaryIO) -> None:
    """Write the output manifest document to ``handle``.

    The input lists (one entry per evidence file: 10^5 or more) are streamed a chunk at
    a time, so the document is never whole in memory; the bytes are those of
    ``orjson.dumps(document, option=OPT_INDENT_2)`` plus a newline. ``result``: an audit's,
    or (for a shard's part) the collected study alone."""
    from auditor.model import Collected

    collected = result if isinstance(result, Collected) else result.collected
    head = orjson.dumps({
        "schema": MANIFEST_SCHEMA,
        "created_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "auditor_version": __version__,
        "root": printable(str(collected.root)),  # (a name not UTF-8: as its files' are)
        "outputs": [{"path": n, "sha256": s, "size": z} for n, s, z in sorted(written)],
    }, option=orjson.OPT_INDENT_2)
    handle.write(head[:-2])  # without the closing "\n}"
    for group in MANIFEST_GROUPS:
        # (evidence files are raw evidence: the other groups need not make their inputs)
        items = collected.all_inputs() if group == "raw_evidence" else collected.inputs
        entries = ({"path": item.path, "absolute": item.absolute,
                    "sha256": item.digest.sha256, "size": item.digest.size}
                   for item in items if item.group == group)
        handle.write(f',\n  "{group}": ['.encode())
        empty = True
        while chunk := list(islice(entries, MANIFEST_CHUNK)):
            # each entry indented to its depth (orjson escapes newlines inside strings)
            text = b",\n".join(_entry_json(entry) for entry in chunk)
            handle.write((b"" if empty else b",") + b"\n    " + text.replace(b"\n", b"\n    "))
            empty = False
        handle.write(b"]" if empty else b"\n  ]")
    handle.write(b"\n}\n")


def _entry_json(entry: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(entry, option=orjson.OPT_INDENT_2)
    except orjson.JSONEncodeError:  # (a lone surrogate: a file name that is not UTF-8)
        return orjson.dumps(printable_json(entry), option=orjson.OPT_INDENT_2)


@dataclass(frozen=True, slots=True)
class Difference:
    """One thing ``auditor verify`` found changed."""

    group: str
    path: str
    what: str
    """``changed``, ``missing``, ``added``, ``unreadable`` or ``unsafe`` (an output path
    leaving the directory)."""
    detail: str = ""


def _checked(entries: list[tuple[str, str, str, str, int]], root: str,
             out: str) -> list[Difference]:
    """What differs of ``entries`` (group, path, location, sha256, size) now. The evidence
    is read below its root as the audit read it, and the outputs below ``out`` as they were
    written (no link followed: a file swapped for a link since is never read where the link
    leads, and an output that is now a link differs), the other inputs where their
    locations lead."""
    differences: list[Difference] = []
    with Beneath(root) as beneath, Beneath(out) as written:
        for group, path, location, sha256, size in entries:
            below = beneath if group == "raw_evidence" else \
                written if group == "outputs" else None
            try:
                try:
                    digest = _input_digest(location, below)
                except (FileNotFoundError, _Outside):  # (a name that is not UTF-8 is
                    if unprintable(location) == location:  # listed printable)
                        raise
                    digest = _input_digest(unprintable(location), below)
            except FileNotFoundError:
                differences.append(Difference(group, path, "missing"))
            except _Outside:
                differences.append(Difference(group, path, "unsafe",
                                              "outside the evidence root; not read"))
            except OSError as error:
                differences.append(
                    Difference(group, path, "changed", "a link in its place; not read")
                    if error.errno == errno.ELOOP and group == "outputs" else
                    Difference(group, path, "unreadable", open_reason(error)))
            else:
                if digest.sha256 != sha256 or digest.size != size:
                    differences.append(Difference(
                        group, path, "changed", f"expected {sha256[:16]}…/{size}, found "
                        f"{digest.sha256[:16]}…/{digest.size}"))
    return differences


def _parents(rel: str) -> Iterator[str]:
    """The folders above a relative path (``plots/a.png``: ``plots``)."""
    parts = rel.split("/")[:-1]
    for end in range(1, len(parts) + 1):
        yield "/".join(parts[:end])


class _Outside(Exception):
    """An evidence file's location is not below the evidence root."""


def _input_digest(location: str, beneath: Beneath | None) -> FileDigest:
    """The digest of the input at ``location``: a regular file, read below the evidence
    root without following a link when ``beneath`` is given (raw evidence; :class:`_Outside`
    when it is not below it), else where ``location`` leads."""
    if beneath is None:
        return _regular_digest(location)
    rel = beneath.relative(location)
    if rel is None:
        raise _Outside
    with beneath.open(rel) as file:
        reader = HashingReader(file)
        reader.drain()
        return reader.digest()


def _regular_digest(location: str) -> FileDigest:
    """The digest of the regular file at ``location`` (links followed); anything else (a
    FIFO put in a file's place would block the read for ever, a device never end it) is an
    ``OSError`` saying what it is."""
    if not stat.S_ISREG(os.stat(location).st_mode):
        raise OSError(errno.EINVAL, "not a regular file")
    return sha256_file(location)


def verify_outputs(out: Path | str, inputs: bool = True,
                   manifest: dict[str, Any] | None = None,
                   checked: frozenset[str] = frozenset()) -> tuple[list[Difference], int]:
    """Re-hash every output and (unless not ``inputs``) every input the manifest lists;
    (differences, files checked). ``manifest``: the manifest document, when the caller
    has read it already (a merge reads a part's once, and checks what it names first);
    ``checked``: outputs the caller hashed against it already (a part's own files, read
    once through their directory), not read again."""
    out = Path(out)
    manifest_path = out / MANIFEST
    if not out.is_dir():
        raise VerifyError(f"{out}: not a directory")
    try:
        if manifest is None:  # (a FIFO: never waited on)
            manifest = orjson.loads(regular_bytes(manifest_path, follow=False))
    except FileNotFoundError:
        raise VerifyError(f"{out}: no {MANIFEST}; is this an audit output directory?") from None
    except (OSError, orjson.JSONDecodeError) as error:
        said = error.strerror if isinstance(error, OSError) and error.strerror else error
        raise VerifyError(f"{manifest_path}: unreadable manifest ({said})") from None
    if not isinstance(manifest, dict) or manifest.get("schema") != MANIFEST_SCHEMA:
        raise VerifyError(f"{manifest_path}: not an auditor output manifest")
    from auditor.schema import validate_document

    problems = validate_document("output_manifest", manifest, str(manifest_path))
    if problems:
        raise VerifyError(f"{manifest_path}: malformed manifest: {problems[0].message}")
    differences: list[Difference] = []
    entries: list[tuple[str, str, str, str, int]] = []  # group, path, location, sha256, size
    for item in manifest["outputs"]:
        if item["path"] in checked:
            continue
        inside = join_text(item["path"])
        if inside is None:  # a tampered manifest must not send verify out of the directory
            differences.append(Difference("outputs", item["path"], "unsafe",
                                          "path leaves the output directory; not read"))
            continue
        entries.append(("outputs", item["path"], os.path.join(os.path.abspath(out), inside),
                        item["sha256"], item["size"]))
    root, raw = manifest.get("root", ""), manifest.get("raw_evidence", [])
    if not os.path.isdir(root) and os.path.isdir(unprintable(root)):
        root = unprintable(root)  # (a name that is not UTF-8 is written printable)
    root_gone = inputs and bool(raw) and not os.path.isdir(root)
    if root_gone:  # one line, not one "missing" per file of a study moved or deleted
        differences.append(Difference(
            "evidence_root", root, "missing",
            f"moved, deleted or no longer a directory: none of the {len(raw):,} evidence "
            "files read from it was checked"))
    groups = [group for group in ("raw_evidence", "source_inputs", "protocol_inputs")
              if inputs and not (root_gone and group == "raw_evidence")]
    for group in groups:
        for item in manifest.get(group, []):
            location = item.get("absolute") or str(Path(root) / item["path"])
            entries.append((group, item["path"], location, item["sha256"], item["size"]))
    differences.extend(_checked(entries, root, os.path.abspath(out)))
    listed = {item["path"] for item in manifest["outputs"]} | {MANIFEST}
    folders = {parent for name in listed for parent in _parents(name)}
    for dirpath, dirnames, filenames in os.walk(out):  # (links not followed: listed)
        for name in [*filenames, *dirnames]:
            rel = (Path(dirpath) / name).relative_to(out).as_posix()
            if rel not in listed and (name in filenames or rel not in folders
                                      or os.path.islink(out / rel)):
                differences.append(Difference("outputs", rel, "added"))
    return sorted(differences, key=lambda d: (d.group, d.path)), len(entries)
