"""Shard parts: what ``auditor audit ROOT --shard I/N --out PART`` writes, and what
``auditor merge`` reads back.

A part holds one shard's collected study (:class:`~auditor.model.CollectedParts`: the study's
inputs and the period units of every N-th period from the I-th) as ``part.jsonl``, what it
is as ``part.json``, optionally its signature (``part.hmac``), and an output manifest
pinning them and every input the shard read, so ``auditor verify PART`` re-checks it like an
audit. A part is data, never code: JSON lines (a head, then one line per period unit, then
one per unlisted file) that :mod:`auditor.pipeline.codec` decodes by the model's own types,
each line at most :data:`MAX_LINE` bytes, then checked field by field against ``part.json``
(root, shard, period count, the shard's own periods, protocol and input digests), and
path by path: each input it names (a period record's, the study's) is one its manifest pins,
raw evidence below the study's root, and each evidence file, unlisted file and layout path a
path below that root (what the merged manifest and ``auditor verify`` would open).

Labs keep parts on shared file systems, so :func:`read_part` opens a part's directory and
files without following links, reads each once (the bytes decoded are the bytes hashed and
compared with the manifest) and refuses, with one line, a part that someone other than the
caller (or root) owns or may write unless the caller trusts them (``--trust-parts``) or the
part carries a valid HMAC-SHA256 under the key both sides were given (``--key-file``).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson

from auditor import __version__
from auditor._text import printable, printable_json
from auditor.errors import InputError
from auditor.model import HASHED_STATUSES, CollectedParts, FileOutcome, InputFile, PeriodUnit
from auditor.pipeline.codec import CodecError, decode, encode

PART = "part.jsonl"
META = "part.json"
SIGNATURE = "part.hmac"
MANIFEST = "output_manifest.json"
OWN_FILES = frozenset({PART, META})
"""A part's files :func:`read_part` reads once and checks against its manifest's pins (a
merge's verification need not hash them again)."""
PART_SCHEMA = "auditor/shard-part/v2"
MAX_LINE = 256 << 20
"""The longest line of a part (one period unit: its records, traces' phases and log events,
already bounded by the collectors); a longer one is refused before it is parsed."""
MAX_META = 64 << 20
"""The largest ``part.json`` or output manifest read whole (a manifest lists each evidence
file of the shard: about 200 bytes each)."""
MIN_KEY = 16
MAX_SHARDS = 100_000
"""The most shards a study is split in (a part saying more is refused, never counted)."""
_SIGNED = b"auditor shard part v2\n"
_Unlisted = tuple[tuple[int, int], FileOutcome]


def part_meta(parts: CollectedParts, collection: dict[str, Any]) -> dict[str, Any]:
    """What ``part.json`` says of a part: its shard, its study, the options it was
    collected with (merge refuses parts that differ in any of these)."""
    assert parts.shard is not None
    digests = {item.path: item.digest.sha256 for item in parts.study_inputs}
    return {
        "schema": PART_SCHEMA,
        "auditor_version": __version__,
        "root": str(parts.root),
        "shard": list(parts.shard),
        "periods_total": parts.periods_total,
        "periods": [unit.index for unit in parts.units],
        "protocol_sha256": parts.protocol.digest.sha256 if parts.protocol.digest else None,
        "inputs_sha256": dict(sorted(digests.items())),
        "seen_sha256": parts.seen_sha256,
        "collection": collection,
    }


def part_lines(parts: CollectedParts) -> Iterator[bytes]:
    """The part's lines: its head (the collected study without its units and unlisted
    files), then one ``{"unit": ...}`` per period unit, one ``{"unlisted": ...}`` per file."""
    yield encode(replace(parts, units=(), unlisted=())) + b"\n"
    for unit in parts.units:
        yield encode({"unit": unit}) + b"\n"
    for item in parts.unlisted:
        yield encode({"unlisted": item}) + b"\n"


def part_files(parts: CollectedParts, collection: dict[str, Any],
               key: bytes | None = None) -> dict[str, bytes]:
    """A part's files by name (:data:`PART`, :data:`META` and, given a ``key``,
    :data:`SIGNATURE`): what the command line writes."""
    data = b"".join(part_lines(parts))
    # (a root or an option's path that is not UTF-8 written printable, as the manifest's)
    meta = orjson.dumps(printable_json(part_meta(parts, collection)),
                        option=orjson.OPT_INDENT_2) + b"\n"
    files = {PART: data, META: meta}
    if key is not None:
        files[SIGNATURE] = signature(key, meta, hashlib.sha256(data).hexdigest()).encode() \
            + b"\n"
    return files


def signature(key: bytes, meta: bytes, data_sha256: str) -> str:
    """The part's HMAC-SHA256 (hex) under ``key``: over its ``part.json`` and its data
    (given by its SHA-256: the merge hashes the data as it reads it), each by its SHA-256."""
    message = (_SIGNED + hashlib.sha256(meta).hexdigest().encode() + b"\n"
               + data_sha256.encode() + b"\n")
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def read_key(path: Path) -> bytes:
    """The key in ``path`` (``--key-file``): a regular file of at least :data:`MIN_KEY`
    bytes that no one but its owner's group may read; one line otherwise."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        raise InputError(f"--key-file {path}: cannot read ({error.strerror})") from None
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"--key-file {path}: not a regular file")
        if info.st_mode & 0o007:
            raise InputError(f"--key-file {path}: others may read or write it (mode "
                             f"{stat.S_IMODE(info.st_mode):04o}); chmod o-rwx it")
        key = os.read(descriptor, 1 << 16)
    finally:
        os.close(descriptor)
    if len(key) < MIN_KEY:
        raise InputError(f"--key-file {path}: a key needs at least {MIN_KEY} bytes "
                         "(e.g. head -c 32 /dev/urandom > KEY)")
    return key


@dataclass(frozen=True, slots=True)
class Trust:
    """How :func:`read_part` decides a part may be read."""

    key: bytes | None = None
    """Parts must carry a valid signature under this key (then who owns them is moot)."""
    anyone: bool = False
    """Parts others own or may write are read as the caller's own (``--trust-parts``)."""


def read_part(path: Path, trust: Trust = Trust()
              ) -> tuple[dict[str, Any], CollectedParts, dict[str, Any]]:
    """A part's ``part.json``, its collected study and its output manifest, each file read
    once through the part directory's descriptor (no link followed), checked against its
    manifest and ``part.json``; one line naming ``path`` (:class:`InputError`) otherwise.
    The manifest's inputs are not re-hashed here (the caller verifies them)."""
    try:
        directory = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as error:
        raise InputError(f"merge: {path}: not a part directory ({error.strerror}; "
                         "a link is not followed)") from None
    try:
        if trust.key is None and not trust.anyone:
            _check_owner(path, ".", os.fstat(directory))
        manifest = _document(path, directory, MANIFEST, trust)
        pinned = _pinned(path, manifest)
        meta_bytes = _whole(path, directory, META, trust, pinned)
        meta = _meta(path, meta_bytes)
        with _opened(path, directory, PART, trust) as (handle, size):
            hasher = hashlib.sha256()
            parts = _decoded(path, _lines(path, handle, hasher), meta)
            _check_pin(path, PART, pinned, hasher.hexdigest(), size)
        if trust.key is not None:
            _check_signature(path, directory, trust, pinned, meta_bytes, hasher.hexdigest())
    finally:
        os.close(directory)
    _check_against_meta(path, meta, parts)
    _check_manifest_inputs(path, meta, manifest)
    _check_data_paths(path, parts)
    _check_data_inputs(path, parts, manifest)
    return meta, parts, manifest


def _check_owner(path: Path, name: str, info: os.stat_result) -> None:
    """Refuse a file or directory someone other than the caller (or root) owns or may
    write: one line saying how to proceed."""
    what = path if name == "." else path / name
    if info.st_uid not in (os.getuid(), 0):
        raise InputError(f"merge: {what}: owned by another user (uid {info.st_uid}); "
                         "merge parts only you or root can write, or pass --trust-parts "
                         "(or sign parts with --key-file)")
    if info.st_mode & 0o022:
        raise InputError(f"merge: {what}: others may write it (mode "
                         f"{stat.S_IMODE(info.st_mode):04o}); chmod -R go-w the part, or pass "
                         "--trust-parts (or sign parts with --key-file)")


class _opened:
    """A part's file opened through its directory's descriptor: no link followed, never
    waiting on a FIFO, a regular file (of the caller's, unless trusted); (binary handle,
    size)."""

    def __init__(self, path: Path, directory: int, name: str, trust: Trust) -> None:
        try:
            descriptor = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
                                 | os.O_CLOEXEC, dir_fd=directory)
        except OSError as error:
            raise InputError(f"merge: {path}: {name} cannot be read ({error.strerror}; "
                             "a link is not followed)") from None
        info = os.fstat(descriptor)
        try:
            if not stat.S_ISREG(info.st_mode):
                raise InputError(f"merge: {path}: {name} is not a regular file")
            if trust.key is None and not trust.anyone:
                _check_owner(path, name, info)
        except InputError:
            os.close(descriptor)
            raise
        self.handle = os.fdopen(descriptor, "rb")
        self.size = info.st_size

    def __enter__(self) -> tuple[Any, int]:
        return self.handle, self.size

    def __exit__(self, *_: object) -> None:
        self.handle.close()


