"""One attempt's verdict on hand-built model values (no study on disk): which finding
blocks and with which reason (:func:`attempt_blockers`, the rule's ``blocks``), and the
decision for each way an attempt ends (:func:`judge_attempt` through
:func:`evidence_shows` and :func:`decide`)."""

from __future__ import annotations

import pytest

from auditor.model import AttemptEvidence, AttemptRead, Citation, Finding, Reason, SacctDump
from auditor.reason.verdict import Judgement, attempt_blockers, judge_attempt
from auditor.rules import RULES, finding
from tests.reason.values import (
    LOG,
    PIDS,
    RECORD,
    SUBJECT,
    TRIAL,
    attempt,
    collected,
    completed_phases,
    context,
    event,
    log,
    period,
    phase,
    sacct,
    sacct_job,
    trace,
    trace_path,
    trial,
)

FLAG = "COSMOS_SHUTDOWN_ON_NO_POLICY_REPLICAS"


def judge(the_attempt: AttemptEvidence | None = None, *, findings: tuple[Finding, ...] = (),
          dump: SacctDump | None = None) -> Judgement:
    """Judge one attempt of one period, as the engine would."""
    one = the_attempt if the_attempt is not None else attempt()
    the_period = period(one)
    return judge_attempt(the_period, one, context(collected(the_period, dump=dump), findings))


def rules_of(judgement: Judgement) -> list[str]:
    """The decisive findings' rule ids, in order."""
    return [item.rule_id for item in judgement.decisive]


# ----------------------------------------------------------------- the blockers


def test_blockers_follow_the_documented_order_whatever_the_findings_order() -> None:
    """Integrity first, then the files' contents, the period record's, the cross-checks;
    each with its rule's ``blocks`` reason. The findings are handed over in the reverse
    order, so only the function's own order can put them right."""
    the_attempt = attempt(statuses={LOG: "mismatched"})
    the_period = period(the_attempt, findings=[finding(
        "AUD015", RECORD, [Citation(RECORD)], field="period", inside=2, outside=1)])
    cross = finding("AUD110", SUBJECT, [Citation(trace_path(PIDS[0]))], detail="pid differs")
    contents = finding("AUD002", trace_path(PIDS[1]), [Citation(trace_path(PIDS[1]), line=3)],
                       where=":3", error="seq must be an integer")
    integrity = finding("AUD102", LOG, [Citation(LOG)], manifest=RECORD, what="SHA-256",
                        expected="a", actual="b")
    study = collected(the_period)
    blockers = attempt_blockers(the_period, the_attempt,
                                context(study, [cross, contents, integrity]))
    assert [(reason, item.rule_id) for reason, item in blockers] == [
        (Reason.EVIDENCE_MISMATCH, "AUD102"),
        (Reason.EVIDENCE_INVALID, "AUD002"),
        (Reason.IDENTITY_MISMATCH, "AUD015"),
        (Reason.IDENTITY_MISMATCH, "AUD110"),
    ]


def test_an_integrity_finding_blocks_only_for_the_status_of_its_row() -> None:
    """A row marked missing is blocked by its AUD101, first; a verified row's AUD101 (a
    stale one) is not an integrity blocker."""
    missing = finding("AUD101", TRIAL, [Citation(TRIAL)], manifest=RECORD)
    the_attempt = attempt(statuses={TRIAL: "missing"})
    the_period = period(the_attempt)
    blockers = attempt_blockers(the_period, the_attempt,
                                context(collected(the_period), [missing]))
    assert [(r, f.rule_id) for r, f in blockers] == [(Reason.EVIDENCE_MISSING, "AUD101")]
    verified = attempt()
    blockers = attempt_blockers(period(verified), verified,
                                context(collected(period(verified)), [missing]))
    assert blockers == []


BLOCKING_FILE_RULES = sorted(rule_id for rule_id, rule in RULES.items()
                             if rule.blocks is not None and rule.stage == "collect"
                             and rule_id != "AUD015")
BLOCKING_CROSS_CHECKS = sorted(rule_id for rule_id, rule in RULES.items()
                               if rule.blocks is not None and rule.stage == "validate"
                               and rule_id not in ("AUD101", "AUD102", "AUD103", "AUD104"))


