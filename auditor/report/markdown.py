"""``diagnostic.md``: the report a reviewer reads, shaped like seed ``002``.

Sections: headline reconstruction (with evidence problems on the first screen
when there are any), diagnosis and limits (periods with the same diagnosis
explained once), the per-period table and worker PIDs, the evidence locator
and integrity tally, accounting in its overlapping scopes, launcher
disagreements and waivers, findings, and provenance.

Everything quoted from evidence goes through :func:`md_escape` or
:func:`code_block`, so a log line cannot inject markup, links or HTML.
The output is a pure function of the result: byte-identical for the same evidence.
"""

from __future__ import annotations

import os
import re
from collections import Counter, defaultdict
from collections.abc import Sequence

from auditor._io import clip, counted
from auditor.catalogue import in_family
from auditor.model import (
    AuditResult,
    Citation,
    Reasoning,
    Verdict,
    VerdictKind,
)
from auditor.report.appendix import (
    MAX_NAMED_PERIODS,
    accounting_section,
    arrays_of,
    disagreements_section,
    findings_section,
    outside_arrays,
    plots_section,
    provenance_section,
    waivers_section,
)
from auditor.report.mdformat import (
    code_block,
    code_span,
    md_escape,
    number,
    table,
    utc,
    utc_seconds,
)

PHASE_WORDS = {"rollout_init": "rollout-initialization", "init_model": "model-initialization",
               "actor_update": "actor-update", "weight_sync": "weight-synchronization",
               "rollout_generate": "rollout-generation"}
MAX_FINDINGS_LISTED = 200
MAX_CITED_PERIODS = 50
"""Periods whose citations a diagnosis group lists in full (the rest are in the tables)."""


# ------------------------------------------------------------------ escaping


# ------------------------------------------------------------------ sections


def render_markdown(result: AuditResult, outputs: Sequence[tuple[str, str, int]] = ()) -> str:
    """The whole report. ``outputs`` lists (name, sha256, size) of the other outputs."""
    reasoning = result.reasoning
    parts = [
        _headline(result, reasoning),
        _problems(result, reasoning),
        _diagnosis(result, reasoning),
        _period_table(result, reasoning),
        _locator(result),
        accounting_section(result, reasoning),
        disagreements_section(reasoning),
        waivers_section(reasoning),
        findings_section(result),
        plots_section(outputs),
        provenance_section(result, outputs),
    ]
    return "\n\n".join(p.strip("\n") for p in parts if p.strip()) + "\n"


def _study(result: AuditResult) -> str:
    for period in result.collected.periods:
        if period.record.study:
            return period.record.study
    return result.collected.root.name


def _without_element(reasoning: Reasoning) -> str:
    """A sentence on the attempts' jobs the scheduler's dump has no element row for."""
    jobs = reasoning.accounting.jobs_without_element
    if not jobs:
        return ""
    named = ", ".join(code_span(j) for j in jobs[:MAX_NAMED_PERIODS])
    more = f" and {len(jobs) - MAX_NAMED_PERIODS:,} more" if len(jobs) > MAX_NAMED_PERIODS else ""
    return (f" **The scheduler's dump has no element row for "
            f"{'job' if len(jobs) == 1 else 'jobs'} {named}{more}** (of the attempts' jobs): "
            "their state is unknown, and the allocation scope leaves them out.")


