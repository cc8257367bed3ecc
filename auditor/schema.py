"""JSON Schemas (draft 2020-12) of every file kind, and findings from validating against them.

The schemas ship in the package (``auditor/schemas/*.json``) and are loaded
with :mod:`importlib.resources`, so they work from a wheel or a zip. Each is
compiled once (cached). Validation yields one ``AUD002 schema-violation``
finding per problem, cited by the JSON pointer of the offending value (for a
missing field, the pointer the field would have) or, for a JSONL record, by
its line number.

One deliberate departure from plain draft 2020-12: ``"integer"`` means a JSON
number written without a fraction or exponent (a Python ``int``), not any
integral number, so ``1.0`` is not a valid pid. Draft 2020-12 already
excludes booleans. This keeps the schemas and the collectors' cheap
``type(value) is int`` checks in exact agreement.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterator, Mapping
from importlib import resources
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

import orjson

from auditor import rules
from auditor._text import clip
from auditor.model import INT64_MAX, INT64_MIN, Citation, Finding
from auditor.model.kinds import KINDS as EVIDENCE_KINDS

if TYPE_CHECKING:  # jsonschema (80 ms to import) only checks what the fast path cannot pass
    from jsonschema.exceptions import ValidationError
    from jsonschema.protocols import Validator

KINDS: tuple[str, ...] = (
    "period",
    "trial",
    "allocator-record",
    "device",
    "process",
    "idle-check",
    "protocol",
    "summary",
    "output-manifest",
)
"""Every schema kind; ``<kind>.schema.json`` in ``auditor/schemas``."""

ALLOCATOR_FORMS: tuple[str, ...] = ("phase", "sample", "terminal", "params")
"""The forms of an allocator record (``$defs`` of ``allocator-record``; ``terminal``: v1.2)."""

_FILENAME_KINDS: tuple[tuple[re.Pattern[str], str, str | None], ...] = (
    (re.compile(r"period-[0-9]+\.json"), "period", None),
    *((kind.loose_compiled, kind.schema,
       kind.directory if kind.loose.startswith("[^/]*") else None)
      for kind in EVIDENCE_KINDS.values() if kind.schema),
    (re.compile(r"protocol\.json"), "protocol", None),
    (re.compile(r"summary\.json"), "summary", None),
    (re.compile(r"output_manifest\.json"), "output-manifest", None),
)
"""A file's schema from its name: the study's own files', and each evidence kind's; a kind
whose names have no prefix of their own (process records, idle checks: any ``*.json``) only
in its folder (``processes/``, ``idle/``)."""


def _is_strict_integer(_checker: object, instance: object) -> bool:
    return isinstance(instance, int) and not isinstance(instance, bool)


@functools.cache
def _strict_validator_class() -> Any:
    """Draft 2020-12 where only a Python ``int`` (never ``bool``) is an integer."""
    from jsonschema import Draft202012Validator, validators

    return validators.extend(
        Draft202012Validator,
        type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_strict_integer),
    )


def kind_for_filename(name: str) -> str | None:
    """The schema kind of a file, from its name (a bare name or any path), or None."""
    path = PurePosixPath(name.replace("\\", "/"))
    for pattern, kind, folder in _FILENAME_KINDS:
        if pattern.fullmatch(path.name) and (folder is None or path.parent.name == folder):
            return kind
    return None


KIND_ALIASES = {
    **{kind.name.replace("_", "-"): kind.schema for kind in EVIDENCE_KINDS.values()
       if kind.schema is not None and kind.name.replace("_", "-") != kind.schema},
    "period-record": "period", "trial-record": "trial",
}
"""The period record's evidence kinds (and other names a user may reach for) by schema."""


def canonical_kind(kind: str) -> str:
    """``kind`` with ``_`` read as ``-`` (``output_manifest`` -> ``output-manifest``), and
    a period record's evidence kind read as its schema's (``device_evidence`` ->
    ``device``, ``allocator_trace`` -> ``allocator-record``)."""
    kind = kind.replace("_", "-")
    return KIND_ALIASES.get(kind, kind)


def load_schema(kind: str) -> Mapping[str, Any]:
    """The schema document of ``kind`` (parsed once; ``_`` and ``-`` are alike in kinds)."""
    return _load_schema(canonical_kind(kind))


