"""A rerun checked against the committed reference: ``results/reference/<experiment>/``.

The repository keeps a reference run of an experiment (the real model's: ``results/reference/real/``) in a
folder of its own, which no pipeline run writes: ``snakemake --config experiment=real`` writes to
``results/real/`` and ends (the Snakefile's ``onsuccess``) with one line per claim from :func:`compare_lines`
(:mod:`kvcert.commands.reference_compare`: every test's estimate and interval, the same up to rounding across machines
or different, by how much in the statistic's own units). ``kvcert reference compare`` prints the same lines at any
time and exits 0 (every claim the same), 1 (a claim differs) or 2 (nothing to compare).

``kvcert reference update`` makes a finished run the reference (:func:`update`), which is how a maintainer regenerates
it after an amendment (tests/test_reference_results.py fails until then). It refuses, in one line, a run whose
claims.json gives a verdict its own tests do not (:mod:`kvcert.analysis.verdict_check`) or whose summary.json
disagrees with it, a run of another experiment, and a run whose records were made by other record code than today's
(:func:`kvcert.provenance.code_digest`) unless ``--reason`` says why it stands (recorded in :data:`RUN`). It writes
the new reference in full in a sibling folder and swaps it in by renaming: its :data:`FILES` and figures, the run's
listing (:data:`RUN`: every record's, table's and document's SHA-256 and item count, which ``kvcert reference
revalidate`` checks its ``--before`` against), and the per-draw replay table (:data:`DRAWS`: the columns the claims
read, float32, zstd) from which C1, C2 and C8 are recomputed (tests/test_reference_results.py).
``revalidations.json`` is carried over: each check names the run it re-validated (``run_sha256``), so the checks
of an earlier reference stay as its history and validate nothing of the new one.
"""

from __future__ import annotations

import json
import os
import shutil
from datetime import datetime, timezone
from pathlib import Path

from ..atomic import write_text
from .reference_compare import NOTHING, compare
from .revalidate import CHECKS, RUN, run_manifest

#: where the references live, inside the checkout
REFERENCE_ROOT = Path("results") / "reference"
#: the files of a run that make its reference (beside its ``figures/``, :data:`RUN` and :data:`DRAWS`)
FILES = ("claims.json", "summary.json", "report.md", "report.html", "scores.parquet", "replay_cells.csv")
#: the per-draw replay table of a reference (:func:`replay_draws`)
DRAWS = "replay_draws.parquet"
#: its columns: the keys of a draw and what the replay claims' tests and secondary analyses read
DRAW_KEYS = ("model", "example_id", "layer", "head", "budget", "query_kind", "step", "draw")
DRAW_FLOATS = ("error", "radius", "radius_robust")
DRAW_FLAGS = ("diverged", "covered", "covered_robust", "covered_anytime", "covered_anytime_robust")


def compare_lines(run_dir: str | Path, reference_dir: str | Path) -> list[str]:
    """The run's claims against the reference's (:func:`kvcert.commands.reference_compare.compare`): a head line,
    one line per claim; nothing where the experiment keeps no reference; one line where either cannot be read (a
    Snakemake run's last words: never a traceback)."""
    try:
        return compare(run_dir, reference_dir)[0]
    except (ValueError, OSError) as exc:
        return [f"kvcert: not compared with the reference {reference_dir}: {exc}"]


