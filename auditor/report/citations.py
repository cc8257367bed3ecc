"""Citations in the report: a diagnosis group's evidence stated once, as its pattern, and
every period's own citations in ``evidence.md``.

The periods of a group (one diagnosis) cite the same files at the same lines and
pointers, differing only in the names a period gives them: its attempt directory, its
job id, its workers' pids. :func:`group_pattern` writes each citation with those names as
placeholders (``trial-<job>.json#/invocation/exit_code``), takes the citations most of the
group share as the pattern, and returns the periods whose citations differ from it (the
exceptions, which the report lists). :func:`render_evidence` writes every period's
citations in full, with those of the findings that decided it (:func:`decisive_citations`).
Reporters see only the :class:`~auditor.model.AuditResult`.
"""

from __future__ import annotations

import functools
import os
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from auditor._text import clip
from auditor.model import AuditResult, Citation, Verdict
from auditor.model.kinds import KINDS
from auditor.report.groups import counted_view
from auditor.report.mdformat import code_span
from auditor.store import Kept, Mapped

QUOTED_PER_FILE = 3
"""Locations of one file shown with their quotes (the rest are named without)."""
SHOWN_QUOTE = 40
"""Characters of a quote a group's pattern shows (``evidence.md`` shows each whole): a
longer quote is left to it."""


@dataclass(frozen=True)
class Names:
    """What a period calls the files it cites: the placeholders' values."""

    attempt_dir: str
    job: str
    pids: tuple[int, ...]
    record: str
    ranks: int
    hosts: tuple[str, ...] = ()
    """The workers' hosts, longest first (contract v1.2 names files by host and pid)."""

    @functools.cached_property
    def host_set(self) -> frozenset[str]:
        """:attr:`hosts`, each looked up at once."""
        return frozenset(self.hosts)

    @functools.cached_property
    def placeholders(self) -> dict[str, str]:
        """The numbers in a path that are this period's names, by their placeholder."""
        placeholders = {str(pid): "<pid>" for pid in self.pids}
        if self.job:
            placeholders[self.job] = "<job>"
        return placeholders


def names_of(result: AuditResult, verdict: Verdict) -> Names:
    """The names of ``verdict``'s period: its counted attempt (else its last)."""
    view, counted = counted_view(result, verdict.subject)
    return Names(
        attempt_dir=view.attempt_dir,
        job=(counted.job_id if counted is not None else None) or "",
        pids=view.pids,
        record=view.record,
        ranks=view.ranks,
        hosts=view.hosts,
    )


def _abstract(path: str, names: Names) -> str:
    """``path`` with the period's own names as placeholders."""
    if path == names.record:
        return "BASE/pairs/PAIR/period-<period>.json"
    if names.attempt_dir and path.startswith(names.attempt_dir.rstrip("/") + "/"):
        path = path[len(names.attempt_dir.rstrip("/")) + 1:]
    elif not path.startswith("/"):  # (an input given outside the root keeps its path)
        path = "BASE/" + path
    if names.hosts:  # (a node's files are every node's: one pattern)
        path = _host_named(path, names.host_set)
    placeholders = names.placeholders
    parts = _NUMBER.split(path)  # (text, number, text, ...: each whole number alone)
    parts[1::2] = [placeholders.get(n, n) for n in parts[1::2]]
    return "".join(parts)


def _host_named(path: str, hosts: frozenset[str]) -> str:
    """``path`` with ``<host>`` for the host its name gives, where it names a file of a kind
    the contract names by host (:data:`_BY_HOST`) and that host is a worker's: only that part
    of the name (a host called ``worker`` or ``policy`` is not the ``worker-`` of a device
    file's name, nor the folder ``worker-logs``, nor a role)."""
    cut = path.rfind("/")
    folder = path[path.rfind("/", 0, max(cut, 0)) + 1:cut] if cut > 0 else ""
    name = path[cut + 1:]
    for form in _BY_HOST.get(folder, ()):
        match = form.fullmatch(name)
        if match is not None and match.group("host") in hosts:
            start, end = match.span("host")
            return f"{path[:cut + 1]}{name[:start]}<host>{name[end:]}"
    return path


def _by_host() -> dict[str, tuple[re.Pattern[str], ...]]:
    """:data:`_BY_HOST`, from the kinds' declared names (one place says how files are named)."""
    forms: dict[str, tuple[re.Pattern[str], ...]] = {}
    for kind in KINDS.values():
        for form in kind.names:
            if "host" in form.compiled.groupindex:
                forms[kind.directory] = (*forms.get(kind.directory, ()), form.compiled)
    return forms


