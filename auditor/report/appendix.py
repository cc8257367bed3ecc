"""The report's closing sections: accounting in its overlapping scopes, launcher
disagreements, waivers, findings, plots and provenance."""

from __future__ import annotations

import hashlib
import heapq
from collections import Counter
from collections.abc import Iterator, Sequence
from itertools import islice

from auditor._text import counted, printable
from auditor.model import (
    DEFAULT_PROTOCOL,
    AuditResult,
    ElementCost,
    InputFile,
    Reasoning,
    Severity,
)
from auditor.model.results import folder_of
from auditor.report.groups import named_arrays
from auditor.report.mdformat import code_block, code_span, figure, number, prose, table
from auditor.report.tables import sorted_findings
from auditor.rules import describe, located

MAX_FINDINGS_LISTED = 200
MAX_OTHERS_LISTED = 5
"""Errors and warnings about no single period the report lists (all: ``evidence.md``)."""
MAX_NAMED_PERIODS = 500
ELAPSED_SHOWN = 12
"""The most elements' elapsed times the accounting section spells out in its sentence."""
NS = 1_000_000_000


def arrays_of(result: AuditResult) -> list[str]:
    """The study's arrays: as its period records name them, else as the accounted sacct
    rows do (records without an ``array_job_id``)."""
    named = named_arrays(result)
    return sorted(named or {e.array_job_id for e in result.reasoning.accounting.elements
                            if e.array_job_id})


def _requeued(gpu_seconds: int | None, elements: Sequence[ElementCost]) -> str:
    """The allocation scope's share that runs lost to requeue or preemption held."""
    if not gpu_seconds:
        return ""
    named = ", ".join(code_span(e.job_id) for e in elements[:MAX_NAMED_PERIODS])
    return (f", of which **{gpu_seconds:,} GPU-seconds were held by runs lost to requeue or "
            f"preemption** ({named})")


def _history_missing(result: AuditResult) -> str:
    """Said when the dump lacks the earlier runs of requeued elements (captured without
    ``sacct -D``: an element still REQUEUED, or Restarts above the records present)."""
    sacct = result.collected.sacct
    lacking = sacct is not None and (
        any(f.rule_id == "AUD024" for f in sacct.findings)
        or any(job.state == "REQUEUED" for job in sacct.jobs)
        # (a requeued run the evidence shows, no record of its own: a dump without Restarts)
        or any(f.rule_id == "AUD119" and f.value("restart") is not None
               for f in result.findings))
    return (" The dump was captured without `sacct -D`: the earlier runs of requeued elements "
            "are missing from it, and so are the GPU-seconds they held." if lacking else "")


def _outside(outside: Sequence[ElementCost], gpu_seconds: int | None) -> str:
    """The jobs outside the array that ran attempts: not part of the allocation scope (the
    contract defines it per array element), counted apart."""
    if not outside:
        return ""
    jobs = ", ".join(code_span(e.job_id) for e in outside[:MAX_NAMED_PERIODS])
    figure_text = "unknown" if gpu_seconds is None else f"{gpu_seconds:,} GPU-seconds"
    many = len(outside) != 1
    return (f". The {number(len(outside))} job{'s' if many else ''} outside the array that "
            f"ran attempts ({jobs}, {'retries' if many else 'a retry'} submitted on "
            f"{'their' if many else 'its'} own) {'are' if many else 'is'} not part of that "
            f"scope: **{figure_text}**, counted apart")


def _unrelated(result: AuditResult, elements: Sequence[ElementCost]) -> str:
    """The dump's rows of jobs the study did not run (another array, a job of no attempt):
    left out of every scope, and said, so the figures are not read as the dump's total."""
    sacct = result.collected.sacct
    counted_ids = {e.job_id for e in elements}
    others = [job for job in (sacct.jobs if sacct is not None else ())
              if job.job_id not in counted_ids]
    if not others:
        return ""
    jobs = ", ".join(code_span(job.job_id) for job in others[:MAX_NAMED_PERIODS])
    more = f" and {len(others) - MAX_NAMED_PERIODS:,} more" \
        if len(others) > MAX_NAMED_PERIODS else ""
    seconds = sum(v for job in others for record in job.records
                  if (v := record.gpu_seconds) is not None)
    return (f" The dump also holds {counted(len(others), 'job')} the study did not run "
            f"({jobs}{more}: no array of its records, no attempt's job; {seconds:,} "
            "GPU-seconds known), counted in no scope.")


