"""Attention-level replay (claims C1, C2) and the impossibility demonstration for one model.

    python analysis/replay.py --model NAME [--model-path DIR] --records MANIFEST.jsonl \
        --prereg preregistration [--configs configs] [--experiment smoke] [--threads N] \
        --out replay.parquet --impossibility-out impossibility.json
    python analysis/replay.py --model-config MODEL_OR_JOB.yaml --records ... (same outputs)

The model is ``configs/model/NAME.yaml`` (``--model-path`` overrides its path, e.g. a
retrained embedded model) or a model/job config file. Budgets, draws, later queries,
δ, the retention design and the sampling seed come from the frozen ``analysis_plan``. The same as ``kvcert
replay …`` (:mod:`kvcert.generation.cli`); logic: :func:`kvcert.generation.replay_step.replay_step`.
"""

import sys

from kvcert.cli import main

if __name__ == "__main__":
    status = main(["replay", *sys.argv[1:]])
    if status:
        sys.exit(status)
