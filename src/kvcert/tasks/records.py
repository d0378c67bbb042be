"""The task record: one prompt with its gold answers, and its JSONL storage.

Every task generator and loader in :mod:`kvcert.tasks` emits :class:`TaskRecord`
objects; everything downstream (generation, scoring, analysis) reads them. The JSONL
reader checks every line against the schema and names the missing or mistyped field
together with the file and line number.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, NamedTuple

from ..atomic import atomic_path

# name -> (expected type(s), human-readable type)
_SCHEMA: dict[str, tuple[type | tuple[type, ...], str]] = {
    "id": (str, "str"),
    "task": (str, "str"),
    "context": (str, "str"),
    "question": (str, "str"),
    "answers": (list, "list[str]"),
    "metadata": (dict, "dict"),
    "length": (int, "int"),
}
# optional fields: name -> (expected type, human-readable type, default)
_OPTIONAL: dict[str, tuple[type, str, Any]] = {
    "separator": (str, "str", "\n\n"),
    "answer_prefix": (str, "str", ""),
}


class QuestionAnswer(NamedTuple):
    """One question a record's context can answer.

    ``answer`` is the gold answer (what scoring looks for); ``response`` the reference
    reply — the one the embedded model is trained to give: a sentence that restates the
    fact ("Nora lives in Lisbon"), or, where the prompt ends with an answer prefix that
    already restates it (``answer_prefix``, RULER's needle: "The special magic number
    for pocket mentioned in the provided text is"), just the value; ``key`` the words
    that identify the fact (needle key, person, code item); ``fact`` the sentence of the
    context that states it (empty where unknown).
    """

    question: str
    answer: str
    response: str
    key: str
    answer_prefix: str = ""
    fact: str = ""


class RecordError(ValueError):
    """A record does not follow the :class:`TaskRecord` schema."""


def check_text(value: Any, name: str, where: str) -> str:
    """``value`` if it is text a tokenizer can encode; else :class:`RecordError` in one line naming
    the field (a null or a number where text belongs, a lone surrogate such as ``"\\ud800"``)."""
    if not isinstance(value, str):
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise RecordError(f"{where}: field {name!r} must be text, got {type(value).__name__} {shown}; "
                          "fix the data file")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RecordError(f"{where}: field {name!r} holds {value[exc.start]!r} at character {exc.start}, a lone "
                          "surrogate (not UTF-8 text: a truncated emoji or a bad export); fix the data file") from None
    return value


@dataclass
class TaskRecord:
    """One evaluation item.

    ``context`` is the part of the prompt a streaming run prefills and compresses
    before it sees ``question``; :func:`kvcert.tasks.prompting.build_prompt_ids`
    joins the two and renders them through the model's chat template. ``length`` is
    the number of tokens of that complete prompt under the tokenizer the record was
    generated for. ``metadata`` always holds ``target_tokens``; the needle task adds
    ``depth`` (percent) and ``num_needles``, the multi-turn task ``turn_distance``,
    ``fact_turn`` and ``num_turns``; ``multiturn_chat`` adds ``messages``, its earlier
    turns as chat messages (``{"role", "content"}``), from which its prompt is built
    (``context`` is their transcript; :mod:`kvcert.tasks.prompting`).

    ``separator`` joins context and question in the user message (LongBench's blank
    line by default; RULER's needle template uses one newline). ``answer_prefix`` is
    text the prompt ends with after the chat template's generation prompt, so that the
    model's answer continues it (RULER appends its answer prefix this way); empty for
    tasks that have none. Both are optional in JSONL (older files lack them).
    """

    id: str
    task: str
    context: str
    question: str
    answers: list[str]
    metadata: dict[str, Any] = field(default_factory=dict)
    length: int = 0
    separator: str = "\n\n"
    answer_prefix: str = ""

    def __post_init__(self) -> None:
        validate_record(asdict(self))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "record") -> "TaskRecord":
        validate_record(data, where)
        optional = {name: data[name] for name in _OPTIONAL if name in data}
        return cls(**{name: data[name] for name in _SCHEMA}, **optional)


def validate_record(data: dict[str, Any], where: str = "record") -> None:
    """Raise :class:`RecordError` naming the first missing or mistyped field."""
    if not isinstance(data, dict):
        raise RecordError(f"{where}: expected a JSON object, got {type(data).__name__}")
    for name, (types, type_name) in _SCHEMA.items():
        if name not in data:
            raise RecordError(f"{where}: missing field {name!r}")
        value = data[name]
        # bool is an int subclass; a length of True is a bug, not a number.
        if not isinstance(value, types) or (name == "length" and isinstance(value, bool)):
            raise RecordError(
                f"{where}: field {name!r} must be {type_name}, got {type(value).__name__}"
            )
    for name, (kind, type_name, _) in _OPTIONAL.items():
        if name in data and not isinstance(data[name], kind):
            raise RecordError(
                f"{where}: field {name!r} must be {type_name}, got {type(data[name]).__name__}"
            )
    if not all(isinstance(a, str) for a in data["answers"]):
        raise RecordError(f"{where}: field 'answers' must be a list of strings")
    for name in ("context", "question", *(n for n in _OPTIONAL if n in data)):
        check_text(data[name], name, where)
    for answer in data["answers"]:
        check_text(answer, "answers", where)
    if not data["answers"]:
        raise RecordError(f"{where}: field 'answers' is empty")
    if "target_tokens" not in data["metadata"]:
        raise RecordError(f"{where}: field 'metadata' lacks 'target_tokens'")
    messages = data["metadata"].get("messages")
    if messages is not None:  # a chat record's earlier turns (multiturn_chat)
        if not isinstance(messages, list) or not all(isinstance(m, dict) and set(m) == {"role", "content"}
                                                     for m in messages):
            raise RecordError(f"{where}: metadata 'messages' must be a list of {{'role', 'content'}} objects")
        for m in messages:
            check_text(m["role"], "metadata.messages.role", where)
            check_text(m["content"], "metadata.messages.content", where)


def write_jsonl(records: Iterable[TaskRecord], path: str | Path) -> int:
    """Write records one JSON object per line; return how many were written."""
    count = 0
    with atomic_path(path) as tmp, tmp.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record.to_dict(), ensure_ascii=False) + "\n")
            count += 1
    return count


def read_jsonl(path: str | Path) -> list[TaskRecord]:
    """Read and validate a JSONL file of records (blank lines are skipped)."""
    return [TaskRecord.from_dict(data, where) for where, data in json_lines(path, RecordError)]


def json_lines(path: str | Path, error: type[Exception] = ValueError) -> Iterator[tuple[str, Any]]:
    """``(where, value)`` of each line of a JSONL file but the blank ones, ``where`` its ``path:line``; a line
    that is not JSON is refused as ``error``, in one line naming it."""
    for number, line in utf8_lines(path):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise error(f"{where}: not valid JSON ({exc.msg})") from exc
        yield where, value


#: byte-order marks a file that is not UTF-8 may start with, and what they mean
_BOMS = {b"\xff\xfe": "a UTF-16 little-endian byte-order mark", b"\xfe\xff": "a UTF-16 big-endian byte-order mark"}


def load_records(records_path: str | Path, start: int = 0, stop: int | None = None) -> list[TaskRecord]:
    """The records of a manifest (``start:stop``), refused in one line where it is missing or repeats an id."""
    records_path = Path(records_path)
    if not records_path.exists():
        raise FileNotFoundError(f"records: {records_path} does not exist; build the task manifest first")
    records = read_jsonl(records_path)[start:stop]
    ids = [r.id for r in records]
    if len(set(ids)) != len(ids):
        raise ValueError(f"records: {records_path} holds duplicate ids")
    return records


def not_utf8(path: Path, offset: int, byte: int, line: int, head: bytes = b"") -> RecordError:
    """The one-line error of a data file whose ``byte`` at ``offset`` (on ``line``) is not UTF-8: the file,
    the byte and its position, and the remedy (``head``: the file's first bytes, to name a UTF-16 mark)."""
    mark = f", and the file starts with {_BOMS[head[:2]]}" if head[:2] in _BOMS else ""
    return RecordError(f"{path}: byte 0x{byte:02x} at byte offset {offset} (line {line}) is not UTF-8{mark}; "
                       "the file must be UTF-8 text: re-encode it (e.g. iconv -f <its encoding> -t UTF-8)")


def utf8_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(line number from 1, text) of each line of a UTF-8 file; a byte that is not UTF-8 is refused in one
    line naming the file and its byte offset (:func:`not_utf8`)."""
    path = Path(path)
    offset, head = 0, b""
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            head = head or raw[:2]
            try:
                yield number, raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise not_utf8(path, offset + exc.start, raw[exc.start], number, head) from None
            offset += len(raw)


def read_utf8(path: str | Path) -> str:
    """The whole text of a UTF-8 file; a byte that is not UTF-8 is refused in one line (:func:`not_utf8`)."""
    path = Path(path)
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise not_utf8(path, exc.start, data[exc.start], data.count(b"\n", 0, exc.start) + 1, data[:2]) from None


class _Silent:
    """A progress display that shows nothing (a build asked for none)."""

    def update(self, n: int = 1) -> None:
        """Nothing to show."""

    def close(self) -> None:
        """Nothing to show."""


def progress_of(progress: Callable[[int], Any] | None, total: int):
    """The display of a build of ``total`` records: ``progress(total)`` (an object with ``update`` and
    ``close``, e.g. :func:`kvcert.progress.progress`), or a silent one where ``progress`` is None."""
    return _Silent() if progress is None else progress(total)
