"""The producer kit's array on a real Slurm 22.05: audited, its verdicts against what was done.

Needs the cluster (``AUDITOR_SLURM=1``, root; see ``conftest.py``). The ``kit`` fixture runs
``tests/slurm/kit.py``'s array (``auditor run`` around the example trainer, ``auditor seal``
after it, one ending per element); every check of :class:`tests.slurm.kit_checks.KitVerdicts`
runs on two audits of the study: with its own ``-D`` dump and with the contract's. The same
checks run on the saved copy in ``fixtures/slurm/kit`` (``test_kit_saved.py``). What only
the live run can show (the batch scripts' own logs) is checked here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.slurm.cluster import skip_reason
from tests.slurm.kit import KitRun
from tests.slurm.kit_checks import Audited, KitVerdicts, audit

if (_reason := skip_reason()) is not None:
    pytest.skip(_reason, allow_module_level=True)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@pytest.fixture(scope="module", params=["contract-D", "contract"])
def audited(request: pytest.FixtureRequest, kit: KitRun,
            tmp_path_factory: pytest.TempPathFactory) -> Audited:
    out = tmp_path_factory.mktemp("kit-audit") / "out"
    return audit(kit.root, out, kit.array, kit.dumps, request.param)


class TestLiveKit(KitVerdicts):
    """The checks on the live run's study."""


def test_the_batch_scripts_did_what_the_harness_says(kit: KitRun) -> None:
    logs = kit.logs
    assert "SIGUSR1 received (not forwarded)" in logs[6]
    assert "DUE TO TIME LIMIT" in logs[6] and "SIGTERM received" in logs[6]
    assert "SIGUSR1 received" in logs[7] and "(not forwarded)" not in logs[7]
    assert "CANCELLED AT" in logs[5]
    assert "DUE TO JOB REQUEUE" in logs[8] and "restart=1" in logs[8]
    assert "auditor run exited 137" in logs[9] and "auditor run exited 255" in logs[10]
    assert "auditor run exited 0" in logs[3]                 # the coordinated shutdown
    assert "auditor run exited 143" in logs[4]               # the same, flag off
    assert 11 not in logs                                     # it never ran
    for task, text in logs.items():
        assert text.count("auditor seal exited 0") == (2 if task == 8 else 1), task


def test_the_study_is_not_written_by_the_audit(kit: KitRun, tmp_path: Path) -> None:
    before = sorted((p.relative_to(kit.root), p.stat().st_mtime_ns)
                    for p in kit.root.rglob("*"))
    audit(kit.root, tmp_path / "out", kit.array, kit.dumps, "contract-D")
    assert sorted((p.relative_to(kit.root), p.stat().st_mtime_ns)
                  for p in kit.root.rglob("*")) == before
