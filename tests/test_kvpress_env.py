"""kvcert and kvpress in one environment (docs/kvpress.md), built here in a throwaway venv.

The venv sees this environment's packages (kvcert included); into it go the transformers
release kvpress 0.5.5 accepts (< 5.3, with its own small dependencies, and the ``kernels`` release
that transformers 5.2 pins), kvpress's small
imports (cachetools, fire) and kvpress itself with ``--no-deps`` (its other declared
dependencies are imported by none of the presses used here; a plain install resolves too). There, ``scripts/kvpress_goldens.py`` re-derives every kept set of
``tests/fixtures/kvpress/goldens.json`` and ``tests/kvpress_checks.py`` runs kvcert with
kvpress's own pipeline and presses, then kvcert's golden comparison again on that release.
Skipped, with the reason, only where no package index answers.
"""

from __future__ import annotations

import json
import os
import subprocess
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GOLDENS = REPO / "tests" / "fixtures" / "kvpress" / "goldens.json"
GOLDEN = json.loads(GOLDENS.read_text())
# kvpress 0.5.5's pins, and the Hugging Face ``kernels`` release transformers 5.2 accepts (its own extra's pin):
# transformers >= 5.25 installs ``kernels`` 0.19, whose LayerRepository refuses the arguments transformers 5.2's
# import passes ("Either a revision or a version must be specified"), so a newer one seen through the parent
# environment breaks ``import transformers.modeling_utils`` there
REQUIREMENTS = ["transformers>=5.2,<5.3", "kernels>=0.10.2,<0.11", "cachetools>=5.5.2,<6", "fire>=0.6,<0.7"]
# what pip says when it cannot reach an index (as opposed to a resolution failure)
UNREACHABLE = ("NewConnectionError", "Failed to establish a new connection",
               "Temporary failure in name resolution", "Network is unreachable", "ProxyError")

pytestmark = [pytest.mark.kvpress, pytest.mark.slow]


def _run(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONNOUSERSITE": "1"}
    return subprocess.run(args, capture_output=True, text=True, env=env, **kwargs)


def _pip(python: Path, *args: str) -> None:
    done = _run([str(python), "-m", "pip", "install", "-q", *args])
    if done.returncode:
        text = done.stdout + done.stderr
        if any(sign in text for sign in UNREACHABLE):
            pytest.skip(f"no package index reachable for {' '.join(args)}: {text.strip().splitlines()[-1]}")
        pytest.fail(f"pip install {' '.join(args)} failed:\n{text[-3000:]}")


@pytest.fixture(scope="module")
def kvpress_python(tmp_path_factory) -> Path:
    """A venv over this one's packages, with kvpress and the transformers it accepts."""
    folder = tmp_path_factory.mktemp("kvpress-venv")
    venv.create(folder, system_site_packages=True, with_pip=True)
    python = folder / "bin" / "python"
    purelib = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    # the running environment's packages (a venv's are not the base interpreter's system site)
    import site

    parents = [p for p in site.getsitepackages() if Path(p).is_dir()]
    Path(purelib, "kvcert-parent.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in parents))
    _pip(python, *REQUIREMENTS)
    _pip(python, "--no-deps", f"kvpress=={GOLDEN['kvpress']}")
    return python


def test_every_golden_kept_set_is_re_derived_beside_kvcert(kvpress_python, tmp_path):
    out = tmp_path / "goldens.json"
    done = _run([str(kvpress_python), str(REPO / "scripts" / "kvpress_goldens.py"), "--out", str(out)], cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    derived = json.loads(out.read_text())
    installed = _run([str(kvpress_python), "-c", "import importlib.metadata as m, kvcert, transformers; "
                      "print(m.version('kvpress'), transformers.__version__, kvcert.__file__)"]).stdout.split()
    assert derived["kvpress"] == installed[0] == GOLDEN["kvpress"]
    assert installed[1].startswith("5.2.") and Path(installed[2]).is_relative_to(REPO)  # one env: this kvcert
    assert derived["input_ids"] == GOLDEN["input_ids"]
    assert [(r["press"], r["compression_ratio"]) for r in derived["results"]] == \
        [(r["press"], r["compression_ratio"]) for r in GOLDEN["results"]]
    for ours, theirs in zip(derived["results"], GOLDEN["results"]):
        assert ours["kept"] == theirs["kept"], (ours["press"], ours["compression_ratio"])


def test_kvcert_runs_with_kvpress_in_that_environment(kvpress_python):
    """kvpress's pipeline with kvcert's presses and cache, kvpress's presses as kvcert scorers,
    ``kvcert run`` with a kvpress scorer (tests/kvpress_checks.py), and kvcert's own golden
    comparison on kvpress's transformers release."""
    done = _run([str(kvpress_python), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                 "tests/kvpress_checks.py", "tests/test_kvpress_goldens.py"], cwd=REPO)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    assert " failed" not in done.stdout and " skipped" not in done.stdout, done.stdout[-3000:]