def _whole(path: Path, directory: int, name: str, trust: Trust,
           pinned: dict[str, tuple[str, int]] | None) -> bytes:
    """A small file's bytes (at most :data:`MAX_META`), checked against its pin unless
    ``pinned`` is None (the manifest itself)."""
    with _opened(path, directory, name, trust) as (handle, _):
        data: bytes = handle.read(MAX_META + 1)
    if len(data) > MAX_META:
        raise InputError(f"merge: {path}: {name} is larger than {MAX_META >> 20} MiB")
    if pinned is not None:
        _check_pin(path, name, pinned, hashlib.sha256(data).hexdigest(), len(data))
    return data


def _document(path: Path, directory: int, name: str, trust: Trust) -> dict[str, Any]:
    data = _whole(path, directory, name, trust, None)
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError as error:
        raise InputError(f"merge: {path}: {name} is not JSON ({error})") from None
    if not isinstance(document, dict):
        raise InputError(f"merge: {path}: {name} is not a JSON object")
    return document


def _pinned(path: Path, manifest: dict[str, Any]) -> dict[str, tuple[str, int]]:
    """The manifest's outputs, by name: (sha256, size)."""
    outputs = manifest.get("outputs")
    pins: dict[str, tuple[str, int]] = {}
    for item in outputs if isinstance(outputs, list) else ():
        if isinstance(item, dict) and type(item.get("path")) is str \
                and type(item.get("sha256")) is str and type(item.get("size")) is int:
            pins[item["path"]] = (item["sha256"], item["size"])
    if PART not in pins or META not in pins:
        raise InputError(f"merge: {path}: not a shard part (its {MANIFEST} pins no {PART} "
                         f"and {META})")
    return pins