@pytest.mark.parametrize("rule_id", BLOCKING_FILE_RULES)
def test_a_file_finding_blocks_with_its_rules_reason(rule_id: str) -> None:
    the_attempt = attempt()
    item = finding(rule_id, LOG, [Citation(LOG)])
    blockers = attempt_blockers(period(the_attempt), the_attempt,
                                context(collected(period(the_attempt)), [item]))
    assert blockers == [(RULES[rule_id].blocks, item)]


@pytest.mark.parametrize("rule_id", BLOCKING_CROSS_CHECKS)
def test_a_cross_check_about_the_period_blocks_with_its_rules_reason(rule_id: str) -> None:
    the_attempt = attempt()
    item = finding(rule_id, SUBJECT, [Citation(RECORD)])
    blockers = attempt_blockers(period(the_attempt), the_attempt,
                                context(collected(period(the_attempt)), [item]))
    assert blockers == [(RULES[rule_id].blocks, item)]


def test_informational_and_warning_findings_block_nothing() -> None:
    """A trace line that is not JSON (AUD003: the records around it count), a clipped
    line, a launcher disagreement: none has a ``blocks``, none blocks."""
    the_attempt = attempt()
    items = [finding("AUD003", trace_path(PIDS[0]), [Citation(trace_path(PIDS[0]), line=2)]),
             finding("AUD007", LOG, [Citation(LOG, line=5)], length=9, limit=4),
             finding("AUD211", SUBJECT, [Citation(TRIAL)], status="ok", error="",
                     verdict="unresolved")]
    assert all(RULES[item.rule_id].blocks is None for item in items)
    assert attempt_blockers(period(the_attempt), the_attempt,
                            context(collected(period(the_attempt)), items)) == []


def test_a_trace_with_nothing_but_findings_is_invalid_evidence() -> None:
    """Every line of a trace unreadable (only AUD003s, which block nothing one by one):
    the trace holds nothing, so the attempt's evidence is invalid."""
    bad = finding("AUD003", trace_path(PIDS[0]), [Citation(trace_path(PIDS[0]), line=1)],
                  error="x")
    traces = [trace(PIDS[0], (), [bad], samples=0),
              trace(PIDS[1], completed_phases(PIDS[1], 1))]
    the_attempt = attempt(traces=traces)
    blockers = attempt_blockers(period(the_attempt), the_attempt,
                                context(collected(period(the_attempt))))
    assert blockers == [(Reason.EVIDENCE_INVALID, bad)]


def test_a_finding_cited_twice_blocks_once() -> None:
    the_attempt = attempt()
    item = finding("AUD001", LOG, [Citation(LOG), Citation(TRIAL)], error="x")
    blockers = attempt_blockers(period(the_attempt), the_attempt,
                                context(collected(period(the_attempt)), [item]))
    assert blockers == [(Reason.EVIDENCE_INVALID, item)]


def test_an_unfinished_element_blocks_before_any_other_blocker() -> None:
    """sacct still shows the element RUNNING: ``array_partial`` comes first, even before
    a mismatched file."""
    mismatch = finding("AUD102", LOG, [Citation(LOG)])
    judgement = judge(attempt(statuses={LOG: "mismatched"}), findings=(mismatch,),
                      dump=sacct(sacct_job("RUNNING", end=None)))
    assert (judgement.outcome, judgement.reason) == ("unresolved", Reason.ARRAY_PARTIAL)
    assert rules_of(judgement) == ["AUD210", "AUD102"]


def test_an_attempt_without_a_readable_trial_is_unresolved() -> None:
    """Its trial listed but unreadable (no finding of its own here): evidence invalid."""
    clean = attempt()
    read = AttemptRead(clean.read.key, (), None, log(), clean.read.traces, (), ())
    judgement = judge(AttemptEvidence(clean.subject, clean.spec, read, clean.files))
    assert (judgement.reason, rules_of(judgement)) == (Reason.EVIDENCE_INVALID, ["AUD214"])


# ------------------------------------------------------------------ the decision


