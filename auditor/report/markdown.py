"""``diagnostic.md``: the report a reviewer reads, shaped like seed ``002``.

Sections: headline reconstruction (with evidence problems on the first screen
when there are any), diagnosis and limits (periods with the same diagnosis
explained once), the per-period table and worker PIDs, the evidence locator
and integrity tally, accounting in its overlapping scopes, launcher
disagreements and waivers, findings, and provenance.

Everything quoted from evidence goes through :func:`prose`, :func:`code_span` or
:func:`code_block`, so a log line cannot inject markup, links or HTML. Each diagnosis
group states its evidence once, as the pattern its periods share; every period's own
citations are in ``evidence.md`` (:func:`render_evidence_md`).
The output is a pure function of the result: byte-identical for the same evidence.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence

from auditor._text import counted
from auditor.model import (
    UNFINISHED_STATES,
    AuditResult,
    Reasoning,
    Verdict,
    VerdictKind,
)
from auditor.model.kinds import ALLOCATOR_TRACE, DEVICE_EVIDENCE, TRAINING_LOG, TRIAL
from auditor.report.appendix import (
    MAX_NAMED_PERIODS,
    accounting_section,
    arrays_of,
    disagreements_section,
    disagreements_table,
    elements_table,
    findings_section,
    findings_table,
    outside_arrays,
    plots_section,
    provenance_section,
    waivers_section,
)
from auditor.report.citations import (
    render_evidence,
)
from auditor.report.diagnosis import diagnosis_section
from auditor.report.groups import (
    cause_word,
    counted_attempt,
    diagnosis_groups,
    outcomes_by_index,
)
from auditor.report.mdformat import (
    NS_PER_DAY,
    SpilledCodeBlock,
    code_block,
    code_span,
    number,
    prose,
    table,
    table_lines,
    utc,
    utc_day,
    utc_seconds,
)
from auditor.report.overview import configurations_section, unresolved_lines
from auditor.report.tables import device_values
from auditor.rules import in_family
from auditor.store import SortedRows

PHASE_WORDS = {"rollout_init": "rollout-initialization", "init_model": "model-initialization",
               "actor_update": "actor-update", "weight_sync": "weight-synchronization",
               "rollout_generate": "rollout-generation"}
MAX_FINDINGS_LISTED = 200


def render_markdown(result: AuditResult, outputs: Sequence[str] = ()) -> str:
    """The whole report. ``outputs`` names the other outputs (with ``evidence.md`` among
    them when it is written: the report links it), in the order they are written; it needs
    their names only, so it can be written beside them."""
    return "".join(markdown_chunks(result, outputs))


def markdown_chunks(result: AuditResult, outputs: Sequence[str] = ()) -> Iterator[str]:
    """:func:`render_markdown`'s text in pieces, its sections one after another, made as
    they are wanted, the period table a line at a time (a million periods' table was
    about 80 MB while it was made)."""
    reasoning = result.reasoning
    linked = "evidence.md" in outputs
    sections: list[Callable[[], str | Iterator[str]]] = [
        lambda: _headline(result, reasoning),
        lambda: configurations_section(result),
        lambda: unresolved_lines(result),
        lambda: _problems(result, reasoning),
        lambda: diagnosis_section(result, reasoning, linked),
        lambda: _period_table_lines(result, reasoning),
        lambda: _locator(result),
        lambda: accounting_section(result, reasoning),
        lambda: disagreements_section(reasoning),
        lambda: waivers_section(reasoning),
        lambda: findings_section(result),
        lambda: plots_section(outputs),
        lambda: provenance_section(result, outputs),
    ]
    gap = ""  # (the sections a blank line apart, each without its own leading and
    # trailing newlines; an empty one left out)
    for section in sections:
        made = section()
        if isinstance(made, str):
            if made.strip():
                yield gap + made.strip("\n")
                gap = "\n\n"
            continue
        first = next(made, None)  # (a section of lines may have none: then left out)
        if first is None:
            continue
        yield gap + first  # (lines: none starting or ending the section with "\n")
        gap = "\n\n"
        for line in made:
            yield "\n"
            yield line
    yield "\n"


def render_evidence_md(result: AuditResult) -> str:
    """``evidence.md``: every period's citations, by the report's diagnosis groups."""
    return "".join(evidence_md_lines(result))


def evidence_md_lines(result: AuditResult) -> Iterator[str]:
    """``evidence.md`` a line at a time (what :func:`render_evidence_md` joins)."""
    groups = diagnosis_groups(result.reasoning, MAX_NAMED_PERIODS)
    yield from render_evidence(result, [(group.title, group.members) for group in groups])
    for section in (_period_table_lines(result, result.reasoning, full=True),
                    iter(elements_table(result.reasoning).splitlines()),
                    iter(findings_table(result).splitlines()),
                    iter(disagreements_table(result.reasoning).splitlines())):
        first = next(section, None)
        if first is not None:
            yield "\n"
            yield first + "\n"
            yield from (line + "\n" for line in section)


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
    lines = [f"# Audit of {code_span(_study(result))}{date}", ""]
    arrays = ", ".join(code_span(a) for a in arrays_of(result)) or "(no array id recorded)"
    outside = outside_arrays(result, elements)  # (a retry submitted as a job of its own)
    elements = tuple(e for e in elements if e not in outside)
    if elements or outside:
        exits = _exits(result)
        # (a pending range is each task it still holds, not one element: contract v1.1)
        tasks = {job.job_id: len(held) for job in (result.collected.sacct.jobs if
                                                   result.collected.sacct else ())
                 if (held := job.pending_tasks) is not None}
        states: Counter[str] = Counter()
        for e in elements:
            states[f"{e.state} {exits.get(e.job_id, '')}".strip()] += tasks.get(e.job_id, 1)
        states = +states  # (a range whose every task has its own row holds none)
        count = sum(states.values())
        # (an element pending or running has not ended: its state is what the dump shows)
        ended = not any(e.state in UNFINISHED_STATES for e in elements)
        if not count:  # (none, or only a range whose every task has a row of its own)
            sentence = f"No element of {arrays} has a scheduler record"
        elif len(states) == 1:
            state = next(iter(states))
            every = ("The one array element" if count == 1 else
                     "Both array elements" if count == 2 else
                     f"All {number(count)} array elements")
            sentence = f"{every} of {arrays} {'ended' if ended else 'are'} {code_span(state)}"
        else:
            listed = ", ".join(f"{number(n)} {code_span(s)}" for s, n in sorted(states.items()))
            sentence = (f"The {number(count)} array elements of {arrays} "
                        f"{'ended' if ended else 'are, as the dump shows them'}: {listed}")
        oom = any(job.state == "OUT_OF_MEMORY" or any(s.state == "OUT_OF_MEMORY"
                                                     for s in job.steps)
                  for job in (result.collected.sacct.jobs if result.collected.sacct else ()))
        sentence += ", with a scheduler `OUT_OF_MEMORY` state." if oom else \
            ", with no scheduler `OUT_OF_MEMORY` state."
        lines.append(sentence)
        if outside:
            listed = ", ".join(f"{code_span(e.job_id)} {code_span(e.state)}"
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
        lines.append(
            "The study ran without a scheduler (`\"scheduler\": \"none\"`): no element "
            "states were expected, and the allocation scope is not measured."
            if result.collected.protocol.scheduler == "none" else
            f"No scheduler record was available for array {arrays}; element states "
            "and allocation-scope accounting are unknown.")
    lines += ["", _reconstruction(reasoning), "", _gpu_time(result), "",
              "The auditor only reads: no raw evidence was changed, and no experiment or "
              "retry was launched."]
    if result.partial:
        lines += ["", f"**Partial audit:** {_partial_causes(result)}; see the findings "
                      "section."]
    return "\n".join(lines)


def _gpu_time(result: AuditResult) -> str:
    """The GPU time in one line: what the allocations held, what the attempts ran, and how
    much of that the unresolved periods and the wasted retries took (the Accounting
    section's figures; its "at least" where one is a lower bound)."""
    acc = result.reasoning.accounting
    least = "at least " if acc.attempts_without_times else ""
    if acc.allocation_gpu_seconds is not None:
        held = (f"the allocations held {'at least ' if acc.allocation_records_unknown else ''}"
                f"**{_gpu_hours(acc.allocation_gpu_seconds)}**; ")
    elif result.collected.protocol.scheduler == "none" and result.collected.sacct is None:
        held = "the allocations are not measured (no scheduler); "
    else:
        held = "what the allocations held is unknown; "
    wasted = (f"{'at least ' if acc.wasted_at_least else ''}"
              f"{_gpu_hours(acc.wasted_gpu_seconds)} on "
              f"{counted(acc.wasted_attempts, 'attempt')} retried after a completed one"
              if acc.wasted_attempts else "none on retries after a completion")
    return (f"GPU time: {held}the attempts ran {least}**{_gpu_hours(acc.task_gpu_seconds)}**, "
            f"{'at least ' if acc.unresolved_at_least else ''}"
            f"{_gpu_hours(acc.unresolved_gpu_seconds)} of it in unresolved periods and "
            f"{wasted} (overlapping scopes, never to be added: see Accounting).")


def _gpu_hours(seconds: float) -> str:
    """``12.35 GPU-hours``; under a tenth of an hour, whole GPU-seconds."""
    if seconds >= 360:
        return f"{seconds / 3600:,.2f} GPU-hours"
    return f"{seconds:,.0f} GPU-second{'' if round(seconds) == 1 else 's'}"


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
    gpus_of = {f.subject: f.gpus for f in reasoning.facts}
    launches = len(reasoning.attempts)
    failed: Counter[tuple[int | None, str]] = Counter()
    unresolved: Counter[int | None] = Counter()
    completed: Counter[int | None] = Counter()
    for verdict in reasoning.verdicts:
        gpus = gpus_of[verdict.subject]
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
    if len(configs) == 1:  # (not "zero of one configurations resolve")
        text += (f" The one configuration, {code_span(configs[0].key)}, "
                 + ("resolves" if resolved else "does not resolve"))
    else:
        text += (f" {number(len(resolved)).capitalize()} of {number(len(configs))} "
                 f"configurations {verb}")
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
                every_word = "all" if len(resolved) > 2 else "both"
                text += f", {every_word} {next(iter(gpu_set))}-GPU {outcome_word}"
    text += "."
    gate, partial = reasoning.gate, reasoning.gate_partial
    if not partial.passed:  # (the headline never says more than the gate allows)
        integrity = [r for r in reasoning.gate_reasons if r.integrity]
        why = (f" ({prose(integrity[0].text, 200)}"
               + (f", and {counted(len(integrity) - 1, 'more reason')}" if len(integrity) > 1
                  else "") + ")") if integrity else ""
        text += (" **No configuration can enter the evaluation: the gate fails, even with "
                 f"`--allow-partial`{why}.** Included configurations: none.")
        return text
    if resolved:
        text += (" Evaluation is restricted to that resolved subset: "
                 + ", ".join(code_span(c.key) for c in resolved))
        text += (f". The reviewer's waivers (see Waivers) add the unresolved {waived_in}."
                 if waived_in else ".")
    elif waived_in:
        text += (f" Only the reviewer's waivers (see Waivers) let configurations enter the "
                 f"evaluation: the unresolved {waived_in}.")
    else:
        text += " No configuration can enter the evaluation."
    text += (f" The gate {'passes' if gate.passed else 'fails'}; with `--allow-partial` it "
             "passes.")
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
    unusual = result.collected.unusual_evidence()
    bad = [e for e in unusual if e.status != "unlisted"]
    unlisted = [e for e in unusual if e.status == "unlisted"]
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
    rows = [[code_span(e.path), e.status, prose(e.detail or "—"),
             code_span(f"{e.pair}/period-{e.period}") if e.period is not None else "—"]
            for e in bad + unlisted]
    rows += [[code_span(p.record.path), "unreadable period record", "—",
              code_span(p.subject)] for p in unreadable]
    lines.append(table(["file", "status", "detail", "period"], rows[:MAX_FINDINGS_LISTED]))
    if len(rows) > MAX_FINDINGS_LISTED:
        lines += ["", f"{len(rows) - MAX_FINDINGS_LISTED:,} more are in `evidence.parquet` "
                      "(its `status` column)."]
    if affected:
        rest = len(affected) - MAX_NAMED_PERIODS
        lines += ["", "Affected periods: "
                  + ", ".join(code_span(s) for s in affected[:MAX_NAMED_PERIODS])
                  + (f", and {rest:,} more (see `periods.parquet`)." if rest > 0 else ".")]
    return "\n".join(lines)


def _period_rows(result: AuditResult, reasoning: Reasoning, full: bool = True
                 ) -> Iterator[tuple[list[str], str]]:
    """The table's rows, one per attempt (a retried period's every attempt), with each
    attempt's PIDs line, made as they are wanted. What a row says of its verdict and
    period is made first, in the study's order (a large study's are kept packed: read in
    the table's order, each look-up would remake a block of them)."""
    facts = reasoning.facts
    dates = {ns // NS_PER_DAY for f in facts
             for ns in (f.actor_update_finished_ns, f.post_update_sync_finished_ns) if ns}
    dated = len(dates) > 1
    said: dict[str, tuple[str, list[tuple[int, str, str, str] | int] | None]] = {}
    """By subject: the verdict's words, and for a retried period each attempt in order
    (the counted one's index, or an other's index, job, outcome and PIDs)."""
    texts: dict[str, str] = {}
    for verdict, fact in zip(reasoning.verdicts, facts, strict=True):
        if not full and (verdict.verdict is not VerdictKind.UNRESOLVED
                         or fact.actor_update_finished_ns is None):
            continue  # (the report's table: the unresolved periods that got that far)
        cause = cause_word(verdict)
        text = verdict.verdict.value + (
            f" (`{verdict.reason}`{', ' + cause if cause else ''})"
            if verdict.verdict is VerdictKind.UNRESOLVED else f" ({cause})" if cause else "")
        period, chosen, _ = counted_attempt(result, verdict.subject)
        attempts = period.attempts if period is not None else ()
        each: list[tuple[int, str, str, str] | int] | None = None
        if len(attempts) > 1:
            each = []
            judged = outcomes_by_index(result, verdict.subject)  # (once: not per attempt)
            for attempt in sorted(attempts, key=lambda a: a.spec.index):
                if attempt is chosen:
                    each.append(attempt.spec.index)
                    continue
                other = judged.get(attempt.spec.index)
                outcome = "not judged" if other is None else other.outcome + (
                    "" if other.reason in ("completed", "eligible_failure")
                    else f" (`{other.reason}`)") + (", wasted" if other.wasted else "")
                pids = ",".join(str(w.pid) for w in sorted(
                    attempt.spec.workers, key=lambda w: (w.rank is None, w.rank or 0)))
                each.append((attempt.spec.index, attempt.spec.job_id or "?", outcome, pids))
        said[verdict.subject] = (texts.setdefault(text, text), each)
    # (sorted as sorted() sorts, stably, with what a row reads of each period's facts
    # waiting on disk: a million periods' facts held for the sort were about 70 MB)
    ordered = SortedRows(0)
    for f in facts:
        if f.subject not in said:
            continue
        ordered.extend((((f.gpus or 0, f.array_task_id if f.array_task_id is not None
                          else 1 << 30, f.pair, f.period), f.subject, f.array_task_id,
                         f.workload, f.seed, f.gpus, f.job_id, f.period,
                         f.actor_update_finished_ns, f.post_update_sync_finished_ns,
                         f.raw_peak_mib, f.pids_by_rank),))
    for (_, subject, task_id, workload_name, seed, gpu_count, job_id, period, actor_ns,
         sync_ns, raw_peak, pids_by_rank) in ordered:
        outcome_text, each = said[subject]
        index = str(task_id) if task_id is not None else "—"
        workload = prose(f"{workload_name or '?'} / {seed if seed is not None else '?'}")
        gpus = str(gpu_count) if gpu_count is not None else "—"
        for entry in each if each is not None else [None]:
            if entry is None or isinstance(entry, int):
                which = f", attempt {entry + 1}" if entry is not None else ""
                yield ([index, workload, f"{job_id or '?'} / {period}{which}", gpus,
                        *([outcome_text] if full else []), utc(actor_ns, with_date=dated),
                        utc(sync_ns, with_date=dated),
                        str(raw_peak) if raw_peak is not None else "—"],
                       f"{job_id or '?'} / {period}{which}: "
                       + ",".join(str(p) for p in pids_by_rank))
                continue
            number, job, outcome, pids = entry
            which = f", attempt {number + 1}"
            yield ([index, workload, f"{job} / {period}{which}", gpus,
                    *([f"{outcome}; not counted"] if full else []), "—", "—", "—"],
                   f"{job} / {period}{which}: {pids}")


MAX_TABLE_ROWS = 12
"""Rows of the report's final-step table (every period's row is in ``evidence.md``)."""


def _period_table_lines(result: AuditResult, reasoning: Reasoning, full: bool = False
                        ) -> Iterator[str]:
    """The period table's section a line at a time (the table's a row at a time; of each
    row, only its PIDs line is kept, for the block after the table): in the report, the
    periods whose ranks reached the final-step update (at most :data:`MAX_TABLE_ROWS`
    rows), the times seed ``002`` tabled; in ``evidence.md`` (``full``), every period."""
    dates = {ns // NS_PER_DAY for f in reasoning.facts
             for ns in (f.actor_update_finished_ns, f.post_update_sync_finished_ns) if ns}
    one_date = utc_day(next(iter(dates))) if len(dates) == 1 else None
    reached = sum(1 for f, v in zip(reasoning.facts, reasoning.verdicts, strict=True)
                  if f.actor_update_finished_ns is not None
                  and v.verdict is VerdictKind.UNRESOLVED)
    if not full and not reached:
        return
    when = f"rendered as UTC on {one_date}" if one_date else "rendered as UTC"
    yield "## Periods" if full else "## How far the unresolved periods got"
    yield ""
    yield (
        ("Every period, a row per attempt. " if full else
         "Unresolved periods whose ranks recorded the final-step actor update (every "
         "period's row, with its PIDs: [`evidence.md`](evidence.md)). ")
        + f"Times: the latest `finished_ns` across ranks, {when}. “Sync” is the weight "
        "synchronization **after** the final-step actor update, excluding initialization "
        "synchronization. Peaks: raw trial peaks, not eligible completed-run peaks."
    )
    yield ""
    pids = SpilledCodeBlock()  # (each row's PIDs line, on disk till the table is made)
    rows = 0
    retried = more = False

    def cells() -> Iterator[list[str]]:
        nonlocal rows, retried, more
        for row, line in _period_rows(result, reasoning, full):
            if not full and rows == MAX_TABLE_ROWS:
                more = True  # (the report's table stops: the rest are evidence.md's)
                return
            rows += 1
            retried = retried or ", attempt " in row[2]
            pids.add(line)
            yield row

    verdict = ["Verdict"] if full else []
    yield from table_lines(
        ["Index", "Workload / seed", "Actual job / period", "GPUs", *verdict,
         "Actor update finished", "Post-update sync finished", "Raw peak MiB"],
        cells(), ["---", "---", "---", "---:", *(["---"] if full else []), "---", "---", "---:"],
    )
    if retried:
        yield ""
        yield ("A retried period has a row per attempt; its times and peak are those of the "
               "attempt its verdict rests on.")
    if more:
        yield ""
        yield "The other rows are in [`evidence.md`](evidence.md) and `periods.parquet`."
    yield from ("", "Worker PIDs in rank order:", "")
    yield from pids


def _locator(result: AuditResult) -> str:
    collected = result.collected
    integrity = collected.evidence_statuses()
    listed = sum(n for s, n in integrity.items() if s != "unlisted")
    hosts = any(worker.host for period in collected.timeline for attempt in period.attempts
                for worker in attempt.spec.workers)  # (v1.2 names: host and pid)
    lines = ["## Evidence locator", ""]
    lines.append(code_block([
        f"BASE={collected.root}",
        _pair_pattern(result),
        _attempt_pattern(result),
        "",
        f"ATTEMPT/{ALLOCATOR_TRACE.shown_form(host=hosts)}",
        f"ATTEMPT/{DEVICE_EVIDENCE.shown_form(host=hosts).replace('<role>', _role(result))}",
        f"ATTEMPT/{TRAINING_LOG.shown.replace('<job>', '<actual-job>')}",
        f"ATTEMPT/{TRIAL.shown.replace('<job>', '<actual-job>')}",
        "BASE/pairs/PAIR/period-<period>.json",
    ]))
    lines.append("")
    unreadable = sum(1 for p in collected.periods if not p.record.readable)
    # (summary.json's files_listed counts the period records too: the sum is said first)
    total = f"{listed + len(collected.periods):,} files listed"
    if listed == integrity.get("verified", 0) and not integrity.get("unlisted") \
            and not unreadable:
        lines.append(f"Integrity: {total}: all {listed:,} evidence files verified (SHA-256 and "
                     "size against their period record), all "
                     f"{len(collected.periods):,} period records read; no unlisted file.")
    else:
        lines.append(
            f"Integrity: {total}: {listed:,} evidence files, {integrity.get('verified', 0):,} "
            f"verified (SHA-256 and size against their period record), "
            f"{integrity.get('mismatched', 0):,} mismatched, {integrity.get('missing', 0):,} "
            f"missing, {integrity.get('unsafe', 0):,} unsafe paths, "
            f"{integrity.get('unreadable', 0):,} unreadable; "
            f"{integrity.get('unlisted', 0):,} unlisted files. {len(collected.periods):,} "
            f"period records read, {unreadable:,} unreadable.")
    lines += ["", _cross_checks(result)]
    return "\n".join(lines)


def _pair_pattern(result: AuditResult) -> str:
    """``PAIR=`` as the pairs are named: their workload and seed as placeholders when every
    pair's name holds them, else an example."""
    patterns = set()
    for period in result.collected.periods:
        record = period.record
        name = record.pair
        if record.workload and record.seed is not None and record.workload in name \
                and str(record.seed) in name:
            name = name.replace(record.workload, "<workload>", 1)
            head, _, tail = name.rpartition(str(record.seed))
            patterns.add(f"{head}<seed>{tail}")
        else:
            patterns.add("")
    if len(patterns) == 1 and "" not in patterns:
        return f"PAIR={next(iter(patterns))}"
    example = result.collected.periods[0].record.pair if result.collected.periods else "?"
    return f"PAIR=<pair>   (e.g. {example})"


def _attempt_pattern(result: AuditResult) -> str:
    """``ATTEMPT=`` as the attempt directories are named (pair, GPUs and job as
    placeholders), else the contract's usual layout."""
    patterns = set()
    for period in result.collected.periods:
        for attempt in period.attempts:
            folder, job = attempt.spec.attempt_dir, attempt.spec.job_id
            if not folder or not job or not folder.startswith(period.record.pair):
                patterns.add("")
                continue
            rest = folder[len(period.record.pair):]
            if period.record.gpus is not None:
                rest = rest.replace(f"{period.record.gpus}gpu", "<gpus>gpu", 1)
            patterns.add("PAIR" + rest.replace(job, "<actual-job>"))
    shown = next(iter(patterns)) if len(patterns) == 1 and "" not in patterns \
        else "PAIR-<gpus>gpu/attempt-<actual-job>"
    return f"ATTEMPT=BASE/{shown}"


def _role(result: AuditResult) -> str:
    roles = device_values(result, "role")
    role = next(iter(roles)) if len(roles) == 1 else None
    return role or "<role>"


def _cross_checks(result: AuditResult) -> str:
    """One sentence per cross-check family: what was checked and how it came out."""
    fired = Counter(f.rule_id for f in result.findings)
    traces = idle_ok = readable = 0
    for period in result.collected.periods:  # (one pass, none held)
        record = period.record
        if record.readable:
            readable += 1
            traces += sum(len(a.traces) for a in period.attempts)
            idle_ok += record.idle_check is not None and record.idle_check.passed is True

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
        f"post-period idle checks: {idle_ok:,} of {readable:,} passed."
    )


