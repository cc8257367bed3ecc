"""The allocator record's shape, declared once: read from the shipped JSON Schema.

``auditor/schemas/allocator-record.schema.json`` (also what ``auditor validate`` checks)
is the one declaration of an allocator trace record. Everything the trace reader checks
by hand is derived from it here, at import: the fields of a phase record and of a memory
sample with their types and minimums (:func:`phase_ok`, :func:`sample_ok`, one table
lookup per field: they run on phase records and on odd lines only), and the written
forms of a memory sample (:data:`SAMPLE_FORMS`, :data:`SAMPLE_FIELDS`), which the fast
path recognises with its digits taken out. The hand checks are stricter than the schema
in one way, on purpose: an integer is a JSON integer (``1.0`` is refused), as orjson
reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple, cast

from auditor.collect.jsondoc import has_duplicate_keys
from auditor.model import INT64_MAX, INT64_MIN
from auditor.schema import load_schema


class FieldCheck(NamedTuple):
    """One field of a record form, as its schema declares it."""

    key: str
    kind: type
    """``int`` or ``str``."""
    minimum: int | None
    nullable: bool
    required: bool


def _checks(schema: Mapping[str, Any], form: str) -> tuple[FieldCheck, ...]:
    """The field checks of the schema's ``form`` (``phase`` or ``sample``)."""
    definitions = schema["$defs"]
    declared = definitions[form]
    required = declared["required"]
    checks = []
    for key, spec in declared["properties"].items():
        if "$ref" in spec:
            spec = definitions[spec["$ref"].rsplit("/", 1)[1]]
        types = spec["type"] if isinstance(spec["type"], list) else [spec["type"]]
        kinds = [kind for kind in types if kind != "null"]
        if len(kinds) != 1 or kinds[0] not in ("integer", "string"):
            raise ValueError(f"allocator-record {form}.{key}: unsupported type {types}")
        checks.append(FieldCheck(key, int if kinds[0] == "integer" else str,
                                 spec.get("minimum"), "null" in types, key in required))
    return tuple(checks)


_SCHEMA = load_schema("allocator-record")
PHASE_CHECKS = _checks(_SCHEMA, "phase")
"""The fields of a phase record (one that has ``phase``)."""
SAMPLE_CHECKS = _checks(_SCHEMA, "sample")
"""The fields of a memory sample (no ``phase``)."""

SAMPLE_FIELDS: tuple[str, ...] = tuple(_SCHEMA["$defs"]["sample"]["required"])
"""A memory sample's keys in the contract's order (the order its writers use)."""

SAMPLE_FORMS: tuple[bytes, ...] = tuple(
    ("{" + separator.join(f'"{key}":{space}' for key in SAMPLE_FIELDS) + closing).encode()
    + b"\n"
    for separator, space, closing in ((",", "", "}"), (", ", " ", "}"))
)
"""The written forms of a memory sample with its digits taken out: compact (orjson's)
and ``json.dumps``'s default (``{"pid": , "seq": , ... }``), keys in :data:`SAMPLE_FIELDS`
order."""


class _Form(NamedTuple):
    """A form's field checks grouped by what each needs (a phase record is checked in
    1.0 us so, 1.5 us field by field with every check's every flag)."""

    bounded: tuple[tuple[str, int], ...]
    """The required, never null integers with a minimum: ``(key, minimum)``."""
    typed: tuple[tuple[str, type], ...]
    """The other required, never null fields: ``(key, type)``."""
    rest: tuple[FieldCheck, ...]
    """The optional or nullable fields."""


def _form(checks: tuple[FieldCheck, ...]) -> _Form:
    strict = [check for check in checks if check.required and not check.nullable]
    return _Form(
        tuple((check.key, cast(int, check.minimum)) for check in strict
              if check.kind is int and check.minimum is not None),
        tuple((check.key, check.kind) for check in strict
              if check.kind is not int or check.minimum is None),
        tuple(check for check in checks if check not in strict))


_PHASE_FORM = _form(PHASE_CHECKS)
_SAMPLE_FORM = _form(SAMPLE_CHECKS)


def _fits(form: _Form, record: dict[str, Any]) -> bool:
    get = record.get
    for key, least in form.bounded:
        value = get(key)
        if type(value) is not int or value < least or value > INT64_MAX:
            return False
    for key, kind in form.typed:
        value = get(key)
        if type(value) is not kind:
            return False
        if kind is int and not INT64_MIN <= cast(int, value) <= INT64_MAX:
            return False
    for key, kind, minimum, nullable, required in form.rest:
        value = get(key)
        if value is None and ((nullable and key in record) or (not required
                                                               and key not in record)):
            continue  # (null where the schema allows it; a required key is never absent)
        if type(value) is not kind:
            return False
        if kind is int and (cast(int, value) > INT64_MAX
                            or cast(int, value) < (INT64_MIN if minimum is None
                                                   else minimum)):
            return False
    return True


def phase_ok(record: dict[str, Any]) -> bool:
    """True when a phase record matches the ``phase`` form of the schema."""
    return _fits(_PHASE_FORM, record)


def sample_ok(record: dict[str, Any]) -> bool:
    """True when a record without ``phase`` matches the ``sample`` form of the schema."""
    return _fits(_SAMPLE_FORM, record)


def count(value: object) -> int | None:
    """A non-negative integer a signed 64-bit integer holds, else None."""
    return value if type(value) is int and 0 <= value < (1 << 63) else None


def repeats_a_key(raw: bytes, record: dict[str, Any]) -> bool:
    """Whether the line ``raw`` (parsed into ``record``) spells a key twice. Outside its
    strings JSON holds one colon per key, so a line with as many colons as the record
    has keys repeats none (nor holds a nested object, or a colon in a string): only the
    other lines need the full check, which writes the record back."""
    return raw.count(b":") != len(record) and has_duplicate_keys(raw, record)
