"""Commands that orchestrate the stages: ``kvcert plan``, ``check``, ``run``, ``manifest`` and ``shard``, the
pre-flight, the one-off run, what a finished run prints, and the warm server of a local Snakemake run."""
