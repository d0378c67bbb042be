"""Attention-level replay (claims C1, C2) and the impossibility demonstration for one model.

    python analysis/replay.py --model NAME [--model-path DIR] --records MANIFEST.jsonl \
        --prereg preregistration [--configs configs] [--experiment smoke] [--threads N] \
        --out replay.parquet --impossibility-out impossibility.json
    python analysis/replay.py --model-config MODEL_OR_JOB.yaml --records ... (same outputs)

The model is ``configs/model/NAME.yaml`` (``--model-path`` overrides its path, e.g. a
retrained embedded model) or a model/job config file. Budgets, draws, later queries,
δ and the retention design come from the frozen ``analysis_plan``. Logic:
:func:`kvcert.analysis.steps.replay_step`.
"""

import argparse

from kvcert.analysis.steps import replay_step, resolve_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", help="model name: configs/model/<name>.yaml")
    which.add_argument("--model-config", help="a model config (name, path, dtype, device) or a job config with one")
    p.add_argument("--model-path", default=None, help="override the model config's path")
    p.add_argument("--configs", default="configs", help="hydra configs folder (for --model)")
    p.add_argument("--experiment", default=None, help="experiment name (recorded in the provenance)")
    p.add_argument("--records", required=True, help="task records manifest (JSONL) of the replay cell")
    p.add_argument("--prereg", default="preregistration", help="pre-registration folder (frozen)")
    p.add_argument("--out", required=True, help="replay draws (Parquet)")
    p.add_argument("--impossibility-out", required=True, help="impossibility rows (JSON)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed of the replay draws")
    p.add_argument("--max-layers", type=int, default=None, help="replay this many evenly spaced layers (default: all)")
    p.add_argument("--max-examples", type=int, default=None, help="replay only the first N records")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    a = p.parse_args()
    model = resolve_model(a.model_config, a.model, a.configs, a.model_path)
    out, imp = replay_step(model, a.records, a.prereg, a.out, a.impossibility_out, a.seed, a.max_layers,
                           a.max_examples, a.threads, a.experiment)
    print(out)
    print(imp)


if __name__ == "__main__":
    main()
