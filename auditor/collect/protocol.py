"""Read ``protocol.json`` (the frozen rules) into a :class:`Protocol`, or give the defaults.

Every key is optional and a missing key takes the built-in default of
:class:`auditor.model.Protocol`. A key whose value breaks the schema (anywhere
inside it) also takes its default, as a whole: a half-read rule list could
change what counts as success. Each schema problem is an ``AUD002``; one
``AUD014`` names the keys that fell back. A protocol that cannot be read at all
gives the defaults, the cause's finding and an ``AUD014``.

``terminal_event.pattern`` must compile as a Python regular expression with a
named group ``step``; otherwise it is dropped (``AUD014``) and the built-in
terminal-event matcher applies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, BinaryIO

from auditor import rules
from auditor._io import HashingReader
from auditor._text import clip
from auditor.collect.jsondoc import as_list, as_obj, finish, load_json
from auditor.collect.terminal import SpecError, from_document
from auditor.model import (
    DEFAULT_PROTOCOL,
    Citation,
    Configuration,
    EligibleFailure,
    Finding,
    Protocol,
)
from auditor.model.presets import TerminalSpec
from auditor.schema import validate_document

PROTOCOL_LIMIT = 1 << 20
"""Largest protocol file parsed (bytes)."""

def default_protocol() -> Protocol:
    """The built-in rules (no protocol file)."""
    return DEFAULT_PROTOCOL


def read_protocol(stream: BinaryIO | HashingReader, path: str) -> Protocol:
    """Read ``protocol.json`` from ``stream``; ``path`` is how it is cited."""
    doc, findings = load_json(stream, path, PROTOCOL_LIMIT, kind="protocol")
    digest = finish(stream)
    if doc is None:
        cause = rules.describe(findings[0]) if findings else "unreadable"
        findings.append(
            rules.finding(
                "AUD014", path, [Citation(path)], error=f"{cause}; built-in defaults apply"
            )
        )
        return replace(DEFAULT_PROTOCOL, path=path, digest=digest, findings=tuple(findings))

    schema_findings = validate_document("protocol", doc, path)
    findings.extend(schema_findings)
    broken = [cite.pointer or "" for item in schema_findings for cite in item.citations]

    def usable(pointer: str) -> bool:
        """Present in the document, and no problem at, above or below ``pointer``."""
        if not _present(doc, pointer):
            return False
        return not any(
            bad == pointer or bad.startswith(pointer + "/") or pointer.startswith(bad + "/")
            for bad in broken
        )

    fallbacks = sorted(
        {bad.split("/")[1] for bad in broken if bad.count("/") >= 1 and bad != "/schema"}
    )
    if fallbacks:
        findings.append(
            rules.finding(
                "AUD014",
                path,
                [Citation(path, pointer=f"/{fallbacks[0]}")],
                error=f"invalid {', '.join(fallbacks)}: built-in defaults apply there",
            )
        )

    values: dict[str, Any] = {}
    if usable("/name"):
        values["name"] = doc["name"]
    if usable("/terminal_event/steps_from"):
        values["steps_from"] = doc["terminal_event"]["steps_from"]
    if usable("/terminal_event/pattern"):
        pattern, problem = _terminal_pattern(doc["terminal_event"]["pattern"])
        if problem:
            findings.append(
                rules.finding(
                    "AUD014",
                    path,
                    [Citation(path, pointer="/terminal_event/pattern", quote=clip(pattern, 80))],
                    error=f"terminal_event.pattern {problem}; the built-in matcher applies",
                )
            )
        else:
            values["terminal_pattern"] = pattern
    terminal = _terminal_spec(doc, usable, values.get("terminal_pattern"), path, findings)
    if terminal is not None:
        values["terminal"] = terminal
    if usable("/terminal_event/sources"):
        values["terminal_sources"] = tuple(dict.fromkeys(doc["terminal_event"]["sources"]))
    if usable("/completion_phases"):
        phases = doc["completion_phases"]
        if isinstance(phases, dict):  # (contract v1.2: phases by role)
            values["completion_phases_by_role"] = tuple(
                (role, tuple(names)) for role, names in sorted(phases.items()))
        else:
            values["completion_phases"] = tuple(phases)
    if usable("/eligible_failures"):
        values["eligible_failures"] = tuple(
            EligibleFailure(item["phase"], tuple(item["error_types"]))
            for item in as_list(doc["eligible_failures"])
        )
    if usable("/coordinated_shutdown_flag"):
        values["coordinated_shutdown_flag"] = doc["coordinated_shutdown_flag"]
    if usable("/configurations"):
        values["configurations"] = tuple(
            Configuration(item["workload"], item["gpus"], tuple(item["seeds"]))
            for item in as_list(doc["configurations"])
        )
    if usable("/scheduler"):
        values["scheduler"] = doc["scheduler"]
    if usable("/idle_check"):
        values["idle_check"] = doc["idle_check"]
    if usable("/anchors"):
        values["anchors"] = tuple(
            (name, value.lower()) for name, value in as_obj(doc["anchors"]).items()
        )
    return Protocol(path=path, digest=digest, findings=tuple(findings), **values)


_SPEC_KEYS = ("preset", "patterns", "offset", "veto", "marker", "json")


def _terminal_spec(doc: dict[str, Any], usable: Callable[[str], bool], pattern: str | None,
                   path: str, findings: list[Finding]) -> TerminalSpec | None:
    """The matcher ``terminal_event`` gives (contract v1.2): None when it gives none of its
    v1.2 keys (then its ``pattern``, if any, is the v1 matcher), or one that cannot work
    (an ``AUD014``: the built-in matcher applies)."""
    given = {key: doc["terminal_event"][key] for key in _SPEC_KEYS
             if usable(f"/terminal_event/{key}")}
    if not given:
        return None
    if pattern:
        given["pattern"] = pattern
    try:
        return from_document(given)
    except SpecError as error:
        findings.append(rules.finding(
            "AUD014", path, [Citation(path, pointer="/terminal_event")],
            error=f"{error}; the built-in matcher applies"))
        return None


def _present(doc: dict[str, Any], pointer: str) -> bool:
    node: object = doc
    for part in pointer[1:].split("/"):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _terminal_pattern(pattern: str) -> tuple[str, str]:
    """(pattern, problem): problem is ``""`` when it compiles with a named group ``step``
    (compiled as the training-log reader compiles it: by ``regex``, Python's syntax)."""
    import regex

    try:
        compiled = regex.compile(pattern)
    except (regex.error, RecursionError, OverflowError, ValueError, TypeError) as error:
        return pattern, f"does not compile: {error}"
    if "step" not in compiled.groupindex:
        return pattern, "has no named group 'step'"
    return pattern, ""
