"""The model and the method: loading a model, the certified attention path, importance scorers, budget
allocation, the retention designs, the certificate, the compacted cache and the press that evicts into it."""
