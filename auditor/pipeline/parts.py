"""Shard parts: what ``auditor audit ROOT --shard I/N --out PART`` writes, and what
``auditor merge`` reads back.

A part holds one shard's collected study (:class:`~auditor.model.CollectedParts`: the study's
inputs and the period units of every N-th period from the I-th) as ``part.pickle``, what it
is as ``part.json``, and an output manifest pinning both and every input the shard read, so
``auditor verify PART`` re-checks it like an audit. A part is read back only after its
manifest verified, and only with an unpickler that makes nothing but the model's own types
(never a function, never another module's class): a part is data, not code.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import orjson

from auditor import __version__
from auditor.errors import InputError
from auditor.model import Collected, CollectedParts, PeriodUnit
from auditor.report.output import StagedOutput, verify_outputs

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


def write_part(parts: CollectedParts, collected: Collected, out: Path,
               collection: dict[str, Any], force: bool = False) -> None:
    """Write shard ``parts`` to ``out`` atomically, as an audit writes its outputs
    (``collected``: the parts assembled, whose inputs the manifest pins)."""
    with StagedOutput(out, parts.root, force) as staged:
        staged.put(PART, pickle.dumps(parts, protocol=5))
        staged.put(META, orjson.dumps(part_meta(parts, collection),
                                      option=orjson.OPT_INDENT_2) + b"\n")
        staged.seal(collected)


def read_part(path: Path, inputs: bool = True) -> tuple[dict[str, Any], CollectedParts]:
    """A part's ``part.json`` and its collected study, after its manifest verified (every
    output and, unless not ``inputs``, every input it pins unchanged); one line
    (:class:`InputError`) otherwise."""
    differences, _ = verify_outputs(path, inputs=inputs)
    if differences:
        first = differences[0]
        raise InputError(f"merge: {path}: {len(differences)} difference(s) against its output "
                         f"manifest (first: {first.what} {first.group}/{first.path}); a part "
                         "must verify before it is merged")
    try:
        meta = orjson.loads((path / META).read_bytes())
        data = (path / PART).read_bytes()
    except (OSError, orjson.JSONDecodeError) as error:
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
