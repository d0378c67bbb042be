"""The report's document model: blocks (headings, paragraphs, tables, figures, notes) rendered
to Markdown (figures linked as files) and to one self-contained HTML page (figures embedded as
base64 PNG, no external resource), and the number formats every section shares."""

from __future__ import annotations

import base64
import html
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

#: verdict words the HTML colours
VERDICT_WORDS = ("holds", "killed", "inconclusive", "uninformative")
#: a line break inside a table cell (Markdown and HTML: ``<br>``; any other newline in a cell is a space)
BR = "\u2028"


# --- a tiny document model --------------------------------------------------------------------
@dataclass
class Block:
    kind: str  # heading | paragraph | table | figure | code | note | contents
    text: str = ""
    level: int = 2
    header: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    path: Path | None = None
    css_class: str = ""  # a table's class in the HTML (its layout rules in CSS)


class Document:
    """Blocks rendered to Markdown and HTML; figures are numbered in order of appearance,
    headings get anchors, and a ``contents`` block lists the level-2 headings."""

    def __init__(self) -> None:
        self.blocks: list[Block] = []
        self.figures = 0

    def heading(self, text: str, level: int = 2) -> None:
        self.blocks.append(Block("heading", text, level))

    def note(self, text: str) -> None:
        self.blocks.append(Block("note", text))

    def contents(self) -> None:
        self.blocks.append(Block("contents"))

    def paragraph(self, text: str) -> None:
        self.blocks.append(Block("paragraph", text))

    def table(self, header: Sequence[str], rows: Sequence[Sequence], css_class: str = "") -> None:
        self.blocks.append(Block("table", header=[str(h) for h in header], rows=[[str(c) for c in r] for r in rows],
                                 css_class=css_class))

    def figure(self, path: Path | None, caption: str) -> None:
        if path is None:
            self.paragraph(f"*{caption}: no data.*")
        else:
            self.figures += 1
            self.blocks.append(Block("figure", f"Fig. {self.figures} — {caption}", path=path))

    def _toc(self) -> list[tuple[str, str]]:
        return [(b.text, slug(b.text)) for b in self.blocks if b.kind == "heading" and b.level == 2]

    def code(self, text: str) -> None:
        self.blocks.append(Block("code", text))

    def _render(self, by_kind: Mapping[str, Callable[[Block], str]]) -> list[str]:
        """Each block through the renderer of its kind, in order."""
        return [by_kind[b.kind](b) for b in self.blocks]

    def markdown(self, base: Path) -> str:
        cell = lambda s: s.replace("|", "\\|").replace("\n", " ").replace(BR, "<br>")  # noqa: E731
        return "\n".join(self._render({
            "heading": lambda b: f"{'#' * b.level} {b.text}\n",
            "paragraph": lambda b: b.text + "\n",
            "table": lambda b: "\n".join(["| " + " | ".join(cell(h) for h in b.header) + " |",
                                          "|" + "---|" * len(b.header),
                                          *("| " + " | ".join(cell(c) for c in r) + " |" for r in b.rows), ""]),
            "figure": lambda b: f"![{b.text}]({b.path.relative_to(base).as_posix()})\n\n*{b.text}*\n",
            "code": lambda b: "```\n" + b.text + "\n```\n",
            "note": lambda b: "> " + b.text + "\n",
            "contents": lambda b: "Contents: " + " · ".join(f"[{t}](#{a})" for t, a in self._toc()) + "\n",
        }))

    def html(self, title: str) -> str:
        body = self._render({
            "heading": lambda b: f'<h{b.level} id="{slug(b.text)}">{html.escape(b.text)}</h{b.level}>',
            "paragraph": lambda b: f"<p>{_inline(b.text)}</p>",
            "table": _html_table,
            "figure": lambda b: (f'<figure><img alt="{html.escape(b.text)}" src="data:image/png;base64,'
                                 f'{base64.b64encode(b.path.read_bytes()).decode()}">'
                                 f"<figcaption>{html.escape(b.text)}</figcaption></figure>"),
            "code": lambda b: f"<pre>{html.escape(b.text)}</pre>",
            "note": lambda b: f'<div class="note">{_inline(b.text)}</div>',
            "contents": lambda b: ('<nav class="contents"><strong>Contents</strong><ol>'
                                   + "".join(f'<li><a href="#{a}">{html.escape(t)}</a></li>' for t, a in self._toc())
                                   + "</ol></nav>"),
        })
        return (
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
        )