def _check_pin(path: Path, name: str, pinned: dict[str, tuple[str, int]], sha256: str,
               size: int) -> None:
    if pinned.get(name) != (sha256, size):
        raise InputError(f"merge: {path}: {name} differs from its output manifest; a part "
                         "must verify before it is merged")


def _meta(path: Path, data: bytes) -> dict[str, Any]:
    try:
        meta = orjson.loads(data)
    except orjson.JSONDecodeError as error:
        raise InputError(f"merge: {path}: not a shard part ({error})") from None
    if not isinstance(meta, dict) or meta.get("schema") != PART_SCHEMA:
        raise InputError(f"merge: {path}: not a shard part (no {META} of {PART_SCHEMA})")
    shard, total = meta.get("shard"), meta.get("periods_total")
    if not (isinstance(shard, list) and len(shard) == 2 and all(type(n) is int for n in shard)
            and 1 <= shard[0] <= shard[1] <= MAX_SHARDS) \
            or type(total) is not int or total < 0:
        raise InputError(f"merge: {path}: {META} has no shard I/N and period count")
    if meta.get("auditor_version") != __version__:
        raise InputError(f"merge: {path}: written by auditor "
                         f"{meta.get('auditor_version') or 'of an unknown version'}, "
                         f"this is {__version__}; audit the shard again")
    periods = meta.get("periods")
    if not isinstance(periods, list) or not all(type(n) is int for n in periods) \
            or any(not 0 <= n < total or n % shard[1] != shard[0] - 1 for n in periods):
        raise InputError(f"merge: {path}: {META} lists periods that are not shard "
                         f"{shard[0]}/{shard[1]}'s of {total}")
    for key in ("root", "protocol_sha256", "seen_sha256"):
        if not isinstance(meta.get(key), str | None):
            raise InputError(f"merge: {path}: {META} has no {key}")
    if not isinstance(meta.get("inputs_sha256"), dict) \
            or not isinstance(meta.get("collection"), dict):
        raise InputError(f"merge: {path}: {META} has no inputs and collection options")
    return meta


