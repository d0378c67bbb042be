"""A run made before a change to the code that makes records, compared with a rerun after it, item by item.

A change to the code that makes records (:func:`kvcert.provenance.code_digest`) that cannot alter one (a move, a
rename, dead code removed) still changes the code digest every record carries, so the committed reference stops matching
(tests/test_reference_results.py). Instead of replacing the reference, a maintainer keeps a copy of the run the
reference was made from (``before``), reruns the experiment at the new code (``after``, the pipeline's
``results/<experiment>/``) and lets :func:`compare_runs` check that every output is the same:

* every generation record (``generations/**/*.jsonl``, line by line, every field),
* every replay table (``replay/**/*.parquet``: its rows, exactly, and its provenance) and impossibility table,
* every manifest (``manifests/**/*.jsonl``, byte for byte),
* the scores (``scores.parquet``), ``claims.json`` and ``summary.json``,
* the report (``report.md``, ``report.html``: commits and code digests masked) and its figures, byte for byte,

each with the fields (or a table's columns) that say *when* and *by which code* something was made left out
(:data:`VOLATILE`: the git commit, the code digest, times and durations). ``kvcert reference revalidate --before DIR``
first checks that ``before`` is the reference's own run (:func:`check_before`): the reference lists its run's outputs
(:data:`RUN`, written by ``kvcert reference update``: each file's SHA-256 and items, :func:`run_manifest`), and
``before`` must hold exactly those files with those digests, of the same experiment; ``after`` must be of that
experiment too, and the comparison must cover every item the listing holds. It prints the comparison and, when
everything is equal, appends the check to ``results/reference/<experiment>/revalidations.json`` once
({code_digest, reference_code_digests, run_sha256, experiment, compared, equal, command, date}; the same check again
appends nothing), which the reference test accepts in place of a new reference.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

#: fields that record when, how fast, or by which commit or code something was made: they differ between two runs
#: of the same code and are left out of every comparison (anywhere in a record, a table's provenance or a claims
#: document)
VOLATILE = frozenset({
    "code_digest", "code_digests", "git_commit", "analysis_git_commit", "started_utc", "verified_utc",
    "decode_seconds", "prefill_seconds", "seconds", "wall_time_seconds", "generation_seconds",
})
#: the file in a reference folder that holds the equality checks
CHECKS = "revalidations.json"


def stable(value):
    """``value`` with every :data:`VOLATILE` key removed, at any depth."""
    if isinstance(value, dict):
        return {k: stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [stable(v) for v in value]
    return value


def _differing(a: dict, b: dict) -> list[str]:
    """The top-level keys whose :func:`stable` values differ between two mappings (one only has counts too)."""
    a, b = stable(a), stable(b)
    return [k for k in dict.fromkeys([*a, *b]) if k not in a or k not in b or a[k] != b[k]]


@dataclass
class Comparison:
    """What was compared (items: a record, a table row, a manifest, a document) and the first differences."""

    compared: int = 0
    equal: int = 0
    differences: list[str] = field(default_factory=list)
    made_by: set[str] = field(default_factory=set)  # the code digests the ``after`` records carry
    made_before_by: set[str] = field(default_factory=set)

    def add(self, same: bool, items: int, where: str) -> None:
        self.compared += items
        if same:
            self.equal += items
        elif len(self.differences) < 20:
            self.differences.append(where)


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _compare_records(before: Path, after: Path, rel: str, out: Comparison) -> None:
    old, new = _records(before), _records(after)
    out.made_before_by.update(str(r.get("code_digest")) for r in old)
    out.made_by.update(str(r.get("code_digest")) for r in new)
    if len(old) != len(new):
        out.add(False, max(len(old), len(new)), f"{rel}: {len(old)} records before, {len(new)} after")
        return
    for i, (a, b) in enumerate(zip(old, new)):
        keys = _differing(a, b)
        out.add(not keys, 1, f"{rel}:{i + 1}: {', '.join(keys)} differ")


def _compare_table(before: Path, after: Path, rel: str, out: Comparison) -> None:
    from ..tables import read_table

    old, old_prov = read_table(before)
    new, new_prov = read_table(after)
    if "code_digest" in new_prov:
        out.made_by.add(str(new_prov["code_digest"]))
        out.made_before_by.add(str(old_prov.get("code_digest")))
    keys = _differing(old_prov, new_prov)
    if keys:
        out.add(False, 1, f"{rel}: provenance {', '.join(keys)} differ")
    old, new = (df.drop(columns=[c for c in df.columns if c in VOLATILE]) for df in (old, new))  # the scores' columns
    same = list(old.columns) == list(new.columns) and old.shape == new.shape and old.equals(new)
    out.add(same, max(len(old), len(new)), f"{rel}: rows differ ({old.shape} before, {new.shape} after)")


def _compare_json(before: Path, after: Path, rel: str, out: Comparison) -> None:
    a, b = json.loads(before.read_text()), json.loads(after.read_text())
    keys = _differing(a, b) if isinstance(a, dict) and isinstance(b, dict) else ["content"] * (stable(a) != stable(b))
    out.add(not keys, 1, f"{rel}: {', '.join(keys)} differ")


def _compare_bytes(before: Path, after: Path, rel: str, out: Comparison) -> None:
    out.add(before.read_bytes() == after.read_bytes(), 1, f"{rel}: bytes differ")


def _compare_report(before: Path, after: Path, rel: str, out: Comparison) -> None:
    """A report's text with every git commit (40 hex digits), the tally of the records' commits and the code digests
    of the two runs' records masked: what it says of the results must be the same to the byte."""
    import re

    def masked(path: Path) -> list[str]:
        text = re.sub(r"\b[0-9a-f]{40}\b", "<commit>", path.read_text())
        # a tally of the records' commits ("N distinct — <commit> (n), …"): a resumed run spans more commits
        text = re.sub(r"(commits?): \d+ distinct — <commit> \(\d+\)(?:, <commit> \(\d+\))*", r"\1: <commits>", text)
        for digest in out.made_by | out.made_before_by:
            text = text.replace(digest, "<code digest>")
        return text.splitlines()

    a, b = masked(before), masked(after)
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    out.add(a == b, 1, f"{rel}: line {first + 1} differs")


