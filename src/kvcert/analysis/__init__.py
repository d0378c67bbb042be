"""Scoring generation records into the pre-registered claims (the paper's seven, and C8), and the report.

The data path (docs/design.md §4) reads one way: generation shards → :mod:`.load` (one
row per generation, refused unless it belongs to the verified pre-registration) →
:mod:`.claims` (C1–C8, exactly as ``preregistration/claims.yaml`` states them) →
:mod:`.report` (report.md, self-contained report.html, figures). Attention-level
replay (C1, C2, C8) comes from :mod:`.replay` (the model side, the only module here that
needs torch) and is summarised by :mod:`.replay_stats` (its layout and statistics, which
the claims and the report read); the statistics from :mod:`.stats`; the
gating and escalation policies from :mod:`.gating`; the multi-turn table from
:mod:`.multiturn`. Nothing in :mod:`kvcert` outside this package imports it.
"""