@functools.cache
def _load_schema(kind: str) -> Mapping[str, Any]:
    if kind not in KINDS:
        raise ValueError(f"unknown schema kind {kind!r}; expected one of {', '.join(KINDS)}")
    text = resources.files("auditor").joinpath("schemas", f"{kind}.schema.json").read_text("utf-8")
    schema: dict[str, Any] = json.loads(text)
    _bound_integers(schema)
    return schema


INT64 = (INT64_MIN, INT64_MAX)
"""The range of every integer field (a signed 64-bit integer: what the tables hold)."""


def _bound_integers(node: object) -> None:
    """Give every integer-typed subschema of ``node`` the 64-bit range where it sets no
    tighter bound: a value past it is a finding naming its pointer, never a crash where
    the tables are written (contract: every integer field is 64-bit)."""
    if isinstance(node, dict):
        types = node.get("type")
        if types == "integer" or (isinstance(types, list) and "integer" in types):
            node.setdefault("minimum", INT64[0])
            node.setdefault("maximum", INT64[1])
        for value in node.values():
            _bound_integers(value)
    elif isinstance(node, list):
        for value in node:
            _bound_integers(value)


def validator(kind: str) -> Validator:
    """The compiled (cached) validator of ``kind``."""
    return _validator(canonical_kind(kind))


@functools.cache
def _validator(kind: str) -> Validator:
    schema = load_schema(kind)
    strict = _strict_validator_class()
    strict.check_schema(schema)
    validator_: Validator = strict(schema)
    return validator_


@functools.cache
def allocator_form_validator(form: str) -> Validator:
    """A validator for one form (``phase`` or ``sample``) of an allocator record.

    Validating against the ``oneOf`` of both forms only says "not valid under
    any of the given schemas"; against the form the record claims (it has
    ``phase`` or not) each problem gets its own pointer and message.
    """
    if form not in ALLOCATOR_FORMS:
        raise ValueError(f"unknown allocator record form {form!r}")
    schema = dict(load_schema("allocator-record"))
    del schema["oneOf"]
    schema["$ref"] = f"#/$defs/{form}"
    validator_: Validator = _strict_validator_class()(schema)
    return validator_


def pointer_of(parts: Iterator[object] | tuple[object, ...] | list[object]) -> str:
    """RFC 6901 JSON pointer of a path of keys and indexes (``""`` for the root)."""
    return "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in parts)


def json_text(value: object, limit: int = 80) -> str:
    """``value`` as (clipped) JSON text, for messages."""
    try:
        text = orjson.dumps(value).decode("utf-8")
    except (TypeError, orjson.JSONEncodeError):
        try:
            text = repr(value)
        except RecursionError:  # (orjson parses 1,024 levels; repr recurses past Python's limit)
            text = "nested too deep to show"
    return clip(text, limit)