def outside_arrays(result: AuditResult, elements: Sequence[ElementCost]
                    ) -> tuple[ElementCost, ...]:
    """The accounted jobs that are no element of the study's arrays (a retry submitted as a
    job of its own), by sacct's own JobID (none when the dump has no JobID: ``AUD021``)."""
    sacct = result.collected.sacct
    if sacct is None or "jobid" not in {field.lower() for field in sacct.fields}:
        return ()
    arrays = set(arrays_of(result))
    return tuple(e for e in elements if e.array_job_id not in arrays)



def accounting_section(result: AuditResult, reasoning: Reasoning) -> str:
    acc = reasoning.accounting
    collected = result.collected
    lines = ["## Accounting", ""]
    sacct_input = next((i for i in collected.inputs if i.path == collected.sacct_display), None)
    if collected.sacct_display:
        lines.append("Saved scheduler response:")
        lines.append("")
        lines.append(code_block([collected.sacct_display] + (
            [f"SHA256: {sacct_input.digest.sha256}"] if sacct_input else [])))
        lines.append("")
        arrays = " ".join(arrays_of(result)) or "<array>"
        lines.append("Expected capture (`TZ=UTC`, `SLURM_TIME_FORMAT=standard`):")
        lines.append("")
        lines.append(code_block([
            f"sacct -n -P -j {arrays} --format=JobID,JobIDRaw,JobName,State,ExitCode,Start,"
            "End,ElapsedRaw,AllocTRES,NodeList,Reason"]))
        lines.append("")
    uniform = len({(e.state, e.gpus) for e in acc.elements}) == 1 and all(
        e.elapsed_s is not None and e.gpus is not None for e in acc.elements) \
        and not outside_arrays(result, acc.elements)  # (else the table says which is which)
    if acc.elements and uniform and len(acc.elements) > 1:  # (the table would repeat itself)
        first, last = acc.elements[0], acc.elements[-1]
        shown = acc.elements[:ELAPSED_SHOWN]  # (a large array's: evidence.md has each)
        more = len(acc.elements) - len(shown)
        lines.append(f"Elements {code_span(first.job_id)} to {code_span(last.job_id)}, all "
                     f"{code_span(first.state)} at {first.gpus} GPUs: `ElapsedRaw` "
                     + ", ".join(str(e.elapsed_s) for e in shown) + " s"
                     + (f" and {more:,} more ([`evidence.md`](evidence.md))." if more else "."))
        lines.append("")
    elif acc.elements:
        each = "The element's" if len(acc.elements) == 1 else \
            f"Each of the {number(len(acc.elements))} elements'"
        lines.append(f"{each} state, `ElapsedRaw`, GPUs and GPU-seconds: "
                     "[`evidence.md`](evidence.md).")
        lines.append("")
    missing = acc.jobs_without_element
    unknown = ("no scheduler dump was read" if not collected.scheduler_usable() else
               "the scheduler dump lacks the allocations' GPUs or elapsed times (`AUD019`)")
    unmeasured = collected.protocol.scheduler == "none" and collected.sacct is None
    allocation = (
        "**not measured**: the study ran without a scheduler (`\"scheduler\": \"none\"`)"
        if unmeasured else
        f"**unknown**: {unknown}" if acc.allocation_gpu_seconds is None else
        f"**{'at least ' if acc.allocation_records_unknown else ''}"
        f"{acc.allocation_gpu_seconds:,} GPU-seconds = "
        f"{acc.allocation_gpu_seconds / 3600:.9f} GPU-hours**"
        + (f" (the GPU-seconds of {counted(acc.allocation_records_unknown, 'record')} are "
           "unknown: no elapsed time or no GPU count in the dump; "
           "[`evidence.md`](evidence.md) lists each)" if acc.allocation_records_unknown
           else ""))
    outside = outside_arrays(result, acc.elements)
    # (an attempt without its invocation time counts 0: the attempts' figures are then
    # lower bounds, as the allocation's is with records of unknown length)
    least = "at least " if acc.attempts_without_times else ""
    untimed = (f" ({counted(acc.attempts_without_times, 'attempt')} without an invocation time "
               f"{'counts' if acc.attempts_without_times == 1 else 'count'} none: no trial "
               "record, or one without its start or end)" if acc.attempts_without_times else "")
    requeued = [e for e in acc.elements if e.attempts or e.state == "PREEMPTED"]
    over = "elements" if not requeued else \
        "every record of each array element, `sacct -D`'s earlier runs included" \
        if any(e.attempts for e in requeued) else "every record of each array element"
    lines.append(
        f"Allocation scope (outer elapsed seconds × allocated GPUs, summed over {over}): "
        f"{allocation}" + _requeued(acc.requeued_gpu_seconds, requeued)
        + _outside(outside, acc.outside_array_gpu_seconds)
        + (f", over the {number(len(acc.elements))} elements the scheduler's dump reports: "
           f"{counted(len(missing), 'attempt job')} without an element row "
           f"({', '.join(code_span(j) for j in missing[:MAX_NAMED_PERIODS])}"
           f"{', ...' if len(missing) > MAX_NAMED_PERIODS else ''}) "
           f"{'is' if len(missing) == 1 else 'are'} not counted, and "
           f"{'its' if len(missing) == 1 else 'their'} reservation scope counts the period's "
           "GPUs, the allocation's being unknown" if missing else "") + ". "
        f"Task scope (each attempt's invocation time × the GPUs its period used): "
        f"{least}{figure(acc.task_gpu_seconds)} GPU-seconds{untimed}. "
        "Reservation scope (invocation time × the GPUs the allocation held): "
        + (f"**unknown**: {unknown}. " if acc.reservation_gpu_seconds is None else
           f"{least}{figure(acc.reservation_gpu_seconds)} GPU-seconds. ")
        + "**These overlapping scopes must not be added.**"
        + _history_missing(result) + _unrelated(result, acc.elements)
    )
    lines.append("")
    lines.append(
        (f"Wasted attempts (retried after a completed attempt): {acc.wasted_attempts}, "
         f"{_least(acc.wasted_at_least)}{figure(acc.wasted_gpu_seconds)} task-scope "
         "GPU-seconds. " if acc.wasted_attempts
         else "No attempt was wasted. ") + "Unresolved periods account for "
        f"{_least(acc.unresolved_at_least)}{figure(acc.unresolved_gpu_seconds)} task-scope "
        "GPU-seconds"
        + ("; each configuration's are in `summary.json`." if reasoning.configurations
           else ".")
    )
    return "\n".join(lines)


