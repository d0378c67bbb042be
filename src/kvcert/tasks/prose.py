"""A natural-prose haystack that needs no download: the language reference's text that every Python
installation ships, ``pydoc_data.topics`` (PSF license; ``from pydoc_data.topics import topics``, a dict of
about 465 k characters: the text ``help("assert")`` shows).

RULER's ``essay`` haystack is Paul Graham's essays, downloaded text that kvcert does not ship; the prose
haystack stands in for it (RULER's five essay tasks, :mod:`kvcert.tasks.ruler`) and gives the needle,
multikey and look-alike tasks a haystack of real English (``haystack="prose"``: the tasks
``needle_prose``, ``multikey_prose``, ``lookalike_prose``) beside the one repeated noise sentence.

The sentence stream (:func:`sentences`), deterministic for one text:

1. the topics in the order of their sorted keys;
2. each topic cut into paragraphs (runs of non-blank lines); a paragraph is kept when it reads as prose
   (:func:`is_prose`): it ends a sentence (``.``, ``?``, ``!``, before a closing quote or bracket), at
   least :data:`MIN_LETTERS` of its non-space characters are letters, and no line is code — a grammar
   production (``::=``), an interactive session (``>>>``, ``...``), a comment, a table rule, a line of
   symbols only. Code blocks, grammar productions, tables and headings go; a list item keeps its text,
   its bullet (``*``, ``1.``) dropped;
3. whitespace normalised (every run one space);
4. split into sentences after ``.``, ``?`` or ``!`` (and a closing quote or bracket) followed by a space
   and a capital, a quote or a bracket — never after ``e.g.``, ``i.e.``, ``etc.``, ``vs.``, ``cf.``;
5. a sentence kept when it has :data:`MIN_WORDS` to :data:`MAX_WORDS` words, at least
   :data:`MIN_LETTERS` letters, none of the marks of code or addresses (:data:`CODE_MARKS`) and none of
   the words a needle is made of (``magic number``: a haystack sentence never reads as a needle).

:class:`ProseHaystack` reads it as lines (:data:`SENTENCES_PER_LINE` sentences per line) from an offset
drawn per prompt from the example's own generator, wrapping around the end of the stream, so each prompt
takes its own passage and keeps its sentence boundaries; indexable as
:class:`kvcert.tasks.needle.NeedleHaystack` (``lines[:n]``: a longer haystack extends a shorter).

**The text is a snapshot, so every Python reads the same prose.** ``pydoc_data`` is regenerated with
every release of the documentation (3.10, 3.11, 3.12 and 3.13 ship different texts, and patch releases may
differ too), so the stream that the tasks read is not the interpreter's but kvcert's snapshot of it,
``prose_sentences.txt`` beside this module: the stream of Python 3.11.7's ``pydoc_data.topics`` (one
sentence a line, UTF-8; :data:`SNAPSHOT_PYTHON`), made by :func:`clean_sentences` and written by
:func:`write_snapshot`. The Python documentation is under the PSF License Agreement (Copyright © 2001-2023
Python Software Foundation; All Rights Reserved); ``prose_sentences.NOTICE.txt`` beside it says so.
:func:`source` is the snapshot's identity (the module it came from, the Python it came from, the SHA-256 of
its bytes, pinned in :data:`SNAPSHOT_SHA256`: an edited snapshot is refused where it is read); a manifest
built from prose carries it in its seal (``sources``, :mod:`kvcert.generation.manifest`), and a manifest whose
seal names another digest is refused in one line that says to rebuild it.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

#: the module the text comes from
SOURCE_NAME = "pydoc_data.topics"
#: a paragraph or sentence is prose when at least this share of its non-space characters are letters
MIN_LETTERS = 0.75
#: a sentence's words, at least and at most (shorter: a fragment; longer: a run-on the splitter missed)
MIN_WORDS, MAX_WORDS = 4, 80
#: sentences per haystack line (RULER's noise line is five short sentences, about 25 tokens; one sentence of
#: this text is about as long)
SENTENCES_PER_LINE = 1
#: words a needle is made of; a sentence holding one is dropped
NEEDLE_WORDS = ("magic number",)
#: characters of code, not of prose (a comment, a brace, a backslash) and addresses; a sentence holding one is dropped
CODE_MARKS = ("#", "{", "}", "\\", "::", "http", "www.")

_ABBREVIATIONS = ("e.g.", "i.e.", "etc.", "vs.", "cf.", "Mr.", "Dr.", "approx.")
_CODE_LINE = re.compile(r"::=|^\s*(>>>|\.\.\.|#|\||\+[-=+]+)|^[\W_]+$")
_BULLET = re.compile(r"^\s*(\*|-|\d+\.|\(\d+\))\s+")
_SENTENCE_END = re.compile(r"[.!?][\"'”’)\]]*$")
_BOUNDARY = re.compile(r"(?<=[.!?])([\"'”’)\]]*)\s+(?=[A-Z\"“‘(*])")


def _letters(text: str) -> float:
    chars = [c for c in text if not c.isspace()]
    return sum(c.isalpha() for c in chars) / len(chars) if chars else 0.0


def is_prose(lines: list[str]) -> bool:
    """Whether a paragraph (its lines, as in the text) reads as prose (the module docstring, step 2)."""
    if any(_CODE_LINE.search(line) for line in lines):
        return False
    text = " ".join(line.strip() for line in lines)
    return bool(_SENTENCE_END.search(text)) and _letters(text) >= MIN_LETTERS


def split_sentences(text: str) -> list[str]:
    """``text`` (whitespace normalised) cut after each sentence end (step 4 of the module docstring)."""
    out: list[str] = []
    start = 0
    for match in _BOUNDARY.finditer(text):
        end = match.start() + len(match.group(1))
        words = text[start:end].split()
        if words and words[-1].lower() in {a.lower() for a in _ABBREVIATIONS}:
            continue
        out.append(text[start:end].strip())
        start = match.end()
    out.append(text[start:].strip())
    return [s for s in out if s]


def keep_sentence(sentence: str) -> bool:
    """Step 5 of the module docstring."""
    words = sentence.split()
    return (MIN_WORDS <= len(words) <= MAX_WORDS and _letters(sentence) >= MIN_LETTERS
            and bool(_SENTENCE_END.search(sentence)) and not any(w in sentence.lower() for w in NEEDLE_WORDS)
            and not any(mark in sentence for mark in CODE_MARKS))


def paragraphs(text: str) -> list[list[str]]:
    """The runs of non-blank lines of ``text``."""
    out: list[list[str]] = [[]]
    for line in text.splitlines():
        if line.strip():
            out[-1].append(line)
        elif out[-1]:
            out.append([])
    return [p for p in out if p]


def clean_sentences(topics: Mapping[str, str]) -> tuple[str, ...]:
    """The sentence stream of a ``topics`` mapping (the module docstring's steps 1–5)."""
    out: list[str] = []
    for key in sorted(topics):
        for paragraph in paragraphs(topics[key]):
            if not is_prose(paragraph):
                continue
            text = " ".join(_BULLET.sub("", line, count=1).strip() if i == 0 else line.strip()
                            for i, line in enumerate(paragraph))
            out += [s for s in split_sentences(" ".join(text.split())) if keep_sentence(s)]
    return tuple(out)


#: the snapshot of the sentence stream the tasks read (one sentence a line, UTF-8), its Python and its SHA-256
SNAPSHOT = Path(__file__).with_name("prose_sentences.txt")
SNAPSHOT_PYTHON = "3.11.7"
SNAPSHOT_SHA256 = "e8fc5ee3b8a0d79cea5241fb6f7e4bb02d3d209fce9a47dadf6eedb9fd2798af"


def interpreter_sentences() -> tuple[str, ...]:
    """This interpreter's own stream (``pydoc_data.topics``, cleaned): the snapshot's source on Python
    :data:`SNAPSHOT_PYTHON`, another text on another Python."""
    from pydoc_data.topics import topics

    return clean_sentences(topics)


def write_snapshot(path: str | Path = SNAPSHOT) -> str:
    """Write this interpreter's stream as the snapshot (one sentence a line); its SHA-256, to pin in
    :data:`SNAPSHOT_SHA256` with :data:`SNAPSHOT_PYTHON` set to this interpreter's version."""
    data = "".join(s + "\n" for s in interpreter_sentences()).encode("utf-8")
    from ..atomic import write_bytes

    write_bytes(path, data)
    return hashlib.sha256(data).hexdigest()


@lru_cache(maxsize=1)
def sentences() -> tuple[str, ...]:
    """The sentence stream the tasks read: the snapshot (:data:`SNAPSHOT`), checked against its pinned digest."""
    data = SNAPSHOT.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != SNAPSHOT_SHA256:
        raise ValueError(f"{SNAPSHOT.name}: its SHA-256 is {digest[:16]}…, not the pinned {SNAPSHOT_SHA256[:16]}…: "
                         f"restore it from git (git checkout -- src/kvcert/tasks/{SNAPSHOT.name})")
    return tuple(data.decode("utf-8").splitlines())


def stream_digest(stream: tuple[str, ...]) -> str:
    """SHA-256 of a sentence stream: its sentences one a line, UTF-8."""
    return hashlib.sha256("".join(s + "\n" for s in stream).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class ProseSource:
    """The prose's identity: the module, the interpreter's version, the SHA-256 of the sentence stream. A
    source that is not a file: a manifest's seal records :meth:`seal_entry` under :attr:`name`
    (:func:`kvcert.generation.manifest.source_digests`)."""

    name: str
    python: str
    sha256: str
    sentences: int

    def seal_entry(self) -> dict:
        return {"python": self.python, "sha256": self.sha256, "sentences": self.sentences}


@lru_cache(maxsize=1)
def source() -> ProseSource:
    """The prose's source: the snapshot of Python :data:`SNAPSHOT_PYTHON`'s text, the same on every Python."""
    stream = sentences()
    return ProseSource(SOURCE_NAME, SNAPSHOT_PYTHON, stream_digest(stream), len(stream))


def task_sources(task_cfg: Mapping) -> list:
    """A prose task's ``sources`` (:class:`kvcert.tasks.Task`): the prose, which its seal records."""
    return [source()]


class ProseHaystack:
    """Consecutive lines of the sentence stream, ``per_line`` sentences each, from an offset drawn from ``rng``
    (uniform over the stream's sentences), wrapping around its end: ``lines[:n]`` is the passage's first ``n``
    lines (a longer haystack extends a shorter, as :class:`kvcert.tasks.needle.NeedleHaystack`'s)."""

    def __init__(self, rng: Any, per_line: int = SENTENCES_PER_LINE, stream: tuple[str, ...] | None = None):
        if per_line < 1:
            raise ValueError(f"per_line: a line holds at least one sentence, got {per_line}")
        self.stream = sentences() if stream is None else stream
        if not self.stream:
            raise ValueError(f"{SNAPSHOT.name}: no prose sentences; restore it from git")
        self.per_line = per_line
        self.offset = rng.randrange(len(self.stream))

    def line(self, i: int) -> str:
        n = len(self.stream)
        return " ".join(self.stream[(self.offset + i * self.per_line + j) % n] for j in range(self.per_line))

    def __getitem__(self, part: slice) -> list[str]:
        if not isinstance(part, slice) or part.stop is None:
            raise TypeError("a prose haystack is read as lines[:n]")
        return [self.line(i) for i in range(*part.indices(part.stop))]

    def take(self, n: int) -> list[str]:
        """The first ``n`` lines."""
        return self[:n]
