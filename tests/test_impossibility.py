"""Theorem 1 on a real (random-init) model: the retained state is identical, the error is not."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

from kvcert import enable_certified_attention
from kvcert.method.impossibility import impossibility_demo
from kvcert.method.integration import capture_attention_inputs


@torch.no_grad()
@pytest.mark.parametrize("mode", ["shift", "permute"])
def test_altering_evicted_values_is_invisible_but_moves_the_error(mode):
    model = tiny_model("llama", seed=3)
    enable_certified_attention(model)
    x = torch.randint(0, 128, (1, 400), generator=torch.Generator().manual_seed(0))
    obs = capture_attention_inputs(model, x, [1])[1]
    result = impossibility_demo(obs, budget=0.25, scorer="snapkv", mode=mode, magnitude=100.0)
    assert result.identical_retained_state
    if mode == "shift":
        assert result.error_ratio >= 10.0
    else:
        assert result.error_after != result.error_before
    assert result.retained_hash_before == result.retained_hash_after and result.mode == mode


@torch.no_grad()
def test_capture_requires_enabled_model_and_valid_layer():
    model = tiny_model("llama")
    x = torch.randint(0, 128, (1, 10))
    with pytest.raises(ValueError, match="enable_certified_attention"):
        capture_attention_inputs(model, x, [0])
    enable_certified_attention(model)
    with pytest.raises(ValueError, match="layers"):
        capture_attention_inputs(model, x, [7])