#: a run's outputs, each pattern with how its files are compared (the module docstring)
KINDS = (("generations/**/*.jsonl", _compare_records), ("replay/**/*.parquet", _compare_table),
         ("replay/**/*.impossibility.json", _compare_json),
         ("manifests/**/*.jsonl", _compare_bytes),
         ("scores.parquet", _compare_table), ("claims.json", _compare_json), ("summary.json", _compare_json),
         ("report.md", _compare_report), ("report.html", _compare_report),
         ("figures/*.png", _compare_bytes))
#: the file in a reference folder that lists its run's outputs (:func:`run_manifest`)
RUN = "run.json"


def _names(pattern: str, *roots: Path) -> list[str]:
    return sorted({p.relative_to(root).as_posix() for root in roots for p in root.glob(pattern) if p.is_file()})


def items(path: Path, compare) -> int:
    """The items :func:`compare_runs` counts in one file: its records (lines), its table's rows, else 1."""
    if compare is _compare_records:
        return sum(1 for line in path.read_text().splitlines() if line.strip())
    if compare is _compare_table:
        import pyarrow.parquet as pq

        return int(pq.ParquetFile(path).metadata.num_rows)
    return 1


def run_manifest(folder: str | Path) -> dict:
    """Every output of the run in ``folder`` that :func:`compare_runs` compares: {path: {sha256, items}}, the items
    in all, and the SHA-256 of the listing (``sha256``: what names this run)."""
    import hashlib

    from ..config.hashing import file_sha256

    folder = Path(folder)
    files = {rel: {"sha256": file_sha256(folder / rel), "items": items(folder / rel, compare)}
             for pattern, compare in KINDS for rel in _names(pattern, folder)}
    listing = json.dumps(files, sort_keys=True).encode()
    return {"files": files, "items": sum(f["items"] for f in files.values()),
            "sha256": hashlib.sha256(listing).hexdigest()}


def compare_runs(before: str | Path, after: str | Path) -> Comparison:
    """Every output of the run in ``before`` against the same file of the run in ``after`` (the module docstring);
    a file only one of them has is a difference."""
    before, after = Path(before), Path(after)
    out = Comparison()
    for pattern, compare in KINDS:
        for rel in _names(pattern, before, after):
            a, b = before / rel, after / rel
            if not (a.is_file() and b.is_file()):
                out.add(False, 1, f"{rel}: only in {'the run before' if a.is_file() else 'the run after'}")
                continue
            compare(a, b, rel, out)
    return out


