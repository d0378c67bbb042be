"""LongBench v1: loading the data and turning rows into task records.

Source: Bai et al. 2023, "LongBench: A Bilingual, Multitask Benchmark for Long
Context Understanding" (ACL 2024). The prompt templates (``DATASET2PROMPT``), the
answer budgets (``DATASET2MAXLEN``) and the truncation rule follow the official
``config/dataset2prompt.json``, ``config/dataset2maxlen.json`` and ``pred.py`` of
THUDM/LongBench (v1), for all 21 datasets (English, Chinese and code); the templates
are the official strings character for character (narrativeqa's "asconcisely"
included); the metrics live in :mod:`kvcert.tasks.longbench_metrics`. ``DATASET2MAXLEN`` and
``NO_CHAT_TEMPLATE_DATASETS`` are :mod:`kvcert.config.task_table`'s, which derives each data set's task config
from them.

**Data.** The original hub dataset is driven by a loading script that current
``datasets`` no longer runs. :func:`load_longbench` reads instead, from a local
path: the official ``<dataset>.jsonl`` (also under ``data/``, as the released zip
unpacks), or Parquet files — everything under ``<dir>/<dataset>/`` (e.g. the hub's
``<dataset>/test/0000.parquet`` conversion) or ``<dir>/<dataset>.parquet`` /
``<dir>/<dataset>-*.parquet``; or a hub dataset id, through ``datasets.load_dataset``
(imported only when called). ``<dataset>_e`` (LongBench-E) is a different name and
is never picked up for ``<dataset>``. Every row must carry the eight official
fields (``REQUIRED_FIELDS``).

**Records.** :func:`longbench_records` fills the dataset's template and cuts it in
the middle exactly as ``pred.py`` does (:func:`middle_truncate`): tokenize *with* the
tokenizer's special tokens (a Llama or Mistral tokenizer adds BOS), and when that gives
more than ``max_length`` ids keep the decoded first and last ``int(max_length / 2)``
ids, special tokens skipped, joined. With a BOS-adding tokenizer this truncates a text
of exactly ``max_length`` tokens, and the first half holds one text token fewer than
the last. ``max_length`` bounds the filled template; the chat template is applied
afterwards (through :func:`kvcert.tasks.prompting.build_prompt_ids`), so its own
tokens come on top, as in ``pred.py``.

The truncated prompt is split into ``context`` (instruction and document) and
``question`` (the rest) right after ``{context}``, at the newlines that follow it
(:func:`split_template`): a blank line for most templates, one newline for trec and
lsht, none for lcc and repobench-p; the record's ``separator`` holds them, so
``context + separator + question`` is exactly the (truncated) filled template.
**Chat template.** ``pred.py`` wraps prompts in the chat model's template except for
trec, triviaqa, samsum, lsht, lcc and repobench-p (``NO_CHAT_TEMPLATE_DATASETS``: "chat
models are better off without build prompts on these tasks"), whose filled template is
tokenized as it is, special tokens added (a Llama tokenizer's BOS). kvcert does the same by
default (``chat_template="official"``: those records carry ``metadata["chat_template"] =
False``, which :func:`~kvcert.tasks.prompting.build_prompt_ids` honours); the task config's
``chat_template: all`` renders every prompt through the chat template instead.

**Generation.** samsum's answer ends at a newline and its first token may be neither EOS
nor the newline (``pred.py``'s ``eos_token_id=[eos, "\n"]`` and ``min_length`` = prompt + 1):
those records carry ``metadata["stop_newline"] = True``
(:func:`kvcert.generation.engine.stop_rules`).

**LongBench-E.** ``dataset: <name>_e`` (one of ``LONGBENCH_E_DATASETS``, the 13 of
``pred.py --e``) reads ``<name>_e.jsonl`` and uses ``<name>``'s template, answer budget,
chat rule and metric; the record's task is ``longbench_<name>_e``.

The raw prediction is scored (:func:`score_longbench_record`): ``eval.py`` strips nothing,
so neither does kvcert (a leading space or a trailing newline changes the score).
"""

from __future__ import annotations