def _headline(result: AuditResult, reasoning: Reasoning) -> str:
    elements = reasoning.accounting.elements
    element_ids = {e.job_id for e in elements}
    ends = [(job.end, job) for job in (result.collected.sacct.jobs
                                       if result.collected.sacct else ())
            if job.end is not None and job.job_id in element_ids]
    last = max(ends, key=lambda item: item[0])[1] if ends else None
    # the day the array ended: the scheduler's, else the last invocation's end
    finished = max((a.finished_ns for a in reasoning.attempts if a.finished_ns), default=None)
    date = f" — {utc_seconds(last.end)[:10]}" if last is not None else \
        f" — {utc_seconds(finished // 1_000_000_000)[:10]}" if finished else ""
    lines = [f"# Audit of {md_escape(_study(result))}{date}", ""]
    arrays = ", ".join(code_span(a) for a in arrays_of(result)) or "(no array id recorded)"
    outside = outside_arrays(result, elements)  # (a retry submitted as a job of its own)
    elements = tuple(e for e in elements if e not in outside)
    if elements or outside:
        exits = _exits(result)
        states = Counter(f"{e.state} {exits.get(e.job_id, '')}".strip() for e in elements)
        if not elements:
            sentence = f"No element of {arrays} has a scheduler record"
        elif len(states) == 1:
            state = next(iter(states))
            every = ("The one array element" if len(elements) == 1 else
                     "Both array elements" if len(elements) == 2 else
                     f"All {number(len(elements))} array elements")
            sentence = f"{every} of {arrays} ended {code_span(state)}"
        else:
            listed = ", ".join(f"{number(n)} {code_span(s)}" for s, n in sorted(states.items()))
            sentence = f"The {number(len(elements))} array elements of {arrays} ended: {listed}"
        oom = any(job.state == "OUT_OF_MEMORY" or any(s.state == "OUT_OF_MEMORY"
                                                     for s in job.steps)
                  for job in (result.collected.sacct.jobs if result.collected.sacct else ()))
        sentence += ", with a scheduler `OUT_OF_MEMORY` state." if oom else \
            ", with no scheduler `OUT_OF_MEMORY` state."
        lines.append(sentence)
        if outside:
            listed = ", ".join(f"{code_span(e.job_id)} `{md_escape(e.state)}`"
                               for e in outside[:MAX_NAMED_PERIODS])
            more = f" and {len(outside) - MAX_NAMED_PERIODS:,} more" \
                if len(outside) > MAX_NAMED_PERIODS else ""
            lines[-1] += (f" Outside the array, {'the job' if len(outside) == 1 else 'jobs'} "
                          f"{listed}{more} also ran attempts.")
        if last is not None:
            index = f"index {last.array_task_id} / " if last.array_task_id is not None else ""
            job = last.job_id_raw or last.job_id
            what = "job" if last.array_task_id is None and last.array_job_id is None \
                else "element"
            lines[-1] += (f" The last {what}, {index}actual job {code_span(job)}, ended at "
                          f"**{utc_seconds(last.end, with_date=False)} UTC**.")
        lines[-1] += _without_element(reasoning)
    else:
        lines.append(f"No scheduler record was available for array {arrays}; element states "
                     "and allocation-scope accounting are unknown.")
    lines += ["", _reconstruction(reasoning), "",
              "The auditor only reads: no raw evidence was changed, and no experiment or "
              "retry was launched."]
    if result.partial:
        lines += ["", f"**Partial audit:** {_partial_causes(result)}; see the findings "
                      "section."]
    return "\n".join(lines)


def _partial_causes(result: AuditResult) -> str:
    """What made the audit partial, counted."""
    caps = Counter(f.rule_id for f in result.findings)
    causes = []
    if result.findings_not_kept:
        causes.append(f"{counted(result.findings_not_kept, 'finding')} counted but not kept "
                      "(findings limits)")
    if caps["AUD013"]:
        causes.append(f"findings capped in {counted(caps['AUD013'], 'place')} (`AUD013`)")
    if caps["AUD016"]:
        causes.append(f"phase records capped in {counted(caps['AUD016'], 'trace')} "
                      "(`AUD016`)")
    return "; ".join(causes)


def _exits(result: AuditResult) -> dict[str, str]:
    """``exit:signal`` of every allocation row, by job id."""
    sacct = result.collected.sacct
    if sacct is None:
        return {}
    return {job.job_id: f"{job.exit_code}:{job.signal if job.signal is not None else 0}"
            for job in sacct.jobs if job.exit_code is not None}


