"""tests/tiers.sh, the README's test command, with its plugin tests/tier_order.py: what makes a tier pass."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression

from tier_order import TIERS, tier_of

HERE = Path(__file__).parent
MARKERS = ("kernel", "pipeline", "slow", "slurm", "gpu_compile")
#: docs/testing.md's marker expressions, one per tier
EXPRESSIONS = {
    "unit": "not kernel and not pipeline and not slow and not slurm and not gpu_compile",
    "kernel": "kernel and not pipeline and not slow",
    "pipeline": "pipeline and not slow and not slurm and not gpu_compile",
    "slow": "slow and not slurm and not gpu_compile",
    "slurm": "slurm",
    "compile": "gpu_compile",
}


def suite(tmp_path: Path, tests: str) -> Path:
    """A folder holding tests/tiers.sh, the tier plugin, and one test module ``tests``."""
    (tmp_path / "tests").mkdir()
    for name in ("tiers.sh", "tier_order.py"):
        shutil.copy(HERE / name, tmp_path / "tests" / name)
    (tmp_path / "tests" / "test_some.py").write_text(tests)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n" + "".join(f"    {m}: m\n" for m in MARKERS))
    return tmp_path


def tiers(folder: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("KVCERT_TIERS_MAY_BE_EMPTY", "PYTHONPATH")}
    return subprocess.run(["bash", "tests/tiers.sh", *args], cwd=folder, capture_output=True, text=True,
                          env={**base, **env}, timeout=300)


def test_a_tier_that_selects_no_test_fails_unless_allowed(tmp_path):
    """pytest's exit 5 (no test ran) fails the tier, unless KVCERT_TIERS_MAY_BE_EMPTY names it."""
    folder = suite(tmp_path, "def test_one():\n    assert True\n")
    empty = tiers(folder, "slurm")
    assert empty.returncode == 5 and "selected no test" in empty.stdout, empty.stdout
    allowed = tiers(folder, "slurm", KVCERT_TIERS_MAY_BE_EMPTY="slurm")
    assert allowed.returncode == 0, allowed.stdout
    ran = tiers(folder, "unit")
    assert ran.returncode == 0 and "1 passed" in ran.stdout, ran.stdout
    one_empty = tiers(folder, "unit", "slurm")  # a tier that ran does not excuse an empty one
    assert one_empty.returncode == 5 and "tier slurm selected no test" in one_empty.stdout, one_empty.stdout


def test_tiers_run_in_order_and_a_failing_tier_stops_the_later_ones(tmp_path):
    folder = suite(tmp_path, (
        "import pytest\n"
        "@pytest.mark.slow\ndef test_slow():\n    open('ran-slow', 'w').close()\n"
        "@pytest.mark.pipeline\ndef test_pipeline():\n    assert False, 'the pipeline tier fails'\n"
        "def test_unit():\n    open('ran-unit', 'w').close()\n"
    ))
    out = tiers(folder, "unit", "pipeline", "slow")
    assert out.returncode == 1, out.stdout
    assert (folder / "ran-unit").exists() and not (folder / "ran-slow").exists()
    lines = out.stdout.splitlines()
    assert any(line.startswith("tier unit (") and "1 passed" in line for line in lines), out.stdout
    assert any(line.startswith("tier pipeline (") and "1 failed" in line and "FAILED" in line for line in lines)
    assert "tier slow: not run (1 tests), tier pipeline failed before it" in lines, out.stdout
    unknown = tiers(folder, "fast")
    assert unknown.returncode == 2 and "unknown tier 'fast'" in unknown.stderr


def test_with_two_workers_a_failure_in_one_stops_the_later_tiers_in_the_other(tmp_path):
    """pytest-xdist: one worker's failing unit test keeps the other worker from starting a later tier's test."""
    folder = suite(tmp_path, "def test_unit_fails():\n    assert False, 'a unit test fails'\n")
    (folder / "tests" / "test_other.py").write_text(
        "import pytest, time\n"
        "def test_unit_slowly():\n    time.sleep(3)\n"
        "@pytest.mark.slow\ndef test_slow():\n    open('ran-slow', 'w').close()\n")
    out = tiers(folder, "unit", "slow", KVCERT_TEST_WORKERS="2")
    assert out.returncode == 1, out.stdout
    assert "(2 workers)" in out.stdout and not (folder / "ran-slow").exists(), out.stdout
    lines = out.stdout.splitlines()
    assert any(line.startswith("tier unit (") and "1 failed" in line and "1 passed" in line for line in lines), out.stdout
    assert "tier slow: not run (1 tests), tier unit failed before it" in lines, out.stdout
    alone = tiers(folder, "unit", KVCERT_TEST_WORKERS="0")  # one process, no xdist
    assert alone.returncode == 1 and "workers)" not in alone.stdout and "1 failed, 1 passed" in alone.stdout


@pytest.mark.parametrize("markers", [set(c) for n in range(len(MARKERS) + 1)
                                     for c in itertools.combinations(MARKERS, n)],
                         ids=lambda markers: "+".join(sorted(markers)) or "none")  # the same ids in every xdist worker
def test_a_tests_tier_is_the_one_the_documented_expressions_select(markers):
    """Every combination of markers lands in one tier, and in the one docs/testing.md's expressions give it
    where they give exactly one (two of them can select a test carrying both slurm and gpu_compile)."""
    selecting = [t for t in TIERS if Expression.compile(EXPRESSIONS[t]).evaluate(lambda name, **kw: name in markers)]
    assert selecting, markers
    assert tier_of(markers) in selecting
    if len(selecting) == 1:
        assert tier_of(markers) == selecting[0]