_BY_HOST = _by_host()
"""Per folder of a kind whose names hold a host (contract v1.2), those name forms, in the
kind's order (the first whose host is a worker's is the name's)."""

_NUMBER = re.compile(r"(\d+)")
"""A whole number in a path: the job id or a pid it names becomes a placeholder."""


def _where(cite: Citation) -> str:
    return f":{cite.line}" if cite.line is not None else f"#{cite.pointer}" if cite.pointer \
        else ""


@dataclass
class _Member:
    """One period's citations, abstracted: file pattern -> each file's locations."""

    files: dict[str, dict[str, tuple[str, ...]]]
    """Abstract path -> concrete path -> its locations, in order."""
    quotes: dict[tuple[str, str], list[str]]
    """(concrete path, location) -> the quotes cited there."""
    ranks: int

    def signature(self, general: set[str]) -> tuple[object, ...]:
        return tuple(sorted(
            (path, tuple(sorted(("*",) * len(w) if path in general else w
                                for w in files.values())))
            for path, files in self.files.items()))


def _member(result: AuditResult, verdict: Verdict,
            skip: Callable[[Citation], bool] | None = None) -> _Member:
    names = names_of(result, verdict)
    files: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    quotes: dict[tuple[str, str], list[str]] = defaultdict(list)
    for cite in verdict.citations:
        if skip is not None and skip(cite):
            continue
        shown = _abstract(cite.path, names)
        where = _where(cite)
        if where not in files[shown][cite.path]:
            files[shown][cite.path].append(where)
        quotes[(cite.path, where)].append(cite.quote)
    return _Member({p: {c: tuple(w) for c, w in f.items()} for p, f in files.items()},
                   dict(quotes), names.ranks)


@dataclass(frozen=True)
class Pattern:
    """A group's shared citations (rendered) and the periods that differ from them."""

    text: str
    exceptions: Sequence[Verdict]
    """In the group's order (each made again as it is read)."""


def group_pattern(result: AuditResult, members: Sequence[Verdict],
                  skip: Callable[[Citation], bool] | None = None) -> Pattern:
    """The citations most of ``members`` share (but those ``skip`` leaves out: what the
    report says elsewhere), as one line of placeholders, and the members whose citations
    differ.

    Read in three passes over the members, each with its citations abstracted once, in
    the first, and kept by the store (on disk when they are many: a large group's members
    held at once so were hundreds of MB; made again in each pass, they took two thirds of
    the pattern's time): which abstract paths are cited at a row of each period's own, the
    members' most common signature, then what those that have it share."""
    lines = _LineTally()
    made: Kept[_Member] = Kept()
    for verdict in members:
        member = _member(result, verdict, skip)
        lines.add(member)
        made.append(member)
    general = lines.varying()
    signatures: Counter[tuple[object, ...]] = Counter(
        member.signature(general) for member in made)
    common, _ = signatures.most_common(1)[0]
    del signatures
    first: _Member | None = None
    quotes: dict[tuple[str, tuple[str, ...], str], _QuoteTally] = {}
    exceptions: list[int] = []
    for place, member in enumerate(made.drain()):
        if member.signature(general) != common:
            exceptions.append(place)
            continue
        if first is None:
            first = member
            for path, files in first.files.items():
                if path not in general:
                    for wheres in files.values():
                        for where in wheres:
                            quotes.setdefault((path, wheres, where), _QuoteTally())
        for (path, wheres, where), tally in quotes.items():
            for concrete, cited_at in member.files.get(path, {}).items():
                if cited_at == wheres:
                    for quote in member.quotes.get((concrete, where), []):
                        tally.add(quote)
    assert first is not None
    parts = []
    for path, files in first.files.items():
        if path in general:
            wheres = next(iter(files.values()))
            located = ":<row>" if wheres and wheres[0].startswith(":") else ""
            parts.append(code_span(path + located) + " (the period's own row)")
            continue
        variants = Counter(files.values())  # (each file's locations: alike, or not)
        for wheres, count in variants.items():
            text = _locations(path, [(w, quotes[(path, wheres, w)].shown()) for w in wheres])
            if len(variants) > 1:
                text += f" for {count} {'file' if count == 1 else 'files'}"
            elif count > 1:
                text += " for every rank" if count == first.ranks else \
                    f" for each of {count} files"
            parts.append(text)
    return Pattern("; ".join(parts) or "no citation",
                   Mapped(exceptions, members.__getitem__))


