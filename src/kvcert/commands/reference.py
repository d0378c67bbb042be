"""A rerun checked against the committed reference: ``results/reference/<experiment>/``.

The repository keeps a reference run of an experiment (the real model's: ``results/reference/real/``) in a
folder of its own, which no pipeline run writes: ``snakemake --config experiment=real`` writes to
``results/real/`` and ends (the Snakefile's ``onsuccess``) with one line per claim from
:func:`compare_lines` — the same verdict and value as the reference, or what differs and by how much.
``kvcert reference compare`` prints the same lines at any time; ``kvcert reference update`` makes a finished
run the reference (copies its :data:`FILES` and figures), which is how a maintainer regenerates it after an
amendment (tests/test_reference_results.py fails until then).

Reads ``summary.json`` files only (:func:`kvcert.analysis.steps.summary` writes them), never the analysis code.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

#: where the references live, inside the checkout
REFERENCE_ROOT = Path("results") / "reference"
#: the files of a run that make its reference (beside its ``figures/``)
FILES = ("claims.json", "summary.json", "report.md", "report.html", "scores.parquet", "replay_cells.csv")
#: a value that differs from the reference's by less than this is the same (summary.json keeps full floats; a
#: rerun on another CPU rounds differently in the last digits)
SAME = 5e-7


def _summary(folder: Path) -> dict | None:
    path = folder / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _value(v) -> str:
    return "–" if v is None else f"{v:.4f}"


def claim_line(cid: str, ours: dict | None, ref: dict | None) -> str:
    """One claim's comparison: ``same`` verdict and value, or each difference with its size."""
    if ours is None or ref is None:
        return f"  {cid}: {'not in this run' if ours is None else 'not in the reference'}"
    v, r = ours.get("value"), ref.get("value")
    same_value = (v is None and r is None) or (v is not None and r is not None and abs(v - r) < SAME)
    if ours["verdict"] == ref["verdict"] and same_value:
        return f"  {cid}: same as the reference — {ours['verdict']}, {ours.get('statistic')} = {_value(v)}"
    parts = []
    if ours["verdict"] != ref["verdict"]:
        parts.append(f"verdict {ours['verdict']} (reference: {ref['verdict']})")
    else:
        parts.append(f"same verdict {ours['verdict']}")
    if not same_value:
        delta = "" if v is None or r is None else f", {v - r:+.4f}"
        parts.append(f"{ours.get('statistic')} = {_value(v)} (reference {_value(r)}{delta})")
    else:
        parts.append(f"same {ours.get('statistic')} = {_value(v)}")
    return f"  {cid}: DIFFERS — " + "; ".join(parts)


def compare_lines(run_dir: str | Path, reference_dir: str | Path) -> list[str]:
    """The run's verdicts against the reference's, one line per claim, after one line naming both; nothing where
    the experiment keeps no reference; one line where the run has no summary yet."""
    run_dir, reference_dir = Path(run_dir), Path(reference_dir)
    ref = _summary(reference_dir)
    if ref is None:
        return []
    ours = _summary(run_dir)
    if ours is None:
        return [f"kvcert: no {run_dir / 'summary.json'} yet to compare with the reference {reference_dir}"]
    same_freeze = ours.get("prereg_hash") == ref.get("prereg_hash")
    claims = dict.fromkeys([*(ref.get("claims") or {}), *(ours.get("claims") or {})])
    lines = [claim_line(cid, (ours.get("claims") or {}).get(cid), (ref.get("claims") or {}).get(cid)) for cid in claims]
    n_same = sum("same as the reference" in line for line in lines)
    head = (f"kvcert: this run against the reference {reference_dir}: {n_same} of {len(lines)} claims the same"
            + ("" if same_freeze else
               f" (the reference was made under pre-registration {str(ref.get('prereg_hash'))[:12]}, this run under "
               f"{str(ours.get('prereg_hash'))[:12]}: a difference may be the amendment's; `kvcert reference update` "
               "makes this run the reference)"))
    return [head, *lines]


def update(run_dir: str | Path, reference_dir: str | Path) -> list[Path]:
    """Make the finished run in ``run_dir`` the reference: copy its :data:`FILES` and ``figures/`` (replacing the
    reference's); a one-line error naming what the run lacks."""
    run_dir, reference_dir = Path(run_dir), Path(reference_dir)
    missing = [name for name in FILES if not (run_dir / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{run_dir}: lacks {', '.join(missing)}; finish the run first "
                                "(snakemake --cores all --config experiment=...)")
    reference_dir.mkdir(parents=True, exist_ok=True)
    copied = []
    for name in FILES:
        shutil.copy2(run_dir / name, reference_dir / name)
        copied.append(reference_dir / name)
    if (reference_dir / "figures").exists():
        shutil.rmtree(reference_dir / "figures")
    if (run_dir / "figures").is_dir():
        shutil.copytree(run_dir / "figures", reference_dir / "figures")
        copied.append(reference_dir / "figures")
    return copied


def reference_command(args) -> int:
    run_dir = Path(args.results) / args.experiment
    reference_dir = Path(args.reference) if args.reference else REFERENCE_ROOT / args.experiment
    if args.action == "revalidate":
        return _revalidate(args, run_dir, reference_dir)
    if args.action == "update":
        copied = update(run_dir, reference_dir)
        print(f"kvcert: {run_dir} is now the reference {reference_dir} ({len(copied)} files and folders); commit it")
        return 0
    lines = compare_lines(run_dir, reference_dir)
    if not lines:
        print(f"kvcert: experiment {args.experiment} keeps no reference ({reference_dir / 'summary.json'} does not "
              "exist)")
        return 1
    print("\n".join(lines))
    return 0


def _revalidate(args, run_dir: Path, reference_dir: Path) -> int:
    from .revalidate import revalidate

    if not args.before:
        raise SystemExit("kvcert reference revalidate: give --before DIR, a copy of the run the reference was made "
                         "from (docs/pipeline.md)")
    command = (f"kvcert reference revalidate --experiment {args.experiment} --before <copy of the reference's run>"
               f" (after: {run_dir.as_posix()})")
    result, entry = revalidate(args.before, run_dir, reference_dir, command)
    print(f"kvcert: {run_dir} against {args.before}: {result.equal:,} of {result.compared:,} items the same")
    for line in result.differences:
        print(f"  {line}")
    if entry is None:
        print("kvcert: not re-validated: the runs differ; regenerate the reference (`kvcert reference update`)")
        return 1
    print(f"kvcert: the reference {reference_dir} is re-validated at code {entry['code_digest']}; commit "
          f"{reference_dir / 'revalidations.json'}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("reference", help="compare a finished run with the committed reference, or make it "
                                                "the reference")
    p.add_argument("action", choices=["compare", "update", "revalidate"],
                   help="compare: verdicts against the reference; update: make the run the reference; revalidate: "
                        "check a rerun at new code item by item against --before and record the check")
    p.add_argument("--experiment", default="real", help="the experiment (default real)")
    p.add_argument("--results", default="results", help="the pipeline's results folder (default results)")
    p.add_argument("--reference", default=None,
                   help=f"the reference folder (default {REFERENCE_ROOT.as_posix()}/<experiment>)")
    p.add_argument("--before", default=None,
                   help="revalidate: a copy of the run the reference was made from (the folder, as results/<experiment>)")
    p.set_defaults(func=reference_command)