CSS = (
    "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222;line-height:1.4}"
    ".scroll{overflow-x:auto;margin:0.5em 0 1.5em}"
    "table{border-collapse:collapse;font-size:0.88em}th,td{border:1px solid #ccc;padding:3px 7px;"
    "text-align:left;vertical-align:top;max-width:26em;overflow-wrap:break-word}th{background:#f0f0f0}"
    "figure{margin:1em 0}figure img{width:100%;max-width:880px;display:block}"
    ".note{background:#fff8e1;border-left:4px solid #f0b400;padding:0.6em 0.9em;margin:1em 0}"
    "nav.contents{background:#f6f6f6;padding:0.4em 1em;margin:1em 0;font-size:0.92em}nav.contents ol{margin:0.3em 0;"
    "columns:2}code{background:#f0f0f0;padding:0 3px}"
    "figcaption{font-style:italic;font-size:0.9em;max-width:880px}"
    "pre{background:#f6f6f6;padding:0.6em;font-size:0.85em;white-space:pre-wrap;overflow-wrap:anywhere}"
    "td code{white-space:nowrap}"
    # the claims table at 800 px: its last column (notes) breaks long identifiers anywhere rather than widen it
    "table.claims td:last-child{overflow-wrap:anywhere;min-width:9em}"
    "strong.holds{color:#1a7f37}strong.killed{color:#b42318}strong.inconclusive{color:#9a6700}"
    "strong.uninformative{color:#6e40c9}"
)


def _html_table(b: Block) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in b.header)
    rows = "".join("<tr>" + "".join(f"<td>{_inline(c).replace(BR, '<br>')}</td>" for c in r) + "</tr>" for r in b.rows)
    cls = f' class="{html.escape(b.css_class)}"' if b.css_class else ""
    return f'<div class="scroll"><table{cls}><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></div>'


def _inline(text: str) -> str:
    """Escape, then render **bold** (verdict words get a colour class), *italics* and `code`."""
    parts = html.escape(text).split("**")
    out = []
    for i, p in enumerate(parts):
        if i % 2:
            cls = p if p in VERDICT_WORDS else ""
            out.append(f'<strong class="{cls}">{p}</strong>' if cls else f"<strong>{p}</strong>")
        else:
            p = re.sub(r"`([^`]+)`", r"<code>\1</code>", p)
            out.append(re.sub(r"(?<![\w*])\*([^*\s][^*]*?)\*(?![\w*])", r"<em>\1</em>", p))
    return "".join(out)


def slug(text: str) -> str:
    """A heading's anchor (GitHub's rule: lower case, punctuation dropped, spaces to dashes)."""
    return re.sub(r"[^\w\- ]", "", text.lower()).strip().replace(" ", "-")


def fmt(x, digits: int = 3) -> str:
    if x is None:
        return "–"
    try:
        x = float(x)
    except (TypeError, ValueError):
        return str(x)
    if math.isnan(x):
        return "–"
    return f"{x:.{digits}f}"


def fmt_ci(stat: Mapping | Any, digits: int = 3) -> str:
    """'0.637 [0.612, 0.666]' of an estimate's mapping (``estimate``, ``ci``) or of a typed test
    (:class:`kvcert.analysis.claims_document.ClaimTest`)."""
    if not isinstance(stat, Mapping):
        stat = {"estimate": stat.estimate, "ci": stat.ci}
    lo, hi = (stat.get("ci") or [None, None])
    return f"{fmt(stat.get('estimate'), digits)} [{fmt(lo, digits)}, {fmt(hi, digits)}]"