class _LineTally:
    """Of each abstract path the members cite: how many cite it, whether every one cites
    it at one line of its own file, and how often each such line recurs (what
    :meth:`varying` needs of them, gathered a member at a time)."""

    def __init__(self) -> None:
        self.cited: Counter[str] = Counter()
        self.lines: dict[str, Counter[tuple[tuple[str, ...], ...]] | None] = {}

    def add(self, member: _Member) -> None:
        for path, files in member.files.items():
            self.cited[path] += 1
            located = tuple(sorted(files.values()))
            seen = self.lines.setdefault(path, Counter())
            if seen is None:
                continue
            if not (len(located) == 1 and len(located[0]) == 1
                    and located[0][0][:1] == ":"):
                self.lines[path] = None  # (not at a line of each one's own: never general)
                continue
            seen[located] += 1

    def varying(self) -> set[str]:
        """The abstract paths cited at a line that differs from period to period, most of
        them at their own (a scheduler dump's row of each element): written ``:<row>``."""
        general = set()
        for path, seen in self.lines.items():
            count = self.cited[path]
            if seen is None or count < 2:
                continue
            if seen.most_common(1)[0][1] * 2 < count:
                general.add(path)
        return general


class _QuoteTally:
    """The quotes a pattern's location is cited with, as :meth:`shown` needs them: the
    one every period gives, if they all give one."""

    def __init__(self) -> None:
        self.one: str | None = None
        self.alike = True

    def add(self, quote: str) -> None:
        if not quote or (self.one is not None and quote != self.one):
            self.alike = False
        elif self.one is None:
            self.one = quote

    def shown(self) -> str:
        """The quote shown (quotes that differ from period to period are each period's own,
        in ``evidence.md``)."""
        if self.alike and self.one is not None and len(self.one) <= SHOWN_QUOTE:
            return code_span(self.one, SHOWN_QUOTE + 20)
        return ""


def _locations(shown: str, located: Sequence[tuple[str, str]]) -> str:
    """One file's locations, each with its (rendered) quote: ``a.jsonl:7`` (`q`), ``:8``
    (`q`); locations without a quote are named together."""
    if not located:
        return code_span(shown, 160)
    pieces: list[str] = []
    pending: list[str] = []
    shown_quotes = 0
    for index, (where, quote) in enumerate(located):
        name = shown + where if index == 0 else where
        if quote and shown_quotes < QUOTED_PER_FILE:
            if pending:
                pieces.append(code_span(",".join(pending), 160))
                pending = []
            shown_quotes += 1
            pieces.append(f"{code_span(name, 160)} ({quote})")
        elif pending == [shown]:  # (the whole file, then a place in it: the place says both)
            pending = [shown + where]
        elif pending:
            pending.append(where[1:] if where[:1] == ":" else where)
        else:
            pending.append(name)
    if pending:
        pieces.append(code_span(",".join(pending), 160))
    return ", ".join(pieces)


