"""The post-period idle check (contract v1 and v1.2): the period record's, each worker
host's own in it, and each node's own file (``idle/<host>.json``) the record is held to.
``AUD118`` when one is absent, failed or (under a required policy) could not be made."""

from __future__ import annotations

from collections.abc import Iterator

from auditor.model import (
    CLOCK_SLACK_NS,
    Citation,
    Finding,
    IdleCheck,
    PeriodEvidence,
    PeriodRecord,
)
from auditor.rules import finding


def idle_checks(period: PeriodEvidence, optional: bool) -> Iterator[Finding]:
    """Every idle check finding of a readable period (``optional``: the protocol's policy
    is optional, so a check not made decides nothing)."""
    record = period.record
    subject = period.subject
    idle = record.idle_check
    hosts = worker_hosts(period)
    if idle is not None and (idle.hosts or len(hosts) > 1):
        yield from _host_idle_checks(record, subject, idle, hosts, optional)
    elif idle is None:
        if not optional:  # (under an optional policy the report says it, and nothing more)
            yield finding("AUD118", subject, [Citation(record.path, pointer="/idle_check")],
                          form="absent")
    elif idle.passed is None and idle.unavailable is not None:
        if not optional:
            yield finding("AUD118", subject,
                          [Citation(record.path, pointer="/idle_check/unavailable",
                                    quote=idle.unavailable)],
                          form="unavailable", unavailable=idle.unavailable)
    elif idle.passed is not True:
        yield _failed(record, subject, idle)
    yield from _own_idle_files(period, idle, optional)
    yield from _checked_before_the_end(period, idle)


def _checked_before_the_end(period: PeriodEvidence, idle: IdleCheck | None
                            ) -> Iterator[Finding]:
    """An ``AUD118`` (``before_end``) for an idle check timed before the period's last attempt
    ended: it shows the GPUs before the run, not that the run left them idle."""
    trial = period.attempts[-1].read.trial if period.attempts else None
    if idle is None or trial is None or trial.finished_ns is None:
        return
    ended = trial.finished_ns
    times = [("/idle_check/checked_ns", idle.checked_ns),
             *((f"/idle_check/hosts/{item.host}/checked_ns", item.checked_ns)
               for item in idle.hosts)]
    for pointer, checked in times:
        if checked is not None and checked < ended - CLOCK_SLACK_NS:
            yield finding("AUD118", period.subject,
                          [Citation(period.record.path, pointer=pointer, quote=str(checked)),
                           Citation(trial.path, pointer="/invocation/finished_ns",
                                    quote=str(ended))],
                          form="before_end", seconds=(ended - checked) // 1_000_000_000)


def _failed(record: PeriodRecord, subject: str, idle: IdleCheck) -> Finding:
    """``AUD118`` for the record's own word that the check did not pass."""
    used = ", ".join(str(v) for v in idle.gpu_memory_used_mib) or "?"
    return finding(
        "AUD118", subject,
        [Citation(record.path, pointer="/idle_check/passed", quote=str(idle.passed))],
        passed=idle.passed, used=used, processes=idle.gpu_processes,
    )


def worker_hosts(period: PeriodEvidence) -> tuple[str, ...]:
    """The hosts the period's last attempt's workers ran on (contract v1.2), sorted."""
    if not period.attempts:
        return ()
    return tuple(sorted({w.host for w in period.attempts[-1].spec.workers if w.host}))


def _host_idle_checks(record: PeriodRecord, subject: str, idle: IdleCheck,
                      hosts: tuple[str, ...], optional: bool) -> Iterator[Finding]:
    """Every worker host's own idle check (contract v1.2): each must have passed; one that
    could not be made decides nothing under an optional policy. A node the workers do not
    name (a controller's) whose check failed fails the period too, and so does the record's
    own ``passed: false`` where no node's says why."""
    by_host = {item.host: item for item in idle.hosts}
    pointer = "/idle_check/hosts"
    if not idle.hosts:  # (the one-node form, for workers on several nodes)
        if not optional or idle.passed is False:
            yield finding("AUD118", subject, [Citation(record.path, pointer="/idle_check")],
                          form="one_node", hosts=", ".join(hosts))
        return
    failed = False
    for host in hosts or tuple(by_host):
        item = by_host.get(host)
        cite = Citation(record.path, pointer=f"{pointer}/{host}")
        if item is None:
            if not optional:  # (optional: a check not made decides nothing)
                yield finding("AUD118", subject, [Citation(record.path, pointer=pointer)],
                              form="host_absent", host=host)
        elif item.passed is None:
            if not optional:
                yield finding("AUD118", subject, [cite], form="host_unavailable", host=host,
                              unavailable=item.unavailable or "not said why")
        elif item.passed is not True:
            failed = True
            yield finding("AUD118", subject, [cite], form="host_failed", host=host)
    named = frozenset(hosts)  # (a scan of the tuple per node was H²/2: 1.7 s at 16,384)
    for host, item in sorted(by_host.items()):
        if host not in named and hosts and item.passed is False:  # (a node of no worker)
            failed = True
            yield finding("AUD118", subject,
                          [Citation(record.path, pointer=f"{pointer}/{host}")],
                          form="host_failed", host=host)
    if idle.passed is False and not failed:
        yield _failed(record, subject, idle)


def _own_idle_files(period: PeriodEvidence, idle: IdleCheck | None,
                    optional: bool) -> Iterator[Finding]:
    """Each node's own idle check file (``idle/<host>.json`` of the last attempt: the
    period's end) held against the record that gathered it: a node whose own file says its
    check failed (or, under a required policy, could not be made) never passes on the
    record's word. Where the record says the same of that node, its own finding says it."""
    if not period.attempts:
        return
    by_host = {item.host: item.passed for item in idle.hosts} if idle is not None else {}
    for own in period.attempts[-1].read.idle:
        if own.passed is True or (own.passed is None and optional):
            continue
        named = idle is not None and (not idle.hosts or own.host in by_host)
        said = None if idle is None else by_host.get(own.host) if idle.hosts else idle.passed
        if named and said is own.passed:
            continue
        yield finding(
            "AUD118", period.subject,
            [Citation(own.path or "", pointer="/passed", quote=_json_word(own.passed))],
            form="own_file", host=own.host, path=own.path, passed=_json_word(own.passed),
            why=f" ({own.unavailable})" if own.unavailable else "",
            said=f"passed={_json_word(said)}" if named else "nothing of it")


def _json_word(value: bool | None) -> str:
    """``true``, ``false`` or ``null``, as the file says it."""
    return "null" if value is None else "true" if value else "false"


