"""The rule table: every finding the auditor can produce, as data.

Each rule has a stable id (``AUD...``), a kebab-case symbol, a title, a
description of what triggers it, a message template (``str.format`` fields,
never evaluated code) and a severity. Stages create findings only through
:func:`finding`, so a finding can never carry an id the table lacks.

Numbering: ``AUD0xx`` collection (a file could not be read as its kind says),
``AUD1xx`` validation (integrity, identity, timeline, provenance), ``AUD2xx``
reasoning (exits, completion, infrastructure, attempts, configurations).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from auditor.model import Citation, Finding, Reason, Severity
from auditor.model.kinds import KINDS


@dataclass(frozen=True, slots=True)
class GatePolicy:
    """How a rule's findings fail the gate: one gate reason per (rule, subject)."""

    order: int
    """Where its reasons stand in the gate's list (lower first); every ``integrity`` rule's
    come before the configurations' reasons, the others' after."""
    integrity: bool
    """True: it fails even ``--allow-partial`` (evidence, anchors, the scheduler's word);
    False: only the plain gate, and a finding about a period is then carried by its
    configuration (one reason a period, not two)."""
    text: str
    """The reason as the gate lists it (``{subject}``, ``{message}`` filled in)."""


@dataclass(frozen=True, slots=True)
class Rule:
    """One entry of the rule table: what it says, and its policy."""

    rule_id: str
    symbol: str
    title: str
    description: str
    template: str
    severity: Severity
    blocks: Reason | None = None
    """The verdict reason a finding of this rule about an attempt's evidence makes its
    period unresolved with (the first blocker found decides); None when it blocks
    nothing by itself (informational, or judged by the reasoning itself)."""
    gate: GatePolicy | None = None
    """Whether and how a finding of this rule fails the gate (None: only through the
    verdicts and configurations it leads to)."""
    family: str | None = None
    """The report's cross-check sentence that counts it: ``identity``, ``job_ids`` or
    ``timeline`` (None: not a cross-check)."""
    forms: Mapping[str, str] = field(default_factory=dict)
    """Where one rule says what it found in several shapes (a name that is wrong, a pid
    that is nobody's), each shape's template by name: a finding names its form
    (``finding(..., form="not_a_worker", ...)``) and is rendered from it and its named
    values, never from a sentence made beforehand. :attr:`template` is then what the rule
    says in general (``auditor rules``)."""

    def template_of(self, form: object = None) -> str:
        """The template a finding of this rule in ``form`` is rendered from (None: the
        rule's own); a form the rule does not have is a bug, as an unknown rule id is."""
        if form is None:
            return self.template
        if not isinstance(form, str) or form not in self.forms:
            raise KeyError(f"{self.rule_id} has no form {form!r}")
        return self.forms[form]

    @property
    def stage(self) -> str:
        """``collect``, ``validate`` or ``reason``, from the id's hundreds."""
        return {"0": "collect", "1": "validate"}.get(self.rule_id[3], "reason")


E, W, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO
INVALID = Reason.EVIDENCE_INVALID
SCHEDULER = GatePolicy(1, True, "scheduler dump unusable: {message}")
"""The scheduler's word is evidence too: without it no element's state is known."""
FROZEN_INPUTS = frozenset({"protocol.json", "execution_commits.json"})
"""The study's own rules and commit pins: an error finding about either fails the gate
(whatever its rule: the verdicts were reached under other rules, or without the check)."""
FROZEN_GATE = GatePolicy(2, True, "frozen input unusable: {message}")
SACCT_ENDED = "{subject}: sacct reports {state} for job {job_id}"
"""A form of the rules of how an attempt ended: what the scheduler's dump said."""
LOG_LINE = "{subject}: {text} (log line {line})"
"""A form of the rules of how an attempt ended: what a line of the training log said."""
_KINDS = ", ".join(KINDS)
"""The evidence kinds the contract names, as the messages list them."""