def replay_draws(run_dir: Path, out: Path) -> int:
    """Write the run's replay tables of the deciding data seed (``replay/<model>/*.parquet``; a second data seed's,
    ``replay/<model>/stability/``, decide nothing and are left out) as one table at ``out``: the columns
    :data:`DRAW_KEYS`, :data:`DRAW_FLOATS` (float32) and :data:`DRAW_FLAGS`, sorted by draw key, zstd with the
    floats' bytes split by stream; its provenance lists the tables it was made from. Returns its rows."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ..config.hashing import file_sha256
    from ..tables import METADATA_KEY, read_table

    columns = [*DRAW_KEYS, *DRAW_FLOATS, *DRAW_FLAGS]
    frames, sources = [], []
    for path in sorted(run_dir.glob("replay/*/*.parquet")):
        df, prov = read_table(path, columns=columns)
        frames.append(df)
        sources.append({"path": path.relative_to(run_dir).as_posix(), "sha256": file_sha256(path), "rows": len(df),
                        "prereg_hash": prov.get("prereg_hash"), "code_digest": prov.get("code_digest")})
    if not frames:
        raise FileNotFoundError(f"{run_dir}: no replay tables (replay/<model>/*.parquet); finish the run first")
    df = pd.concat(frames, ignore_index=True)
    df = df.astype({**{c: "category" for c in ("model", "example_id", "query_kind")}, "layer": "int16",
                    "head": "int16", "step": "int16", "draw": "int32", "budget": "float32",
                    **{c: "float32" for c in DRAW_FLOATS}, **{c: "bool" for c in DRAW_FLAGS}})
    df = df.sort_values(list(DRAW_KEYS), kind="stable").reset_index(drop=True)
    table = pa.Table.from_pandas(df, preserve_index=False)
    meta = {**(table.schema.metadata or {}),
            METADATA_KEY: json.dumps({"sources": sources, "columns": columns}, sort_keys=True).encode()}
    from ..atomic import atomic_path

    with atomic_path(out) as tmp:
        pq.write_table(table.replace_schema_metadata(meta), tmp, compression="zstd", compression_level=9,
                       use_byte_stream_split=list(DRAW_FLOATS), use_dictionary=[*DRAW_KEYS[:2], "query_kind"])
    return len(df)


def _check_run(run_dir: Path, experiment: str | None, reason: str | None) -> dict:
    """Refuse, in one line, a run that cannot be the reference; returns what :data:`RUN` records of its making."""
    from ..analysis.claims_document import ClaimsDocument
    from ..provenance import code_digest
    from .reference_compare import read_run

    missing = [name for name in FILES if not (run_dir / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{run_dir}: lacks {', '.join(missing)}; finish the run first "
                                "(snakemake --cores all --config experiment=...)")
    read_run(run_dir)  # its verdicts follow from its tests, its summary agrees with its claims
    doc = ClaimsDocument.read(run_dir / "claims.json")
    if experiment is not None and doc.experiment != experiment:
        raise ValueError(f"{run_dir}: a run of experiment {doc.experiment!r}, not {experiment!r}; give its own "
                         f"--experiment, or the run of {experiment}")
    made = json.loads((run_dir / "summary.json").read_text()).get("code_digests") or []
    current = code_digest()
    if made != [current] and not reason:
        raise ValueError(f"{run_dir}: records made by record code {made}, today's is {current}: rerun the experiment "
                         "at this code, or give --reason saying why this run stands (recorded in the reference)")
    return {"experiment": doc.experiment, "prereg_hash": doc.provenance.prereg_hash, "code_digests": made,
            "current_code_digest": current, "reason": reason if made != [current] else None,
            "made_utc": datetime.now(timezone.utc).replace(microsecond=0).isoformat()}


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (an update under way)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's, or cannot tell: leave its folder
        return True
    return True


def _leftovers(reference_dir: Path) -> None:
    """Sweep what a killed update left beside the reference: its half-written sibling (removed) and, killed between
    its two renames, the old reference set aside (renamed back when the reference is absent)."""
    for path in sorted(reference_dir.parent.glob(f".{reference_dir.name}.*-*")):
        kind, _, pid = path.name.rpartition("-")
        if not pid.isdigit() or _alive(int(pid)):
            continue
        if kind.endswith(".old") and not reference_dir.exists():
            path.rename(reference_dir)
        else:
            shutil.rmtree(path, ignore_errors=True)


def update(run_dir: str | Path, reference_dir: str | Path, experiment: str | None = None,
           reason: str | None = None) -> list[Path]:
    """Make the finished run in ``run_dir`` the reference (the module docstring): checked (:func:`_check_run`),
    written in full beside the reference, then renamed over it; returns the reference's files and folders."""
    run_dir, reference_dir = Path(run_dir), Path(reference_dir)
    making = _check_run(run_dir, experiment, reason)
    reference_dir.parent.mkdir(parents=True, exist_ok=True)
    _leftovers(reference_dir)
    new = reference_dir.with_name(f".{reference_dir.name}.new-{os.getpid()}")
    old = reference_dir.with_name(f".{reference_dir.name}.old-{os.getpid()}")
    try:
        new.mkdir()
        for name in FILES:
            shutil.copy2(run_dir / name, new / name)
        if (run_dir / "figures").is_dir():
            shutil.copytree(run_dir / "figures", new / "figures")
        replay_draws(run_dir, new / DRAWS)
        listing = run_manifest(run_dir)
        write_text(new / RUN, json.dumps({**making, "items": listing["items"], "sha256": listing["sha256"],
                                          "files": listing["files"]}, indent=1) + "\n")
        if (reference_dir / CHECKS).is_file():  # the history of earlier references' checks (module docstring)
            shutil.copy2(reference_dir / CHECKS, new / CHECKS)
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        raise
    if reference_dir.exists():
        reference_dir.rename(old)
    new.rename(reference_dir)
    shutil.rmtree(old, ignore_errors=True)
    return sorted(reference_dir.iterdir())


