"""Generation: the plan of an experiment (grid → shards → jobs, their cost), task manifests, the engine of
question-aware and streaming runs over a (compressed) cache, the per-step signals, the one record type, sharded
resumable output, and the replay of captured decode steps."""