def _lines(path: Path, handle: Any, hasher: Any) -> Iterator[tuple[int, Any]]:
    """Each line of the part's data, parsed: (line number, JSON value), hashed as read."""
    number = 0
    while line := handle.readline(MAX_LINE + 1):
        number += 1
        hasher.update(line)
        if len(line) > MAX_LINE:
            raise InputError(f"merge: {path}: {PART} line {number} is longer than "
                             f"{MAX_LINE >> 20} MiB")
        try:
            yield number, orjson.loads(line)
        except orjson.JSONDecodeError as error:
            raise InputError(f"merge: {path}: {PART} line {number}: not JSON "
                             f"({error})") from None


def _decoded(path: Path, lines: Iterable[tuple[int, Any]], meta: dict[str, Any]
             ) -> CollectedParts:
    """The collected study the part's lines hold, by the model's types."""
    head: CollectedParts | None = None
    units: list[PeriodUnit] = []
    unlisted: list[_Unlisted] = []
    expected = len(meta["periods"])
    try:
        for number, value in lines:
            where = f"{PART} line {number}"
            if head is None:
                head = decode(value, CollectedParts, where)
            elif isinstance(value, dict) and value.keys() == {"unit"}:
                if len(units) == expected or unlisted:
                    raise InputError(f"merge: {path}: {where}: a period unit past the "
                                     f"{expected} {META} lists")
                units.append(decode(value["unit"], PeriodUnit, where + " unit"))
            elif isinstance(value, dict) and value.keys() == {"unlisted"}:
                unlisted.append(decode(value["unlisted"], _Unlisted, where + " unlisted"))
            else:
                raise InputError(f"merge: {path}: {where}: neither a unit nor an unlisted file")
    except CodecError as error:
        raise InputError(f"merge: {path}: {PART} cannot be read ({error})") from None
    if head is None or head.units or head.unlisted:
        raise InputError(f"merge: {path}: {PART} holds no collected study")
    return replace(head, units=tuple(units), unlisted=tuple(unlisted))