def json_type(value: object) -> str:
    """The JSON type name of a parsed value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def problems(validator_: Validator, doc: object) -> list[tuple[str, str]]:
    """Every problem of ``doc`` as (JSON pointer, message), sorted by pointer, deduplicated."""
    found: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    try:
        for error in validator_.iter_errors(doc):
            for item in _explain(error):
                if item not in seen:
                    seen.add(item)
                    found.append(item)
    except RecursionError:  # (jsonschema reprs a wrong value in its message: one nested
        # deeper than Python's recursion limit, which orjson parses, cannot be; a problem)
        found.append(("", "a value nested too deep to check against the schema (arrays "
                          "or objects nested past Python's recursion limit)"))
    found.sort(key=lambda item: item[0])
    return found


def _explain(error: ValidationError) -> list[tuple[str, str]]:
    pointer = pointer_of(tuple(error.absolute_path))
    instance = error.instance
    if error.validator == "required" and isinstance(instance, dict):
        names = error.validator_value if isinstance(error.validator_value, list) else []
        return [
            (f"{pointer}{pointer_of((name,))}", "required field missing")
            for name in names
            if name not in instance
        ]
    if error.validator == "type":
        wanted = error.validator_value
        wanted_text = " or ".join(wanted) if isinstance(wanted, list) else str(wanted)
        found = json_type(instance)
        if instance is not None:
            found = f"{found} {json_text(instance)}"
        message = f"expected {wanted_text}, found {found}"
        return [(pointer, message)]
    if error.validator == "const":
        return [(pointer, f"expected {json_text(error.validator_value)}, found "
                          f"{json_text(instance)}")]
    if error.validator == "not" and error.validator_value == {"required": ["phase"]}:
        return [(pointer, "a memory sample must not have 'phase'")]
    return [(pointer, clip(error.message, 200))]


@functools.cache
def _fast_validator(kind: str) -> Callable[[object], object] | None:
    """A compiled (fastjsonschema) yes/no validator of ``kind``, about 20x faster than
    jsonschema; None when fastjsonschema is missing or cannot compile the schema."""
    try:
        import fastjsonschema
    except ImportError:  # pragma: no cover - a declared dependency
        return None
    schema = dict(load_schema(kind))
    # fastjsonschema knows draft-07; these schemas use nothing of 2020-12 it lacks
    schema["$schema"] = "http://json-schema.org/draft-07/schema#"
    try:
        compiled: Callable[[object], object] = fastjsonschema.compile(schema)
    except Exception:  # noqa: BLE001 - any compile problem means: use jsonschema only
        return None
    return compiled


def _has_float(value: object) -> bool:
    """True when a float appears anywhere in ``value`` (fastjsonschema, like the JSON Schema
    spec, takes 1.0 as an integer; the auditor does not, so such documents take the slow
    path)."""
    kind = type(value)
    if kind is float:
        return True
    if kind is dict:
        items = value.values()  # type: ignore[attr-defined]
    elif kind is list:
        items = value
    else:
        return False
    for item in items:
        item_kind = type(item)
        if item_kind is float or ((item_kind is dict or item_kind is list) and _has_float(item)):
            return True
    return False


def is_valid_fast(kind: str, doc: object) -> bool:
    """True when ``doc`` certainly satisfies ``kind``'s schema (checked the fast way)."""
    fast = _fast_validator(canonical_kind(kind))
    try:
        if fast is None or _has_float(doc):
            return False
    except RecursionError:  # (orjson parses 1,024 levels, past Python's recursion limit: a
        return False  # hostile document takes the slow path, which says so)
    import fastjsonschema

    try:
        fast(doc)
    except fastjsonschema.JsonSchemaException:
        return False
    return True


def validate_document(kind: str, doc: object, path: str) -> list[Finding]:
    """``AUD002`` findings for every way ``doc`` (a parsed JSON document) breaks its schema.

    Each finding cites ``path`` with the JSON pointer of the problem; its
    ``where`` is ``#<pointer>``. Valid documents (the common case) are confirmed
    by a compiled validator; only invalid ones pay for jsonschema's full explanation.
    """
    if canonical_kind(kind) != "allocator-record" and is_valid_fast(kind, doc):
        return []
    findings = []
    for pointer, message in problems(_checker_for(kind, doc), doc):
        findings.append(
            rules.finding(
                "AUD002",
                path,
                [Citation(path, pointer=pointer, quote=_quote_at(doc, pointer))],
                where=f"#{pointer}",
                error=message,
            )
        )
    return findings


def _checker_for(kind: str, doc: object) -> Validator:
    """The validator for ``doc``: for ``allocator-record``, the form the record claims
    (terminal when its ``kind`` says so, phase when it has ``phase``, else sample), for
    precise messages."""
    if canonical_kind(kind) == "allocator-record":
        claimed = doc.get("kind") if isinstance(doc, dict) else None
        form = claimed if claimed in ("terminal", "params") \
            else "phase" if isinstance(doc, dict) and "phase" in doc else "sample"
        return allocator_form_validator(form)
    return validator(kind)


def validate_record(kind: str, record: object, path: str, line: int) -> list[Finding]:
    """``AUD002`` findings for one JSONL record at ``line``; ``where`` is ``:<line>``."""
    findings = []
    for pointer, message in problems(_checker_for(kind, record), record):
        findings.append(
            rules.finding(
                "AUD002",
                path,
                [Citation(path, line=line, pointer=pointer, quote=_quote_at(record, pointer))],
                where=f":{line}",
                error=f"{pointer or '/'}: {message}",
            )
        )
    return findings


def _quote_at(doc: object, pointer: str) -> str:
    """The value at ``pointer`` as short JSON text (``""`` when absent)."""
    node = doc
    if pointer:
        for raw in pointer[1:].split("/"):
            part = raw.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return ""
    return json_text(node)