def _least(lower_bound: bool) -> str:
    return "at least " if lower_bound else ""


def elements_table(reasoning: Reasoning) -> str:
    """Every accounted element's row (``evidence.md``'s; the report sums them)."""
    acc = reasoning.accounting
    if not acc.elements:
        return ""
    def row(e: ElementCost, name: str) -> list[str]:
        return [name, code_span(e.job_id_raw) if e.job_id_raw else "—", code_span(e.state),
                str(e.elapsed_s) if e.elapsed_s is not None else "—",
                str(e.gpus) if e.gpus is not None else "—",
                f"{e.gpu_seconds:,}" if e.gpu_seconds is not None else "—"]
    # (a requeued element's earlier runs, sacct -D's records, held the GPUs too: the
    # allocation scope sums them, so their rows are here, oldest first, above its last)
    return "\n".join(["## Scheduler elements", "", table(
        ["Element", "JobIDRaw", "State", "ElapsedRaw s", "GPUs", "GPU-seconds"],
        (line for e in acc.elements for line in (
            *(row(earlier, f"{code_span(e.job_id)} (run {n} of {len(e.attempts) + 1})")
              for n, earlier in enumerate(e.attempts, 1)),
            row(e, code_span(e.job_id) if not e.attempts else
                f"{code_span(e.job_id)} (run {len(e.attempts) + 1}, the last)"))),
        ["---", "---", "---", "---:", "---:", "---:"])])