def _check_signature(path: Path, directory: int, trust: Trust,
                     pinned: dict[str, tuple[str, int]], meta: bytes, data_sha256: str) -> None:
    assert trust.key is not None
    if SIGNATURE not in pinned:
        raise InputError(f"merge: {path}: not signed (no {SIGNATURE}); audit the shard with "
                         "--key-file, or merge without it")
    given = _whole(path, directory, SIGNATURE, Trust(anyone=True), pinned).strip()
    if not hmac.compare_digest(given, signature(trust.key, meta, data_sha256).encode()):
        raise InputError(f"merge: {path}: its signature does not match (another key, or the "
                         "part was altered)")


def _check_against_meta(path: Path, meta: dict[str, Any], parts: CollectedParts) -> None:
    """The decoded study against ``part.json``, field by field."""
    digests = {item.path: item.digest.sha256 for item in parts.study_inputs}
    protocol = parts.protocol.digest.sha256 if parts.protocol.digest else None
    checks = (("root", printable(str(parts.root)), meta["root"]),
              ("shard", list(parts.shard) if parts.shard else None, meta["shard"]),
              ("periods_total", parts.periods_total, meta["periods_total"]),
              ("periods", [unit.index for unit in parts.units], meta["periods"]),
              ("protocol_sha256", protocol, meta["protocol_sha256"]),
              ("inputs_sha256", dict(sorted(digests.items())), meta["inputs_sha256"]),
              ("seen_sha256", parts.seen_sha256, meta.get("seen_sha256")))
    for name, held, said in checks:
        if held != said:
            raise InputError(f"merge: {path}: {PART} and {META} disagree on {name}")
    if not parts.root.is_absolute():
        raise InputError(f"merge: {path}: {META} names no absolute study root")


def _check_manifest_inputs(path: Path, meta: dict[str, Any], manifest: dict[str, Any]) -> None:
    """A part's manifest names only files under its study's root, and the scheduler dump,
    protocol inputs and sources its collection options name: never another file for the
    merge to open."""
    root = meta["root"]
    if manifest.get("root") != root:
        raise InputError(f"merge: {path}: its {MANIFEST} and {META} name different roots")
    collection = meta["collection"]
    given = [str(collection["sacct"])] if collection.get("sacct") else []
    given += [str(pair[1]) for pair in collection.get("protocol_inputs") or ()
              if isinstance(pair, list) and len(pair) == 2]
    named = {os.path.abspath(name) for name in given} | {os.path.realpath(name)
                                                         for name in given}
    source_root = collection.get("source_root")
    for group in ("raw_evidence", "source_inputs", "protocol_inputs"):
        for item in manifest.get(group) or ():
            absolute = item.get("absolute") if isinstance(item, dict) else None
            if not isinstance(absolute, str) or not (
                    _beneath(absolute, root) or absolute in named
                    or (group == "source_inputs" and isinstance(source_root, str)
                        and _beneath(absolute, os.path.realpath(source_root)))):
                raise InputError(f"merge: {path}: its {MANIFEST} names {absolute!r}, outside "
                                 "its study's root and the inputs its options name")


def _check_data_paths(path: Path, parts: CollectedParts) -> None:
    """Every path the part's data holds that the merge, its report or ``auditor verify``
    of its output would open (the study's root, its layout's files, each evidence file read
    and hashed: the merged manifest's raw evidence is the root joined with its path) names
    a file below the study's root; one line naming the part and the field otherwise."""
    root = str(parts.root)
    if root == "/" or os.path.normpath(root) != root:
        raise InputError(f"merge: {path}: {PART} root {root!r} is not a study root (a "
                         "normal absolute path other than /)")
    if str(parts.layout.root) != root:
        raise InputError(f"merge: {path}: {PART} layout.root {str(parts.layout.root)!r} is "
                         "not its study's root")
    layout = parts.layout
    named = [("layout.period_records", rel) for rel in layout.period_records]
    named += [("layout.attempt_dirs", rel) for rel in layout.attempt_dirs]
    named += [("layout.stray_pair_files", rel) for rel in layout.stray_pair_files]
    named += [("layout.linked_dirs", rel) for rel in layout.linked_dirs]
    named += [(f"layout.{name}", rel) for name in ("protocol", "execution_commits", "sacct")
              if (rel := getattr(layout, name)) is not None]
    for field, rel in named:
        _check_relative(path, field, rel)
    for unit in parts.units:
        for attempt in unit.evidence.attempts:
            for row in attempt.files:
                if row.actual_sha256 is not None and row.status in HASHED_STATUSES:
                    _check_relative(path, f"unit {unit.index} evidence path", row.path)
    for _, outcome in parts.unlisted:
        if outcome.digest is not None:
            _check_relative(path, "unlisted display", outcome.display)