def _reconstruction(reasoning: Reasoning) -> str:
    facts = {f.subject: f for f in reasoning.facts}
    launches = len(reasoning.attempts)
    failed: Counter[tuple[int | None, str]] = Counter()
    unresolved: Counter[int | None] = Counter()
    completed: Counter[int | None] = Counter()
    for verdict in reasoning.verdicts:
        gpus = facts[verdict.subject].gpus
        if verdict.verdict is VerdictKind.FAILED:
            failed[(gpus, _failure_words(verdict))] += 1
        elif verdict.verdict is VerdictKind.UNRESOLVED:
            unresolved[gpus] += 1
        else:
            completed[gpus] += 1
    pieces = [f"{launches:,} launch{'es' if launches != 1 else ''}"]
    for (gpus, words), n in sorted(failed.items(), key=lambda i: (i[0][0] or 0, i[0][1])):
        pieces.append(f"{n:,} eligible {_gpus(gpus)}{words} failure{'s' if n != 1 else ''}")
    for gpus, n in sorted(unresolved.items(), key=lambda i: i[0] or 0):
        pieces.append(f"{n:,} unresolved {_gpus(gpus)}period{'s' if n != 1 else ''}")
    total_completed = sum(completed.values())
    if total_completed:
        pieces.extend(f"{n:,} eligible {_gpus(g)}completion{'s' if n != 1 else ''}"
                      for g, n in sorted(completed.items(), key=lambda i: i[0] or 0))
    else:
        pieces.append("zero eligible completions")
    text = "Final reconstruction: **" + "; ".join(pieces) + ".**"
    configs = reasoning.configurations
    resolved = [c for c in configs if c.status == "resolved"]
    waived_in = ", ".join(code_span(key) for key in reasoning.gate_partial.included_by_waiver)
    verb = "resolves" if len(resolved) == 1 else "resolve"
    text += (f" {number(len(resolved)).capitalize()} of {number(len(configs))} configurations "
             f"{verb}")
    if resolved:
        kinds = {c.outcome for c in resolved}
        gpu_set = {c.gpus for c in resolved}
        if len(kinds) == 1 and len(gpu_set) == 1:
            kind = next(iter(kinds)) or "mixed"
            if len(resolved) == 1:
                outcome_word = {"failed": "failure", "completed": "completion",
                                "mixed": "mixed outcome"}[kind]
                text += f", a {next(iter(gpu_set))}-GPU {outcome_word}"
            else:
                outcome_word = {"failed": "failures", "completed": "completions",
                                "mixed": "mixed outcomes"}[kind]
                every = "all" if len(resolved) > 2 else "both"
                text += f", {every} {next(iter(gpu_set))}-GPU {outcome_word}"
        text += (". Evaluation is restricted to that resolved subset: "
                 + ", ".join(code_span(c.key) for c in resolved))
        text += (f". The reviewer's waivers (see Waivers) add the unresolved {waived_in}."
                 if waived_in else ".")
    elif waived_in:
        text += (f". Only the reviewer's waivers (see Waivers) let configurations enter the "
                 f"evaluation: the unresolved {waived_in}.")
    else:
        text += ". No configuration can enter the evaluation."
    gate = reasoning.gate
    text += (f" The gate {'passes' if gate.passed else 'fails'}; with `--allow-partial` it "
             f"{'passes' if reasoning.gate_partial.passed else 'fails'}.")
    return text


def _failure_words(verdict: Verdict) -> str:
    for item in verdict.findings:
        if item.rule_id == "AUD203":
            quote = item.citations[0].quote if item.citations else ""
            phase, _, error = quote.partition(" ")
            words = PHASE_WORDS.get(phase, phase.replace("_", "-"))
            kind = " memory" if "OutOfMemory" in error else ""
            return f"{words}{kind}"
    return ""


def _gpus(gpus: int | None) -> str:
    return f"{gpus}-GPU " if gpus is not None else ""