def disagreements_section(reasoning: Reasoning) -> str:
    """The report's: how often the launcher's own status disagrees, the periods it would
    have rerun although they resolved named (the table is in ``evidence.md``)."""
    found = reasoning.disagreements
    if not found:
        return ""
    by = Counter((status, verdict) for _, status, _, verdict in found)
    resolved = [subject for subject, _, _, verdict in found if verdict == "resolved"]
    text = (f"The launcher's own status disagrees with the auditor's verdict for "
            f"{counted(len(found), 'period')}: "
            + ", ".join(f"{code_span(status)} where the verdict is {verdict} ({n:,})"
                        for (status, verdict), n in sorted(by.items()))
            + ". The auditor never copies it.")
    if resolved:
        text += (" Resolved although the launcher says otherwise: "
                 + ", ".join(code_span(s, 300) for s in resolved[:MAX_NAMED_PERIODS])
                 + (", ..." if len(resolved) > MAX_NAMED_PERIODS else "") + ".")
    return "\n".join(["## Launcher and auditor disagree", "", text + " Each, with the "
                       "launcher's validation error, is in [`evidence.md`](evidence.md) and "
                       "`summary.json` (`disagreements`)."])


def disagreements_table(reasoning: Reasoning) -> str:
    """``evidence.md``'s table of every disagreement."""
    if not reasoning.disagreements:
        return ""
    lines = ["## Launcher and auditor disagree", "",
             "The launcher's own `status` is reported beside the auditor's verdict; the "
             "auditor never copies it.", ""]
    lines.append(table(
        ["Period", "Launcher status", "Launcher validation error", "Auditor verdict"],
        ([code_span(s), code_span(st), prose(err or "—"), v]
         for s, st, err, v in reasoning.disagreements),
    ))
    return "\n".join(lines)


def waivers_section(reasoning: Reasoning) -> str:
    if not reasoning.waivers:
        return ""
    lines = ["## Waivers", "", "Waived findings no longer block the gate; they are listed here "
             "so the waiver is never silent.", ""]
    lines.append(table(
        ["Rule", "Subject", "Reason", "Gate reasons lifted"],
        ([code_span(w.rule_id), code_span(w.subject), prose(w.reason), str(w.matched)]
         for w in reasoning.waivers),
    ))
    return "\n".join(lines)


def findings_section(result: AuditResult) -> str:
    items = sorted_findings(result)
    counts = Counter(f.severity.value for f in items)
    kinds = (f"{counted(counts.get('error', 0), 'error')}, "
             f"{counted(counts.get('warning', 0), 'warning')}, "
             f"{counts.get('info', 0):,} informational")
    if result.findings_not_kept:
        head = (f"{len(items):,} findings kept: {kinds}; "
                f"{counted(result.findings_not_kept, 'more finding')} were counted but not "
                "kept, as findings limits were reached (`AUD013` says where). "
                "Every finding kept, with all its citations, is in `findings.parquet`.")
    else:
        head = (f"{counted(len(items), 'finding')} ({kinds}), each with its citations in "
                "`findings.parquet`.")
    lines = ["## Findings", "", head + " Counted by rule: [`evidence.md`](evidence.md)."]
    # a period's findings are its diagnosis; the others (a study's, an array's, a
    # configuration's, a file's) are said nowhere else
    periods = {v.subject for v in result.verdicts}
    others = [f for f in items if f.severity is not Severity.INFO and f.subject not in periods]
    if others:  # (a file's finding a verdict rests on is its period's: its rule is listed there)
        candidates = {(f.rule_id, f.subject, f.message) for f in others}
        subjects = {f.subject for f in others}  # (a million periods' findings: none kept)
        rested = {key for v in result.verdicts for f in v.findings if f.subject in subjects
                  and (key := (f.rule_id, f.subject, f.message)) in candidates}
        others = [f for f in others if (f.rule_id, f.subject, f.message) not in rested]
    owners = result.periods_of_files(others)
    files = [(f, owner) for f in others if (owner := owners.get(folder_of(f.subject)))]
    others = [f for f in others if not owners.get(folder_of(f.subject))]
    for title, listed in (("Errors and warnings about a period's files:", files),
                          ("Errors and warnings about no single period:",
                           [(f, []) for f in others])):
        if not listed:
            continue
        lines += ["", title, ""]
        lines.extend(f"- {code_span(f.rule_id)} {code_span(where)}"
                     + (f" ({', '.join(code_span(s) for s in owner)})" if owner else "")
                     + f": {prose(what, 300)}" for f, owner in listed[:MAX_OTHERS_LISTED]
                     for where, what in [located(f)])
        if len(listed) > MAX_OTHERS_LISTED:
            lines.append(f"- and {len(listed) - MAX_OTHERS_LISTED:,} more in "
                         "`findings.parquet`")
    return "\n".join(lines)