from dataclasses import replace
from itertools import islice
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from kvcert.tasks.lengths import LENGTH_SETTING, LengthError
from kvcert.tasks.longbench_metrics import DATASET2METRIC, score_sample
from kvcert.tasks.prompting import build_prompt_ids
from kvcert.config.sources import HUB_PREFIX, SourceError, hub_id, missing
from kvcert.config.task_table import DATASET2MAXLEN, NO_CHAT_TEMPLATE_DATASETS, LONGBENCH_PREFIX as TASK_PREFIX
from kvcert.tasks.records import TaskRecord, check_text, json_lines, progress_of

__all__ = [
    "CHAT_TEMPLATE_RULES", "DATASET2MAXLEN", "DATASET2METRIC", "DATASET2PROMPT", "LONGBENCH_E_DATASETS",
    "NO_CHAT_TEMPLATE_DATASETS", "base_dataset",
    "QA_DATASETS", "REQUIRED_FIELDS", "TASK_PREFIX", "load_longbench", "longbench_records",
    "middle_truncate", "score_longbench_record", "split_template", "task_name",
]

#: the official prompt templates (``config/dataset2prompt.json``), all 21 datasets.
DATASET2PROMPT: dict[str, str] = {
    "narrativeqa": (
        "You are given a story, which can be either a novel or a movie script, and a question. "
        "Answer the question asconcisely as you can, using a single phrase if possible. Do not "
        "provide any explanation.\n\nStory: {context}\n\nNow, answer the question based on the "
        "story asconcisely as you can, using a single phrase if possible. Do not provide any "
        "explanation.\n\nQuestion: {input}\n\nAnswer:"
    ),
    "qasper": (
        "You are given a scientific article and a question. Answer the question as concisely as "
        "you can, using a single phrase or sentence if possible. If the question cannot be "
        "answered based on the information in the article, write \"unanswerable\". If the "
        "question is a yes/no question, answer \"yes\", \"no\", or \"unanswerable\". Do not "
        "provide any explanation.\n\nArticle: {context}\n\n Answer the question based on the "
        "above article as concisely as you can, using a single phrase or sentence if possible. "
        "If the question cannot be answered based on the information in the article, write "
        "\"unanswerable\". If the question is a yes/no question, answer \"yes\", \"no\", or "
        "\"unanswerable\". Do not provide any explanation.\n\nQuestion: {input}\n\nAnswer:"
    ),
    "multifieldqa_en": (
        "Read the following text and answer briefly.\n\n{context}\n\nNow, answer the following "
        "question based on the above text, only give me the answer and do not output any other "
        "words.\n\nQuestion: {input}\nAnswer:"
    ),
    "multifieldqa_zh": (
        "阅读以下文字并用中文简短回答：\n\n{context}\n\n现在请基于上面的文章回答下面的问题，只告诉我答案，"
        "不要输出任何其他字词。\n\n问题：{input}\n回答："
    ),
    "hotpotqa": (
        "Answer the question based on the given passages. Only give me the answer and do not "
        "output any other words.\n\nThe following are given passages.\n{context}\n\nAnswer the "
        "question based on the given passages. Only give me the answer and do not output any "
        "other words.\n\nQuestion: {input}\nAnswer:"
    ),
    "2wikimqa": (
        "Answer the question based on the given passages. Only give me the answer and do not "
        "output any other words.\n\nThe following are given passages.\n{context}\n\nAnswer the "
        "question based on the given passages. Only give me the answer and do not output any "
        "other words.\n\nQuestion: {input}\nAnswer:"
    ),
    "musique": (
        "Answer the question based on the given passages. Only give me the answer and do not "
        "output any other words.\n\nThe following are given passages.\n{context}\n\nAnswer the "
        "question based on the given passages. Only give me the answer and do not output any "
        "other words.\n\nQuestion: {input}\nAnswer:"
    ),
    "dureader": (
        "请基于给定的文章回答下述问题。\n\n文章：{context}\n\n请基于上述文章回答下面的问题。\n\n问题：{input}\n回答："
    ),
    "gov_report": (
        "You are given a report by a government agency. Write a one-page summary of the "
        "report.\n\nReport:\n{context}\n\nNow, write a one-page summary of the report.\n\nSummary:"
    ),
    "qmsum": (
        "You are given a meeting transcript and a query containing a question or instruction. "
        "Answer the query in one or more sentences.\n\nTranscript:\n{context}\n\nNow, answer the "
        "query based on the above meeting transcript in one or more sentences.\n\nQuery: "
        "{input}\nAnswer:"
    ),
    "multi_news": (
        "You are given several news passages. Write a one-page summary of all news. \n\nNews:\n"
        "{context}\n\nNow, write a one-page summary of all the news.\n\nSummary:"
    ),
    "vcsum": "下面有一段会议记录，请你阅读后，写一段总结，总结会议的内容。\n会议记录：\n{context}\n\n会议总结：",
    "trec": (
        "Please determine the type of the question below. Here are some examples of "
        "questions.\n\n{context}\n{input}"
    ),
    "triviaqa": (
        "Answer the question based on the given passage. Only give me the answer and do not "
        "output any other words. The following are some examples.\n\n{context}\n\n{input}"
    ),
    "samsum": (
        "Summarize the dialogue into a few short sentences. The following are some "
        "examples.\n\n{context}\n\n{input}"
    ),
    "lsht": "请判断给定新闻的类别，下面是一些例子。\n\n{context}\n{input}",
    "passage_count": (
        "There are some paragraphs below sourced from Wikipedia. Some of them may be duplicates. "
        "Please carefully read these paragraphs and determine how many unique paragraphs there "
        "are after removing duplicates. In other words, how many non-repeating paragraphs are "
        "there in total?\n\n{context}\n\nPlease enter the final count of unique paragraphs after "
        "removing duplicates. The output format should only contain the number, such as 1, 2, "
        "3, and so on.\n\nThe final answer is: "
    ),
    "passage_retrieval_en": (
        "Here are 30 paragraphs from Wikipedia, along with an abstract. Please determine which "
        "paragraph the abstract is from.\n\n{context}\n\nThe following is an abstract.\n\n{input}"
        "\n\nPlease enter the number of the paragraph that the abstract is from. The answer "
        "format must be like \"Paragraph 1\", \"Paragraph 2\", etc.\n\nThe answer is: "
    ),
    "passage_retrieval_zh": (
        "以下是若干段落文字，以及其中一个段落的摘要。请确定给定的摘要出自哪一段。\n\n{context}\n\n下面是一个摘要\n\n"
        "{input}\n\n请输入摘要所属段落的编号。答案格式必须是\"段落1\"，\"段落2\"等格式\n\n答案是："
    ),
    "lcc": "Please complete the code given below. \n{context}Next line of code:\n",
    "repobench-p": "Please complete the code given below. \n{context}{input}Next line of code:\n",
}