_RULES: tuple[Rule, ...] = (
    # ---------------------------------------------------------------- collect
    Rule("AUD001", "json-invalid", "File is not valid JSON",
         "A JSON evidence file (period, trial, device, protocol) could not be parsed.",
         "{path}: not valid JSON: {error}", E,
         blocks=INVALID),
    Rule("AUD002", "schema-violation", "Field missing or of the wrong type",
         "A JSON document or JSONL record does not match its kind's JSON Schema.",
         "{path}{where}: {error}", E,
         blocks=INVALID),
    Rule("AUD003", "jsonl-line-invalid", "JSONL line is not a JSON object",
         "A line of an allocator trace (or a JSON line of a metrics file) is not JSON (or not "
         "an object); later lines still count. A metrics file's JSON document that cannot be "
         "parsed is said so too: the protocol's predicates cannot read it.",
         "{path}:{line}: not a JSON object: {error}", E,
         forms={"document": "{path}: not a JSON document the protocol's predicates can read "
                            "({error})"}),
    Rule("AUD004", "jsonl-truncated", "Last JSONL line has no newline",
         "The final line of a JSONL file ends without a newline: the writer may have been "
         "killed mid-record.", "{path}:{line}: final line has no trailing newline", W,
         forms={form: "{path}:{line}: final line has no trailing newline; " + text
                for form, text in (
                    ("too_long", "the line is too long to parse and is not counted"),
                    ("not_json", "it is not valid JSON (writer cut off?) and is not counted"),
                    ("kept", "it parses and is kept"),
                    ("unusable", "it parses but is not a usable record"))}),
    Rule("AUD005", "text-not-utf8", "Text is not valid UTF-8",
         "Bytes that are not UTF-8 were decoded with replacement characters.",
         "{path}:{line}: invalid UTF-8 (decoded with replacement)", INFO),
    Rule("AUD006", "nul-bytes", "File holds NUL bytes",
         "NUL bytes in a text file (often a crash or a sparse write).",
         "{path}:{line}: NUL bytes in line", W),
    Rule("AUD007", "line-clipped", "Line longer than the scan limit",
         "A line was longer than the per-line limit; only its start was examined "
         "(the whole line was still hashed).", "{path}:{line}: line of {length} bytes clipped "
         "to {limit}", W),
    Rule("AUD008", "sacct-row-malformed", "sacct row cannot be read",
         "A line of the scheduler dump has the wrong number of fields or unreadable values.",
         "{path}:{line}: {error}", W),
    Rule("AUD009", "sacct-refused", "sacct dump cannot be read safely",
         "The dump is fixed-width, has the wrong field count for its format, or is empty; it "
         "is refused rather than misread.", "{path}: {error}", E,
         gate=SCHEDULER),
    Rule("AUD020", "terminal-pattern-too-slow", "Protocol's terminal pattern given up",
         "The protocol's terminal_event.pattern searched one line of a training log for over "
         "a second (it backtracks without end on it): it was given up for the rest of that "
         "log, which the built-in matcher reads instead. Fix the pattern.",
         "{path}:{line}: terminal_event.pattern searched this line for over {seconds:g} s; "
         "given up for the rest of the log (the built-in matcher reads it)", E),
    Rule("AUD022", "pair-dir-link", "A pair directory is a link",
         "An entry under pairs/ is a symbolic link that may stand for a pair directory (it "
         "leads out of the evidence root, nowhere, or to a directory outside pairs/): it is "
         "never followed, so the period records it may hold are missing from the audit. The "
         "gate fails.",
         "{path}: a link in a pair directory's place; not followed, so the period records it "
         "may hold are missing from this audit", E,
         gate=GatePolicy(3, True, "unsafe path: {message}")),
    Rule("AUD025", "dir-unlistable", "A directory under pairs/ cannot be listed",
         "A pair directory (or pairs/ itself) cannot be listed (no read or search "
         "permission, an I/O error): the period records it may hold are missing from the "
         "audit. The gate fails.",
         "{path}: cannot be listed ({error}); the period records it may hold are missing "
         "from this audit", E,
         gate=GatePolicy(3, True, "unreadable: {message}")),
    Rule("AUD021", "sacct-states-unknown", "sacct dump says no element's state",
         "The dump was captured without JobID or State: whether an element is still pending "
         "or running cannot be known, so, as with no dump (AUD123), the gate fails unless "
         "waived.",
         "{path}: captured without {fields}: {consequence}; the gate fails unless waived", E,
         gate=SCHEDULER),
    Rule("AUD023", "sacct-header-mismatch", "sacct dump's header differs from --format",
         "The dump's header line (sacct run without -n) names other fields than the format "
         "the audit was given (--sacct-format, or --format of auditor sacct): the header, "
         "what the file itself says, is read, and the given format is ignored.",
         "{path}:{line}: {error}", W),
    Rule("AUD024", "sacct-history-missing", "sacct dump lacks the earlier runs' records",
         "sacct's Restarts counts more runs of an element than the dump has records for: it "
         "was captured without -D, so the earlier runs' records, and the GPU-seconds they "
         "held, are not in it (the allocation scope misses them).",
         "{path}: {consequence}", W),
    Rule("AUD027", "sacct-record-repeated", "sacct dump holds one run's record twice",
         "A job's allocation record comes again with the same Start: a run starts once, and "
         "a requeued run starts anew, so this is the same run read twice (a dump saved twice "
         "into one file, or a mid-run capture and a later one joined), not a run of its own: "
         "it is counted once, its later record giving its state, never as GPU-seconds lost "
         "to requeue.",
         "{path}:{line}: job {job} is recorded again with the Start of line {first}: one "
         "run, counted once{more}", W),
    Rule("AUD026", "sacct-not-utf8", "sacct dump saved as UTF-16 or UTF-32",
         "The scheduler dump opens with a UTF-16 (or UTF-32) byte-order mark: it went "
         "through PowerShell 5's > (Out-File) or a Windows editor's \"Unicode\" save, where "
         "sacct writes UTF-8. It was read decoded, all of it (the figures are the dump's); a "
         "value that was not ASCII (a job name, a reason) may have been changed on the way "
         "(PowerShell decodes a program's output in the console's code page). One that does "
         "not decode whole is refused (AUD009).",
         "{path}: {encoding} (a byte-order mark at byte 0); sacct writes UTF-8: it was read "
         "decoded; re-run sacct with its output redirected by a POSIX shell, or convert "
         "with `iconv -f {codec} -t UTF-8`", W),
    Rule("AUD019", "sacct-fields-missing", "sacct dump lacks fields the audit uses",
         "The dump was captured without a field the audit relies on (JobIDRaw, ExitCode, "
         "ElapsedRaw or Elapsed, AllocTRES, Start, End): what it would show is unknown.",
         "{path}: captured without {fields}: {consequence}", W),
    Rule("AUD010", "file-empty", "File is empty",
         "An evidence file has no bytes.", "{path}: file is empty", E,
         blocks=INVALID),
    Rule("AUD011", "period-record-unreadable", "Period record cannot be used",
         "A period record could not be read or parsed; its period is kept (from its path) "
         "and cannot resolve.", "{path}: period record unusable: {error}", E,
         gate=GatePolicy(4, True, "period record unreadable: {subject}")),
    Rule("AUD012", "file-too-large", "JSON document too large to parse",
         "A JSON document exceeds the size limit for its kind; it was hashed, not parsed.",
         "{path}: {size} bytes exceeds the {limit}-byte limit for {kind}", E,
         blocks=INVALID),
    Rule("AUD013", "findings-capped", "Too many findings for one file",
         "The per-file findings cap was reached; later findings of this file were counted, "
         "not kept.", "{path}: {dropped} further findings not kept (cap {cap})", W),
    Rule("AUD015", "period-path-mismatch", "Period record disagrees with its path",
         "The pair or period inside pairs/<pair>/period-<n>.json differs from its path.",
         "{path}: {field} is {inside!s} inside, {outside!s} in the path", E,
         blocks=Reason.IDENTITY_MISMATCH),
    Rule("AUD016", "phases-capped", "Too many phase records in one trace",
         "A trace holds more phase records than the auditor keeps; the first and last were "
         "kept, the middle counted.", "{path}: {dropped} phase records in the middle not kept "
         "(cap {cap})", W),
    Rule("AUD017", "log-ends-mid-line", "Training log ends mid-line",
         "The training log's last line has no newline: the log was cut while it was being "
         "written, so lines after the cut (a terminal line among them) may be lost.",
         "{path}:{line}: the log ends mid-line (no final newline)", W),
    Rule("AUD018", "evidence-kind-unknown", "Evidence entry of an unknown kind",
         f"A period record lists a file under a kind the contract does not name ({_KINDS}): "
         "the file is hash-checked but not parsed, and an attempt missing that kind is AUD107.",
         "{path}: {pointer} has kind {kind!r}, not one of " + _KINDS + "; {file} is only "
         "hash-checked", W),
    Rule("AUD014", "protocol-invalid", "Protocol file unusable",
         "protocol.json could not be used; built-in defaults apply where it failed.",
         "{path}: {error}", E),
    # --------------------------------------------------------------- validate
    Rule("AUD101", "evidence-missing", "Listed evidence file is missing",
         "A file listed in a period record does not exist.",
         "{path}: listed in {manifest} but missing", E,
         blocks=Reason.EVIDENCE_MISSING, gate=GatePolicy(0, True, "evidence missing: {subject}")),
    Rule("AUD102", "evidence-mismatch", "Evidence file differs from its manifest",
         "The SHA-256 or size of a listed file differs from its period record.",
         "{path}: {what} differs from {manifest} (expected {expected}, found {actual})", E,
         blocks=Reason.EVIDENCE_MISMATCH,
         gate=GatePolicy(0, True, "evidence mismatched: {subject}")),
    Rule("AUD103", "evidence-unsafe-path", "Manifest path escapes the root",
         "A listed path is absolute, has a '..' part, or resolves through a link outside the "
         "evidence root; the file is never opened.", "{path}: unsafe path ({why}) in {manifest}",
         E,
         blocks=Reason.EVIDENCE_UNSAFE, gate=GatePolicy(0, True, "evidence unsafe: {subject}")),
    Rule("AUD104", "evidence-unreadable", "Listed evidence file cannot be read",
         "A listed path is a directory, lacks read permission, or is a link loop.",
         "{path}: cannot be read ({why})", E,
         blocks=Reason.EVIDENCE_UNREADABLE,
         gate=GatePolicy(0, True, "evidence unreadable: {subject}")),
    Rule("AUD105", "evidence-unlisted", "File not listed in any manifest",
         "A file inside an attempt directory is listed in no period record, or a file under "
         "pairs/ is not named as a period record (pairs/<pair>/period-<n>.json).",
         "{path}: present but listed in no period record", W,
         forms={"stray_in_pairs": "{path}: under pairs/ but not named "
                                  "pairs/<pair>/period-<n>.json (<n> in ASCII digits, no "
                                  "leading zero, below 2^63), so not read as a period record "
                                  "(were it one, its period is missing from this audit)"}),
    Rule("AUD106", "attempt-dir-orphan", "Attempt directory referenced by no period",
         "An attempt directory on disk (or a link in an arm's or attempt directory's place) is "
         "named by no period record.",
         "{path}: attempt directory referenced by no period record", W,
         forms={"link": "{path}: a link in an arm's or attempt directory's place, named by no "
                        "period record; never followed, so what it leads to is not audited"}),
    Rule("AUD107", "evidence-kind-missing", "Attempt lacks a kind of evidence",
         "An attempt lists no file of a kind the verdict needs (trial, training log, one "
         "allocator trace and device file per worker).",
         "{subject}: no {kind} listed", E,
         blocks=Reason.EVIDENCE_MISSING,
         forms={"for_worker": "{subject}: no {kind} listed for pid {pid} (rank {rank})"}),
    Rule("AUD110", "identity-mismatch", "pid / rank / role disagree",
         "The pid, rank or role of a worker differ between the device file name, its content, "
         "the period's workers, the pid's allocator trace and a process record's name and "
         "content.",
         "{subject}: {file}: pid, rank or role disagree", E,
         blocks=Reason.IDENTITY_MISMATCH, family="identity",
         forms={"rank_twice": "{subject}: rank {rank} is listed for pids {pids}",
                "pid_twice": "{subject}: pid {pid} is listed for ranks {ranks}",
                "misnamed": "{subject}: {file}: name is not {expected}",
                "name_vs_content": "{subject}: {file}: file name says {what} {in_name}, "
                                   "content says {in_file}",
                "not_a_worker": "{subject}: {file}: pid {pid} is not among the period's workers",
                "rank_vs_record": "{subject}: {file}: rank {rank} but the period lists pid "
                                  "{pid} as rank {listed_rank}",
                "role_vs_record": "{subject}: {file}: role {role} but the period lists pid "
                                  "{pid} as role {listed_role}",
                "host_vs_record": "{subject}: {file}: host {host} but the period lists pid "
                                  "{pid} on {listed_host}",
                "line_host": "{subject}: {file}: a record of host {host}, where the period "
                             "lists pid {pid} on {listed_host}",
                "line_pid": "{subject}: {file}: line {line} has pid {other_pid}",
                "line_rank": "{subject}: {file}: line {line} has rank {rank}, the period lists "
                             "pid {pid} as rank {listed_rank}",
                "two_writers": "{subject}: {file}: written by two processes of pid {pid}, on "
                               "{first} (line {first_line}) and on {second} (line "
                               "{second_line}); a worker is (host, pid)"}),
    Rule("AUD111", "job-id-mismatch", "Job ids disagree",
         "The device job_id, the period's job_id, the trial's job_id and the sacct JobIDRaw of "
         "the element do not all agree.", "{subject}: {who} says job {job_id}; {others}", E,
         blocks=Reason.IDENTITY_MISMATCH, family="job_ids",
         forms={"sacct_raw": "{subject}: sacct has element {element} as job {job_id_raw}; the "
                             "{who} says job {job_id}",
                "sacct_array": "{subject}: sacct places job {job_id} in array {sacct_array}, the "
                               "{who} says {record_array}",
                "sacct_element": "{subject}: sacct has job {job_id} as element {sacct_element}, "
                                 "the {who} says {record_element}"}),
    Rule("AUD112", "trial-period-mismatch", "Trial record disagrees with its period",
         "The trial's pair, period or gpus differ from the period record.",
         "{subject}: trial {field} is {trial_value!s}, period record says {period_value!s}", E,
         blocks=Reason.IDENTITY_MISMATCH,
         forms={"out_of_order": "{subject}: the attempt at {pointer} started before the one "
                                "listed before it ({earlier}): the attempts are not in launch "
                                "order"}),
    Rule("AUD113", "gpu-shared", "One GPU serves two ranks",
         "Two ranks of one period report the same GPU uuid.",
         "{subject}: GPU {uuid} serves ranks {ranks}", E,
         blocks=Reason.IDENTITY_MISMATCH, family="identity"),
    Rule("AUD114", "worker-count-mismatch", "Worker count differs from gpus",
         "A period lists a number of workers other than its gpus.",
         "{subject}: {workers} workers listed for {gpus} GPUs", E,
         blocks=Reason.IDENTITY_MISMATCH, family="identity"),
    Rule("AUD115", "timeline-disorder", "Records out of order",
         "An allocator record finishes before it starts, or seq does not rise.",
         "{path}:{line}: seq {seq} does not rise above {last_seq}", E,
         blocks=Reason.TIMELINE_INCONSISTENT, family="timeline",
         forms={"reversed": "{path}:{line}: started_ns {started} is after finished_ns "
                            "{finished}"}),
    Rule("AUD116", "timeline-outside-invocation", "Record outside the attempt's invocation",
         "An allocator record (or a process record) lies outside the trial's invocation "
         "window.",
         "{path}:{line}: {records} record(s) outside the invocation window, first: {phase} "
         "step {step}", E,
         blocks=Reason.TIMELINE_INCONSISTENT, family="timeline",
         forms={"samples": "{path}: memory samples outside the invocation window",
                "process": "{path}: the {role} process's {field} {value} is {edge} the "
                           "invocation's ({bound}) by more than a minute: its node's clock "
                           "disagrees, or it is another run's"}),
    Rule("AUD117", "invocation-outside-allocation", "Invocation outside the sacct allocation",
         "The trial's invocation window is not inside the element's sacct Start..End.",
         "{subject}: invocation {edge} the allocation (sacct {field} {sacct}, invocation "
         "{invocation}){hint}", E,
         blocks=Reason.TIMELINE_INCONSISTENT, family="timeline",
         forms={"reversed": "{subject}: invocation finished_ns is before started_ns"}),
    Rule("AUD118", "idle-check-failed", "GPUs not left idle",
         "The post-period idle check did not pass (or is absent).",
         "{subject}: idle check passed={passed} (GPU memory used MiB: {used}; processes: "
         "{processes})", E,
         blocks=Reason.IDLE_CHECK_FAILED,
         forms={"absent": "{subject}: no post-period idle check recorded",
                "unavailable": "{subject}: no idle check could be made ({unavailable}); the "
                               "protocol requires one (idle_check: required)",
                "one_node": "{subject}: the idle check is one node's, but the workers ran on "
                            "{hosts}: each node's own is needed (idle/<host>.json)",
                "host_absent": "{subject}: no idle check of worker host {host} "
                               "(idle_check.hosts)",
                "host_unavailable": "{subject}: no idle check could be made on {host} "
                                    "({unavailable}); the protocol requires one",
                "host_failed": "{subject}: the idle check on {host} did not pass",
                "before_end": "{subject}: the idle check was timed {seconds} s before the "
                              "last attempt ended: it shows nothing of what the run left",
                "own_file": "{subject}: {host}'s own idle check ({path}) says passed={passed}"
                            "{why}, where the period record says {said}",
                "earlier_attempt": "{subject}: {host}'s own idle check after attempt "
                                   "{attempt} ({path}) says passed={passed}{why}: that run "
                                   "did not leave its GPUs idle (a later run's check is not "
                                   "its own)"}),
    Rule("AUD119", "sacct-element-missing", "No scheduler record for the attempt",
         "The attempt's job id has no allocation row in the sacct dump (its step rows, if "
         "any, do not say how the allocation ended).",
         "{subject}: job {job_id} has no allocation row in the sacct dump", W,
         family="job_ids",
         forms={"restart": "{subject}: job {job_id} restart {restart} has no record of its own "
                           "in the sacct dump (its latest record is restart {latest}'s; a dump "
                           "captured without sacct -D keeps only that one): the invocation is "
                           "not compared with an allocation"}),
    Rule("AUD120", "anchor-mismatch", "Protocol anchor does not match",
         "A protocol input's SHA-256 differs from its expected anchor, or the input is absent.",
         "anchor {name}: expected {expected}, found {found}", E,
         gate=GatePolicy(5, True, "{message}"),
         forms={"not_given": "anchor {name}: no --protocol-input {name}=PATH was given to "
                             "check it against"}),
    Rule("AUD121", "commit-mismatch", "Period ran another commit",
         "A period record's commit differs from execution_commits.json for its pair.",
         "{subject}: commit {actual} but execution_commits.json pins {expected}", E,
         blocks=Reason.COMMIT_MISMATCH),
    Rule("AUD122", "source-input-missing", "Source input cannot be read",
         "A --source file could not be read or escapes --source-root.", "{path}: {problem}", E),
    Rule("AUD123", "sacct-missing", "No scheduler dump",
         "The study has no accounting/sacct-raw.psv (nor sacct-raw.json) and no --sacct was "
         "given: whether an "
         "element is still pending or running, the allocation scope and the cross-checks "
         "against the scheduler cannot be established. It fails the gate (as a refused dump, "
         "AUD009, does) unless waived.",
         "{path}: no scheduler dump (and no --sacct); element states and the allocation "
         "scope are unknown", E,
         gate=SCHEDULER),
    Rule("AUD124", "sacct-state-unknown", "sacct state Slurm does not name",
         "A row of the scheduler dump has a State that is none of Slurm's job states or "
         "flags (a typo, a site's patch, a newer Slurm): what it means for the element "
         "(finished or not, how) is not known, and the verdict rests on the trial record "
         "alone. Said once per state, at its first row.",
         "{path}:{line}: state {state!r} of {job} is not a state Slurm names{more}; what it "
         "means for the element is unknown", W),
    Rule("AUD125", "sealed-late", "Period sealed long after its attempt ended",
         "The period record was written by auditor seal more than an hour after its last "
         "attempt's invocation ended: its manifest proves the evidence has not changed since "
         "it was sealed, not before (contract v1.1).",
         "{subject}: sealed {delay} after its last attempt ended ({sealed_by}); the manifest "
         "proves no change since then, not before", W),
    Rule("AUD126", "sacct-element-absent", "Array element the dump does not show",
         "A period record names an array element (array_job_id and array_task_id) of which "
         "the scheduler's dump has no row, nor a pending range holding it: either it ended "
         "moments before the dump was captured and was not yet accounted (capture again), or "
         "it was cancelled while still pending (such an element never gets a row). Its final "
         "state is unknown: the gate fails unless waived (contract v1.1).",
         "{subject}: named by {records} but absent from the scheduler dump: not yet accounted "
         "when it was captured (capture again), or cancelled while pending (never a row); "
         "its final state is unknown", E,
         gate=GatePolicy(1, True, "scheduler dump incomplete: {message}")),
    # ----------------------------------------------------------------- reason
    Rule("AUD127", "attempt-listed-twice", "One attempt listed twice",
         "A period record lists one attempt directory (or, without one, one job and restart) "
         "more than once, or two period records list it: one run is one attempt of one "
         "period, and counting it twice would count its GPU time twice and make a retry of "
         "it, or give another period's run as this one's. Every period listing it is "
         "unresolved, whichever record is the copy.",
         "{subject}: {pointer} lists attempt {attempt} again (first at {first})", E,
         blocks=Reason.IDENTITY_MISMATCH,
         forms={"other_record": "{subject}: {where} lists attempt {attempt}, which "
                "{others} also list{s}"}),
    Rule("AUD128", "attempts-steps-differ", "Attempts of one period ran different step counts",
         "The attempts of a retried period were dispatched different step counts (the "
         "protocol's steps_from): a rerun of fewer steps completing is not the period's "
         "training completing. Every such period is unresolved.",
         "{subject}: {key} was {first} for attempt {first_attempt} and {other} for attempt "
         "{other_attempt}", E,
         blocks=Reason.IDENTITY_MISMATCH),
    Rule("AUD129", "allocation-gpus-short", "The period ran more GPUs than its allocation held",
         "The sacct record of the attempt's run (AllocTRES, its -D record for a requeued run) "
         "held fewer GPUs than the period record's gpus: the record, the run or the row is "
         "not what it says, and the reservation scope would fall below the task scope. The "
         "period is unresolved.",
         "{subject}: the period ran on {gpus} GPUs, but sacct's record of job {job_id} (line "
         "{line}) held {held}", E,
         blocks=Reason.IDENTITY_MISMATCH),
    Rule("AUD201", "terminal-event-missing", "Clean exit without the terminal event",
         "The attempt exited cleanly but its training log lacks the terminal event for the "
         "dispatched step count.",
         "{subject}: clean exit; all {ranks} ranks completed {phases} for step {step}; terminal "
         "event absent from the training log", E,
         blocks=Reason.TERMINAL_EVENT_MISSING),
    Rule("AUD202", "completion-phase-missing", "A rank lacks a completion phase",
         "A rank has no error-free record of a completion phase for the final step.",
         "{subject}: {problems}", E,
         blocks=Reason.COMPLETION_PHASE_MISSING,
         forms={"none": "{subject}: no completion records"}),
    Rule("AUD203", "eligible-failure", "Eligible failure recorded",
         "A rank's phase ended in an error type the protocol lists as a measurement.",
         "{subject}: rank {rank}: {phase} ended in {error_type}", INFO),
    Rule("AUD204", "unclean-exit", "Attempt did not exit cleanly",
         "The invocation or a process exited non-zero and not by coordinated shutdown.",
         "{subject}: {exit}", E,
         blocks=Reason.UNCLEAN_EXIT),
    Rule("AUD205", "coordinated-shutdown", "Exit 143 accepted as coordinated shutdown",
         "The controller exited 143 with the shutdown flag on and no signal received.",
         "{subject}: {exit}", INFO),
    Rule("AUD206", "cancelled", "Attempt was cancelled",
         "scancel (received SIGTERM), a CANCELLED scheduler state or a slurmstepd "
         "cancellation line.", "{subject}: {exit}", E,
         blocks=Reason.CANCELLED,
         forms={"sacct": SACCT_ENDED, "log": LOG_LINE}),
    Rule("AUD207", "time-limit", "Attempt hit the time limit",
         "A TIMEOUT scheduler state, a pre-timeout SIGUSR1 or a time-limit cancellation line.",
         "{subject}: {exit}", E,
         blocks=Reason.TIME_LIMIT,
         forms={"sacct": SACCT_ENDED, "log": LOG_LINE,
                "sacct_after": "{subject}: {exit}; sacct reports {state} for job {job_id}: the "
                               "signal was the time limit's"}),
    Rule("AUD208", "node-failure", "Node failure",
         "The scheduler reports NODE_FAIL (or BOOT_FAIL) for the element or one of its "
         "steps, or the training log "
         "a node failure (slurmstepd's DUE TO NODE FAILURE, srun's or salloc's Node failure): "
         "an infrastructure failure either way.", SACCT_ENDED, E,
         blocks=Reason.INFRASTRUCTURE_FAILURE,
         forms={"log": LOG_LINE}),
    Rule("AUD209", "infrastructure-error", "Infrastructure error in the evidence",
         "NCCL watchdog timeout, host-RAM out-of-memory, scheduler OUT_OF_MEMORY, or an "
         "error the protocol does not list as eligible.",
         "{subject}: {nccl} (log line {line}) before {exit}", E,
         blocks=Reason.INFRASTRUCTURE_FAILURE,
         forms={"sacct_oom": "{subject}: sacct reports OUT_OF_MEMORY (host memory) on {where} "
                             "of job {job_id}",
                "log": LOG_LINE}),
    Rule("AUD210", "array-partial", "Element not finished",
         "The element's latest scheduler record is PENDING, RUNNING, REQUEUED or SUSPENDED.",
         "{subject}: job {job_id} is {state} in sacct", E,
         blocks=Reason.ARRAY_PARTIAL, gate=GatePolicy(8, False, "array partial: {message}"),
         forms={"array": "{subject}: element {job_id} is still {state}; the array is partial"}),
    Rule("AUD211", "launcher-disagrees", "Launcher's status differs from the verdict",
         "The trial record's own status disagrees with the auditor's verdict.",
         "{subject}: launcher said {status!s}{error}; auditor says {verdict}", W),
    Rule("AUD212", "wasted-attempt", "Attempt after a completed one",
         "An attempt retried after an earlier attempt of the period had completed.",
         "{subject}: attempt {attempt} (job {job_id}) ran after a completed attempt; "
         "{gpu_seconds} GPU-seconds wasted", W),
    Rule("AUD213", "configuration-uncovered", "Configuration has missing periods",
         "The protocol expects a (workload, gpus, seed) that no period record covers.",
         "{subject}: no period covers seed(s) {seeds}", E,
         forms={"uncovered": "{subject}: no period covers this configuration"}),
    Rule("AUD214", "no-attempt-evidence", "Period has no usable attempt",
         "The period record lists no attempt, or none whose trial could be read.",
         "{subject}: the period record lists no attempt", E,
         forms={"no_trial": "{subject}: no readable trial record for the attempt"}),
    Rule("AUD216", "ended-after-exit", "Scheduler ended the job after a clean exit",
         "sacct reports TIMEOUT, CANCELLED, PREEMPTED or DEADLINE for a job whose last "
         "attempt had exited 0 before the job ended, or the training log holds a slurmstepd "
         "cancellation line while the trial record says the invocation exited 0: the "
         "attempt's verdict stands, and the report says why.",
         "{subject}: sacct reports {state} for job {job_id}{actual}, which ended at {ended} "
         "UTC, after the attempt's invocation exited 0 at {finished} UTC; the attempt's "
         "evidence stands", W,
         forms={"log": "{subject}: the training log says {said}, but the trial record has the "
                       "invocation exit 0: the job was ended after the command returned; the "
                       "attempt's evidence stands"}),
    Rule("AUD217", "configuration-unexpected", "Configuration the protocol does not list",
         "Periods ran a (workload, gpus) that protocol.json does not list: the configuration "
         "stays unresolved and out of the inclusion list.",
         "{subject}: {periods} of {workload} with {gpus} GPUs, a configuration {protocol} does "
         "not list", E,
         gate=GatePolicy(7, False,
                         "configuration {subject} unresolved: the protocol does not list it")),
    Rule("AUD218", "run-ended-by", "What ended the run",
         "The cause of a period that did not complete, as one stable word (gpu_oom, host_oom, "
         "nccl, segfault, signal, actor_died, child_failed, python_exception, node_failure, "
         "time_limit, cancelled, preempted, unknown), with the line or record it rests on and "
         "the knock-ons that followed it (contract v1.1, Causes).",
         "{subject}: ended by {cause}: {cause_detail}{knock_on}", INFO),
    Rule("AUD219", "preempted", "Attempt was preempted",
         "sacct reports PREEMPTED for the job's last attempt, or the training log a slurmstepd "
         "cancellation DUE TO PREEMPTION: the scheduler took the allocation back; the attempt "
         "measured nothing and the period needs a new run.", "{subject}: {exit}", E,
         blocks=Reason.PREEMPTED,
         forms={"sacct": SACCT_ENDED, "log": LOG_LINE,
                "sacct_after": "{subject}: {exit}; sacct reports {state} for job {job_id}: the "
                               "signal was the preemption's"}),
    Rule("AUD215", "waived", "Finding waived",
         "A finding was waived on the command line; it no longer blocks its subject.",
         "{subject}: {waived_rule} waived: {reason}", W),
)

