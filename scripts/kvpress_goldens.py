"""Golden fixtures of NVIDIA kvpress's token selection, for tests/test_kvpress_goldens.py.

Runs in an environment with kvpress 0.5.5 (it needs transformers < 5.3): kvpress's own
(scripts/kvpress_goldens.sh builds one) or kvcert's beside it (tests/test_kvpress_env.py
re-derives every kept set there). It does not import kvcert.

On the committed tiny checkpoint ``tests/fixtures/kvpress/model`` (a Llama with grouped-
query attention, random weights; written here, seeded, when absent) it prefills one fixed
sequence of distinct token ids under each press and compression ratio, and records which positions
each layer and KV head keeps — read back from what the press left (the gathered keys
matched against the uncompressed ones; Ada-KV's masked indices). Output:
``tests/fixtures/kvpress/goldens.json`` with every kept set as a hex bit mask.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "kvpress"
LENGTH = 640  # prompt tokens: above SnapKV's 64-query window at every ratio below
VOCAB = 1024  # distinct ids: repeated tokens would tie in key norm (RoPE keeps norms)
RATIOS = (0.5, 0.75, 0.875)
SEED = 0


def make_model(folder: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         initializer_range=0.2)
    LlamaForCausalLM(config).save_pretrained(folder)


def presses():
    from kvpress import (AdaKVPress, KnormPress, ObservedAttentionPress, PyramidKVPress, SnapKVPress,
                         StreamingLLMPress, TOVAPress)

    return {
        "streaming_llm": lambda r: StreamingLLMPress(compression_ratio=r),
        "tova": lambda r: TOVAPress(compression_ratio=r),
        "knorm": lambda r: KnormPress(compression_ratio=r),
        "snapkv": lambda r: SnapKVPress(compression_ratio=r),
        "adakv": lambda r: AdaKVPress(SnapKVPress(compression_ratio=r)),
        "observed_attention": lambda r: ObservedAttentionPress(compression_ratio=r),
        "pyramidkv": lambda r: PyramidKVPress(compression_ratio=r),
    }


def mask_hex(mask: torch.Tensor) -> str:
    """A bool vector as hex (position i is bit i of the big integer)."""
    return format(sum(1 << int(i) for i in torch.nonzero(mask).flatten()), "x")


def kept_by(model, press, ids: torch.Tensor) -> list[list[str]]:
    """[layer][kv head] -> kept positions (hex mask) of one prefill under ``press``."""
    from transformers import DynamicCache

    kept: dict[int, list[str]] = {}
    inner = press.compress

    def recording(module, hidden_states, keys, values, attentions, kwargs):
        out_keys, out_values = inner(module, hidden_states, keys, values, attentions, kwargs)
        n = keys.shape[2]
        if getattr(module, "masked_key_indices", None) is not None:  # Ada-KV masks instead of gathering
            mask = torch.ones(keys.shape[:3], dtype=torch.bool)
            b, h, s = module.masked_key_indices
            mask[b, h, s] = False
            module.masked_key_indices = None
        else:
            same = (out_keys[:, :, :, None, :] == keys[:, :, None, :, :]).all(-1)  # [B, H, kept, N]
            assert bool((same.sum(-1) == 1).all()), "a kept key matches no (or several) original keys"
            mask = torch.zeros(keys.shape[:3], dtype=torch.bool)
            mask.scatter_(-1, same.float().argmax(-1), True)
        assert mask.shape[-1] == n
        kept[module.layer_idx] = [mask_hex(mask[0, h]) for h in range(mask.shape[1])]
        return out_keys, out_values

    press.compress = recording
    with torch.no_grad(), press(model):
        model(input_ids=ids, past_key_values=DynamicCache())
    return [kept[i] for i in sorted(kept)]


def main() -> None:
    import importlib.metadata

    import transformers
    from transformers import AutoModelForCausalLM

    transformers.utils.logging.disable_progress_bar()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(FIXTURES / "goldens.json"))
    args = parser.parse_args()
    folder = FIXTURES / "model"
    if not (folder / "config.json").exists():
        make_model(folder)
    ids = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(SEED))[:LENGTH].unsqueeze(0)
    results = []
    for name, make in presses().items():
        eager = name == "observed_attention"  # it reads the attention weights, which only eager returns
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                     attn_implementation="eager" if eager else "sdpa").eval()
        for ratio in RATIOS:
            results.append({"press": name, "compression_ratio": ratio, "kept": kept_by(model, make(ratio), ids)})
            print(f"{name} compression_ratio={ratio}: done")
    golden = {"kvpress": importlib.metadata.version("kvpress"),
              "transformers": transformers.__version__, "torch": torch.__version__,
              "input_ids": ids[0].tolist(), "results": results}
    Path(args.out).write_text(json.dumps(golden, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
