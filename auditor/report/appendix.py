"""The report's closing sections: accounting in its overlapping scopes, launcher
disagreements, waivers, findings, plots and provenance."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from auditor._io import counted
from auditor.catalogue import describe
from auditor.model import DEFAULT_PROTOCOL, AuditResult, ElementCost, Reasoning, Severity
from auditor.report.mdformat import code_block, code_span, md_escape, number, table
from auditor.report.tables import sorted_findings

MAX_FINDINGS_LISTED = 200
MAX_NAMED_PERIODS = 500
NS = 1_000_000_000


def arrays_of(result: AuditResult) -> list[str]:
    """The study's arrays: as its period records name them, else as the accounted sacct
    rows do (records without an ``array_job_id``)."""
    named = {p.record.array_job_id for p in result.collected.periods if p.record.array_job_id}
    return sorted(named or {e.array_job_id for e in result.reasoning.accounting.elements
                            if e.array_job_id})


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
    if acc.elements:
        lines.append(table(
            ["Element", "JobIDRaw", "State", "ElapsedRaw s", "GPUs", "GPU-seconds"],
            ([md_escape(e.job_id), md_escape(e.job_id_raw or "—"), md_escape(e.state),
              str(e.elapsed_s) if e.elapsed_s is not None else "—",
              str(e.gpus) if e.gpus is not None else "—",
              f"{e.gpu_seconds:,}" if e.gpu_seconds is not None else "—"]
             for e in acc.elements),
            ["---", "---", "---", "---:", "---:", "---:"],
        ))
        lines.append("")
    missing = acc.jobs_without_element
    unknown = ("no scheduler dump was read" if not collected.scheduler_usable() else
               "the scheduler dump lacks the allocations' GPUs or elapsed times (`AUD019`)")
    allocation = (
        f"**unknown**: {unknown}" if acc.allocation_gpu_seconds is None else
        f"**{acc.allocation_gpu_seconds:,} GPU-seconds = "
        f"{acc.allocation_gpu_seconds / 3600:.9f} GPU-hours**")
    outside = outside_arrays(result, acc.elements)
    over = "elements" if not outside else (
        f"the array's elements and the {number(len(outside))} "
        f"job{'s' if len(outside) != 1 else ''} outside it that ran "
        f"attempts ({', '.join(code_span(e.job_id) for e in outside[:MAX_NAMED_PERIODS])})")
    lines.append(
        f"Allocation scope (outer elapsed seconds × allocated GPUs, summed over {over}): "
        f"{allocation}"
        + (f", over the {number(len(acc.elements))} elements the scheduler's dump reports: "
           f"{counted(len(missing), 'attempt job')} without an element row "
           f"({', '.join(code_span(j) for j in missing[:MAX_NAMED_PERIODS])}"
           f"{', ...' if len(missing) > MAX_NAMED_PERIODS else ''}) "
           f"{'is' if len(missing) == 1 else 'are'} not counted, and "
           f"{'its' if len(missing) == 1 else 'their'} reservation scope counts the period's "
           "GPUs, the allocation's being unknown" if missing else "") + ". "
        f"Task scope (each attempt's invocation time × the GPUs its period used): "
        f"{acc.task_gpu_seconds:,.6f} GPU-seconds ({acc.task_gpu_seconds / 3600:.9f} GPU-hours). "
        f"Reservation scope (invocation time × the GPUs the allocation held): "
        + (f"**unknown**: {unknown}. " if acc.reservation_gpu_seconds is None else
           f"{acc.reservation_gpu_seconds:,.6f} GPU-seconds "
           f"({acc.reservation_gpu_seconds / 3600:.9f} GPU-hours). ")
        + "**These overlapping scopes must not be added.**"
    )
    lines.append("")
    lines.append(
        f"Wasted attempts (retried after a completed attempt): {acc.wasted_attempts}, "
        f"{acc.wasted_gpu_seconds:,.6f} task-scope GPU-seconds. Unresolved periods account for "
        f"{acc.unresolved_gpu_seconds:,.6f} task-scope GPU-seconds."
    )
    if reasoning.configurations:
        lines.append("")
        lines.append(table(
            ["Configuration", "Status", "Outcome", "Periods", "Task GPU-s", "Reservation GPU-s"],
            ([md_escape(c.key), c.status, c.outcome or "—", str(len(c.periods)),
              f"{c.task_gpu_seconds:,.6f}", "unknown" if c.reservation_gpu_seconds is None
              else f"{c.reservation_gpu_seconds:,.6f}"]
             for c in reasoning.configurations),
            ["---", "---", "---", "---:", "---:", "---:"],
        ))
    return "\n".join(lines)


def disagreements_section(reasoning: Reasoning) -> str:
    if not reasoning.disagreements:
        return ""
    lines = ["## Launcher and auditor disagree", "",
             "The launcher's own `status` is reported beside the auditor's verdict; the "
             "auditor never copies it.", ""]
    lines.append(table(
        ["Period", "Launcher status", "Launcher validation error", "Auditor verdict"],
        ([md_escape(s), md_escape(st), md_escape(err or "—"), v]
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
        ([md_escape(w.rule_id), md_escape(w.subject), md_escape(w.reason), str(w.matched)]
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
        head = (f"{len(items):,} findings: {kinds}. Every finding, with all its citations, "
                "is in `findings.parquet`.")
    lines = ["## Findings", "", head]
    by_rule = Counter((f.rule_id, f.symbol, f.severity.value) for f in items)
    if by_rule:
        lines += ["", table(["Rule", "Symbol", "Severity", "Count"],
                            ([r, s, sev, str(n)] for (r, s, sev), n in sorted(by_rule.items())),
                            ["---", "---", "---", "---:"])]
    shown = [f for f in items if f.severity.value != "info"][:MAX_FINDINGS_LISTED]
    if shown:
        lines += ["", table(["Rule", "Subject", "Message", "Cited"],
                            ([f.rule_id, md_escape(f.subject), md_escape(f.message),
                              "; ".join(code_span(c.locator(), 120) for c in f.citations[:3])
                              or "—"] for f in shown))]
        hidden = sum(1 for f in items if f.severity.value != "info") - len(shown)
        if hidden > 0:
            lines += ["", f"{hidden} further errors and warnings are in `findings.parquet`."]
    return "\n".join(lines)


def plots_section(outputs: Sequence[tuple[str, str, int]]) -> str:
    plots = [name for name, _, _ in outputs if name.endswith(".png")]
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
    text = (f"Sealing: {counted(len(delays), 'period record')} sealed by "
            f"{', '.join(code_span(s) for s in sealers) or 'auditor seal'}, "
            f"{seconds[0]:.0f} to {seconds[-1]:,.0f} s after the attempt's end")
    if unsealed:
        text += f"; {number(unsealed)} not sealed by it"
    if late:
        text += (f"; {number(len(late))} more than an hour after (`AUD125`: the manifest "
                 "proves no change since then, not before): "
                 + ", ".join(code_span(subject) for subject, _ in late[:MAX_NAMED_PERIODS]))
    return text + "."


def provenance_section(result: AuditResult, outputs: Sequence[tuple[str, str, int]]) -> str:
    collected = result.collected
    lines = ["## Provenance", ""]
    protocol = collected.protocol
    # an error about protocol.json fails the gate (the verdicts were reached under other
    # rules): provenance says which, the summary's AUD014 first
    problem = next((f for f in sorted(collected.findings, key=lambda f: f.rule_id != "AUD014")
                    if f.subject == "protocol.json" and f.severity is Severity.ERROR), None)
    said = md_escape(describe(problem), limit=300) if problem else ""
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
        pinned = ("matches `execution_commits.json` for every pair"
                  if collected.execution_commits is not None and not any(
                      f.rule_id == "AUD121" for f in result.findings)
                  else "is not confirmed by `execution_commits.json`"
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
        lines += ["", "Anchors: none given (no `--anchor`, none in the protocol): no protocol "
                      "input was checked against an expected SHA-256."]
    groups = collected.input_counts()
    lines += ["", f"Inputs read and hashed: {groups.get('raw_evidence', 0):,} raw-evidence, "
                  f"{groups.get('source_inputs', 0):,} source-input and "
                  f"{groups.get('protocol_inputs', 0):,} protocol-input files, each listed with "
                  "its SHA-256 and size in `output_manifest.json`."]
    sources = [i for i in collected.inputs if i.group == "source_inputs"]
    if sources:
        lines += ["", code_block(f"{i.path}  {i.digest.sha256}" for i in sources)]
    if outputs:
        lines += ["", "Other outputs of this audit (the output manifest lists these and this "
                      "report; `auditor verify` re-checks them):", ""]
        lines.append(code_block(f"{name}  {sha}  {size}" for name, sha, size in outputs))
    return "\n".join(lines)

