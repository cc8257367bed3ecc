"""The cross-checks (:func:`auditor.validate.checks.validate`) on hand-built model values:
a consistent study gives no finding, and each planted disagreement gives its rule's, about
the period it concerns."""

from __future__ import annotations

from dataclasses import replace

import pytest

from auditor.model import (
    AuditOptions,
    Collected,
    Finding,
    HostIdle,
    IdleCheck,
    TrialRecord,
    Worker,
)
from auditor.validate.checks import validate
from tests.helpers import CountedStr
from tests.reason.values import (
    ATTEMPT_DIR,
    PAIR,
    PIDS,
    SUBJECT,
    T0,
    attempt,
    collected,
    completed_phases,
    device,
    period,
    phase,
    row,
    sacct,
    sacct_job,
    trace,
    trial,
)


def checked(study: Collected) -> list[tuple[str, str]]:
    """(rule, subject) of every finding of the cross-checks."""
    return [(item.rule_id, item.subject)
            for item in validate(study.timeline, study, AuditOptions())]


def one(**changes: object) -> Collected:
    """The consistent study, one period, with a sacct row and commit pins, changed."""
    the_attempt = attempt(**changes)  # type: ignore[arg-type]
    return collected(period(the_attempt), dump=sacct(sacct_job()), commits={PAIR: "c"})


def with_devices(*devices: object) -> Collected:
    """The consistent study with ``devices`` read for its attempt."""
    clean = attempt()
    read = replace(clean.read, devices=tuple(devices))  # type: ignore[arg-type]
    return collected(period(replace(clean, read=read)), dump=sacct(sacct_job()),
                     commits={PAIR: "c"})


def details(study: Collected) -> list[str]:
    """What every finding says, without its leading subject (:func:`describe`)."""
    from auditor.rules import describe

    return [describe(item) for item in validate(study.timeline, study, AuditOptions())]


def test_the_consistent_study_gives_no_finding() -> None:
    assert checked(one()) == []
    assert checked(collected(period(attempt()))) == []  # (no sacct, no pins: nothing to say)


def test_the_idle_check_must_have_passed() -> None:
    for idle in (None, IdleCheck(False, T0 + 700 * 10**9, (900, 0), 1)):
        study = collected(period(attempt(), idle=idle))
        assert checked(study) == [("AUD118", SUBJECT)]


def test_an_idle_check_timed_before_the_run_ended_shows_nothing_of_it() -> None:
    """A passed check timed before the last attempt's end (by more than two clocks differ)
    is no post-period check: AUD118 before_end. Within a minute, or after, it stands."""
    ended = trial().finished_ns
    assert ended is not None
    for at, found in ((T0, [("AUD118", SUBJECT)]), (ended - 30 * 10**9, []),
                      (ended + 5 * 10**9, [])):
        study = collected(period(attempt(), idle=IdleCheck(True, at, (0, 0), 0)))
        assert checked(study) == found, at


def test_a_trial_that_disagrees_with_its_period_is_aud112() -> None:
    assert checked(one(the_trial=replace(trial(), gpus=4))) == [("AUD112", SUBJECT)]


def test_two_ranks_on_one_gpu_is_aud113() -> None:
    study = with_devices(device(0, PIDS[0]), device(1, PIDS[1], gpu_uuid="GPU-0000-0"))
    found = validate(study.timeline, study, AuditOptions())
    assert [(f.rule_id, f.value("uuid"), f.value("ranks")) for f in found] == [
        ("AUD113", "GPU-0000-0", "0, 1")]


def test_a_device_whose_content_contradicts_its_name_is_aud110() -> None:
    study = with_devices(device(0, PIDS[0], rank=1), device(1, PIDS[1]))
    assert checked(study) == [("AUD110", SUBJECT)]
    assert details(study) == [f"worker-policy-0-{PIDS[0]}.json: file name says rank 0, "
                              "content says 1"]


@pytest.mark.parametrize(("said", "contradicts"), [
    ("n2", True), ("n1.cluster.local", False), (None, False)])
def test_a_workers_file_naming_another_host_than_the_record_is_aud110(
        said: str | None, contradicts: bool) -> None:
    """v1 names carry no host; a v1.2 record lists each worker's: a device file's own
    ``hostname``, or a trace record's ``host``, of another node than the record's is a
    worker that is not who the record says (a fully qualified name is the same node)."""
    clean = attempt()
    workers = tuple(replace(w, host="n1") for w in clean.spec.workers)
    devices = (replace(clean.read.devices[0], hostname=said), clean.read.devices[1])
    traces = (replace(clean.read.traces[0], hosts=((said, 3),) if said else ()),
              clean.read.traces[1])
    changed = replace(clean, spec=replace(clean.spec, workers=workers),
                      read=replace(clean.read, devices=devices, traces=traces))
    study = collected(period(changed), dump=sacct(sacct_job()), commits={PAIR: "c"})
    said_of = [d for d in details(study) if "where the period lists" in d or "host" in d]
    assert bool(said_of) is contradicts, said_of
    if contradicts:
        assert any(d.endswith(f"host n2 but the period lists pid {PIDS[0]} on n1")
                   for d in said_of), said_of
        assert any(f"a record of host n2, where the period lists pid {PIDS[0]} on n1" in d
                   for d in said_of), said_of


