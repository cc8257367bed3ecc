"""Shard parts: what ``auditor audit ROOT --shard I/N --out PART`` writes, and what
``auditor merge`` reads back.

A part holds one shard's collected study (:class:`~auditor.model.CollectedParts`: the study's
inputs and the period units of every N-th period from the I-th) as ``part.pickle``, what it
is as ``part.json``, and an output manifest pinning both and every input the shard read, so
``auditor verify PART`` re-checks it like an audit (the command line writes the part's
directory, and verifies it before it reads one back, with the outputs' own machinery). This
module makes a part's two files and reads them back: only with an unpickler that makes
nothing but the model's own types (never a function, never another module's class): a part
is data, not code.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import orjson

from auditor import __version__
from auditor.errors import InputError
from auditor.model import CollectedParts, PeriodUnit

PART = "part.pickle"
META = "part.json"
PART_SCHEMA = "auditor/shard-part/v1"
_MODEL_MODULES = frozenset({"auditor.model.core", "auditor.model.evidence",
                            "auditor.model.study", "auditor.model.results"})
_OTHER_TYPES = frozenset({("pathlib", "PosixPath"), ("pathlib", "PurePosixPath")})


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
        "collection": collection,
    }


def part_files(parts: CollectedParts, collection: dict[str, Any]) -> dict[str, bytes]:
    """A part's files by name (:data:`PART`, :data:`META`): what the command line writes."""
    return {PART: pickle.dumps(parts, protocol=5),
            META: orjson.dumps(part_meta(parts, collection), option=orjson.OPT_INDENT_2)
            + b"\n"}


def read_part(path: object, files: dict[str, bytes]) -> tuple[dict[str, Any], CollectedParts]:
    """A part's ``part.json`` and its collected study from its files (``files``: by name,
    read after its manifest verified); one line naming ``path`` (:class:`InputError`)
    otherwise."""
    try:
        meta = orjson.loads(files[META])
        data = files[PART]
    except (KeyError, orjson.JSONDecodeError) as error:
        raise InputError(f"merge: {path}: not a shard part ({error})") from None
    if not isinstance(meta, dict) or meta.get("schema") != PART_SCHEMA:
        raise InputError(f"merge: {path}: not a shard part (no {META} of {PART_SCHEMA})")
    shard = meta.get("shard")
    if not (isinstance(shard, list) and len(shard) == 2
            and all(type(n) is int for n in shard) and 1 <= shard[0] <= shard[1]) \
            or type(meta.get("periods_total")) is not int:
        raise InputError(f"merge: {path}: {META} has no shard I/N and period count")
    if meta.get("auditor_version") != __version__:
        raise InputError(f"merge: {path}: written by auditor {meta.get('auditor_version')}, "
                         f"this is {__version__}; audit the shard again")
    try:
        parts = _ModelUnpickler(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, TypeError, ValueError) as error:
        raise InputError(f"merge: {path}: {PART} cannot be read ({error})") from None
    if not isinstance(parts, CollectedParts) or not all(
            isinstance(unit, PeriodUnit) and type(unit.index) is int for unit in parts.units):
        raise InputError(f"merge: {path}: {PART} holds no collected study")
    return meta, parts


class _ModelUnpickler(pickle.Unpickler):
    """Makes only the model's dataclasses and enums (and paths): nothing else can run."""

    def find_class(self, module: str, name: str) -> Any:
        if module in _MODEL_MODULES or (module, name) in _OTHER_TYPES:
            found = super().find_class(module, name)
            if isinstance(found, type) and (found.__module__ == module
                                            or (module, name) in _OTHER_TYPES):
                return found
        raise pickle.UnpicklingError(f"refused to make {module}.{name}")
