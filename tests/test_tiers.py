"""tests/tiers.sh, the README's test command: what makes a tier pass."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


def test_a_tier_that_selects_no_test_fails_unless_allowed(tmp_path):
    """tests/tiers.sh: pytest's exit 5 (no test ran) fails the tier, unless KVCERT_TIERS_MAY_BE_EMPTY names it."""
    (tmp_path / "tests").mkdir()
    shutil.copy(Path(__file__).parent / "tiers.sh", tmp_path / "tests" / "tiers.sh")
    (tmp_path / "tests" / "test_one.py").write_text("def test_one():\n    assert True\n")
    env = {k: v for k, v in os.environ.items() if k != "KVCERT_TIERS_MAY_BE_EMPTY"}
    empty = subprocess.run(["bash", "tests/tiers.sh", "slurm"], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert empty.returncode == 5 and "selected no test" in empty.stdout, empty.stdout
    allowed = subprocess.run(["bash", "tests/tiers.sh", "slurm"], cwd=tmp_path, capture_output=True, text=True,
                             env={**env, "KVCERT_TIERS_MAY_BE_EMPTY": "slurm"})
    assert allowed.returncode == 0, allowed.stdout
    ran = subprocess.run(["bash", "tests/tiers.sh", "unit"], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert ran.returncode == 0 and "1 passed" in ran.stdout, ran.stdout