def _problems(result: AuditResult, reasoning: Reasoning) -> str:
    bad = [e for e in result.collected.evidence if e.status not in ("verified", "unlisted")]
    unlisted = [e for e in result.collected.evidence if e.status == "unlisted"]
    unreadable = [p for p in result.collected.periods if not p.record.readable]
    if not (bad or unlisted or unreadable):
        return ""
    lines = ["## Evidence problems", ""]
    affected = sorted({f"{e.pair}/period-{e.period}" for e in bad if e.period is not None}
                      | {p.subject for p in unreadable})
    said = []
    if bad:
        said.append(f"{counted(len(bad), 'listed evidence file')} failed verification")
    if unreadable:
        said.append(f"{counted(len(unreadable), 'period record')} could not be read")
    if said:
        said[-1] += "; the periods concerned cannot resolve"
    if unlisted:
        said.append(f"{counted(len(unlisted), 'file')} beside the evidence "
                    f"{'is' if len(unlisted) == 1 else 'are'} listed by no period record")
    lines += [". ".join(part[0].upper() + part[1:] for part in said) + ".", ""]
    rows = [[md_escape(e.path), e.status, md_escape(e.detail or "—"),
             md_escape(f"{e.pair}/period-{e.period}") if e.period is not None else "—"]
            for e in bad + unlisted]
    rows += [[md_escape(p.record.path), "unreadable period record", "—",
              md_escape(p.subject)] for p in unreadable]
    lines.append(table(["file", "status", "detail", "period"], rows[:MAX_FINDINGS_LISTED]))
    if len(rows) > MAX_FINDINGS_LISTED:
        lines += ["", f"{len(rows) - MAX_FINDINGS_LISTED:,} more are in `evidence.parquet` "
                      "(its `status` column)."]
    if affected:
        rest = len(affected) - MAX_NAMED_PERIODS
        lines += ["", "Affected periods: "
                  + ", ".join(md_escape(s) for s in affected[:MAX_NAMED_PERIODS])
                  + (f", and {rest:,} more (see `periods.parquet`)." if rest > 0 else ".")]
    return "\n".join(lines)


def _diagnosis(result: AuditResult, reasoning: Reasoning) -> str:
    facts = {f.subject: f for f in reasoning.facts}
    groups: dict[tuple[str, str, str, str], list[Verdict]] = defaultdict(list)
    for verdict in reasoning.verdicts:
        key = (verdict.verdict.value, verdict.reason, verdict.diagnosis, verdict.limits)
        groups[key].append(verdict)
    order = {"unresolved": 0, "failed": 1, "resolved": 2}
    lines = ["## Diagnosis and limits"]
    for (kind, reason_word, diagnosis, limits), members in sorted(
        groups.items(), key=lambda item: (order[item[0][0]], item[0][1], item[1][0].subject)
    ):
        gpus = sorted({g for v in members if (g := facts[v.subject].gpus) is not None})
        gpu_text = "/".join(f"{g}-GPU" for g in gpus)
        title = f"{number(len(members)).capitalize()} {gpu_text} {kind} period" \
                f"{'s' if len(members) != 1 else ''}"
        if kind == "unresolved":
            title += f": `{reason_word}`"
        elif kind == "failed":
            title += ": eligible failure"
        lines += ["", f"### {title}", ""]
        named = ", ".join(
            f"{md_escape(v.subject)} (job {md_escape(facts[v.subject].job_id or '?')})"
            for v in members[:MAX_NAMED_PERIODS])
        rest = len(members) - MAX_NAMED_PERIODS
        lines.append(f"Applies to: {named}" + (f", and {rest:,} more (see `periods.parquet`)."
                                               if rest > 0 else "."))
        lines += ["", _emphasise(md_escape(diagnosis, limit=4000)), ""]
        lines.append(f"**Limits.** {md_escape(limits, limit=4000)}")
        lines += ["", "Evidence cited (file: lines or JSON pointers, relative to the attempt "
                      "directory named first):", ""]
        for verdict in members[:MAX_CITED_PERIODS]:
            lines.append(f"- {md_escape(verdict.subject)}: {_cite_group(verdict.citations)}")
        if len(members) > MAX_CITED_PERIODS:
            lines.append(f"- and {len(members) - MAX_CITED_PERIODS:,} more periods with the same "
                         "diagnosis: their citations are in `periods.parquet` and "
                         "`findings.parquet`")
    return "\n".join(lines)


def _cite_group(cites: Sequence[Citation], limit: int = 12) -> str:
    """Citations folded per file: ``dir/``: ``a.jsonl:7,8``; ``trial.json#/x`` (quote)."""
    if not cites:
        return "no citation"
    # the attempt directory named once (the period record, under pairs/, is named whole)
    evidence = [c for c in cites if not c.path.startswith("pairs/")]
    folders = [c.path.rsplit("/", 1)[0] for c in evidence if "/" in c.path]
    base = ""
    if len(folders) > 1 and len(folders) == len(evidence):
        common = os.path.commonpath(folders)
        base = common + "/" if common else ""
    by_file: dict[str, list[Citation]] = defaultdict(list)
    for cite in cites:
        by_file[cite.path].append(cite)
    parts = []
    for path, group in by_file.items():
        shown = path[len(base):] if base and path.startswith(base) else path
        parts.append(_cite_file(shown, group))
    more = f"; and {len(parts) - limit} more files" if len(parts) > limit else ""
    head = f"{code_span(base, 160)}: " if base else ""
    return head + "; ".join(parts[:limit]) + more