def findings_table(result: AuditResult) -> str:
    """``evidence.md``'s count of findings by rule."""
    by_rule = Counter((f.rule_id, f.symbol, f.severity.value) for f in sorted_findings(result))
    if not by_rule:
        return ""
    return "\n".join(["## Findings by rule", "", table(
        ["Rule", "Symbol", "Severity", "Count"],
        ([r, s, sev, str(n)] for (r, s, sev), n in sorted(by_rule.items())),
        ["---", "---", "---", "---:"])])


def plots_section(outputs: Sequence[str]) -> str:
    plots = [name for name in outputs if name.endswith(".png")]
    if not plots:
        return ""
    lines = ["## Plots", ""]
    lines.extend(f"![{name.rsplit('/', 1)[-1][:-4].replace('_', ' ')}]({name})" for name in plots)
    return "\n".join(lines)


def _sealing(result: AuditResult) -> str:
    """When each period sealed by ``auditor seal`` was sealed, relative to its last
    attempt's end: a manifest proves no change since it was sealed, not before."""
    delays = [(p.subject, delay) for p in result.collected.periods
              if (delay := p.seal_delay_ns()) is not None]
    unsealed = sum(1 for p in result.collected.periods if p.record.sealed_ns is None)
    if not delays:
        return ""
    late = [(subject, delay) for subject, delay in delays if delay > 3600 * NS]
    sealers = sorted({p.record.sealed_by for p in result.collected.periods
                      if p.record.sealed_by})
    seconds = sorted(delay / NS for _, delay in delays)
    def when(delay: float) -> str:  # (before the end the trial records: another node's
        # clock, or a seal made too early)
        return f"{delay:,.0f} s after" if delay >= 0 else f"{-delay:,.0f} s before"
    low, high = seconds[0], seconds[-1]
    span = when(low) if f"{low:.0f}" == f"{high:.0f}" else \
        f"{low:.0f} to {high:,.0f} s after" if low >= 0 else f"{when(low)} to {when(high)}"
    text = (f"Sealing: {counted(len(delays), 'period record')} sealed by "
            f"{', '.join(code_span(s) for s in sealers) or 'auditor seal'}, "
            f"{span} the attempt's end")
    if unsealed:
        text += f"; {number(unsealed)} not sealed by it"
    if late:
        text += (f"; {number(len(late))} more than an hour after (`AUD125`: the manifest "
                 "proves no change since then, not before): "
                 + ", ".join(code_span(subject) for subject, _ in late[:MAX_NAMED_PERIODS]))
    return text + "."


