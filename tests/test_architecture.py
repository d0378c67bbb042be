"""The package's data path reads one way (ARCHITECTURE.md), one folder per stage: the ground floor (the
package root's own modules and the embedded model) → ``config/`` (configuration and pre-registration) →
``tasks/`` → ``method/`` (the model and the method) → ``generation/`` → ``analysis/``. A module imports only
from its own folder or a lower one — at module level or inside a function — and the stages' modules form no
import circle. Commands (``commands/``, ``bench/``, ``training/``, ``rehearsal/``, every ``cli`` module, the
root's ``cli`` and the test fixtures of ``testing``) orchestrate stages and may import any of them; no stage
imports a command."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

#: a stage's folder → its floor; a module directly in kvcert/ (and the embedded model) is the ground floor, 0
FLOORS = {"embedded": 0, "config": 1, "tasks": 2, "method": 3, "generation": 4, "analysis": 5}
#: folders and root modules that hold commands: they run stages and may import any of them
COMMANDS = {"commands", "bench", "training", "rehearsal", "cli", "testing"}
NAMES = {0: "ground floor", 1: "config", 2: "tasks", 3: "method", 4: "generation", 5: "analysis"}


def modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def stage(name: str) -> int | None:
    """None for a command or the package root (its public API re-exports every stage)."""
    parts = name.split(".")
    if name == "kvcert" or parts[-1] == "cli" or parts[1] in COMMANDS:
        return None
    if len(parts) == 2 and parts[1] not in FLOORS:  # a module directly in kvcert/
        return 0
    assert parts[1] in FLOORS, f"{name}: a folder of kvcert/ that is neither a stage nor a command"
    return FLOORS[parts[1]]


def imports(name: str, path: Path, known: dict[str, Path], top_only: bool = False) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_only else list(ast.walk(tree))
    found = set()
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        found |= {t for t in targets if t in known and t != name}
    return found


def test_no_module_imports_a_later_stage_or_a_command():
    known = modules()
    wrong = []
    for name, path in sorted(known.items()):
        mine = stage(name)
        if mine is None:
            continue
        for target in sorted(imports(name, path, known)):
            theirs = stage(target)
            if theirs is None and target != "kvcert":
                wrong.append(f"{name} ({NAMES[mine]}) imports the command {target}")
            elif theirs is not None and theirs > mine:
                wrong.append(f"{name} ({NAMES[mine]}) imports {target} ({NAMES[theirs]})")
    assert not wrong, "\n".join(wrong)


def test_no_import_circle():
    """Among the stages' modules, counting imports inside functions too (a late import hides a circle, it
    does not remove it)."""
    known = modules()
    staged = {n: p for n, p in known.items() if stage(n) is not None}
    graph = {n: {t for t in imports(n, p, known) if t in staged} for n, p in staged.items()}
    state: dict[str, int] = {}
    circles = []

    def visit(node, trail):
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                circles.append(" → ".join(trail[trail.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n, [n])
    assert not circles, "\n".join(circles)


def test_the_kernels_package_lives_in_a_folder_of_its_name():
    """``kvcert_kernels`` is ``kernels/kvcert_kernels/``: nothing importable sits directly under kernels/,
    so the checkout's root holds no package called ``kernels`` (the Hugging Face package transformers
    probes for) and tools that follow folder names find the package where its name says."""
    kernels = SRC.parent / "kernels"
    assert not list(kernels.glob("*.py")), sorted(p.name for p in kernels.glob("*.py"))
    assert (kernels / "kvcert_kernels" / "__init__.py").is_file()


def test_the_checkout_root_is_no_kernels_package_and_kvcert_kernels_imports_without_triton():
    """Started in the checkout (a Snakemake run's pre-flight), transformers does not take kernels/ for the
    Hugging Face ``kernels`` package, a model config loads, and without Triton (the CPU install: Triton is
    the ``gpu`` extra) ``kvcert_kernels`` still imports."""
    import subprocess
    import sys

    # transformers asks for ``kernels`` by its distribution: where Hugging Face's package is installed
    # (transformers 5.25 and later depend on it) it must be that package, else transformers must see none
    code = ("import sys, importlib.metadata; sys.modules['triton'] = None\n"  # as if Triton were not installed
            "import kvcert_kernels\n"
            "from transformers.utils.import_utils import is_kernels_available\n"
            "from transformers import AutoConfig\n"
            "from kvcert.embedded import embedded_model_path\n"
            "try:\n    importlib.metadata.distribution('kernels'); installed = True\n"
            "except importlib.metadata.PackageNotFoundError:\n    installed = False\n"
            "print(type(AutoConfig.from_pretrained(embedded_model_path())).__name__, installed, is_kernels_available())\n"
            "if installed:\n    import kernels; print(kernels.__file__)")
    done = subprocess.run([sys.executable, "-c", code], cwd=SRC.parent, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    config, installed, available = lines[0].split()
    assert config == "LlamaConfig"
    if installed == "False":
        assert available == "False"  # the checkout's kernels/ folder is not taken for the package
    else:
        origin = Path(lines[1]).resolve()
        assert not origin.is_relative_to((SRC.parent / "kernels").resolve()) and origin.name == "__init__.py", origin


def test_planning_and_the_statistics_steps_run_without_torch():
    """Snakemake's planning (the plan, each generate job's specs and config hash: the Snakefile's params) and
    the statistics steps (score, claims with the signals, report; the typed analysis plan; the replay step's
    module) never import torch, transformers or Triton: every ``snakemake`` start and every scoring job would pay
    for it. Run with the three refused at import, so the import that would load one fails, naming it."""
    import subprocess
    import sys

    code = ("import sys\n"
            "class Refuse:\n"  # importing either raises, naming the import
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in ('torch', 'transformers', 'triton'):\n"
            "            raise ImportError(f'{name} imported')\n"
            "sys.meta_path.insert(0, Refuse())\n"
            "from kvcert.config.paths import configs_dir, prereg_dir\n"
            "from kvcert.config.experiment import experiment_grid\n"
            "from kvcert.generation.plan import build_plan\n"
            "import kvcert.analysis.cli, kvcert.analysis.steps, kvcert.analysis.claims, kvcert.analysis.report\n"
            "import kvcert.analysis.signals, kvcert.analysis.report_signals, kvcert.config.analysis_plan, kvcert.commands.cli\n"
            "import kvcert.generation.replay_step\n"  # the replay step's module (its model side is replay.py)
            "_, grid = experiment_grid('smoke', configs_dir(), prereg_dir())\n"
            "plan = build_plan('smoke', grid, configs_dir())\n"
            "jobs = [plan.job(s, configs_dir(), prereg_dir()) for s in plan.shards]\n"
            "print(len(jobs), len({j.config_hash for j in jobs}), sum(len(j.specs) for j in jobs))")
    done = subprocess.run([sys.executable, "-c", code], cwd=SRC.parent, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    shards, hashes, specs = map(int, done.stdout.split())
    assert shards >= 1 and hashes >= 1 and specs >= shards


def test_a_registry_that_differs_from_its_names_is_refused_at_import():
    """kvcert.config.names holds what the registries implement (so a spec validates without torch); a registry that
    implements other names than it lists fails on import, naming both."""
    import pytest

    from kvcert.config.names import check_implemented

    check_implemented("allocation policies", ("uniform", "adakv"), {"adakv": 1, "uniform": 2})
    with pytest.raises(ImportError, match=r"kvcert.config.names lists \['adakv', 'uniform'\] but the implementations are "
                                          r"\['adakv', 'pyramid', 'uniform'\]"):
        check_implemented("allocation policies", ("uniform", "adakv"), {"adakv": 1, "uniform": 2, "pyramid": 3})