def test_a_device_of_another_job_is_aud111() -> None:
    study = with_devices(device(0, PIDS[0]), device(1, PIDS[1], job_id="7000999"))
    assert checked(study) == [("AUD111", SUBJECT)]


def test_a_job_sacct_does_not_know_is_aud119() -> None:
    study = collected(period(attempt()), dump=sacct(sacct_job(raw="7000555",
                                                              job_id="7000000_5")))
    assert ("AUD119", SUBJECT) in checked(study)
    assert "job 7000001 has no allocation row in the sacct dump" in details(study)


def test_a_trace_of_another_pid_is_aud110() -> None:
    stray = trace(PIDS[0], completed_phases(PIDS[0], 0))
    stray = replace(stray, pids=((PIDS[0], 1), (9999, 2)))
    study = one(traces=[stray, trace(PIDS[1], completed_phases(PIDS[1], 1))])
    assert checked(study) == [("AUD110", SUBJECT)]


def test_a_phase_outside_the_invocation_is_aud116() -> None:
    late = (*completed_phases(PIDS[1], 1), phase(PIDS[1], 1, "idle", 3, start=601 * 10**9))
    study = one(traces=[trace(PIDS[0], completed_phases(PIDS[0], 0)), trace(PIDS[1], late)])
    assert checked(study) == [("AUD116", SUBJECT)]


@pytest.mark.parametrize(("started", "finished"), [
    (T0 - 10 * 10**9, T0 + 600 * 10**9),  # (before the allocation's Start)
    (T0, T0 + 800 * 10**9),  # (after its End)
])
def test_an_invocation_outside_its_allocation_is_aud117(started: int, finished: int) -> None:
    moved: TrialRecord = replace(trial(), started_ns=started, finished_ns=finished)
    traces = [replace(t, first_ns=None, last_ns=None) for t in attempt().read.traces]
    # (the idle check after the moved end: this test is of the allocation alone)
    later = collected(period(attempt(the_trial=moved, traces=traces),
                             idle=IdleCheck(True, finished + 10**9, (0, 0), 0)),
                      dump=sacct(sacct_job()), commits={PAIR: "c"})
    assert checked(later) == [("AUD117", SUBJECT)]


def test_a_period_that_ran_another_commit_is_aud121() -> None:
    study = collected(period(attempt()), dump=sacct(sacct_job()), commits={PAIR: "d"})
    found: list[Finding] = validate(study.timeline, study, AuditOptions())
    assert [(f.rule_id, f.value("actual"), f.value("expected")) for f in found] == [
        ("AUD121", "c", "d")]


def test_a_file_named_for_a_pid_of_thousands_of_digits_is_no_workers_file() -> None:
    """A manifest may name a file anything: a device file or trace named for a pid past
    64 bits (5,000 digits here, which Python will not even turn into a number) is no
    worker's file, and the workers' own are still found; nothing raises."""
    huge = "9" * 5000
    clean = attempt()
    odd = replace(clean, files=(*clean.files,
                                row(f"{ATTEMPT_DIR}/device-evidence/worker-policy-0-{huge}.json",
                                    "device_evidence", "missing"),
                                row(f"{ATTEMPT_DIR}/allocator-traces/allocator-{huge}.jsonl",
                                    "allocator_trace", "missing")))
    study = collected(period(odd), dump=sacct(sacct_job()), commits={PAIR: "c"})
    assert checked(study) == checked(one())


def test_each_nodes_idle_check_is_looked_up_once_among_the_workers_hosts() -> None:
    """An attempt on H nodes, each node's own check passed but one node of no worker whose
    check failed: each node's check is looked up among the workers' hosts, not compared
    with each of them (H²/2 tests: 1.7 s per period at 16,384 nodes)."""
    many = 1_000
    hosts = [CountedStr(f"gpu-node-{i:05d}") for i in range(many)]
    clean = attempt()
    workers = tuple(Worker("policy", rank, 100, f"/workers/{rank}", host=host)
                    for rank, host in enumerate(hosts))
    checks = (*(HostIdle(CountedStr(str(host)), True) for host in hosts),
              HostIdle(CountedStr("login-node"), False))
    the_period = period(replace(clean, spec=replace(clean.spec, workers=workers)),
                 idle=IdleCheck(True, T0 + 700 * 10**9, (0, 0), 0, hosts=checks))
    study = collected(the_period)
    CountedStr.compared = 0
    found = [item for item in validate(study.timeline, study, AuditOptions())
             if item.rule_id == "AUD118"]
    assert [(f.value("form"), f.value("host")) for f in found] == [("host_failed", "login-node")]
    assert CountedStr.compared <= 4 * many, CountedStr.compared