def test_a_clean_exit_with_the_terminal_event_and_every_phase_is_completed() -> None:
    judgement = judge()
    assert (judgement.outcome, judgement.reason) == ("completed", Reason.COMPLETED)
    assert rules_of(judgement) == []
    assert any("terminal event for step 20" in s for s in judgement.shows)


def test_a_clean_exit_without_the_terminal_event_is_unresolved() -> None:
    judgement = judge(attempt(the_log=log(terminal=False)))
    assert (judgement.outcome, judgement.reason) == ("unresolved",
                                                     Reason.TERMINAL_EVENT_MISSING)
    assert rules_of(judgement) == ["AUD201"]


@pytest.mark.parametrize("kind", ["rendezvous", "ray_system", "storage", "network"])
def test_a_completed_run_outlives_a_store_a_gcs_a_disk_or_a_service_line(kind: str) -> None:
    """A torchrun agent's store gone at teardown, a raylet losing the GCS as the head exits,
    a remote service retried at start: what ends an attempt that did not complete, never
    what undoes one that did (contract v1.2: a clean exit has no cause)."""
    judgement = judge(attempt(the_log=log(events=[event(kind, 95)])))
    assert (judgement.outcome, judgement.reason) == ("completed", Reason.COMPLETED)


@pytest.mark.parametrize("kind", ["gpu_error", "host_oom", "nccl_timeout"])
def test_a_completed_run_with_a_gpu_fault_host_oom_or_nccl_timeout_stays_unresolved(
        kind: str) -> None:
    """The near-misses: a fault of the machine the run was measured on casts doubt on what
    it measured, whatever its exit."""
    judgement = judge(attempt(the_log=log(events=[event(kind, 50)])))
    assert (judgement.outcome, judgement.reason) == ("unresolved",
                                                     Reason.INFRASTRUCTURE_FAILURE)


@pytest.mark.parametrize(("exit_code", "terminal", "kind"), [
    (0, False, "storage"),  # (the log lost its end: the disk may be why)
    (1, False, "network"), (1, True, "rendezvous"), (137, True, "ray_system")])
def test_an_outlived_line_still_ends_a_run_that_did_not_complete(
        exit_code: int, terminal: bool, kind: str) -> None:
    judgement = judge(attempt(the_trial=trial(exit_code=exit_code),
                              the_log=log(terminal=terminal, events=[event(kind, 50)])))
    assert (judgement.outcome, judgement.reason) == ("unresolved",
                                                     Reason.INFRASTRUCTURE_FAILURE)


def test_a_clean_exit_with_a_rank_short_of_a_completion_phase_is_unresolved() -> None:
    """Rank 1 has ``actor_update`` but its ``weight_sync`` raised."""
    traces = [trace(PIDS[0], completed_phases(PIDS[0], 0)),
              trace(PIDS[1], (phase(PIDS[1], 1, "actor_update", 1, start=100),
                              phase(PIDS[1], 1, "weight_sync", 2, start=200,
                                    error="RuntimeError")))]
    judgement = judge(attempt(traces=traces))
    assert (judgement.outcome, judgement.reason) == ("unresolved",
                                                     Reason.COMPLETION_PHASE_MISSING)
    assert rules_of(judgement) == ["AUD202"]
    assert "rank 1: weight_sync step 20 raised RuntimeError" in \
        judgement.decisive[0].value("problems")


def test_completion_phases_out_of_order_do_not_count() -> None:
    """``weight_sync`` must follow the update: one that started before it finished is not
    the post-update sync."""
    early = [trace(pid, (phase(pid, rank, "weight_sync", 1, start=10),
                         phase(pid, rank, "actor_update", 2, start=100)))
             for rank, pid in enumerate(PIDS)]
    assert judge(attempt(traces=early)).reason is Reason.COMPLETION_PHASE_MISSING