def _check_relative(path: Path, field: str, rel: str) -> None:
    """Refuse a root-relative path of the part's data that is empty, absolute, or has an
    empty, ``.`` or ``..`` part (joined with the root, it would name a file elsewhere)."""
    if not _relative(rel):
        raise InputError(f"merge: {path}: {PART} {field} {rel!r} is not a path below its "
                         "study's root")


def _relative(rel: str) -> bool:
    """Whether ``rel`` joined with a root names a file below it (string work)."""
    return bool(rel) and "\0" not in rel \
        and all(piece not in ("", ".", "..") for piece in rel.split("/"))


def _check_data_inputs(path: Path, parts: CollectedParts, manifest: dict[str, Any]) -> None:
    """Each input the part's data holds (the study's, each period record's), which the merged
    output manifest lists for ``auditor verify`` to open, is one its own manifest pins (path,
    absolute path, digest: what :func:`_check_manifest_inputs` let through) and, for raw
    evidence, a file below the study's root; one line naming the part and the field
    otherwise (a part's manifest is checked, its data must not name another file)."""
    root = str(parts.root)
    given = [(f"study_inputs[{n}]", item) for n, item in enumerate(parts.study_inputs)]
    for unit in parts.units:
        item = unit.record_input
        if item is None:
            continue
        field = f"unit {unit.index} record_input"
        if item.group != "raw_evidence" or item.path != unit.evidence.record.path:
            raise InputError(f"merge: {path}: {PART} {field} is not its period record's "
                             f"raw evidence ({item.group} {item.path!r})")
        given.append((field, item))
    wanted: dict[tuple[object, ...], str] = {}
    for field, item in given:
        if item.group == "raw_evidence" and not (
                _relative(item.path) and _beneath(item.absolute, root)):
            raise InputError(f"merge: {path}: {PART} {field}.absolute names "
                             f"{item.absolute!r}, outside its study's root")
        wanted.setdefault(_input_key(item), field)
    paths = {key[:2] for key in wanted}
    for group in ("raw_evidence", "source_inputs", "protocol_inputs"):
        for entry in manifest.get(group) or ():
            if isinstance(entry, dict) and (group, entry.get("path")) in paths:
                wanted.pop((group, entry["path"], entry.get("absolute"), entry.get("sha256"),
                            entry.get("size")), None)
    if wanted:
        (kind, rel, absolute, _, _), field = next(iter(wanted.items()))
        raise InputError(f"merge: {path}: {PART} {field}.absolute names {absolute!r}, which "
                         f"its {MANIFEST} does not pin as {kind} {rel!r}")


def _input_key(item: InputFile) -> tuple[str, str, str, str, int]:
    """An input as its output manifest's entry shows it (a name that is not UTF-8 written
    printable)."""
    return (item.group, printable(item.path), printable(item.absolute), item.digest.sha256,
            item.digest.size)


def _beneath(absolute: str, root: str) -> bool:
    """Whether ``absolute`` is a path below ``root`` (absolute) with no ``..`` part (string
    work: a study's manifest lists every evidence file)."""
    prefix = root.rstrip("/") + "/"
    return root.startswith("/") and absolute.startswith(prefix) and len(absolute) > len(prefix) \
        and "/../" not in absolute[len(prefix) - 1:] + "/"
