"""Read a saved scheduler dump (``sacct -P`` output, ``sacct-raw.psv``; or ``--json``) into a
:class:`SacctDump`.

The contract's capture command is::

    TZ=UTC SLURM_TIME_FORMAT=standard sacct -n -P -j <array> \\
        --format=JobID,JobIDRaw,JobName,State,ExitCode,Start,End,ElapsedRaw,AllocTRES,NodeList,Reason

but real dumps come from many tools, so :func:`parse_sacct` reads, line by line and in
bounded memory, any ``sacct --parsable``/``--parsable2`` output:

* **Format.** A header line (``sacct`` without ``-n``; names are case-insensitive, so
  ``JobId``/``JobIdRaw`` work) overrides both :data:`DEFAULT_FORMAT` and a ``fields``
  argument, since it is what the file itself says; a header naming other fields than
  ``fields`` is one AUD023 finding saying the header was used. Without a header the
  columns are ``fields`` (``--format`` order; ``%NN`` width suffixes are ignored) or the
  default.
* **Delimiter.** ``delimiter`` when given. Otherwise it is read off the header (the
  separator between the first two names, so ``☃`` or ``^|^`` work), or sniffed from
  the first rows: among ``^|^``, ``|``, ``☃`` and tab, the one that splits the most
  rows into exactly the expected field count wins (ties in that order). A dump that
  fits none of them is refused, never guessed.
* **Trailing delimiters** (``--parsable``) give one extra empty field; the file's mode
  is taken from its first rows and that field is dropped.
* **Delimiter inside a value.** ``-P`` does not escape, so a ``JobName`` holding the
  delimiter gives too many fields. The extras are given back to one free-text column
  (JobName, SubmitLine, Comment, Reason, WorkDir, ...) when exactly one choice of
  column leaves every typed column (JobID, State, ExitCode, times, counts, TRES ...)
  well-formed; otherwise the row is an AUD008 finding.
* **Newline inside a value.** A row with too few fields is joined with the following
  physical line(s) (up to :data:`MAX_JOIN_LINES`) when the joined record has exactly
  the right field count and well-formed typed columns, and no joined line is a whole
  row by itself; otherwise its first line is an AUD008 finding and the following lines
  are read afresh. When the last column is one that holds newlines (SubmitLine,
  Comment, JobName ...), a following line without any delimiter, that is not a job id,
  continues it.
* ``#`` comment lines, blank lines and repeated header lines are skipped; a UTF-8 BOM
  is dropped. Lines are decoded as UTF-8 with replacement (AUD005); NUL bytes are
  removed (AUD006); a line longer than :data:`MAX_LINE` bytes is skipped (AUD007).
  A dump opening with a UTF-16 or UTF-32 byte-order mark (PowerShell 5's ``>``) is read
  decoded, with one AUD026 naming its encoding, and refused when it does not decode whole
  (:mod:`auditor.collect.sacct.encoding`).
* **Values.** ``State`` is normalised to its first word without ``+`` (``CANCELLED by 12``
  and ``CANCELLED+`` both give ``CANCELLED``; ``state_raw`` keeps the text); when the dump
  has no State column the state is ``UNKNOWN`` with ``state_raw`` ``""``. ``ExitCode``
  ``exit:signal`` gives two signed ints, as sacct printed them (an exit of 128 or more is
  printed minus 128: ``exit_code_may_be`` gives ``(15, 143)`` for ``15:0``).
  ``Start``/``End`` are UTC (the dump is captured with ``TZ=UTC``) epoch seconds;
  ``Unknown``/``None``/empty give None. ``ElapsedRaw`` is taken as seconds, else
  ``Elapsed`` (``[D-]HH:MM:SS`` or ``MM:SS.mmm``, fractions dropped) is converted;
  ``Restarts`` (Slurm 24.11 and later) is a count. GPUs come from ``AllocTRES``: the
  untyped ``gres/gpu=N`` when present, else the sum over distinct types of
  ``gres/gpu:TYPE=N`` (MIG types included); ``gres/gpumem``/``gres/gpuutil`` never count;
  None without an AllocTRES column, 0 when the column has no GPU.
* **Shape checks.** A row whose id, State, ExitCode, count or TRES columns are
  malformed is not used (AUD008): its columns are not what the format says. An
  unreadable time or duration only becomes None (AUD008); the row is kept. So a dump
  read with a wrong ``--format`` of the same field count is refused, not misread.
* **Rows.** A JobID without a ``.step`` is an allocation (:class:`SacctJob`); a
  pending range ``5055845_[4-8%2]`` is one job with ``array_task_id`` None and
  ``array_task_spec`` ``"4-8%2"``; it holds only the tasks of its array without a row of
  their own (``own_rows``; ``pending_tasks``, ``covers``): sacct may print a range after
  one of its tasks started. Step rows attach to their allocation by the JobID
  before the dot, or by JobIDRaw (``5055846.batch``). A step that appears before its
  allocation waits for it; a step whose allocation never appears is reported
  (AUD008) and dropped: no allocation is invented for it, so the element counts as
  missing from the dump. When a JobID appears again (``sacct -D``: one ``REQUEUED`` or
  ``PREEMPTED`` record per earlier run), the latest record gives the job's state and each
  earlier one is kept, in order, in its ``attempts`` (the ledger: state, times, elapsed,
  GPUs, line; its state in ``history`` too); steps belong to the record they follow, so
  an earlier run's steps stay with its record. A ``Restarts`` above the records present
  is an AUD024 finding: the dump was captured without ``-D``. A dump without JobID and
  JobIDRaw columns gives one job per row with ``job_id`` ``""``.
* **Other forms** (contract v1.2). A dashed frame line (``-p`` output pasted under one) is
  skipped, not taken for fixed width. A row that does not fit and starts with a quote is
  read without the quotes of a Python repr (``'1_3'|'5'|...`` or ``'1_3|5|...\\n'``). In
  ``-p`` output a row with the format's count ending in an empty value is a field short
  (AUD008). Without ElapsedRaw/Elapsed, a record with Start and End known has End minus
  Start. A state Slurm does not name (:data:`~auditor.model.SLURM_STATES`) is one AUD124 per
  state, at its first row; such a record after one of the same job with a Slurm state is set
  aside, never the job's state.
* **sacct --json** (:mod:`auditor.collect.sacct.slurmjson`): a dump whose first byte is
  ``{`` is ``sacct --json`` of Slurm 23.11 or later, each record read as the ``-P`` row sacct
  prints for it, with exact exit codes; 22.05's and 23.02's JSON is refused.
* **Refusals** (:class:`~auditor.errors.SacctFormatError`, one line saying what to
  do): fixed-width output (``sacct`` without ``-P``), a headerless dump every first row of
  which has more fields than the format (``Restarts`` added: never folded into a free-text
  column), and a dump none of whose first rows fits the format (wrong
  ``--format``/``--delimiter``). An empty dump is not
  refused: it gives an empty :class:`SacctDump` with an AUD009 finding. Occasional
  bad rows are AUD008 findings with their line numbers; at most
  :data:`MAX_FINDINGS` findings are kept per dump (then AUD013).
"""

from __future__ import annotations

from auditor.collect.sacct.format import (
    CAPTURE_HINT,
    DEFAULT_FORMAT,
    MAX_FINDINGS,
    MAX_JOIN_LINES,
    MAX_LINE,
    MAX_RECORD_CHARS,
    REFUSE_AFTER,
    SNIFF_CHARS,
    SNIFF_LINES,
    check_options,
    is_fixed_width,
)
from auditor.collect.sacct.jobs import parse_sacct
from auditor.collect.sacct.queries import job_for, worst_step
from auditor.collect.sacct.slurmjson import JSON_FIELDS, MAX_JSON_BYTES
from auditor.collect.sacct.summary import summary_json, summary_parts

__all__ = [
    "CAPTURE_HINT",
    "DEFAULT_FORMAT",
    "JSON_FIELDS",
    "MAX_FINDINGS",
    "MAX_JOIN_LINES",
    "MAX_JSON_BYTES",
    "MAX_LINE",
    "MAX_RECORD_CHARS",
    "REFUSE_AFTER",
    "SNIFF_CHARS",
    "SNIFF_LINES",
    "check_options",
    "is_fixed_width",
    "job_for",
    "parse_sacct",
    "summary_json",
    "summary_parts",
    "worst_step",
]
