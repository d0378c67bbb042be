"""Attention-level replay (claims C1, C2) and the impossibility demonstration for one model.

    python analysis/replay.py --model-config JOB.yaml --records MANIFEST.jsonl \
        --prereg preregistration --out replay.parquet --impossibility-out impossibility.json

JOB.yaml is a model config (name, path, dtype, device) or a job config with a ``model``
section. Budgets, draws, later queries, δ and the retention design come from the
frozen ``analysis_plan``. Logic: :func:`kvcert.analysis.steps.replay_step`.
"""

import argparse

from kvcert.analysis.steps import replay_step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-config", required=True, help="model or job config (YAML/JSON) with the model to replay")
    p.add_argument("--records", required=True, help="task records manifest (JSONL) of the replay cell")
    p.add_argument("--prereg", default="preregistration", help="pre-registration folder (frozen)")
    p.add_argument("--out", required=True, help="replay draws (Parquet)")
    p.add_argument("--impossibility-out", required=True, help="impossibility rows (JSON)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed of the replay draws")
    p.add_argument("--max-layers", type=int, default=None, help="replay this many evenly spaced layers (default: all)")
    p.add_argument("--max-examples", type=int, default=None, help="replay only the first N records")
    a = p.parse_args()
    out, imp = replay_step(a.model_config, a.records, a.prereg, a.out, a.impossibility_out, a.seed, a.max_layers,
                           a.max_examples)
    print(out)
    print(imp)


if __name__ == "__main__":
    main()
