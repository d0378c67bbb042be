"""What a finished run prints last: every claim's verdict beside the paper's, and where the report is.

The Snakefile's ``onsuccess`` handler calls :func:`verdict_lines` on the run's ``summary.json``
(written by ``kvcert report``); it reads the file, never the analysis code.
"""

from __future__ import annotations

import json
from pathlib import Path


def verdict_lines(out_dir: str | Path) -> list[str]:
    """One line per claim (our verdict and statistic, the paper's verdict, a beside run's: ``kvcert report
    --beside``), then the run's caveat and the report's paths;
    a single line saying what is missing when the run has no summary yet."""
    out = Path(out_dir)
    summary = out / "summary.json"
    if not summary.exists():
        return [f"kvcert: no {summary} yet (the report step has not run)"]
    doc = json.loads(summary.read_text())
    lines = [f"kvcert: verdicts of experiment {doc.get('experiment')} (pre-registration {str(doc.get('prereg_hash'))[:12]})"]
    ran = {label: bool(b.get("run")) for label, b in (doc.get("beside") or {}).items()}
    for cid, c in (doc.get("claims") or {}).items():
        value = c.get("value")
        ci = c.get("ci") or [None, None]
        number = "–" if value is None else f"{value:.3f}" + (
            f" [{ci[0]:.3f}, {ci[1]:.3f}]" if None not in ci else "")
        paper = c.get("paper_verdict") or "none (beyond the paper)"
        stable = c.get("seed_stability")
        stable = "" if stable is None else f"; same verdict on {100 * stable:.0f} % of other bootstrap seeds"
        others = "".join(f"; {label}: " + (b["verdict"] if b else "–" if ran.get(label) else "not run")
                         for label, b in (c.get("beside") or {}).items())
        lines.append(f"  {cid}: {c['verdict']:<13} {c.get('statistic')} = {number}; paper: {paper}{others}{stable}")
    if doc.get("caveat"):
        lines.append(f"kvcert: {doc['caveat']}")
    for name in ("report.html", "report.md"):
        if (out / name).exists():
            lines.append(f"kvcert: report {(out / name).resolve()}")
    return lines