#: the single-document and multi-document English QA tasks (the paper profile's set).
QA_DATASETS: tuple[str, ...] = (
    "narrativeqa", "qasper", "multifieldqa_en", "hotpotqa", "2wikimqa", "musique",
)

#: the datasets of LongBench-E (``pred.py --e``), each read as ``<dataset>_e``.
LONGBENCH_E_DATASETS: tuple[str, ...] = (
    "qasper", "multifieldqa_en", "hotpotqa", "2wikimqa", "gov_report", "multi_news", "trec", "triviaqa",
    "samsum", "passage_count", "passage_retrieval_en", "lcc", "repobench-p",
)

#: how prompts meet the chat template: ``official`` (``pred.py``: none for NO_CHAT_TEMPLATE_DATASETS) or ``all``.
CHAT_TEMPLATE_RULES: tuple[str, ...] = ("official", "all")

#: the fields of every official LongBench row.
REQUIRED_FIELDS: tuple[str, ...] = (
    "input", "context", "answers", "length", "dataset", "language", "all_classes", "_id",
)


def task_name(dataset: str) -> str:
    """The record ``task`` of a LongBench dataset, e.g. ``longbench_hotpotqa`` (``longbench_hotpotqa_e``)."""
    return f"{TASK_PREFIX}{dataset}"