QUOTED_PER_FILE = 3
"""Locations of one file shown with their quotes (the rest are named without)."""


def _cite_file(shown: str, group: Sequence[Citation]) -> str:
    """One file's citations: ``a.jsonl:7`` (quote), ``:8`` (quote); ``t.json#/x`` (quote),
    ``#/y`` (quote): each quote beside the line or JSON pointer it was read at (lines in
    order; a file cited by lines is not also cited by pointers). A citation of the whole
    file shows its quote after the name."""
    quotes: dict[str, str] = {}  # location -> the first quote given for it
    if any(c.line is not None for c in group):
        for cite in sorted((c for c in group if c.line is not None), key=lambda c: c.line or 0):
            where = f":{cite.line}"
            quotes[where] = quotes.get(where) or cite.quote or ""
    else:  # (pointers in the order given: the reasoning's)
        for cite in group:
            if cite.pointer:
                where = f"#{cite.pointer}"
                quotes[where] = quotes.get(where) or cite.quote or ""
    located = list(quotes.items())
    if not located:
        quote = next((c.quote for c in group if c.quote), "")
        return code_span(shown, limit=160) + (f" {md_escape(f'({clip(quote, 160)})', limit=300)}"
                                             if quote else "")
    pieces = []
    pending: list[str] = []  # locations without a quote, named together
    shown_quotes = 0
    for index, (where, quote) in enumerate(located):
        name = shown + where if index == 0 else where
        if quote and shown_quotes < QUOTED_PER_FILE:
            if pending:
                pieces.append(code_span(",".join(pending), limit=160))
                pending = []
            shown_quotes += 1
            pieces.append(f"{code_span(name, limit=160)} "
                          f"{md_escape(f'({clip(quote, 160)})', limit=300)}")
        elif pending:
            pending.append(where[1:] if where[0] == ":" else where)
        else:
            pending.append(name)
    if pending:
        pieces.append(code_span(",".join(pending), limit=160))
    return ", ".join(pieces)


def _emphasise(text: str) -> str:
    """Turn the escaped backticks the engine wrote around names back into code spans."""
    return re.sub(r"\\`([A-Za-z0-9_:./\\-]+?)\\`",
                  lambda m: "`" + m.group(1).replace("\\", "") + "`", text)


def _period_table(result: AuditResult, reasoning: Reasoning) -> str:
    facts = reasoning.facts
    verdicts = {v.subject: v for v in reasoning.verdicts}
    dates = {utc(ns, with_date=True)[:10] for f in facts
             for ns in (f.actor_update_finished_ns, f.post_update_sync_finished_ns) if ns}
    one_date = next(iter(dates)) if len(dates) == 1 else None
    ordered = sorted(facts, key=lambda f: (f.gpus or 0, f.array_task_id if f.array_task_id
                                           is not None else 1 << 30, f.pair, f.period))
    lines = ["## Periods", ""]
    when = f"rendered as UTC on {one_date}" if one_date else "rendered as UTC"
    lines.append(
        f"Times are the exact latest `finished_ns` across ranks, {when}. “Sync” is the weight "
        "synchronization **after** the final-step actor update, excluding initialization "
        "synchronization. Peaks are the launcher's raw trial peaks (or the highest device "
        "peak), not eligible completed-run peaks."
    )
    lines.append("")
    rows = []
    for f in ordered:
        verdict = verdicts[f.subject]
        outcome = verdict.verdict.value + (f" ({verdict.reason})" if verdict.verdict
                                           is VerdictKind.UNRESOLVED else "")
        rows.append([
            str(f.array_task_id) if f.array_task_id is not None else "—",
            md_escape(f"{f.workload or '?'} / {f.seed if f.seed is not None else '?'}"),
            md_escape(f"{f.job_id or '?'} / {f.period}"),
            str(f.gpus) if f.gpus is not None else "—",
            md_escape(outcome),
            utc(f.actor_update_finished_ns, with_date=one_date is None),
            utc(f.post_update_sync_finished_ns, with_date=one_date is None),
            str(f.raw_peak_mib) if f.raw_peak_mib is not None else "—",
        ])
    lines.append(table(
        ["Index", "Workload / seed", "Actual job / period", "GPUs", "Verdict",
         "Actor update finished", "Post-update sync finished", "Raw peak MiB"],
        rows, ["---", "---", "---", "---:", "---", "---", "---", "---:"],
    ))
    lines += ["", "Worker PIDs in rank order (actual job / period: pids):", ""]
    lines.append(code_block(
        f"{f.job_id or '?'} / {f.period}: " + ",".join(str(p) for p in f.pids_by_rank)
        for f in ordered
    ))
    return "\n".join(lines)


