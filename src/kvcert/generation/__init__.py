"""Generation engine: question-aware and streaming runs over a (compressed) cache, the
per-step signals, and sharded resumable output (issue "Generation engine")."""
