"""A failure cause for every period that did not complete (issue 20 item 1; contract v1.1).

End to end on generated studies, one period per outcome: the word in ``summary.json``, the
``AUD218`` finding that cites what it rests on, null for a clean exit.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from tests.helpers import audit, outcome_study, rewrite

OUTCOMES = ["completed", "terminal_missing", "rollout_init_oom", "coordinated_shutdown",
            "flag_off_143", "scancel_sigusr1", "sigkill_137", "cancelled", "timed_out",
            "node_failure"]
EXPECTED = {
    "completed": None, "terminal_missing": None, "coordinated_shutdown": None,
    "rollout_init_oom": "gpu_oom", "flag_off_143": "signal", "scancel_sigusr1": "time_limit",
    "sigkill_137": "signal", "cancelled": "cancelled", "timed_out": "time_limit",
    "node_failure": "node_failure",
}


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return outcome_study(tmp_path_factory.mktemp("causes") / "study", OUTCOMES)


def _causes(summary: dict[str, object]) -> dict[str, object]:
    periods = summary["periods"]
    assert isinstance(periods, list)
    return {OUTCOMES[int(p["seed"]) - 161]: p["cause"] for p in periods}


def test_every_period_that_did_not_complete_has_its_cause(study: Path, tmp_path: Path) -> None:
    summary = audit(study, tmp_path / "out")
    assert _causes(summary) == EXPECTED
    findings = pd.read_parquet(tmp_path / "out" / "findings.parquet")
    ended = findings[findings["rule_id"] == "AUD218"]
    assert len(ended) == sum(1 for word in EXPECTED.values() if word)
    oom = ended[ended["message"].str.contains("ended by gpu_oom")]["message"].iloc[0]
    assert "rollout_init raised torch.OutOfMemoryError" in oom
    kill = ended[ended["message"].str.contains("SIGKILL")]["message"].iloc[0]
    assert "ended by signal: exit 137" in kill


def test_sacct_preempted_is_its_own_reason_and_cause(study: Path, tmp_path: Path) -> None:
    root = tmp_path / "study"
    shutil.copytree(study, root)
    rewrite(root, "accounting/sacct-raw.psv",
            lambda b: b.replace(b"|CANCELLED by 1234|", b"|PREEMPTED|", 1), update_manifest=False)
    summary = audit(root, tmp_path / "out")
    period = next(p for p in summary["periods"] if p["seed"] == 161 + OUTCOMES.index("cancelled"))
    assert (period["reason"], period["cause"]) == ("preempted", "preempted")
    assert "AUD219" in period["rule_ids"]