def provenance_section(result: AuditResult, outputs: Sequence[str]) -> str:
    collected = result.collected
    lines = ["## Provenance", ""]
    protocol = collected.protocol
    # an error about protocol.json fails the gate (the verdicts were reached under other
    # rules): provenance says which, the summary's AUD014 first
    problem = next(iter(sorted(
        (f for f in collected.findings
         if f.subject == "protocol.json" and f.severity is Severity.ERROR),
        key=lambda f: f.rule_id != "AUD014")), None)
    said = prose(describe(problem), limit=300) if problem else ""
    if problem is not None and (not protocol.digest
                                or protocol.name == DEFAULT_PROTOCOL.name):
        digest = f", SHA-256 `{protocol.digest.sha256}`," if protocol.digest else ""
        lines.append(f"`protocol.json`{digest} could not be used ({said}): the built-in "
                     "default rules applied, and the gate fails.")
    elif protocol.path and protocol.digest:
        lines.append(f"Protocol {code_span(protocol.name)} from {code_span(protocol.path)}, "
                     "SHA-256 "
                     f"`{protocol.digest.sha256}`"
                     + (f" (in error: {said}; the gate fails)." if problem
                        else "."))
    else:
        lines.append("No `protocol.json`: the built-in default rules applied.")
    commits = sorted({p.record.commit for p in collected.periods if p.record.commit})
    if commits:
        lines.append("")
        pinned = (f"`execution_commits.json` requires {'it' if len(commits) == 1 else 'them'} "
                  "for every pair"
                  if collected.execution_commits is not None and not any(
                      f.rule_id == "AUD121" for f in result.findings)
                  else "no `execution_commits.json` confirms "
                  + ("it" if len(commits) == 1 else "them")
                  + (" (the study has none)" if collected.layout.execution_commits is None
                     else " (it could not be used: see findings)")
                  if collected.execution_commits is None else
                  "DIFFERS from `execution_commits.json` for some pairs (see findings)")
        lines.append("Commit(s) recorded by the period records: "
                     + ", ".join(code_span(c) for c in commits) + f"; {pinned}.")
    sealing = _sealing(result)
    if sealing:
        lines += ["", sealing]
    anchors = result.anchor_status()
    if anchors:
        lines += ["", "Anchors:", ""]
        lines.append(code_block(f"{name}: {sha}  {status}" for name, sha, status in anchors))
    else:
        lines += ["", "Anchors: none given (no `--anchor`, none in the protocol)."]
    groups = collected.input_counts()
    lines += ["", f"Inputs read and hashed: {groups.get('raw_evidence', 0):,} raw-evidence, "
                  f"{groups.get('source_inputs', 0):,} source-input and "
                  f"{groups.get('protocol_inputs', 0):,} protocol-input files, in "
                  f"`output_manifest.json`; inputs digest: {inputs_digest(result)} (SHA-256 "
                  "of their sorted `path<TAB>sha256<TAB>size<LF>` lines)."]
    sources = [i for i in collected.inputs if i.group == "source_inputs"]
    if sources:
        lines += ["", code_block(f"{i.path}  {i.digest.sha256}" for i in sources)]
    if outputs:
        lines += ["", f"The output directory holds exactly {len(outputs) + 2:,} files; "
                      "`output_manifest.json` pins this report and the others (`auditor "
                      "verify` checks them)."]
    lines += ["", _assertions(result)]
    return "\n".join(lines)


def inputs_digest(result: AuditResult) -> str:
    """One digest of every input: SHA-256 of the sorted ``path\tsha256\tsize\n`` lines of
    the inputs the output manifest lists (paths as it writes them)."""
    collected = result.collected
    try:  # (the evidence files' lines come by path: in the lines' order, nearly always)
        return _digest(heapq.merge(sorted(map(_input_line, collected.inputs)),
                                   _in_order(map(_input_line, collected.hashed_inputs()))))
    except _OutOfOrder:  # (a name whose line sorts apart from its path: all sorted)
        return _digest(iter(sorted(map(_input_line, collected.all_inputs()))))


def _input_line(item: InputFile) -> str:
    return f"{printable(item.path)}\t{item.digest.sha256}\t{item.digest.size}\n"


class _OutOfOrder(Exception):
    """A line came before the one it follows."""


def _in_order(lines: Iterator[str]) -> Iterator[str]:
    """``lines``, checked to be sorted (else :class:`_OutOfOrder`): a path that is not
    UTF-8, or holds a control character below TAB, may sort apart from its line."""
    previous = ""
    for line in lines:
        if line < previous:
            raise _OutOfOrder
        previous = line
        yield line


def _digest(lines: Iterator[str]) -> str:
    digest = hashlib.sha256()
    while chunk := "".join(islice(lines, 4096)):
        digest.update(chunk.encode("utf-8"))
    return digest.hexdigest()


def _assertions(result: AuditResult) -> str:
    """What the outputs do and do not assert about the configurations."""
    unresolved = [c for c in result.reasoning.configurations if c.status != "resolved"]
    if not unresolved:
        return ("Every configuration resolved; `summary.json` lists each with its outcome.")
    gpus = "/".join(f"{g}" for g in sorted({c.gpus for c in unresolved}))
    return ("The outputs list the unresolved configurations explicitly ("
            + ", ".join(code_span(c.key) for c in unresolved[:MAX_NAMED_PERIODS])
            + f" in `summary.json`); no eligible {gpus}-GPU peak is asserted for them.")