@pytest.mark.parametrize("exit_code", [0, 143])
def test_a_coordinated_shutdown_is_a_clean_exit(exit_code: int) -> None:
    """The controller exited 143 with the shutdown flag on and no signal received."""
    the_trial = trial(exit_code=exit_code, processes=[("controller", 143), ("policy", 0)],
                      env=[(FLAG, "1")])
    judgement = judge(attempt(the_trial=the_trial))
    assert (judgement.outcome, judgement.reason) == ("completed", Reason.COMPLETED)
    assert rules_of(judgement) == ["AUD205"]


def test_exit_143_with_the_flag_off_is_a_kill() -> None:
    the_trial = trial(exit_code=143, processes=[("controller", 143)], env=[(FLAG, "0")])
    judgement = judge(attempt(the_trial=the_trial))
    assert (judgement.outcome, judgement.reason) == ("unresolved", Reason.KILLED)
    assert rules_of(judgement) == ["AUD204"]
    assert judgement.exit is not None and judgement.exit.kind == "sigterm"


def test_an_eligible_failure_is_failed() -> None:
    """Rank 0's ``rollout_init`` raised a listed out-of-memory error: a measurement."""
    oom = phase(PIDS[0], 0, "rollout_init", 1, step=None, error="torch.OutOfMemoryError")
    traces = [trace(PIDS[0], (oom,)), trace(PIDS[1])]
    judgement = judge(attempt(the_trial=trial(exit_code=1), the_log=log(terminal=False),
                              traces=traces))
    assert (judgement.outcome, judgement.reason) == ("failed", Reason.ELIGIBLE_FAILURE)
    assert rules_of(judgement) == ["AUD203"]
    assert judgement.shows[0].startswith("Rank 0 recorded `rollout_init` ending in "
                                         "`torch.OutOfMemoryError`")


def test_an_unlisted_error_is_an_unclean_exit_not_a_failure() -> None:
    other = phase(PIDS[0], 0, "rollout_init", 1, step=None, error="ValueError")
    judgement = judge(attempt(the_trial=trial(exit_code=1), the_log=log(terminal=False),
                              traces=[trace(PIDS[0], (other,)), trace(PIDS[1])]))
    assert (judgement.outcome, judgement.reason) == ("unresolved", Reason.UNCLEAN_EXIT)
    assert rules_of(judgement) == ["AUD204"]


@pytest.mark.parametrize(("signal", "reason", "rule"), [
    ("SIGTERM", Reason.CANCELLED, "AUD206"),
    ("SIGUSR1", Reason.TIME_LIMIT, "AUD207"),
])
def test_a_signalled_attempt_is_unresolved_by_its_signal(signal: str, reason: Reason,
                                                         rule: str) -> None:
    """Even with every completion record and the terminal line: a signal was received."""
    judgement = judge(attempt(the_trial=trial(exit_code=0, signal=signal)))
    assert (judgement.outcome, judgement.reason) == ("unresolved", reason)
    assert rules_of(judgement) == [rule]


def test_exit_137_is_killed() -> None:
    judgement = judge(attempt(the_trial=trial(exit_code=137), the_log=log(terminal=False)))
    assert (judgement.outcome, judgement.reason) == ("unresolved", Reason.KILLED)
    assert rules_of(judgement) == ["AUD204"]
    assert judgement.exit is not None and judgement.exit.kind == "sigkill"


def test_an_nccl_error_before_a_gpu_oom_is_the_infrastructures() -> None:
    events = [event("nccl_error", 10, "ncclInternalError"), event("gpu_oom", 20)]
    judgement = judge(attempt(the_trial=trial(exit_code=1),
                              the_log=log(terminal=False, events=events)))
    assert (judgement.outcome, judgement.reason) == ("unresolved",
                                                     Reason.INFRASTRUCTURE_FAILURE)
    assert rules_of(judgement) == ["AUD209"]
    assert judgement.decisive[0].citations[0] == Citation(LOG, line=10,
                                                          quote="nccl_error at line 10")


def test_an_nccl_error_after_a_gpu_oom_is_its_knock_on() -> None:
    """The OOM came first: the peers' failed collectives follow from it."""
    events = [event("gpu_oom", 10), event("nccl_error", 20, "ncclInternalError")]
    judgement = judge(attempt(the_trial=trial(exit_code=1),
                              the_log=log(terminal=False, events=events)))
    assert (judgement.outcome, judgement.reason) == ("unresolved", Reason.UNCLEAN_EXIT)
    assert rules_of(judgement) == ["AUD204"]


