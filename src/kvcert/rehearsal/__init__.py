"""Stand-ins for an experiment's models and data: ``kvcert make-rehearsal --out DIR``.

The paper profile reads Hugging Face checkpoint folders (``$KVCERT_MODEL_DIR/<model>``),
LongBench v1 files (``$LONGBENCH_DIR``) and LoCoMo's JSON (``$LOCOMO_JSON``). This
package makes stand-ins of all three for any experiment's grid, in the same layouts, so
that the paper profile's code path — ``from_pretrained`` on real architectures, BPE
tokenizers with chat templates, LongBench's prompts and middle truncation, the LoCoMo
cell, the replay — runs end to end on a CPU in minutes (experiment ``rehearsal``; the
docs/cluster.md lists the steps):

- ``DIR/models/<model>/`` for every model of the grid (:mod:`.checkpoints`);
- ``DIR/longbench/`` with every LongBench data set of the grid, some as jsonl, some as
  Parquet (:mod:`.longbench_files`), contexts long enough that every length of the grid
  truncates them in the middle;
- ``DIR/locomo/locomo10.json`` (:mod:`.locomo_file`);
- ``DIR/env.sh``: the three exports that point the shipped configs at them.

Nothing here is read by the pipeline: it only writes files that the pipeline then reads
like the real ones.
"""

from __future__ import annotations

import math
import random
import shlex
from dataclasses import dataclass
from pathlib import Path

from . import checkpoints, locomo_file, longbench_files, text
from ..atomic import write_text
from ..tasks import task_for_config

#: the layout of each paper data set (both of the loader's kinds are exercised)
LAYOUT = {"qasper": "jsonl", "hotpotqa": "jsonl", "multifieldqa_en": "parquet", "2wikimqa": "parquet"}
#: LoCoMo stand-in: QA items per conversation (one per category), its sessions and turns
QA_PER_CONVERSATION, SESSIONS, TURNS = 5, 3, 8


@dataclass(frozen=True)
class Sources:
    """What :func:`make_rehearsal` wrote, and the environment that points at it."""

    root: Path
    models: dict[str, Path]
    longbench: dict[str, Path]
    locomo: Path | None

    @property
    def env(self) -> dict[str, str]:
        out = {"KVCERT_MODEL_DIR": str(self.root / "models"), "LONGBENCH_DIR": str(self.root / "longbench")}
        if self.locomo is not None:
            out["LOCOMO_JSON"] = str(self.locomo)
        return out


def _grid_needs(experiment: str, configs: Path | None, prereg: Path | None):
    from ..config.paths import configs_dir, prereg_dir
    from ..generation.jobs import config_file
    from ..config.experiment import experiment_grid
    from ..generation.plan import build_plan

    configs = configs or configs_dir()
    prereg = prereg or prereg_dir()
    plan = build_plan(experiment, experiment_grid(experiment, configs, prereg)[1])
    tasks: dict[str, dict] = {}
    for item in plan.manifests + plan.replays:
        cfg = config_file(configs, "task", item.task)
        entry = tasks.setdefault(item.task, {"cfg": cfg, "examples": 0, "length": 0})
        entry["examples"] = max(entry["examples"], item.examples)
        entry["length"] = max(entry["length"], item.length)
    models = list(dict.fromkeys(m.model for m in plan.manifests))
    return models, tasks


def make_rehearsal(out: str | Path, experiment: str = "rehearsal", rows: int | None = None,
                   context_words: int | None = None, configs: Path | None = None,
                   prereg: Path | None = None, seed: int = 0) -> Sources:
    """Write the stand-ins of ``experiment``'s models and data under ``out``.

    ``rows`` (LongBench rows per data set, and LoCoMo QA items) defaults to the most
    examples the grid asks of each task; ``context_words`` (words per LongBench context) to
    twice the longest length the grid asks of a LongBench task, so every length
    truncates.
    """
    root = Path(out).expanduser().resolve()
    models, tasks = _grid_needs(experiment, configs, prereg)
    family = {name: task_for_config(t["cfg"]).name for name, t in tasks.items()}  # the stand-in data each needs
    longbench_tasks = {name: t for name, t in tasks.items() if family[name] == "longbench"}
    locomo_tasks = [t for name, t in tasks.items() if family[name] == "locomo"]
    longest = max([t["length"] for t in longbench_tasks.values()] + [512])

    written: dict[str, Path] = {}
    data_texts: list[str] = []
    for name, task in longbench_tasks.items():
        dataset = task["cfg"]["dataset"]
        count = rows if rows is not None else task["examples"]
        data = longbench_files.rows(dataset, count, context_words or 2 * longest, seed)
        layout = LAYOUT.get(dataset, longbench_files.LAYOUTS[len(written) % 2])
        written[name] = longbench_files.write_dataset(root / "longbench", dataset, data, layout)
        data_texts += [r["context"] for r in data] + [r["input"] for r in data]
    locomo_path = None
    if locomo_tasks:
        items = rows if rows is not None else max(t["examples"] for t in locomo_tasks)
        count = max(1, math.ceil(items / QA_PER_CONVERSATION))
        conversations = locomo_file.samples(count, SESSIONS, TURNS, seed)
        locomo_path = root / "locomo" / "locomo10.json"
        import json

        write_text(locomo_path, json.dumps(conversations, indent=1, ensure_ascii=False))
        from ..tasks.locomo import render_conversation

        data_texts += [render_conversation(c) for c in conversations]

    corpus = tokenizer_corpus(data_texts, seed)
    made = {}
    for index, model in enumerate(models):
        arch = checkpoints.architecture_of(model)
        made[model] = checkpoints.save_checkpoint(root / "models" / model, arch, corpus, seed=seed + index)
    sources = Sources(root, made, written, locomo_path)
    write_text(root / "env.sh", "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sources.env.items()))
    return sources


def tokenizer_corpus(data_texts: list[str], seed: int = 0) -> list[str]:
    """What the stand-in tokenizers are trained on: the synthetic world, the data sets'
    text, every prompt template the tasks use."""
    from ..tasks import locomo, longbench, lookalike, multikey, multiturn, needle

    templates = list(longbench.DATASET2PROMPT.values())
    templates += [locomo.CONVERSATION_PREAMBLE, locomo.QA_INSTRUCTION, locomo.TEMPORAL_HINT,
                  locomo.ADVERSARIAL_CHOICE, locomo.NO_INFORMATION]
    for task in (needle, lookalike, multikey, multiturn):
        templates += task.vocabulary_texts()
    return text.corpus(random.Random(seed)) + templates + data_texts
