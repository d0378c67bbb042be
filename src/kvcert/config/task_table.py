"""The benchmark tables the RULER and LongBench task configs are derived from, and the derived configs.

The tables are the benchmarks' own configuration, without torch or a tokenizer: RULER's ``synthetic.yaml``
(:data:`RULER_TASKS`, each task's script and arguments) and ``constants.py``'s ``tokens_to_generate``
(:data:`TOKENS_TO_GENERATE`); LongBench's ``config/dataset2maxlen.json`` (:data:`DATASET2MAXLEN`, whose keys are
its 21 data sets) and the data sets ``pred.py`` feeds without the chat template
(:data:`NO_CHAT_TEMPLATE_DATASETS`). :mod:`kvcert.tasks.ruler` and :mod:`kvcert.tasks.longbench` build records
from the same objects.

Each row is a task config, as lm-evaluation-harness derives task variants from one table instead of one
file per variant: ``ruler_<name>`` (``kind: synthetic``, ``max_new_tokens``: its script's
``tokens_to_generate``) and ``longbench_<dataset>`` (``kind: longbench``, the data set, ``source`` the
``LONGBENCH_DIR`` folder, ``max_new_tokens: null`` for ``DATASET2MAXLEN``'s budget at generation, and
``chat_template: official`` on the data sets ``pred.py`` keeps off the chat template).
:func:`derived_config` is what ``configs/task/<name>.yaml`` would hold, its ``${oc.env:…}`` resolved at each
read; a file of that name in the configs folder wins over it (:func:`kvcert.generation.jobs.config_file`,
:func:`kvcert.config.compose.compose_config`), and :func:`group_options` lists both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

RULER_PREFIX = "ruler_"
LONGBENCH_PREFIX = "longbench_"
#: where a LongBench task config reads its data: $LONGBENCH_DIR, else data/longbench (resolved at each read)
LONGBENCH_SOURCE = "${oc.env:LONGBENCH_DIR,data/longbench}"


@dataclass(frozen=True)
class RulerTask:
    """One task of RULER's ``synthetic.yaml``: its script (``task``) and arguments."""

    name: str
    task: str
    args: dict = field(default_factory=dict)

    @property
    def registered(self) -> str:
        return RULER_PREFIX + self.name


def _niah(name: str, haystack: str, k: str, v: str, nk: int = 1, nv: int = 1, nq: int = 1) -> RulerTask:
    return RulerTask(name, "niah", {"type_haystack": haystack, "type_needle_k": k, "type_needle_v": v,
                                    "num_needle_k": nk, "num_needle_v": nv, "num_needle_q": nq})


#: RULER's synthetic.yaml, its order (qa_1 and qa_2 need downloaded data sets and are left out)
RULER_TASKS: dict[str, RulerTask] = {t.name: t for t in (
    _niah("niah_single_1", "noise", "words", "numbers"),
    _niah("niah_single_2", "essay", "words", "numbers"),
    _niah("niah_single_3", "essay", "words", "uuids"),
    _niah("niah_multikey_1", "essay", "words", "numbers", nk=4),
    _niah("niah_multikey_2", "needle", "words", "numbers"),
    _niah("niah_multikey_3", "needle", "uuids", "uuids"),
    _niah("niah_multivalue", "essay", "words", "numbers", nv=4),
    _niah("niah_multiquery", "essay", "words", "numbers", nq=4),
    RulerTask("vt", "variable_tracking", {"type_haystack": "noise", "num_chains": 1, "num_hops": 4}),
    RulerTask("cwe", "common_words_extraction", {"freq_cw": 30, "freq_ucw": 3, "num_cw": 10}),
    RulerTask("fwe", "freq_words_extraction", {"alpha": 2.0}),
)}

#: constants.py's tokens_to_generate: reserved from the length, and the answer budget
TOKENS_TO_GENERATE = {"niah": 128, "variable_tracking": 30, "common_words_extraction": 120,
                      "freq_words_extraction": 50}

#: the official ``max_new_tokens`` of each task (``config/dataset2maxlen.json``).
DATASET2MAXLEN: dict[str, int] = {
    "narrativeqa": 128, "qasper": 128, "multifieldqa_en": 64, "multifieldqa_zh": 64,
    "hotpotqa": 32, "2wikimqa": 32, "musique": 32, "dureader": 128, "gov_report": 512,
    "qmsum": 512, "multi_news": 512, "vcsum": 512, "trec": 64, "triviaqa": 32,
    "samsum": 128, "lsht": 64, "passage_count": 32, "passage_retrieval_en": 32,
    "passage_retrieval_zh": 32, "lcc": 64, "repobench-p": 64,
}

#: datasets ``pred.py`` feeds to chat models without their chat template.
NO_CHAT_TEMPLATE_DATASETS = frozenset({"trec", "triviaqa", "samsum", "lsht", "lcc", "repobench-p"})


def _ruler_config(spec: RulerTask) -> dict:
    return {"name": spec.registered, "kind": "synthetic", "max_new_tokens": TOKENS_TO_GENERATE[spec.task]}


def _longbench_config(dataset: str) -> dict:
    cfg = {"name": LONGBENCH_PREFIX + dataset, "kind": "longbench", "dataset": dataset, "source": LONGBENCH_SOURCE,
           "max_new_tokens": None}
    return {**cfg, "chat_template": "official"} if dataset in NO_CHAT_TEMPLATE_DATASETS else cfg


#: the derived task configs by name, interpolations unresolved (what a hydra config node holds)
TASK_CONFIGS: dict[str, dict] = {
    **{spec.registered: _ruler_config(spec) for spec in RULER_TASKS.values()},
    **{LONGBENCH_PREFIX + dataset: _longbench_config(dataset) for dataset in DATASET2MAXLEN},
}


def derived_config(group: str, name: str) -> dict | None:
    """The derived config ``<group>/<name>`` with its interpolations resolved now (an environment variable
    set since the last read is the one used); None where the table derives none (every group but ``task``)."""
    from omegaconf import OmegaConf

    node = TASK_CONFIGS.get(name) if group == "task" else None
    return None if node is None else OmegaConf.to_container(OmegaConf.create(node), resolve=True)


def group_options(config_dir: str | Path, group: str) -> list[str]:
    """The options of a config group, sorted: its files' names and, for ``task``, the derived configs'."""
    files = {path.stem for path in (Path(config_dir) / group).glob("*.yaml")}
    return sorted(files | set(TASK_CONFIGS) if group == "task" else files)
