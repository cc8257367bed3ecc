"""The attempt's files as ``auditor seal`` reads them, and the workers they name: each file
opened as the regular file it was listed as (never through a link, never a FIFO waited on),
its JSON read within a bound, and the roster of (role, rank, pid, host) its device files and
traces give, refused where two workers would share one (host, pid) (contract v1.2: a worker
is never dropped silently).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from auditor._text import printable
from auditor.capture._files import UNUSABLE_JSON
from auditor.model.kinds import ALLOCATOR_TRACE, DEVICE_EVIDENCE, kind_of


class SealRefused(ValueError):
    """``auditor seal`` will not write (one line saying why)."""


_NO_LINK = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_JSON = 64 << 20
"""The most bytes of a trial record, device file or period record read to find its fields."""


@contextmanager
def _regular(base: Path, relative: str) -> Iterator[BinaryIO]:
    """``base / relative`` opened as the regular file it was listed as: each directory below
    ``base`` (the attempt's, its links refused already) and the file itself opened without
    following a link, and a FIFO never waited on. A file swapped for a link or a FIFO since
    ``_files`` listed it is refused (it could lead out of the root, or hang the seal), never
    read where it leads."""
    path = base / relative
    *folders, name = relative.split("/")
    try:
        descriptor = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for folder in folders:
                inner = os.open(folder, _NO_LINK | os.O_DIRECTORY, dir_fd=descriptor)
                os.close(descriptor)
                descriptor = inner
            opened = os.open(name, _NO_LINK | os.O_NONBLOCK, dir_fd=descriptor)
        finally:
            os.close(descriptor)
    except OSError as error:
        raise SealRefused(f"{printable(str(path))}: cannot be read as it was listed "
                          f"({error.strerror}: a link is not followed); not sealed") from None
    with os.fdopen(opened, "rb") as handle:
        if not stat.S_ISREG(os.fstat(opened).st_mode):
            raise SealRefused(f"{printable(str(path))}: not a regular file; not sealed")
        yield handle


def _json(base: Path, relative: str) -> dict[str, Any] | None:
    try:
        with _regular(base, relative) as handle:
            document = json.loads(handle.read(MAX_JSON + 1))
    except (OSError, *UNUSABLE_JSON):
        return None
    return document if isinstance(document, dict) else None


def _workers(directory: Path, files: list[str]) -> list[dict[str, Any]]:
    """(role, rank, pid, host) of every worker: from its device file, else from the first
    phase record of its trace; a worker is (host, pid) (contract v1.2: pids repeat across
    nodes; a v1 file's host is its name's or, failing that, its content's); sorted by role,
    rank, host, pid. Two device files, or one trace's phase records, naming two (role, rank)
    for one (host, pid) are refused (:func:`_one_process`): listing one would drop the other
    silently. (A trace and a device file that disagree are one process labelled two ways: the
    audit's identity checks say so, the seal lists it once.)"""
    found: dict[tuple[str | None, int], dict[str, Any]] = {}
    claims: list[tuple[str, object, object, object, object, str]] = []
    for relative in files:
        kind = kind_of(relative)
        if kind == DEVICE_EVIDENCE.name:
            document = _json(directory, relative) or {}
            named = DEVICE_EVIDENCE.worker_of(relative)
            host = named[0] if named and named[0] else document.get("hostname")
            claims.append(("", host, document.get("pid"), document.get("role"),
                           document.get("rank"), relative))
            _add_worker(found, document.get("role"), document.get("rank"), document.get("pid"),
                        host)
        elif kind == ALLOCATOR_TRACE.name:
            named = ALLOCATOR_TRACE.worker_of(relative)
            records = _phases(directory, relative, named[0] if named else None)
            claims.extend((relative, named[0] if named and named[0] else record.get("host"),
                           record.get("pid"), record.get("role"), record.get("rank"),
                           f"{relative} line {line}") for record, line in records)
            for record, _ in records[:1]:
                _add_worker(found, record.get("role"), record.get("rank"), record.get("pid"),
                            named[0] if named and named[0] else record.get("host"))
    seen: dict[tuple[str, str, int], tuple[tuple[object, object], str]] = {}
    for source, host, pid, role, rank, where in sorted(claims, key=lambda c: c[0]):
        # (device files first, "" their source: each trace is a source of its own)
        _one_process(directory, seen, source, host, pid, role, rank, where)
    return sorted(found.values(), key=lambda w: (w["role"], w["rank"], w.get("host") or "",
                                                 w["pid"]))


def _one_process(directory: Path,
                 seen: dict[tuple[str, str, int], tuple[tuple[object, object], str]],
                 source: str, host: object, pid: object, role: object, rank: object,
                 where: str) -> None:
    """Refuse a second (role, rank) for one (host, pid) from one ``source`` (the device files,
    ``""``, or one trace): two processes of one hostname and pid (nodes or containers that
    report one hostname, each in a pid namespace of its own), or one process that wrote for
    two ranks; a worker is (host, pid), so one would be listed and the other dropped
    unsaid. ``where`` names the file (and line) that says it."""
    if not isinstance(host, str) or not host or type(pid) is not int \
            or type(role) is not str or type(rank) is not int:
        return
    first = seen.setdefault((source, host, pid), ((role, rank), where))
    if first[0] != (role, rank):
        raise SealRefused(
            f"{printable(str(directory))}: {printable(first[1])} (role "
            f"{printable(str(first[0][0]))}, rank {first[0][1]}) and {printable(where)} "
            f"(role {printable(role)}, rank {rank}) name one worker, pid {pid} on host "
            f"{printable(host)}, twice: two processes of one hostname and pid (nodes or "
            "containers that report the same hostname, each in its own pid namespace: give "
            "each node its own hostname), or one process that wrote for two ranks or roles (a "
            "worker is one process, of one role and rank); one would be listed and the other "
            "dropped; not sealed")


def _add_worker(found: dict[tuple[str | None, int], dict[str, Any]], role: object,
                rank: object, pid: object, host: object) -> None:
    if type(role) is not str or type(rank) is not int or type(pid) is not int:
        return
    host = host if isinstance(host, str) and host else None
    if (host, pid) in found or (host is not None and (None, pid) in found):
        return
    if host is None and any(key[1] == pid for key in found):
        return
    found[(host, pid)] = {"role": role, "rank": rank, "pid": pid,
                          **({"host": host} if host else {})}


PHASE_MARK = b'"phase"'
"""What a phase record's line holds (memory samples, the bulk of a trace, do not): only such
lines are parsed."""


LONGEST_LINE = 1 << 20
"""A trace line longer than this ends the look at its phase records (the audit reads a line
only to its start: no record it could read): carried whole from block to block, a line of
no newline was copied again with each block read."""


def _phases(base: Path, relative: str, host: str | None = None
            ) -> list[tuple[dict[str, Any], int]]:
    """The trace's first phase record (which names the worker) and the phase records
    :func:`_one_process` must see, with their line numbers: of each (host, pid) the first
    record of its first two (role, rank), as more can change nothing it says (``host``: the
    name's, else each record's). None when a line before the first is not JSON (the audit
    names it), and none after the first line that is not. Read in blocks: one holding no
    phase record (memory samples, the bulk of a large trace) is only counted, never split
    into lines; the records kept are a few whatever the trace's length (every phase record
    of a long run, kept, held the seal's memory in proportion to it)."""
    found: list[tuple[dict[str, Any], int]] = []
    kept: dict[tuple[str, int], set[tuple[str, int]]] = {}
    number = 0
    carry = b""
    try:
        with _regular(base, relative) as handle:
            while True:
                block = handle.read(1 << 20)
                data = carry + block
                cut = data.rfind(b"\n") + 1 if block else len(data)
                body, carry = data[:cut], data[cut:]
                if len(carry) > LONGEST_LINE:  # (no phase record: one not JSON to the audit)
                    _phase_lines(body, number, found, kept, host)
                    return found
                if found and PHASE_MARK not in body:
                    number += body.count(b"\n")
                elif body and not _phase_lines(body, number, found, kept, host):
                    return found
                else:
                    number += body.count(b"\n")
                if not block:
                    return found
    except OSError:
        return found


def _phase_lines(body: bytes, number: int, found: list[tuple[dict[str, Any], int]],
                 kept: dict[tuple[str, int], set[tuple[str, int]]], host: str | None) -> bool:
    """Add the phase records of ``body`` (whole lines, the first numbered ``number + 1``) that
    :func:`_phases` keeps to ``found`` (``kept``: the (role, rank) kept of each (host, pid));
    False at a line that is not JSON (nothing after it counts)."""
    lines = body.split(b"\n")
    if body.endswith(b"\n"):
        lines.pop()  # (the empty text after the last newline: no line)
    for index, line in enumerate(lines, number + 1):
        if found and PHASE_MARK not in line:  # (after the first: phase lines only)
            continue
        try:
            record = json.loads(line)
        except UNUSABLE_JSON:
            return False
        if not isinstance(record, dict) or "phase" not in record:
            continue
        worker = host or record.get("host")
        pid, role, rank = record.get("pid"), record.get("role"), record.get("rank")
        if not isinstance(worker, str) or not worker or type(pid) is not int \
                or type(role) is not str or type(rank) is not int:
            if not found:  # (the first names the worker, whatever :func:`_one_process` reads)
                found.append((record, index))
            continue
        ranks = kept.setdefault((worker, pid), set())
        if not found or ((role, rank) not in ranks and len(ranks) < 2):
            # (two of one (host, pid) are refused whatever came before: a third adds nothing)
            ranks.add((role, rank))
            found.append((record, index))
    return True
