"""``kvcert prereg freeze`` freezes only committed files: the record names a git commit, and that commit must hold
the bytes it freezes (an earlier amendment was frozen on uncommitted files, so the commit it names held the
amendment before it)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from kvcert.config.prereg import PreregError, freeze, uncommitted, verify

ROOT = Path(__file__).resolve().parents[1]


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture()
def repo(tmp_path):
    prereg = tmp_path / "preregistration"
    (prereg / "grids").mkdir(parents=True)
    shutil.copy(ROOT / "preregistration" / "claims.yaml", prereg / "claims.yaml")
    shutil.copy(ROOT / "preregistration" / "grids" / "smoke.yaml", prereg / "grids" / "smoke.yaml")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "add", ".")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "prereg")
    return tmp_path, prereg


def test_committed_files_freeze_and_the_record_names_their_commit(repo):
    root, prereg = repo
    record = freeze(prereg)
    assert record.git_commit == _git(root, "rev-parse", "HEAD")
    assert verify(prereg).prereg_hash == record.prereg_hash


@pytest.mark.parametrize("change", ["edited", "untracked"])
def test_a_freeze_of_uncommitted_files_is_refused_in_one_line(repo, change):
    root, prereg = repo
    freeze(prereg)
    if change == "edited":
        path = prereg / "grids" / "smoke.yaml"
        path.write_text(path.read_text() + "# an amendment not yet committed\n")
        name = "grids/smoke.yaml"
    else:
        path = prereg / "grids" / "extra.yaml"
        path.write_text("experiment: extra\n")
        name = "grids/extra.yaml"
    assert uncommitted(prereg, {name: __import__("hashlib").sha256(path.read_bytes()).hexdigest()}) == [name]
    with pytest.raises(PreregError) as refused:
        freeze(prereg, reason="an amendment")
    message = str(refused.value)
    assert "\n" not in message and name in message and "commit them first" in message
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "add", ".")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "amendment")
    record = freeze(prereg, reason="an amendment")
    assert record.git_commit == _git(root, "rev-parse", "HEAD")


def test_outside_git_nothing_is_compared(tmp_path):
    prereg = tmp_path / "p"
    (prereg / "grids").mkdir(parents=True)
    shutil.copy(ROOT / "preregistration" / "claims.yaml", prereg / "claims.yaml")
    assert uncommitted(prereg, {"claims.yaml": "0" * 64}) == []  # no commit is recorded there
