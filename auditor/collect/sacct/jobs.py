"""Job assembly: framed rows into allocations, their steps, pending ranges and history.

:func:`parse_sacct` is the reader (its contract is the package's docstring, see
:mod:`auditor.collect.sacct`): :class:`_Parser` frames the records
(:class:`~.framing._Framer`) and turns each into a :class:`SacctJob` or a
:class:`SacctStep` attached to its allocation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import BinaryIO

from auditor import rules
from auditor._io import CHUNK_SIZE, HashingReader
from auditor._text import clip
from auditor.collect.sacct.encoding import Transcoded, byte_order, encoding_finding
from auditor.collect.sacct.format import (
    MAX_FINDINGS,
    _check_delimiter,
    _Format,
    _normalise_fields,
)
from auditor.collect.sacct.framing import _Framer, _Prefixed
from auditor.collect.sacct.slurmjson import JSON_FORMAT, BadRecord, json_rows, looks_like_json
from auditor.collect.sacct.values import (
    _RE_JOBID,
    _RE_JOBIDRAW,
    _count,
    _elapsed,
    _exit,
    _gpus,
    _state,
    _time,
    forget_values,
)
from auditor.errors import SacctFormatError
from auditor.model import SLURM_STATES, Citation, SacctDump, SacctJob, SacctStep


@dataclass(slots=True)
class _Alloc:
    """A mutable allocation row while the dump is read (its lists made only when used: a
    whole cluster's dump holds millions of allocations, most without an earlier record)."""

    job: SacctJob
    steps: list[SacctStep] | None = None
    earlier: list[_Alloc] | None = None
    """Earlier records of the same job id (``sacct -D``), oldest first."""


@dataclass(slots=True)
class _Unnamed:
    """A state Slurm does not name: its first row, and how many more rows hold it."""

    shown: str
    line: int
    raw: str
    more: int = 0
    aside: int = 0
    """Records of it set aside: each came after a record of its job with a Slurm state."""


@dataclass(slots=True)
class _StepRow:
    """A step row and the keys of the allocation it belongs to."""

    step: SacctStep
    job_key: str | None
    raw_key: str | None
    text: str




def parse_sacct(
    stream: BinaryIO | HashingReader,
    path: str,
    fields: Sequence[str] | None = None,
    delimiter: str | None = None,
) -> SacctDump:
    """Parse a saved ``sacct -P`` dump, streaming, into a :class:`SacctDump`; a dump whose
    first byte is ``{`` is ``sacct --json`` (:mod:`auditor.collect.sacct.slurmjson`: read
    whole, at most :data:`~auditor.collect.sacct.slurmjson.MAX_JSON_BYTES`). A dump that
    opens with a UTF-16 or UTF-32 byte-order mark is read decoded, with one ``AUD026``
    (:mod:`auditor.collect.sacct.encoding`), and refused when it does not decode whole.

    ``path`` is the display path used in citations and findings; ``fields`` is the
    ``--format`` order of a dump without header (a comma-separated string also works);
    ``delimiter`` is its ``--delimiter``. Raises :class:`SacctFormatError` (and nothing
    else, whatever the bytes) for a fixed-width dump, a dump whose rows never fit the
    format, JSON that cannot be read or comes from a Slurm before 23.11, or unusable
    ``fields``/``delimiter`` arguments. The returned dump's
    ``digest`` covers every byte of ``stream``.
    """
    reader = stream if isinstance(stream, HashingReader) else HashingReader(stream)
    parser = _Parser(path, _normalise_fields(fields, path), _check_delimiter(delimiter, path))
    try:
        head = reader.read(CHUNK_SIZE)
        source: HashingReader | Transcoded = reader
        mark = byte_order(head)
        if mark is not None:  # (UTF-16 from PowerShell's >: its text, as sacct wrote it)
            source = Transcoded(head, reader, mark, path)
            parser.findings.append(encoding_finding(path, mark))
            head = source.read(CHUNK_SIZE)
        if looks_like_json(head):
            return _json_dump(parser, reader, head, source)
        first = _Prefixed(head, source)
        del head  # (the splitter lets go of the chunk as it goes on: so must this frame)
        return parser._dump(reader, parser._read(reader, first))
    finally:  # (the caches serve one dump's rows: kept, they pinned 10 MB of its memory)
        forget_values()



def _json_dump(parser: _Parser, reader: HashingReader, head: bytes,
               source: HashingReader | Transcoded) -> SacctDump:
    """The dump of ``sacct --json`` output: each record's rows, as ``-P`` prints them,
    assembled by ``parser`` as a ``-P`` dump's are (exact exit codes); ``head`` and the
    rest are read from ``source`` (``reader``, or its text decoded from UTF-16)."""
    parser.fmt = JSON_FORMAT
    parser.exact = True
    number = 0
    for item in json_rows(source, head, parser.path):
        number += 1
        if isinstance(item, BadRecord):
            parser.any_rows = True
            parser._bad(number, item.where, item.why)
        else:
            parser._row(number, item, "|".join(item))
    if parser.ok_rows == 0 and parser.bad_rows:
        raise SacctFormatError(f"{parser.path}: no record of its 'jobs' list could be read "
                               f"({parser.findings[0].message if parser.findings else '?'})")
    return parser._dump(reader, JSON_FORMAT)


NO_ROWS: frozenset[int] = frozenset()
"""The one empty ``own_rows`` (each ``frozenset()`` is an object of its own: 216 bytes)."""


class _Parser(_Framer):
    """One pass over one dump."""

    def __init__(self, path: str, fields: tuple[str, ...] | None, delimiter: str | None) -> None:
        super().__init__(path, fields, delimiter)
        self.jobs: dict[str, _Alloc] = {}
        self.by_raw: dict[str, str] = {}
        self.waiting: list[_StepRow] = []
        """Step rows read before (or without) their allocation row."""
        self.steps_to: dict[str, _Alloc] = {}
        """The earlier run a job's step rows now follow (its record read again, below its
        latest: a ``-D`` dump saved twice), until the job's next allocation row."""
        self.unnamed: dict[str, _Unnamed] = {}
        """Each state Slurm does not name, where first seen (one ``AUD124`` each)."""
        self.repeated: list[tuple[int, str, str]] = []
        """Records of a run read again (line, job, the earlier record's line):
        one ``AUD027`` says them all."""
        self.texts: dict[str | None, str | None] = {None: None}
        self.columns: tuple[_Format | None, tuple[int, ...]] = (None, ())
        """The format the rows are read with, and where each of :data:`_COLUMNS` is in it
        (-1: not captured): looked up once, not per row and column."""
        self.exact = False
        """Exit codes are the processes' own (``sacct --json``), not printed less 128."""
        self.tres_seen = False
        """Whether an allocation row's AllocTRES held anything (a pending job's is empty)."""
        self.gpus_seen = False
        """Whether one named GPUs (``gres/gpu``): a dump where none does, though they held
        something, comes from a site whose AccountingStorageTRES does not track GPUs."""
        """One of each value the rows repeat (states, step and job names, nodes, reasons,
        array ids): a dump is held for the whole audit, and sent to every worker (a
        million-file study's 55,556 allocations took 160 MB, most of it repeated words)."""

    def _dump(self, reader: HashingReader, fmt: _Format) -> SacctDump:
        """The dump of the rows read (every byte of ``reader`` read)."""
        jobs = self._finish_jobs()
        untracked = self.tres_seen and not self.gpus_seen
        if untracked:  # (no GPU named anywhere: each count is unknown, never 0)
            jobs = tuple(replace(job, gpus=None, attempts=tuple(
                replace(record, gpus=None) for record in job.attempts)) for job in jobs)
        self._unnamed_findings()
        if self.repeated:
            line, job, first = self.repeated[0]
            more = len(self.repeated) - 1
            self._find("AUD027", line, f"{job} (line {first})", job=job, first=first,
                       more=f" (and {more} more record(s) like it)" if more else "")
        if not self.any_rows:
            self._add_empty_finding()
        if self.dropped:
            self.findings.append(rules.finding(
                "AUD013", self.path, (Citation(self.path),),
                dropped=self.dropped, cap=MAX_FINDINGS,
            ))
        return SacctDump(
            path=self.path,
            fields=fmt.fields,
            delimiter=fmt.delimiter,
            header=fmt.header,
            jobs=jobs,
            digest=reader.digest(),
            gpus_untracked=untracked,
            findings=tuple(self.findings),
        )

    # ---------------------------------------------------------------- rows

    def _row(self, number: int, values: list[str], text: str) -> None:
        fmt = self.fmt
        assert fmt is not None
        self.any_rows = True
        if self.columns[0] is not fmt:
            self.columns = (fmt, tuple(fmt.index.get(name, -1) for name in _COLUMNS))
        (at_id, at_raw, at_state, at_exit, at_start, at_end, at_elapsedraw, at_elapsed,
         at_tres, at_restarts, at_name, at_nodes, at_reason) = self.columns[1]

        def get(position: int) -> str | None:
            return None if position < 0 else values[position]

        errors: list[str] = []
        job_id_text = get(at_id)
        raw_text = get(at_raw)
        raw_match = None
        if raw_text is not None and raw_text.strip():
            raw_match = _RE_JOBIDRAW.fullmatch(raw_text.strip())
            if raw_match is None:
                errors.append(f"JobIDRaw {clip(raw_text, 40)!r}")
        id_match = None
        if job_id_text is not None:
            id_match = _RE_JOBID.fullmatch(job_id_text.strip())
            if id_match is None:
                self._bad_id(number, text, "JobID", job_id_text)
                return
        elif raw_text is not None and raw_match is None:
            self._bad_id(number, text, "JobIDRaw", raw_text)
            return

        share = self.texts.setdefault
        state, state_raw = _state(get(at_state), errors)
        state, state_raw = share(state, state) or "", share(state_raw, state_raw) or ""
        exit_code, signal = _exit(get(at_exit), errors)

        named = id_match if id_match is not None else raw_match
        step_name = named.group("step") if named is not None else None
        self.ok_rows += 1
        if state not in SLURM_STATES and state != "UNKNOWN":
            shown = (job_id_text if job_id_text is not None else raw_text) or f"#{number}"
            self._unnamed(state, shown.strip(), number, state_raw)

        if step_name is not None:
            step = SacctStep(share(step_name, step_name) or "", state, state_raw, exit_code,
                             signal, number, self.exact)
            job_key = id_match.group("alloc") if id_match is not None else None
            raw_key = raw_match.group("alloc") if raw_match is not None else None
            self._report_values(number, text, errors)
            self._attach(_StepRow(step, job_key, raw_key, text))
            return

        start = _time(get(at_start), "Start", errors)
        end = _time(get(at_end), "End", errors)
        elapsed = _elapsed(get(at_elapsedraw), get(at_elapsed), errors)
        if elapsed is None and start is not None and end is not None and end >= start:
            elapsed = end - start  # (no ElapsedRaw: what sacct computes it from)
        tres = get(at_tres)
        gpus = _gpus(tres, errors)
        self.tres_seen = self.tres_seen or bool(tres and tres.strip())
        self.gpus_seen = self.gpus_seen or bool(gpus)
        restarts = _count(get(at_restarts), "Restarts", errors)
        self._report_values(number, text, errors)

        job_id_raw = raw_match.group(0) if raw_match is not None else None
        if id_match is not None:
            job_id = id_match.group(0)
            task = id_match.group("task")
            spec = id_match.group("spec")
            is_array = task is not None or spec is not None
            array_job_id = share(id_match.group("base"), id_match.group("base")) \
                if is_array else None
            array_task_id = int(task) if task is not None else None
            key = job_id
        else:
            job_id, spec, array_job_id, array_task_id = job_id_raw or "", None, None, None
            key = job_id_raw if job_id_raw is not None else f"#{number}"
        job = SacctJob(
            job_id=job_id,
            job_id_raw=job_id_raw,
            array_job_id=array_job_id,
            array_task_id=array_task_id,
            array_task_spec=spec,
            job_name=share(get(at_name), get(at_name)),
            state=state,
            state_raw=state_raw,
            exit_code=exit_code,
            signal=signal,
            start=start,
            end=end,
            elapsed_s=elapsed,
            gpus=gpus,
            node_list=share(get(at_nodes), get(at_nodes)),
            reason=share(get(at_reason), get(at_reason)),
            line=number,
            restarts=restarts,
            exit_exact=self.exact,
        )
        self._file(key, job)

    def _file(self, key: str, job: SacctJob) -> None:
        """File an allocation row under ``key`` (its job id): a job's next run under
        ``sacct -D`` takes the earlier one as an attempt of its ledger."""
        earlier = self.jobs.get(key)
        self.steps_to.pop(key, None)
        if earlier is not None and earlier.job.state in SLURM_STATES \
                and job.state not in SLURM_STATES:
            # a record no Slurm state names never replaces the job's last real one (a
            # site's INVALID after CANCELLED by N): its AUD124 says so
            self.unnamed[job.state].aside += 1
            return
        alloc = _Alloc(job)
        again = earlier is not None and job.start is not None \
            and job.start == earlier.job.start and (earlier.job.elapsed_s or 0) > 0
        ledger = earlier.earlier if earlier is not None and job.start is not None \
            and not again else None
        run = next((index for index, record in enumerate(ledger or ()) if record.job.start
                    == job.start and (record.job.elapsed_s or 0) > 0), None)
        if earlier is not None and ledger is not None and run is not None:
            # an earlier run's record again (a -D dump saved twice into the file): that run
            # counted once, in this record, its steps those that follow
            self.repeated.append((job.line, job.job_id, str(ledger[run].job.line)))
            latest = earlier.job.start
            if latest is None or job.start is None or job.start <= latest:
                ledger[run] = self.steps_to[key] = alloc
                return
            # (it started after the record filed as the latest: a mid-run capture, then a -D
            # one holding that run and the one before it; it is the latest)
            alloc.earlier = [*ledger[:run], *ledger[run + 1:], earlier]
            earlier.earlier = None
        elif earlier is not None and again:
            # the same run's record again (one dump saved twice into the file, a capture
            # made mid-run and one made after): a run started once, in one second, and a
            # requeued run starts anew, so it is one run, counted once, in its later record
            # (its state the latest); its earlier runs stay the ledger
            self.repeated.append((job.line, job.job_id, str(earlier.job.line)))
            alloc.earlier = earlier.earlier
        elif earlier is not None:
            # sacct -D: the same job id again is its next run; the earlier record is an
            # attempt of the ledger (with the steps that followed it)
            alloc.earlier = [*(earlier.earlier or ()), earlier]
            earlier.earlier = None
        self.jobs[key] = alloc
        if job.job_id_raw is not None:
            self.by_raw[job.job_id_raw] = key

    def _unnamed(self, state: str, shown: str, number: int, raw: str) -> None:
        seen = self.unnamed.get(state)
        if seen is None:
            self.unnamed[state] = _Unnamed(shown, number, raw)
        else:
            seen.more += 1

    def _unnamed_findings(self) -> None:
        """One ``AUD124`` per state Slurm does not name, at its first row."""
        for state, seen in self.unnamed.items():
            said = f" (and {seen.more} more row(s))" if seen.more else ""
            if seen.aside:
                said += (f"; {seen.aside} such record(s) after one with a Slurm state not "
                         "used: the job keeps its last Slurm state")
            self._find("AUD124", seen.line, seen.raw, state=state, job=seen.shown, more=said)

    def _bad_id(self, number: int, text: str, column: str, value: str) -> None:
        self.bad_values += 1
        if not self.value_sample:
            self.value_sample = f"line {number}: {column} {clip(value, 40)!r}"
        self._bad(number, text, f"unreadable {column} {clip(value, 40)!r}; row not used")

    def _report_values(self, number: int, text: str, errors: list[str]) -> None:
        if errors:
            self._find("AUD008", number, text, error="unreadable " + ", ".join(errors))

    def _attach(self, step_row: _StepRow) -> None:
        alloc = self._parent(step_row)
        if alloc is None:
            self.waiting.append(step_row)
        elif alloc.steps is None:
            alloc.steps = [step_row.step]
        else:
            alloc.steps.append(step_row.step)

    def _parent(self, step_row: _StepRow) -> _Alloc | None:
        if step_row.job_key is not None and step_row.job_key in self.jobs:
            return self.steps_to.get(step_row.job_key) or self.jobs[step_row.job_key]
        if step_row.raw_key is not None:
            key = self.by_raw.get(step_row.raw_key)
            if key is not None:
                return self.steps_to.get(key) or self.jobs.get(key)
            if step_row.job_key is None:
                return self.jobs.get(step_row.raw_key)
        return None

    def _finish_jobs(self) -> tuple[SacctJob, ...]:
        self.steps_to = {}  # (a step read before its job's rows follows its latest run)
        for step_row in self.waiting:
            alloc = self._parent(step_row)
            if alloc is not None:
                if alloc.steps is None:
                    alloc.steps = []
                alloc.steps.append(step_row.step)
                continue
            step = step_row.step
            parent = step_row.job_key or step_row.raw_key or "?"
            exit_text = "" if step.exit_code is None else f" {step.exit_code}:{step.signal}"
            self._find(
                "AUD008", step.line, step_row.text,
                error=(
                    f"step {parent}.{step.step} ({step.state_raw or step.state}{exit_text}) has "
                    "no allocation row in the dump; not attached"
                ),
            )
        own_rows: dict[str, set[int]] = {}
        for alloc in self.jobs.values():
            if alloc.job.array_job_id is not None and alloc.job.array_task_id is not None:
                own_rows.setdefault(alloc.job.array_job_id, set()).add(alloc.job.array_task_id)
        jobs: list[SacctJob] = []
        allocs, self.jobs, self.by_raw = self.jobs, {}, {}
        for alloc in allocs.values():
            attempts = tuple(_finished(earlier, (), NO_ROWS) for earlier in alloc.earlier or ())
            tasks = frozenset(own_rows.get(alloc.job.array_job_id or "", ())) \
                if alloc.job.array_task_spec is not None else NO_ROWS
            jobs.append(_finished(alloc, attempts, tasks))
        del allocs  # (each allocation's row is now its job: the index of them goes)
        self._history_missing(jobs)
        return tuple(jobs)

    def _history_missing(self, jobs: list[SacctJob]) -> None:
        """An ``AUD024`` when sacct's ``Restarts`` counts more runs than the records present:
        the dump was captured without ``-D``, the earlier runs' records (and GPU-seconds)
        are not in it."""
        short = [job for job in jobs if job.history_missing]
        if not short:
            return
        named = ", ".join(f"{job.job_id} (Restarts {job.restarts}, "
                          f"{len(job.records)} record{'s' if len(job.records) > 1 else ''})"
                          for job in short[:5]) + (", ..." if len(short) > 5 else "")
        first = short[0]
        self.findings.append(rules.finding(
            "AUD024", self.path, (Citation(self.path, line=first.line,
                                           quote=str(first.restarts)),),
            consequence=f"sacct's Restarts counts more runs than the dump has records for "
                        f"{len(short)} job{'s' if len(short) > 1 else ''} ({named}): the "
                        "earlier runs' records, and the GPU-seconds they held, are missing "
                        "(capture with sacct -D)",
        ))

    def _add_empty_finding(self) -> None:
        fmt = self.fmt
        if not self.any_bytes:
            error = "the dump is empty (no bytes); no scheduler records to use"
        elif fmt is not None and fmt.header:
            error = "the dump holds a header but no job rows"
        else:
            error = "the dump holds no job rows (only blank, comment or unreadable lines)"
        self.findings.insert(0, rules.finding(
            "AUD009", self.path, (Citation(self.path),), error=error,
        ))


def _finished(alloc: _Alloc, attempts: tuple[SacctJob, ...], own_rows: frozenset[int]
              ) -> SacctJob:
    """The record of ``alloc`` with its steps (in line order), its earlier records and, for
    a pending range, the tasks of its array that have rows of their own.

    The row's own :class:`SacctJob` is completed in place, not copied: it was made by this
    parse and nothing else holds it yet, and a copy of each (a million allocations in a
    cluster's dump) doubled the jobs' memory at the end of the read."""
    job = alloc.job
    steps = alloc.steps
    if steps:
        steps.sort(key=_step_line)  # (stable, as sorted() was: a step's line is its own)
        _complete(job, "steps", tuple(steps))
    if attempts:
        _complete(job, "history", tuple(record.state for record in attempts))
        _complete(job, "attempts", attempts)
    if own_rows is not NO_ROWS:
        _complete(job, "own_rows", own_rows)
    return job


def _step_line(step: SacctStep) -> int:
    return step.line


_complete = object.__setattr__
"""Sets a field of a frozen record this parse made and no one else holds yet."""


_COLUMNS: tuple[str, ...] = (
    "jobid", "jobidraw", "state", "exitcode", "start", "end", "elapsedraw", "elapsed",
    "alloctres", "restarts", "jobname", "nodelist", "reason",
)
"""The columns a row's record is made of, in the order :meth:`_Parser._row` unpacks them."""
