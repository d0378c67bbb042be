"""Training of the embedded model on text from the synthetic task generators.

- :mod:`~kvcert.training.tokenizer` — the word-level tokenizer and its chat template;
- :mod:`~kvcert.training.model` — the Llama (GQA) architecture;
- :mod:`~kvcert.training.data` — training sequences (copy phase, multi-query task text);
- :mod:`~kvcert.training.recipes` — named recipes (``embedded``, ``tiny``);
- :mod:`~kvcert.training.train` — the resumable training loop;
- :mod:`~kvcert.training.evaluate` — greedy full-cache accuracy per task and length;
- :mod:`~kvcert.training.provenance` — the ``provenance.json`` record;
- :mod:`~kvcert.training.cli` — the ``kvcert train-model`` command.
"""
