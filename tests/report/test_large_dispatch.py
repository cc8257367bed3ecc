"""A launcher that flattens a whole configuration into every trial's ``dispatch``: the report
still says what the dispatches share, and says it in about the time it takes to read them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers import copy_example, edit_json

KEYS = 40_000
"""Keys added to each trial's dispatch (the report's group sentence compared every key with
every other dispatch's by a scan: about six minutes at this size, quadratic)."""


def test_a_dispatch_of_forty_thousand_keys_is_summed_up_not_scanned(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    flattened = {f"HYDRA_OVERRIDE_{i:06d}": f"value-{i}" for i in range(KEYS)}
    trials = sorted(p.relative_to(root).as_posix() for p in root.rglob("trial*.json"))
    assert trials
    for rel in trials:
        edit_json(root, rel, lambda doc: doc.setdefault("dispatch", {}).update(flattened))
    out = tmp_path / "out"
    # (a subprocess with a bound far above the audit's own second or two: the old scan
    # would hold a worker of the test run for minutes)
    done = subprocess.run([sys.executable, "-m", "auditor", "audit", str(root), "--out",
                           str(out), "--quiet", "--no-plots"], timeout=90,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    report = (out / "diagnostic.md").read_text()
    assert "`HYDRA_OVERRIDE_000004=value-4` and 39,995 more keys" in report
