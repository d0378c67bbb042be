"""The RULER and LongBench task configs derived from the benchmark tables (:mod:`kvcert.config.task_table`): every
reader gets what the 32 files ``configs/task/ruler_*.yaml`` and ``configs/task/longbench_*.yaml`` held, a file of the
same name still wins, and ``task=<typo>`` still lists every option."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kvcert.config.compose import compose_config
from kvcert.config.task_table import TASK_CONFIGS
from kvcert.generation.jobs import config_file
from kvcert.provenance import config_hash

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"

#: ``kvcert.provenance.config_hash`` of ``config_file(configs, "task", name)`` with ``LONGBENCH_DIR`` unset, generated
#: once from the 32 files the table replaced (before they were deleted): a derived config that differs in a key, a
#: value or the source's interpolation from its file changes its hash, and with it every manifest and record hash.
GOLDEN = {
    "longbench_2wikimqa": "9eb4cd341d643085",
    "longbench_dureader": "1275957927a3a21f",
    "longbench_gov_report": "8c9c7e159be66a80",
    "longbench_hotpotqa": "3df1fa66413a0f5e",
    "longbench_lcc": "ab22676297fe3a3d",
    "longbench_lsht": "36d80406f9d94166",
    "longbench_multi_news": "5555bf5a0c56434c",
    "longbench_multifieldqa_en": "f97e4224020ea791",
    "longbench_multifieldqa_zh": "ed4ac4219540834a",
    "longbench_musique": "70587cec651d0026",
    "longbench_narrativeqa": "c40e3aa7490fb239",
    "longbench_passage_count": "c3d68469f8ba3b5e",
    "longbench_passage_retrieval_en": "b70a4ca5b3fc94c8",
    "longbench_passage_retrieval_zh": "114035d55b14864b",
    "longbench_qasper": "4e767f207e4209c2",
    "longbench_qmsum": "a3a5cd2ad7be35f0",
    "longbench_repobench-p": "bcd03bc5c227c32d",
    "longbench_samsum": "ac698a33f6fc7323",
    "longbench_trec": "07cbad4379b5577c",
    "longbench_triviaqa": "3395dab6232803b9",
    "longbench_vcsum": "b06b8aa9125ddb61",
    "ruler_cwe": "6234e4b91a9a510e",
    "ruler_fwe": "b43a0c9009d09c7d",
    "ruler_niah_multikey_1": "09fdaeeef12922cc",
    "ruler_niah_multikey_2": "988c134e91268730",
    "ruler_niah_multikey_3": "827ac908fe3352c3",
    "ruler_niah_multiquery": "9349fba81773fcc3",
    "ruler_niah_multivalue": "7d1ba6a411afa898",
    "ruler_niah_single_1": "7e387d61589595fb",
    "ruler_niah_single_2": "9e6692ec0a3dfb50",
    "ruler_niah_single_3": "a1ffcaa92cdc640a",
    "ruler_vt": "9fb323eb9384131b",
}


def test_the_table_derives_exactly_the_configs_the_files_held(monkeypatch):
    monkeypatch.delenv("LONGBENCH_DIR", raising=False)
    assert sorted(TASK_CONFIGS) == sorted(GOLDEN)
    assert {name: config_hash(config_file(CONFIGS, "task", name)) for name in GOLDEN} == GOLDEN
    assert not [name for name in GOLDEN if (CONFIGS / "task" / f"{name}.yaml").exists()]


def test_the_longbench_source_is_resolved_at_each_read(monkeypatch, tmp_path):
    monkeypatch.setenv("LONGBENCH_DIR", str(tmp_path))
    assert config_file(CONFIGS, "task", "longbench_lcc")["source"] == str(tmp_path)
    monkeypatch.delenv("LONGBENCH_DIR")
    assert config_file(CONFIGS, "task", "longbench_lcc")["source"] == "data/longbench"


def test_hydra_composes_a_derived_task_as_the_pipeline_reads_it(monkeypatch, tmp_path):
    monkeypatch.setenv("LONGBENCH_DIR", str(tmp_path))
    for task in ("ruler_vt", "longbench_lcc", "longbench_hotpotqa"):
        assert compose_config([f"task={task}"], CONFIGS)["task"] == config_file(CONFIGS, "task", task)


def test_a_file_of_the_same_name_wins_over_the_table(tmp_path):
    """Whole: a composition of the derived config before leaves nothing in hydra's store for the file to be merged
    with (a local ``longbench_lcc.yaml`` without ``chat_template`` has none)."""
    assert compose_config(["task=longbench_lcc"], CONFIGS)["task"]["chat_template"] == "official"
    configs = tmp_path / "configs"
    shutil.copytree(CONFIGS, configs)
    local = {"name": "longbench_lcc", "kind": "longbench", "dataset": "lcc", "source": str(tmp_path),
             "max_new_tokens": 7}
    (configs / "task" / "longbench_lcc.yaml").write_text("".join(f"{k}: {v}\n" for k, v in local.items()))
    assert config_file(configs, "task", "longbench_lcc") == local
    assert compose_config(["task=longbench_lcc"], configs)["task"] == local
    assert config_file(CONFIGS, "task", "longbench_lcc")["max_new_tokens"] is None


def test_a_task_typo_lists_every_option():
    with pytest.raises(ValueError) as caught:
        compose_config(["task=ruler_v"], CONFIGS)
    message = str(caught.value)
    assert "(did you mean task=ruler_vt?)" in message
    listed = message.split("the tasks: ")[1].split(", ")
    assert listed == sorted({p.stem for p in (CONFIGS / "task").glob("*.yaml")} | set(GOLDEN))