def cite_group(cites: Sequence[Citation], limit: int = 12,
               decisive: Sequence[Citation] = ()) -> str:
    """One period's citations folded per file, relative to its attempt directory (named
    once): ``dir/``: ``a.jsonl:7`` (`quote`), ``:8``; ``trial.json#/x`` (`quote`).

    ``decisive``: what the verdict's deciding findings cite beyond ``cites``
    (:func:`decisive_citations`), folded in after them; they do not move the folder named
    first (a dump's row is not in the attempt directory), and past ``limit`` files the
    files they name are kept before the others (what decided the period is never the part
    cut)."""
    if not cites and not decisive:
        return "no citation"
    evidence = [c for c in cites if not c.path.startswith("pairs/")]
    folders = [c.path.rsplit("/", 1)[0] for c in evidence if "/" in c.path]
    base = ""
    if len(folders) > 1 and len(folders) == len(evidence):
        common = os.path.commonpath(folders)
        base = common + "/" if common else ""
    by_file: dict[str, list[Citation]] = defaultdict(list)
    for cite in cites:
        by_file[cite.path].append(cite)
    added: dict[str, list[Citation]] = defaultdict(list)
    for cite in decisive:
        by_file.setdefault(cite.path, [])
        added[cite.path].append(cite)
    kept = list(by_file)
    if len(kept) > limit and decisive:
        deciding = {cite.path for cite in decisive}
        first = [path for path in kept if path in deciding][:limit]
        chosen = {*first, *[path for path in kept if path not in deciding][:limit - len(first)]}
        kept = [path for path in kept if path in chosen]  # (in the order cited)
    parts = []
    for path in kept[:limit]:
        shown = path[len(base):] if base and path.startswith(base) else path
        own, deciding_cites = by_file[path], added.get(path, [])
        if own and deciding_cites and any(c.line is not None for c in (*own, *deciding_cites)):
            # (lines are shown in order, the first few quoted, and pointers not beside lines:
            # folded together, a finding's lines would take the period's own lines' quotes,
            # or hide its pointers; said after them, the period's own stay as they were)
            parts.append(f"{_cite_file(shown, own)}, {_cite_file(shown, deciding_cites)}")
        else:
            parts.append(_cite_file(shown, [*own, *deciding_cites]))
    more = f"; and {len(by_file) - limit} more files" if len(by_file) > limit else ""
    head = f"{code_span(base, 160)}: " if base else ""
    return head + "; ".join(parts) + more


def decisive_citations(verdict: Verdict) -> list[Citation]:
    """What the findings that decided ``verdict`` cite and its own citations do not: the
    dump's row an ``AUD129`` rests on, the two device files of an ``AUD113``, the record's
    pointer of an ``AUD015``. The reasoning keeps, as the verdict's citations, what the
    evidence shows (a blocked period's remaining files among them); the blocker itself is
    cited by its finding, so ``evidence.md`` adds it here. A place already cited (the same
    file and line or pointer), or a whole file already cited at some place, is not repeated;
    each is added once, in the findings' order."""
    cited = {(cite.path, cite.line, cite.pointer) for cite in verdict.citations}
    files = {cite.path for cite in verdict.citations}
    added: list[Citation] = []
    for item in verdict.findings:
        for cite in item.citations:
            place = (cite.path, cite.line, cite.pointer)
            whole = cite.line is None and not cite.pointer
            if not cite.path or place in cited or (whole and cite.path in files):
                continue
            cited.add(place)
            files.add(cite.path)
            added.append(cite)
    return added


def _cite_file(shown: str, group: Sequence[Citation]) -> str:
    """One file's citations, each quote beside the line or pointer it was read at (lines
    in order; a file cited by lines is not also cited by pointers); a citation of the whole
    file shows its quote after the name."""
    quotes: dict[str, str] = {}
    if any(c.line is not None for c in group):
        for cite in sorted((c for c in group if c.line is not None), key=lambda c: c.line or 0):
            quotes[f":{cite.line}"] = quotes.get(f":{cite.line}") or cite.quote or ""
    else:  # (pointers in the order given: the reasoning's)
        for cite in group:
            if cite.pointer:
                quotes[f"#{cite.pointer}"] = quotes.get(f"#{cite.pointer}") or cite.quote or ""
    if not quotes:
        quote = next((c.quote for c in group if c.quote), "")
        return code_span(shown, 160) + (f" ({code_span(clip(quote, 160), 170)})" if quote
                                        else "")
    return _locations(shown, [(w, code_span(clip(q, 160), 170) if q else "")
                              for w, q in quotes.items()])


def render_evidence(result: AuditResult, groups: Sequence[tuple[str, Sequence[Verdict]]]
                    ) -> Iterator[str]:
    """``evidence.md``, a line at a time (each ending its line): every period's citations,
    under its diagnosis group's title (a million periods' lines are never held at once)."""
    root = str(result.collected.root)
    yield from ("# Evidence cited\n", "\n",
                "Every period's citations (file: lines or JSON pointers), by diagnosis group as "
                "in [`diagnostic.md`](diagnostic.md). Paths are relative to the evidence root "
                f"{code_span(root, 400)}; the attempt directory is named first. The same "
                "citations, one row each, are in `findings.parquet` and `evidence.parquet`.\n")
    for title, members in groups:
        yield from ("\n", f"## {title}\n", "\n")
        for verdict in members:
            cited = cite_group(verdict.citations, decisive=decisive_citations(verdict))
            yield f"- {code_span(verdict.subject)}: {cited}\n"