@pytest.mark.parametrize("first", [("gpu_oom", ""), ("exception", "ValueError"),
                                   ("segfault", "SIGSEGV")])
@pytest.mark.parametrize("nccl", ["nccl_timeout", "nccl_error"])
def test_an_nccl_failure_after_a_ranks_own_failure_is_its_knock_on(
        first: tuple[str, str], nccl: str) -> None:
    """Peers time out in their collective after one rank ran out of memory, raised or
    crashed: the period is that rank's unclean exit (its cause), not the infrastructure's."""
    events = [event(first[0], 10, first[1]), event(nccl, 20, "ncclInternalError")]
    judgement = judge(attempt(the_trial=trial(exit_code=1),
                              the_log=log(terminal=False, events=events)))
    assert (judgement.outcome, judgement.reason) == ("unresolved", Reason.UNCLEAN_EXIT)
    assert judgement.cause is not None and judgement.cause.word == first_cause(first[0])


@pytest.mark.parametrize("later", ["exception", "child_failed"])
def test_an_nccl_timeout_before_a_ranks_failure_is_the_infrastructures(later: str) -> None:
    """The near-miss: the collective timed out first, and what follows is its knock-on."""
    events = [event("nccl_timeout", 10), event(later, 20, "RuntimeError")]
    judgement = judge(attempt(the_trial=trial(exit_code=1),
                              the_log=log(terminal=False, events=events)))
    assert (judgement.outcome, judgement.reason) == ("unresolved",
                                                     Reason.INFRASTRUCTURE_FAILURE)
    assert judgement.decisive[0].citations[0].line == 10


def first_cause(kind: str) -> str:
    return {"gpu_oom": "gpu_oom", "exception": "python_exception", "segfault": "segfault"}[kind]


def test_the_rank_whose_record_ended_first_is_the_root_whatever_its_line() -> None:
    """Contract v1.2, first in time by the records' own times: rank 0's record sits on an
    earlier line of its file but ended later (its knock-on, in the collective rank 1 left)."""
    traces = [trace(PIDS[0], (phase(PIDS[0], 0, "actor_update", 1, start=900,
                                    error="RuntimeError"),)),
              trace(PIDS[1], (phase(PIDS[1], 1, "actor_update", 5, start=100,
                                    error="RuntimeError"),))]
    judgement = judge(attempt(traces=traces, the_trial=trial(exit_code=1),
                              the_log=log(terminal=False)))
    assert judgement.cause is not None
    assert judgement.cause.detail.startswith("rank 1: actor_update raised"), judgement.cause


def test_an_nccl_error_before_a_kill_is_the_kills_knock_on() -> None:
    events = [event("nccl_error", 10, "ncclInternalError")]
    judgement = judge(attempt(the_trial=trial(exit_code=137),
                              the_log=log(terminal=False, events=events)))
    assert judgement.reason is Reason.KILLED


def test_an_nccl_error_in_a_completed_runs_teardown_does_not_matter() -> None:
    events = [event("nccl_error", 95, "ncclInternalError")]
    assert judge(attempt(the_log=log(events=events))).reason is Reason.COMPLETED


@pytest.mark.parametrize(("state", "reason", "rule"), [
    ("TIMEOUT", Reason.TIME_LIMIT, "AUD207"),
    ("CANCELLED", Reason.CANCELLED, "AUD206"),
    ("NODE_FAIL", Reason.INFRASTRUCTURE_FAILURE, "AUD208"),
    ("OUT_OF_MEMORY", Reason.INFRASTRUCTURE_FAILURE, "AUD209"),
])
def test_the_schedulers_end_of_an_unclean_attempt_is_its_reason(
        state: str, reason: Reason, rule: str) -> None:
    judgement = judge(attempt(the_trial=trial(exit_code=1), the_log=log(terminal=False)),
                      dump=sacct(sacct_job(state)))
    assert (judgement.outcome, judgement.reason) == ("unresolved", reason)
    assert rules_of(judgement) == [rule]


