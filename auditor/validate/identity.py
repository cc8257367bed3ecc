"""Who each worker's files say it is (``AUD110``): the period record's workers against the
names and contents of their device files, allocator traces and process records (contract
v1.2: a worker is (host, pid), numbered by (role, rank); a file's name and content must
agree, and with the record)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator

from auditor.model import AttemptRead, AttemptSpec, Citation, Finding, PeriodRecord, Worker
from auditor.model.kinds import ALLOCATOR_TRACE, DEVICE_EVIDENCE, PROCESS_RECORD, EvidenceKind
from auditor.rules import finding

CONTROLLER = "controller"


def worker_identity(subject: str, record: PeriodRecord, spec: AttemptSpec, read: AttemptRead
                    ) -> Iterator[Finding]:
    """``AUD110`` for an attempt: a rank or pid listed twice, and every device file, trace
    and process record whose name, content and the record's workers disagree."""
    workers = _Workers(spec.workers)
    # (contract v1.2: ranks may restart at 0 in each role; one process is one rank, else
    # its one trace would stand for two ranks' phases)
    cite = [Citation(record.path, pointer=spec.pointer + "/workers")]
    for (_, rank), pids in _twice(spec.workers, lambda w: (w.role, w.rank), lambda w: w.pid):
        yield finding("AUD110", subject, cite, form="rank_twice", rank=rank, pids=pids)
    for (_, pid), shared in _twice(spec.workers, lambda w: (w.host, w.pid), lambda w: w.rank):
        yield finding("AUD110", subject, cite, form="pid_twice", pid=pid, ranks=shared)
    yield from _device_identity(subject, record, read, workers)
    yield from _trace_identity(subject, read, workers)
    yield from _process_identity(subject, record, read, workers)


class _Workers:
    """A period's workers by who they are, (host, pid) (contract v1.2: pids are unique on
    one node only); a name or record without a host (v1) finds the one worker of its pid."""

    def __init__(self, workers: tuple[Worker, ...]) -> None:
        self.by_key = {w.key: w for w in workers if w.pid is not None}
        self.hosts = any(w.host for w in workers)
        """Whether the record names hosts (v1.2): the name form a misnamed file is shown."""
        self.by_pid: dict[int, list[Worker]] = defaultdict(list)
        for worker in workers:
            if worker.pid is not None:
                self.by_pid[worker.pid].append(worker)

    def get(self, host: str | None, pid: int) -> Worker | None:
        found = self.by_key.get((host, pid))
        if found is not None:
            return found
        same = self.by_pid.get(pid, [])
        if host is None and len(same) == 1:
            return same[0]
        if host is not None and len(same) == 1 and same[0].host is None:
            return same[0]
        return None


_Key = tuple[str | None, int | None]


def _twice(workers: Iterable[Worker], key: Callable[[Worker], _Key],
           value: Callable[[Worker], int | None]) -> list[tuple[_Key, list[int | None]]]:
    """The keys (a role and a rank, or a host and a pid) more than one worker is listed under,
    each with their values, sorted (workers without a rank or a pid aside)."""
    found: dict[_Key, list[int | None]] = defaultdict(list)
    for worker in workers:
        if worker.rank is not None and worker.pid is not None:
            found[key(worker)].append(value(worker))
    return sorted(((k, v) for k, v in found.items() if len(v) > 1),
                  key=lambda item: (str(item[0][0]), item[0][1] or 0))


def _device_identity(subject: str, record: PeriodRecord, read: AttemptRead,
                     workers: _Workers) -> Iterator[Finding]:
    for device in read.devices:
        name = device.path.rsplit("/", 1)[-1]
        match = DEVICE_EVIDENCE.parts(name)
        cite = Citation(device.path)
        if match is None:
            yield finding("AUD110", subject, [cite], form="misnamed", file=name,
                          expected=_own_name(DEVICE_EVIDENCE, workers.hosts))
            continue
        name_pid, name_rank, name_role = int(match["pid"]), int(match["rank"]), match["role"]
        name_host = match.get("host")
        checks: list[tuple[str, object, object, str]] = [
            ("pid", name_pid, device.pid, "/pid"),
            ("rank", name_rank, device.rank, "/rank"),
            ("role", name_role, device.role, "/role"),
        ]
        if name_host is not None:
            checks.append(("host", name_host, device.hostname, "/hostname"))
        for what, in_name, in_file, pointer in checks:
            if in_file is not None and in_file != in_name:
                yield finding("AUD110", subject,
                              [Citation(device.path, pointer=pointer, quote=str(in_file))],
                              form="name_vs_content", file=name, what=what, in_name=in_name,
                              in_file=in_file)
        listed = workers.get(name_host, name_pid)
        if listed is None:
            yield finding("AUD110", subject, [cite], form="not_a_worker", file=name,
                          pid=name_pid)
        elif listed.rank is not None and listed.rank != name_rank:
            yield finding("AUD110", subject,
                          [cite, Citation(record.path, pointer=listed.pointer + "/rank")],
                          form="rank_vs_record", file=name, rank=name_rank, pid=name_pid,
                          listed_rank=listed.rank)
        if listed is not None and _other_host(device.hostname, listed.host):
            yield finding("AUD110", subject,
                          [Citation(device.path, pointer="/hostname",
                                    quote=device.hostname or ""),
                           Citation(record.path, pointer=listed.pointer + "/host")],
                          form="host_vs_record", file=name, host=device.hostname,
                          pid=name_pid, listed_host=listed.host)