def base_dataset(dataset: str) -> str:
    """The LongBench v1 dataset whose template, budget and metric ``dataset`` uses
    (``hotpotqa_e`` → ``hotpotqa``); refuses a ``_e`` name outside LongBench-E."""
    if dataset.endswith("_e") and dataset not in DATASET2PROMPT:
        base = dataset[:-2]
        if base not in LONGBENCH_E_DATASETS:
            raise ValueError(f"dataset: {dataset!r} is not in LongBench-E; its datasets are "
                             f"{', '.join(d + '_e' for d in LONGBENCH_E_DATASETS)}")
        return base
    return dataset


# ------------------------------------------------------------------------ loading

def load_longbench(source: str | Path, dataset: str, split: str = "test",
                   limit: int | None = None, revision: str | None = None) -> list[dict[str, Any]]:
    """The raw rows of one LongBench dataset (first ``limit`` rows when given).

    ``source`` is a local file (``.jsonl`` or ``.parquet``), a local directory (see
    the module docstring for the layouts searched), or a Hub dataset id written
    ``hf:owner/name`` (:mod:`kvcert.config.sources`), loaded as ``datasets.load_dataset(source, dataset, split=split,
    revision=revision)`` and, when the repository has no configuration of that name
    (e.g. the ``refs/convert/parquet`` branch), with ``data_dir=dataset`` instead.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be non-negative, got {limit}")
    files = source_files(source, dataset, split)
    if files is None:
        return _load_hub(hub_id(str(source)), dataset, split, limit, revision)
    rows: list[dict[str, Any]] = []
    for file in files:
        rows.extend(_read_file(file, None if limit is None else limit - len(rows)))
        if limit is not None and len(rows) >= limit:
            break
    return rows


def source_files(source: str | Path, dataset: str, split: str = "test") -> list[Path] | None:
    """The local files :func:`load_longbench` reads for ``dataset`` (the module docstring's layouts), None
    for a Hub id; a source that is neither is refused in one line."""
    path = Path(source).expanduser()
    if path.is_file():
        return [path]
    if path.is_dir():
        files = _local_files(path, dataset, split)
        if not files:
            raise FileNotFoundError(
                f"no LongBench data for {dataset!r} in {path}: expected {dataset}.jsonl (or "
                f"data/{dataset}.jsonl), Parquet files under {dataset}/, or {dataset}.parquet / "
                f"{dataset}-*.parquet"
            )
        return files
    if hub_id(str(source)) is not None:
        return None
    raise missing("longbench", str(source), f"does not exist (a directory holding {dataset}.jsonl or "
                  "Parquet files, or a .jsonl/.parquet file, was expected)")


def count_rows(source: str | Path, dataset: str, split: str = "test") -> tuple[int, str] | None:
    """(how many rows ``dataset``'s local files hold, the files) without parsing them (non-blank lines of a
    JSONL file, the row counts of Parquet footers); None for a Hub id."""
    files = source_files(source, dataset, split)
    if files is None:
        return None
    shown = str(files[0]) if len(files) == 1 else f"{len(files)} files under {files[0].parent}"
    return sum(_file_rows(file) for file in files), shown


def _file_rows(path: Path) -> int:
    """The rows of one data file, uncounted lines and unread columns aside (see :func:`count_rows`)."""
    if path.suffix == ".jsonl":
        with path.open("rb") as handle:
            return sum(1 for line in handle if line.strip())
    if path.suffix != ".parquet":
        raise ValueError(f"{path}: expected a .jsonl or .parquet file")
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path).metadata.num_rows
    except Exception as exc:  # pyarrow's errors name no file
        raise ValueError(f"{path}: not a readable Parquet file ({type(exc).__name__}: {exc})") from None


def _local_files(directory: Path, dataset: str, split: str) -> list[Path]:
    for candidate in (directory / f"{dataset}.jsonl", directory / "data" / f"{dataset}.jsonl"):
        if candidate.is_file():
            return [candidate]
    nested = directory / dataset
    if nested.is_dir():
        files = sorted(nested.rglob("*.parquet"))
        of_split = [
            f for f in files
            if split in f.relative_to(nested).parts[:-1] or f.name.startswith(f"{split}-")
            or f.stem == split
        ]
        return of_split or files
    return sorted(
        f for f in directory.glob("*.parquet")
        if f.stem == dataset or f.name.startswith(f"{dataset}-")
    )


def _read_file(path: Path, limit: int | None) -> list[dict[str, Any]]:
    if path.suffix == ".jsonl":
        return _read_jsonl(path, limit)
    if path.suffix == ".parquet":
        return _read_parquet(path, limit)
    raise ValueError(f"{path}: expected a .jsonl or .parquet file")


def _read_jsonl(path: Path, limit: int | None) -> list[dict[str, Any]]:
    return [_checked_row(row, where) for where, row in islice(json_lines(path), limit)]


def _read_parquet(path: Path, limit: int | None) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    if limit is not None:
        table = table.slice(0, limit)
    return [_checked_row(row, f"{path} row {i}") for i, row in enumerate(table.to_pylist())]


def _load_hub(source: str, dataset: str, split: str, limit: int | None,
              revision: str | None) -> list[dict[str, Any]]:
    import datasets

    try:
        try:
            data = datasets.load_dataset(source, dataset, split=split, revision=revision)
        except ValueError as exc:
            if dataset not in str(exc):
                raise
            # no configuration named after the dataset: one folder per dataset instead
            data = datasets.load_dataset(source, data_dir=dataset, split=split, revision=revision)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise FileNotFoundError(
            f"{HUB_PREFIX}{source}: loading the Hub dataset failed ({type(exc).__name__}: {first})"
        ) from exc
    rows = []
    for index, row in enumerate(data):
        if limit is not None and index >= limit:
            break
        rows.append(_checked_row(dict(row), f"{source} ({dataset}, {split}) row {index}"))
    return rows


def _checked_row(row: Any, where: str) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
    for name in REQUIRED_FIELDS:
        if name not in row:
            raise ValueError(f"{where}: LongBench row lacks field {name!r}")
    answers = row["answers"]
    if not isinstance(answers, (list, tuple)) or not answers:
        raise ValueError(f"{where}: field 'answers' must be a non-empty list")
    for name in ("context", "input", "_id"):  # a null must not become the text "None"
        check_text(row[name], name, where)
    for answer in answers:
        check_text(answer, "answers", where)
    return row


# ------------------------------------------------------------------------ records

def split_template(dataset: str) -> tuple[str, str, str]:
    """``(head, separator, question)`` of the dataset's template.

    ``head`` ends with ``{context}``; ``separator`` is the run of newlines right after
    it (``"\\n\\n"``, ``"\\n"`` or empty); ``question`` is the rest of the template.
    Raises ``ValueError`` for an unknown dataset, or a template that asks its question
    (``{input}``) before the document.
    """
    try:
        template = DATASET2PROMPT[base_dataset(dataset)]
    except KeyError:
        raise ValueError(
            f"no LongBench prompt template for {dataset!r}; known: {', '.join(sorted(DATASET2PROMPT))}"
        ) from None
    if template.count("{context}") != 1:
        raise ValueError(f"the {dataset!r} template does not hold {{context}} exactly once")
    cut = template.index("{context}") + len("{context}")
    head, rest = template[:cut], template[cut:]
    question = rest.lstrip("\n")
    if "{input}" in head:
        raise ValueError(f"the {dataset!r} template asks its question before the document")
    return head, rest[: len(rest) - len(question)], question


def middle_truncate(tokenizer: Any, text: str, max_length: int) -> tuple[str, int, bool]:
    """``(text, n_tokens, truncated)``: ``pred.py``'s middle truncation of ``text``.

    ``n_tokens`` counts the ids of ``tokenizer(text)`` *with* its special tokens, as
    ``pred.py`` does (a BOS-adding tokenizer counts its BOS). Above ``max_length`` the
    text becomes the decoded first ``int(max_length / 2)`` ids followed by the decoded
    last ``int(max_length / 2)`` ids, special tokens skipped (so a BOS costs the first
    half one text token). Re-encoding the result gives those tokens back except near
    the junction, where the two halves meet inside a word and may tokenize differently
    (a few tokens).
    """
    if max_length < 2:
        raise ValueError(f"max_length must be at least 2, got {max_length}")
    ids = list(tokenizer(text, truncation=False)["input_ids"])
    if len(ids) <= max_length:
        return text, len(ids), False
    half = int(max_length / 2)
    kept = (tokenizer.decode(ids[:half], skip_special_tokens=True)
            + tokenizer.decode(ids[-half:], skip_special_tokens=True))
    return kept, len(ids), True


def longbench_records(rows: Iterable[dict[str, Any]], dataset: str, tokenizer: Any,
                      max_length: int, chat_template: str = "official", bar: Any = None) -> list[TaskRecord]:
    """Task records of ``dataset`` (see the module docstring); ``chat_template``: ``official``
    (``pred.py``'s rule, the default) or ``all`` (every prompt through the chat template); ``bar``: a
    progress display told of every record built (``update``).

    ``metadata``: ``dataset``, ``all_classes``, ``max_new_tokens`` (the official
    answer budget), ``original_length`` (ids of the filled template, special tokens
    included, as ``pred.py`` counts them), ``truncated``, ``_id``, ``language``,
    ``longbench_length`` (the row's own ``length`` field) and ``target_tokens``
    (= ``max_length``). ``length`` is the number of prompt tokens after the chat
    template.
    """
    if chat_template not in CHAT_TEMPLATE_RULES:
        raise ValueError(f"chat_template: {chat_template!r} is not one of {CHAT_TEMPLATE_RULES}")
    _, separator, question_template = split_template(dataset)
    base = base_dataset(dataset)
    template = DATASET2PROMPT[base]
    rules = {}
    if chat_template == "official" and base in NO_CHAT_TEMPLATE_DATASETS:
        rules["chat_template"] = False
    if base == "samsum":
        rules["stop_newline"] = True
    records = []
    for index, row in enumerate(rows):
        where = f"{dataset} row {index}"
        _checked_row(row, where)
        filled = template.format(**row)
        question = question_template.format(**row)
        ending = separator + question  # ``filled`` ends with it by construction
        text, n_tokens, truncated = middle_truncate(tokenizer, filled, max_length)
        if not text.endswith(ending):
            raise truncation_error(f"{where} (_id={row['_id']!r})", tokenizer, ending, max_length, n_tokens, index)
        metadata = {
            "dataset": dataset,
            "all_classes": None if row["all_classes"] is None else list(row["all_classes"]),
            "max_new_tokens": DATASET2MAXLEN[base],
            "original_length": n_tokens,
            "truncated": truncated,
            "_id": row["_id"],
            "language": row["language"],
            "longbench_length": row["length"],
            "target_tokens": max_length,
            **rules,
        }
        record = TaskRecord(
            id=f"{task_name(dataset)}:{row['_id']}",
            task=task_name(dataset),
            context=text[: len(text) - len(ending)],
            question=question,
            answers=[str(answer) for answer in row["answers"]],
            metadata=metadata,
            separator=separator,
        )
        records.append(replace(record, length=len(build_prompt_ids(tokenizer, record)[0])))
        if bar is not None:
            bar.update(1)
    return records


#: tokens where the two halves of a middle truncation meet that may re-encode differently
JUNCTION_TOKENS = 4


def truncation_error(where: str, tokenizer: Any, ending: str, max_length: int, n_tokens: int,
                     row: int | None = None) -> LengthError:
    """The one-line refusal of a row whose prompt lost its question part to the middle truncation at
    ``max_length`` tokens (the run's prompt length: ``kvcert run``'s ``length=``, a grid's ``lengths``):
    why — a question part longer than the kept end, or a tokenizer whose decode does not give the text back
    — and the length that would keep it (a :class:`~kvcert.tasks.lengths.LengthError`: where that length is
    beyond the model's positions, ``kvcert run`` says instead to leave the row out, ``limit=`` the rows before
    it, ``row`` being its index, or to use another model)."""
    question = len(tokenizer(ending, add_special_tokens=False)["input_ids"])
    half = int(max_length / 2)
    before = f"leave the row out (limit={row}: the rows before it), or " if row else ""
    if question + JUNCTION_TOKENS > half:
        need = 2 * (question + JUNCTION_TOKENS)
        why = (f"its question part has {question} tokens, more than the last {half} tokens the cut keeps "
               f"(half the length)")
        fix = f"give length={need} or more ({LENGTH_SETTING})"
        instead = f"{before}use a model with more positions"
    else:
        need = n_tokens
        why = ("the tokenizer's decode does not give the text back (a word-level tokenizer drops unknown "
               "words and the spacing)")
        fix = (f"give length={n_tokens} or more, the row's whole prompt, so that nothing is cut ({LENGTH_SETTING}), "
               "or a model whose tokenizer decodes its tokens back to the text")
        instead = f"{before}use a model whose tokenizer decodes its tokens back to the text (any subword tokenizer)"
    return LengthError(f"{where}: middle truncation to {max_length} tokens (the prompt length) lost the "
                       f"question part: {why}", fix, need, instead)


def score_longbench_record(record: TaskRecord, prediction: str) -> float:
    """The LongBench score in [0, 1] of the raw ``prediction`` for one record (what
    ``eval.py`` scores: nothing stripped; the first-line cut of trec, triviaqa, samsum
    and lsht happens inside :func:`~kvcert.tasks.longbench_metrics.score_sample`)."""
    metadata = record.metadata
    return score_sample(base_dataset(metadata["dataset"]), prediction, record.answers, metadata["all_classes"])


# ------------------------------------------------------------------------ the task registry's entry

def build_records(task_cfg: Mapping[str, Any], tokenizer: Any, length: int, examples: int, seed: int,
                  sample: str = "first", progress: Callable[[int], Any] | None = None) -> list[TaskRecord]:
    """The first ``examples`` rows of the config's data set as records at ``length`` tokens (the
    registry's ``build``; ``seed`` and ``sample`` do not apply: the official order is kept); ``progress``:
    a progress display's factory (:func:`~kvcert.tasks.records.progress_of`)."""
    rows = load_longbench(task_cfg["source"], task_cfg["dataset"], limit=examples)
    bar = progress_of(progress, len(rows))
    try:
        return longbench_records(rows, task_cfg["dataset"], tokenizer, max_length=length,
                                 chat_template=task_cfg.get("chat_template") or "official", bar=bar)
    finally:
        bar.close()


def capacity(task_cfg: Mapping[str, Any]) -> tuple[int, str] | None:
    """(the most records the config's data set offers — its rows —, where they are); None where it cannot
    be told without loading the data (a Hub id)."""
    counted = count_rows(task_cfg["source"], task_cfg["dataset"])
    return None if counted is None else (counted[0], f"the rows of {counted[1]}")


def config_sources(task_cfg: Mapping[str, Any]) -> list[Path] | None:
    """The local files a build of the config reads (:func:`source_files`); None for a Hub id."""
    return source_files(task_cfg["source"], task_cfg["dataset"])


def check_config(task_cfg: Mapping[str, Any]) -> list[str]:
    """The pre-flight of a LongBench task config: its source exists and holds its data set (a Hub
    id is checked where it is loaded). One line per problem."""
    name, source = task_cfg.get("name", "?"), str(task_cfg["source"])
    try:
        if hub_id(source) is not None:
            return []
        folder = Path(source).expanduser()
        if folder.is_file():
            return []
        if not folder.is_dir():
            raise missing("longbench", source, "does not exist (a folder of LongBench v1 files was expected)")
        if not _local_files(folder, task_cfg["dataset"], "test"):
            return [f"task {name}: {source} has no {task_cfg['dataset']}.jsonl (nor Parquet files of it)"]
    except SourceError as exc:
        return [f"task {name}: {str(exc).removeprefix('longbench: ')}"]
    return []


def config_answer_tokens(task_cfg: Mapping[str, Any]) -> int | None:
    """The official answer budget of the config's data set (``DATASET2MAXLEN``)."""
    dataset = task_cfg.get("dataset")
    return int(DATASET2MAXLEN[dataset]) if dataset in DATASET2MAXLEN else None


def config_uses_chat(task_cfg: Mapping[str, Any]) -> bool:
    """Whether the config's prompts go through the chat template (``pred.py``'s rule, or ``all``)."""
    return (task_cfg.get("chat_template") or "official") == "all" or \
        base_dataset(str(task_cfg.get("dataset"))) not in NO_CHAT_TEMPLATE_DATASETS