def test_a_time_limit_after_a_clean_exit_leaves_the_attempt_standing() -> None:
    """sacct's TIMEOUT ended the job after the invocation had exited 0: AUD216, completed."""
    judgement = judge(dump=sacct(sacct_job("TIMEOUT", end=1_700_000_700)))
    assert (judgement.outcome, judgement.reason) == ("completed", Reason.COMPLETED)
    assert rules_of(judgement) == ["AUD216"]


def test_a_time_limit_before_the_exit_is_the_schedulers_word() -> None:
    """The job ended before the invocation's recorded finish: the time limit stands."""
    judgement = judge(dump=sacct(sacct_job("TIMEOUT", end=1_700_000_100)))
    assert (judgement.outcome, judgement.reason) == ("unresolved", Reason.TIME_LIMIT)


def test_a_scheduler_kill_explains_missing_evidence() -> None:
    """Evidence missing under a job the scheduler cancelled: the cancellation is the
    reason, the missing file among the decisive findings."""
    missing = finding("AUD101", LOG, [Citation(LOG)], manifest=RECORD)
    judgement = judge(attempt(the_trial=trial(exit_code=1), statuses={LOG: "missing"}),
                      findings=(missing,), dump=sacct(sacct_job("CANCELLED")))
    assert (judgement.outcome, judgement.reason) == ("unresolved", Reason.CANCELLED)
    assert rules_of(judgement) == ["AUD206", "AUD101"]


def test_a_scheduler_kill_does_not_excuse_altered_evidence() -> None:
    mismatch = finding("AUD102", LOG, [Citation(LOG)], manifest=RECORD)
    judgement = judge(attempt(the_trial=trial(exit_code=1), statuses={LOG: "mismatched"}),
                      findings=(mismatch,), dump=sacct(sacct_job("CANCELLED")))
    assert judgement.reason is Reason.EVIDENCE_MISMATCH


def test_a_cancellation_line_after_a_clean_exit_leaves_the_attempt_standing() -> None:
    """slurmstepd's cancellation line in the log of an attempt whose invocation exited 0:
    the job was ended in its teardown; AUD216 says so, the attempt stands."""
    events = [event("slurm_cancelled", 95, "7000001")]
    judgement = judge(attempt(the_log=log(events=events)))
    assert (judgement.outcome, judgement.reason) == ("completed", Reason.COMPLETED)
    assert rules_of(judgement) == ["AUD216"]
    assert judgement.decisive[0].value("said") == "slurmstepd cancelled the job (log line 95)"


@pytest.mark.parametrize(("kind", "reason", "rule"), [
    ("slurm_time_limit", Reason.TIME_LIMIT, "AUD207"),
    ("slurm_cancelled", Reason.CANCELLED, "AUD206"),
    ("nccl_timeout", Reason.INFRASTRUCTURE_FAILURE, "AUD209"),
    ("host_oom", Reason.INFRASTRUCTURE_FAILURE, "AUD209"),
])
def test_the_logs_word_on_an_unclean_end_is_its_reason(kind: str, reason: Reason,
                                                       rule: str) -> None:
    judgement = judge(attempt(the_trial=trial(exit_code=1),
                              the_log=log(terminal=False, events=[event(kind, 50)])))
    assert (judgement.outcome, judgement.reason) == ("unresolved", reason)
    assert rules_of(judgement) == [rule]
    assert judgement.decisive[0].citations[0].line == 50


def test_the_schedulers_state_is_the_last_attempts_of_its_job_only() -> None:
    """Two attempts in one job: sacct's TIMEOUT is the later one's end, not the first's."""
    first, second = attempt(index=0), attempt(index=1)
    the_period = period(first, second)
    study = collected(the_period, dump=sacct(sacct_job("TIMEOUT", end=1_700_000_100)))
    ctx = context(study)
    assert ctx.last_attempt_of_job == {"7000001": f"{SUBJECT}#1"}
    assert judge_attempt(the_period, first, ctx).reason is Reason.COMPLETED
    assert judge_attempt(the_period, second, ctx).reason is Reason.TIME_LIMIT
