"""The pre-registered pipeline's Python side: the plan (grid → jobs), hydra
composition of each run's config, task manifests, and shard execution. The Snakefile
and ``kvcert plan`` both enumerate jobs through :mod:`kvcert.pipeline.plan`, so the
two always agree."""