RULES: dict[str, Rule] = {rule.rule_id: rule for rule in _RULES}
BY_SYMBOL: dict[str, Rule] = {rule.symbol: rule for rule in _RULES}


def finding(
    rule_id: str, subject: str, citations: Iterable[Citation] = (), **values: object
) -> Finding:
    """Build a finding of ``rule_id`` about ``subject``, rendering the rule's template.

    ``values`` fill the template (the form's, when ``form`` names one); ``subject`` and
    ``path`` (the first citation's, when not given) are always available to it. A missing
    value renders as ``?`` rather than failing: bad evidence never crashes the check that
    reports it. An unknown rule id or form is a bug in the check, and raises ``KeyError``.
    """
    rule = RULES[rule_id]
    cites = tuple(citations)
    fields: dict[str, object] = {"subject": subject}
    if cites:
        fields["path"] = cites[0].path
        if cites[0].line is not None:
            fields["line"] = cites[0].line
    fields.update(values)
    message = rule.template_of(values.get("form")).format_map(_Defaulting(fields))
    del fields["subject"]  # (a field of the finding's own)
    return Finding(rule.rule_id, rule.symbol, rule.severity, subject, message, cites,
                   tuple(fields.items()))


def describe(item: Finding) -> str:
    """The finding's message without its leading ``{path}: `` or ``{subject}: ``: what is
    wrong, rendered from its values (for a sentence that names the file itself); a line the
    message opens with is said as one (``line 9: ...``: a bare ``9: `` was a number of
    nothing)."""
    line, what = _opening_line(item)
    return what if line is None else f"line {line}: {what}"


