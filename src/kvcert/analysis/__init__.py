"""Scoring generation records into the pre-registered claims (the paper's seven, and C8), and the report.

The data path (docs/design.md §4) reads one way: generation shards → :mod:`.load` (one
row per generation, refused unless it belongs to the verified pre-registration) →
:mod:`.claims` (C1–C8, exactly as ``preregistration/claims.yaml`` states them: the verdict
rules and the loop; each statistic in its module of :mod:`.claims_stats`, the placebos in
:mod:`.placebos`) → :mod:`.report` (report.md, self-contained report.html, figures). The
analysis choices come from the typed plan, :class:`kvcert.config.analysis_plan.AnalysisPlan`.
Attention-level replay (C1, C2, C8) comes from the generation stage
(:mod:`kvcert.generation.replay`, the model side; its step :mod:`kvcert.generation.replay_step`)
and is summarised by :mod:`.replay_stats` (its statistics, which the claims and the report
read); the statistics from :mod:`.stats`; the gating and escalation policies from
:mod:`.gating`; the multi-turn table from :mod:`.multiturn_recall`. Nothing here needs torch,
and nothing in :mod:`kvcert` outside this package imports it.
"""