def _locator(result: AuditResult) -> str:
    collected = result.collected
    integrity = Counter(e.status for e in collected.evidence)
    listed = sum(n for s, n in integrity.items() if s != "unlisted")
    lines = ["## Evidence locator", ""]
    lines.append(code_block([
        f"BASE={collected.root.name}   (the evidence root as audited; its full path is "
        "\"root\" in output_manifest.json)",
        "PAIR=<pair>   (e.g. " + (collected.periods[0].record.pair if collected.periods
                                  else "?") + ")",
        "ATTEMPT=BASE/PAIR-<gpus>gpu/attempt-<actual-job>",
        "",
        "ATTEMPT/allocator-traces/allocator-<pid>.jsonl",
        "ATTEMPT/device-evidence/worker-<role>-<rank>-<pid>.json",
        "ATTEMPT/training-<actual-job>.log",
        "ATTEMPT/trial-<actual-job>.json",
        "BASE/pairs/PAIR/period-<period>.json",
    ]))
    lines.append("")
    lines.append(
        f"Integrity: {listed:,} listed evidence files; {integrity.get('verified', 0):,} verified "
        f"(SHA-256 and size against their period record), {integrity.get('mismatched', 0):,} "
        f"mismatched, {integrity.get('missing', 0):,} missing, {integrity.get('unsafe', 0):,} "
        f"unsafe paths, {integrity.get('unreadable', 0):,} unreadable; "
        f"{integrity.get('unlisted', 0):,} unlisted files. {len(collected.periods):,} period "
        f"records read, {sum(1 for p in collected.periods if not p.record.readable):,} "
        "unreadable."
    )
    lines += ["", _cross_checks(result)]
    return "\n".join(lines)


def _cross_checks(result: AuditResult) -> str:
    """One sentence per cross-check family: what was checked and how it came out."""
    fired = Counter(f.rule_id for f in result.findings)
    periods = [p for p in result.collected.periods if p.record.readable]
    traces = sum(len(a.read.traces) for p in periods for a in p.attempts)
    idle_ok = sum(1 for p in periods
                  if p.record.idle_check is not None and p.record.idle_check.passed is True)

    def outcome(rules: tuple[str, ...], clean: str) -> str:
        count = sum(fired[rule] for rule in rules)
        named = ", ".join(f"{rule} x{fired[rule]}" if fired[rule] > 1 else rule
                          for rule in rules if fired[rule])  # (the rules that fired)
        return clean if not count else f"{counted(count, 'finding')} ({named})"

    scheduler = result.collected.scheduler_usable()  # (what was not there was not checked)
    sources = "trial, device files and sacct" if scheduler else "trial and device files"
    return (
        f"Cross-checks: the pid and rank of each of the {traces:,} allocator traces against the "
        "period's workers, the device file name and content: "
        f"{outcome(in_family('identity'), 'all agree')}; job ids across period "
        f"record, attempt directory, {sources}: "
        f"{outcome(in_family('job_ids'), 'all agree')}; record order and timestamps inside "
        f"the invocation{' and the allocation' if scheduler else ''}: "
        f"{outcome(in_family('timeline'), 'all consistent')}"
        f"{'' if scheduler else ' (no scheduler dump: nothing was checked against sacct)'}; "
        f"post-period idle checks: {idle_ok:,} of {len(periods):,} passed."
    )