def _experiment(folder: Path) -> str | None:
    path = folder / "claims.json"
    return json.loads(path.read_text()).get("experiment") if path.is_file() else None


def check_before(before: Path, reference_dir: Path, experiment: str) -> dict:
    """Refuse, in one line, a ``before`` that is not the reference's own run: the reference must list its run
    (:data:`RUN`, written by ``kvcert reference update``), of ``experiment``, and ``before`` must hold exactly the
    outputs it lists, each with the SHA-256 listed. Returns the listing."""
    path = reference_dir / RUN
    if not path.is_file():
        raise ValueError(f"{reference_dir}: lists no run ({RUN}: its records' and tables' digests), so no copy can be "
                         "shown to be its run; regenerate the reference (`kvcert reference update`)")
    listed = json.loads(path.read_text())
    if listed.get("experiment") != experiment:
        raise ValueError(f"{reference_dir}: the reference of experiment {listed.get('experiment')!r}, not "
                         f"{experiment!r}; give --experiment {listed.get('experiment')} or another --reference")
    found = _experiment(before)
    if found != experiment:
        raise ValueError(f"{before}: a run of experiment {found!r}, not {experiment!r}; give a copy of the run the "
                         "reference was made from")
    files = listed.get("files") or {}
    here = {rel for pattern, _ in KINDS for rel in _names(pattern, before)}
    from ..config.hashing import file_sha256

    for rel in sorted(set(files) | here):
        if rel not in here or rel not in files or file_sha256(before / rel) != files[rel].get("sha256"):
            why = ("lacks it" if rel not in here else "holds it, the reference's run did not" if rel not in files
                   else "holds another (its SHA-256 is not the one the reference lists)")
            raise ValueError(f"{before}: {rel}: {why}; give a copy of the run the reference was made from "
                             f"({reference_dir / RUN} lists its {len(files)} files)")
    return listed


def revalidate(before: str | Path, after: str | Path, reference_dir: str | Path, command: str,
               experiment: str) -> tuple[Comparison, dict | None, bool]:
    """Compare ``before`` — the reference's own run (:func:`check_before`) — with ``after`` (made by today's code, of
    the same experiment), every item; when every item is equal, append the check to ``reference_dir``/:data:`CHECKS`
    once. Returns the comparison, the entry (None: the runs differ) and whether it was appended now (False: the same
    check is there already). Refused in one line: a ``before`` that is not the reference's run, of another
    experiment, or compared on fewer items than the reference's run holds; an ``after`` not made by today's code."""
    from ..atomic import write_text
    from ..provenance import code_digest

    before, after, reference_dir = Path(before), Path(after), Path(reference_dir)
    listed = check_before(before, reference_dir, experiment)
    if _experiment(after) != experiment:
        raise ValueError(f"{after}: a run of experiment {_experiment(after)!r}, not {experiment!r}; rerun "
                         f"`snakemake --cores all --config experiment={experiment}` first")
    made = json.loads((reference_dir / "summary.json").read_text()).get("code_digests") or []
    result = compare_runs(before, after)
    current = code_digest()
    if result.compared < int(listed.get("items") or 0) or not result.compared:
        raise ValueError(f"{before} and {after}: {result.compared:,} items compared, the reference's run holds "
                         f"{int(listed.get('items') or 0):,}; give the folders of two whole runs of the experiment")
    if not result.made_before_by <= set(made):
        raise ValueError(f"{before}: made by code {sorted(result.made_before_by)}, not the reference's {made}; give a "
                         "copy of the run the reference was made from")
    if result.made_by != {current}:
        raise ValueError(f"{after}: made by code {sorted(result.made_by)}, not today's {current}; rerun the "
                         "experiment at this code first")
    if result.equal != result.compared:
        return result, None, False
    path = reference_dir / CHECKS
    checks = json.loads(path.read_text()) if path.exists() else []
    for entry in checks:
        if entry.get("code_digest") == current and entry.get("run_sha256") == listed["sha256"]:
            return result, entry, False
    entry = {"code_digest": current, "reference_code_digests": sorted(made), "run_sha256": listed["sha256"],
             "experiment": experiment, "compared": result.compared, "equal": result.equal, "command": command,
             "date": datetime.now(timezone.utc).replace(microsecond=0).isoformat()}
    write_text(path, json.dumps([*checks, entry], indent=2) + "\n")
    return result, entry, True