def located(item: Finding) -> tuple[str, str]:
    """(where, what): the finding's subject, with the line its message opens with where the
    subject is that file (``path:9``), and what is wrong (:func:`describe`'s, less that
    line): the line stays with its file."""
    line, what = _opening_line(item)
    if line is not None and item.value("path") == item.subject:
        return f"{item.subject}:{line}", what
    return item.subject, what if line is None else f"line {line}: {what}"


def _opening_line(item: Finding) -> tuple[object, str]:
    """The line a ``{path}:{line}: `` message opens with (None for another), and the rest of
    the message, rendered."""
    template = RULES[item.rule_id].template_of(item.value("form"))
    line = None
    if template.startswith("{path}:{line}: "):
        template, line = template.removeprefix("{path}:{line}: "), item.value("line")
    for head in ("{path}", "{subject}"):
        template = template.removeprefix(head)
    values = _Defaulting({"subject": item.subject, **dict(item.values)})
    return line, template.lstrip(": ").format_map(values)


def unprefixed(item: Finding) -> str:
    """The finding's message less the period's name before it (a diagnosis names its
    periods above); a file's name stays."""
    return item.message.removeprefix(f"{item.subject}: ")


def in_family(family: str) -> tuple[str, ...]:
    """The ids of the rules a cross-check family of the report counts, in id order."""
    return tuple(sorted(rule.rule_id for rule in _RULES if rule.family == family))


class _Unknown:
    """A value the check did not have: ``?`` whatever the field's format (``{n:,}``)."""

    def __format__(self, spec: str) -> str:
        return "?"

    def __str__(self) -> str:
        return "?"

    __repr__ = __str__


_UNKNOWN = _Unknown()


class _Defaulting(dict[str, object]):
    """A format map that renders unknown fields, and fields whose value is None, as ``?``
    (a message never prints Python's ``None``)."""

    def __missing__(self, key: str) -> object:
        return _UNKNOWN

    def __getitem__(self, key: str) -> object:
        value = super().__getitem__(key)
        return _UNKNOWN if value is None else value