def _trace_identity(subject: str, read: AttemptRead, workers: _Workers) -> Iterator[Finding]:
    for trace in read.traces:
        name = trace.path.rsplit("/", 1)[-1]
        who = ALLOCATOR_TRACE.worker_of(name)
        if who is None:
            yield finding("AUD110", subject, [Citation(trace.path)], form="misnamed", file=name,
                          expected=_own_name(ALLOCATOR_TRACE, workers.hosts))
            continue
        host, pid = who
        for other_pid, line in trace.pids:
            if other_pid != pid:
                yield finding("AUD110", subject, [Citation(trace.path, line=line)],
                              form="line_pid", file=name, other_pid=other_pid)
        if len(trace.hosts) > 1:  # (two nodes' processes of one pid in one file)
            (first, first_line), (second, second_line) = trace.hosts[:2]
            yield finding("AUD110", subject, [Citation(trace.path, line=first_line),
                                              Citation(trace.path, line=second_line)],
                          form="two_writers", file=name, pid=pid, first=first,
                          first_line=first_line, second=second, second_line=second_line)
        owner = workers.get(host, pid)
        if owner is None:
            yield finding("AUD110", subject, [Citation(trace.path)], form="not_a_worker",
                          file=name, pid=pid)
            continue
        for rank, line in trace.ranks:
            if owner.rank is not None and rank != owner.rank:
                yield finding("AUD110", subject, [Citation(trace.path, line=line)],
                              form="line_rank", file=name, rank=rank, pid=pid,
                              listed_rank=owner.rank)
        for other, line in trace.hosts:
            if _other_host(other, owner.host):
                yield finding("AUD110", subject, [Citation(trace.path, line=line, quote=other)],
                              form="line_host", file=name, host=other, pid=pid,
                              listed_host=owner.host)


def _other_host(said: str | None, listed: str | None) -> bool:
    """Whether a file's own word on its host contradicts the record's for that worker (the
    node's short names compared: a fully qualified one is the same node)."""
    return bool(said) and bool(listed) and str(said).split(".", 1)[0] \
        != str(listed).split(".", 1)[0]


def _own_name(kind: EvidenceKind, hosts: bool) -> str:
    """The name form (without its folder) a file of ``kind`` should have."""
    return kind.shown_form(host=hosts).rsplit("/", 1)[-1]


def _process_identity(subject: str, record: PeriodRecord, read: AttemptRead,
                      workers: _Workers) -> Iterator[Finding]:
    """A process record's name against its content, and its role against the worker the
    record lists under its (host, pid): seed 000's rule reads the role (a policy's 143
    under a controller's name, or content, is never the controller's)."""
    for process in read.processes:
        if process.path is None:
            continue
        name = process.path.rsplit("/", 1)[-1]
        match = PROCESS_RECORD.parts(name)
        if match is None:
            yield finding("AUD110", subject, [Citation(process.path)], form="misnamed",
                          file=name, expected=_own_name(PROCESS_RECORD, True))
            continue
        name_host, name_role, name_pid = match["host"], match["role"], int(match["pid"])
        for what, in_name, in_file in (("host", name_host, process.host),
                                       ("role", name_role, process.role),
                                       ("pid", name_pid, process.pid)):
            if in_file is not None and in_file != in_name:
                yield finding("AUD110", subject,
                              [Citation(process.path, pointer=f"/{what}", quote=str(in_file))],
                              form="name_vs_content", file=name, what=what, in_name=in_name,
                              in_file=in_file)
        listed = workers.get(name_host, name_pid)
        role = process.role if process.role is not None else name_role
        # (a wrapper's role word may differ from the trainer's own for one process, "rank"
        # and "policy"; the controller's never: seed 000's excuse is the controller's alone)
        if listed is not None and listed.role is not None and listed.role != role \
                and CONTROLLER in (listed.role, role):
            yield finding("AUD110", subject,
                          [Citation(process.path, pointer="/role", quote=role),
                           Citation(record.path, pointer=listed.pointer + "/role")],
                          form="role_vs_record", file=name, role=role, pid=name_pid,
                          listed_role=listed.role)