def reference_command(args) -> int:
    run_dir = Path(args.results) / args.experiment
    reference_dir = Path(args.reference) if args.reference else REFERENCE_ROOT / args.experiment
    if args.action == "revalidate":
        return _revalidate(args, run_dir, reference_dir)
    if args.action == "update":
        made = update(run_dir, reference_dir, args.experiment, args.reason)
        print(f"kvcert: {run_dir} is now the reference {reference_dir} ({len(made)} files and folders); commit it")
        return 0
    lines, status = compare(run_dir, reference_dir)
    if not lines:
        print(f"kvcert: experiment {args.experiment} keeps no reference ({reference_dir / 'claims.json'} does not "
              "exist)")
        return NOTHING
    print("\n".join(lines))
    return status


def _revalidate(args, run_dir: Path, reference_dir: Path) -> int:
    from .revalidate import revalidate

    if not args.before:
        raise ValueError("kvcert reference revalidate: give --before DIR, a copy of the run the reference was made "
                         "from (docs/pipeline.md)")
    command = (f"kvcert reference revalidate --experiment {args.experiment} --before <copy of the reference's run>"
               f" (after: {run_dir.as_posix()})")
    result, entry, appended = revalidate(args.before, run_dir, reference_dir, command, args.experiment)
    print(f"kvcert: {run_dir} against {args.before}: {result.equal:,} of {result.compared:,} items the same")
    for line in result.differences:
        print(f"  {line}")
    if entry is None:
        print("kvcert: not re-validated: the runs differ; regenerate the reference (`kvcert reference update`)")
        return 1
    if not appended:
        print(f"kvcert: the reference {reference_dir} was re-validated at code {entry['code_digest']} already "
              f"({entry['date']}); nothing appended")
        return 0
    print(f"kvcert: the reference {reference_dir} is re-validated at code {entry['code_digest']}; commit "
          f"{reference_dir / CHECKS}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("reference", help="compare a finished run with the committed reference, or make it "
                                                "the reference")
    p.add_argument("action", choices=["compare", "update", "revalidate"],
                   help="compare: every claim's tests against the reference's (exit 0 the same up to rounding, 1 a "
                        "claim differs, 2 nothing to compare); update: make the run the reference; revalidate: check "
                        "a rerun at new code item by item against --before and record the check")
    p.add_argument("--experiment", default="real", help="the experiment (default real)")
    p.add_argument("--results", default="results", help="the pipeline's results folder (default results)")
    p.add_argument("--reference", default=None,
                   help=f"the reference folder (default {REFERENCE_ROOT.as_posix()}/<experiment>)")
    p.add_argument("--before", default=None,
                   help="revalidate: a copy of the run the reference was made from (the folder, as results/<experiment>)")
    p.add_argument("--reason", default=None,
                   help="update: why a run whose records were made by other record code than today's stands as the "
                        "reference (recorded in its run.json)")
    p.set_defaults(func=reference_command)
