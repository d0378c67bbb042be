"""Tiny checkpoints of the paper's architectures, for rehearsing the paper profile.

Each stand-in is a real ``transformers`` class (``Qwen2ForCausalLM``,
``LlamaForCausalLM``, ``MistralForCausalLM``) with random weights, written by
``save_pretrained`` in bfloat16 as the released checkpoints are, with a byte-level BPE
tokenizer trained here on the task text and the special tokens, BOS rule, chat template
and generation config in the style of the model it stands in for:

============  ==========================  ============  ==========================================
stand-in      special tokens              BOS added     chat template
============  ==========================  ============  ==========================================
Qwen2.5       ``<|im_start|>``,           no            ChatML with Qwen's default system message
              ``<|im_end|>`` (EOS),
              ``<|endoftext|>`` (pad)
Llama-3.1     ``<|begin_of_text|>`` (BOS), yes          header blocks, the "Cutting Knowledge Date"
              ``<|start_header_id|>``,                  system block, message text trimmed
              ``<|end_header_id|>``,
              ``<|eot_id|>`` (EOS)
Mistral v0.3  ``<s>`` (BOS), ``</s>``      yes          ``[INST] … [/INST]``
              (EOS), ``[INST]``, ``[/INST]``
============  ==========================  ============  ==========================================

The model configs follow the real ones where the code paths differ: grouped-query
attention (4 query heads, 2 KV heads); Qwen2's q/k/v biases and tied embeddings;
Llama-3.1's ``llama3`` RoPE scaling; Mistral's explicit ``head_dim`` and no sliding
window (v0.3). Weights are random (seeded): the stand-ins exercise the code, not the
paper's numbers. Which stand-in a model config gets is read from its name
(:func:`architecture_of`: ``qwen…``, ``llama…``, ``mistral…``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ..atomic import write_text

#: a note written into every stand-in folder, so that nobody takes it for the real model
NOTE = ("kvcert rehearsal stand-in: a tiny {cls} with random weights, made by `kvcert make-rehearsal`. "
        "It stands in for {real} to rehearse the paper profile's code path; it is not that model.\n")

QWEN_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (message['role'] == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
LLAMA_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set system_message = messages[0]['content'] | trim %}{%- set messages = messages[1:] %}"
    "{%- else %}{%- set system_message = '' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{{- 'Cutting Knowledge Date: December 2023\\n' }}"
    "{{- 'Today Date: 26 Jul 2024\\n\\n' }}"
    "{{- system_message }}{{- '<|eot_id|>' }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
MISTRAL_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}{{- '[INST] ' + message['content'] + '[/INST]' }}"
    "{%- elif message['role'] == 'assistant' %}{{- ' ' + message['content'] + eos_token }}"
    "{%- endif %}"
    "{%- endfor %}"
)


@dataclass(frozen=True)
class Architecture:
    """What a stand-in copies from the model it stands in for."""

    name: str                      # transformers class prefix: Qwen2, Llama, Mistral
    real: str                      # the checkpoint it stands in for
    specials: tuple[str, ...]      # special tokens, in id order
    bos: str | None                # BOS token added to every encoding (None: none)
    eos: str
    pad: str | None
    chat_template: str
    eos_ids: tuple[str, ...]       # generation_config.eos_token_id, as tokens
    config: dict[str, Any] = field(default_factory=dict)
    generation: dict[str, Any] = field(default_factory=dict)


ARCHITECTURES: dict[str, Architecture] = {
    "qwen": Architecture(
        "Qwen2", "Qwen/Qwen2.5-*-Instruct", ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        None, "<|im_end|>", "<|endoftext|>", QWEN_TEMPLATE, ("<|im_end|>", "<|endoftext|>"),
        config={"tie_word_embeddings": True, "rope_theta": 1000000.0, "max_position_embeddings": 32768,
                "use_sliding_window": False},
        generation={"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05},
    ),
    "llama": Architecture(
        "Llama", "meta-llama/Llama-3.1-8B-Instruct",
        ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
        "<|begin_of_text|>", "<|eot_id|>", None, LLAMA_TEMPLATE, ("<|end_of_text|>", "<|eot_id|>"),
        config={"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 8192},
                "max_position_embeddings": 131072},
        generation={"do_sample": True, "temperature": 0.6, "top_p": 0.9},
    ),
    "mistral": Architecture(
        "Mistral", "mistralai/Mistral-7B-Instruct-v0.3", ("<unk>", "<s>", "</s>", "[INST]", "[/INST]"),
        "<s>", "</s>", None, MISTRAL_TEMPLATE, ("</s>",),
        config={"head_dim": 16, "sliding_window": None, "rope_theta": 1000000.0, "max_position_embeddings": 32768},
    ),
}

#: the shape every stand-in shares (small enough for a CPU, large enough for GQA)
SHAPE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2}
VOCAB_SIZE = 1024


def architecture_of(model_name: str) -> Architecture:
    """The stand-in architecture of a model config, from its name."""
    lowered = model_name.lower()
    for prefix, arch in ARCHITECTURES.items():
        if lowered.startswith(prefix):
            return arch
    raise ValueError(f"make-rehearsal: cannot tell the architecture of model {model_name!r} from its name; "
                     f"stand-ins exist for names starting with {', '.join(ARCHITECTURES)}")


def train_tokenizer(arch: Architecture, texts: Iterable[str]):
    """A byte-level BPE trained on ``texts``, wrapped with the architecture's special
    tokens, BOS rule and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=list(arch.specials), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(list(texts), trainer)
    if arch.bos is not None:
        backend.post_processor = processors.TemplateProcessing(
            single=f"{arch.bos} $A", pair=f"{arch.bos} $A {arch.bos} $B",
            special_tokens=[(arch.bos, backend.token_to_id(arch.bos))])
    else:
        backend.post_processor = processors.ByteLevel(trim_offsets=False)
    named = {"bos_token": arch.bos, "eos_token": arch.eos, "pad_token": arch.pad}
    extra = [t for t in arch.specials if t not in named.values()]
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, **{k: v for k, v in named.items() if v is not None},
        additional_special_tokens=extra, clean_up_tokenization_spaces=False, model_max_length=131072,
    )
    tokenizer.chat_template = arch.chat_template
    return tokenizer


def save_checkpoint(folder: str | Path, arch: Architecture, texts: Iterable[str], seed: int = 0) -> Path:
    """Train the tokenizer, build the random-weight model, ``save_pretrained`` both."""
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()  # one line per stand-in is enough
    folder = Path(folder)
    tokenizer = train_tokenizer(arch, texts)
    ids = {name: tokenizer.convert_tokens_to_ids(name) for name in arch.specials}
    config = getattr(transformers, f"{arch.name}Config")(
        vocab_size=len(tokenizer), **SHAPE, **arch.config,
        bos_token_id=ids.get(arch.bos) if arch.bos else None, eos_token_id=ids[arch.eos],
        pad_token_id=ids.get(arch.pad) if arch.pad else None,
    )
    torch.manual_seed(seed)
    model = getattr(transformers, f"{arch.name}ForCausalLM")(config).to(torch.bfloat16)
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=[ids[t] for t in arch.eos_ids],
        pad_token_id=config.pad_token_id, **arch.generation)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    write_text(folder / "REHEARSAL.txt", NOTE.format(cls=f"{arch.name}ForCausalLM", real=arch.real))
    return folder


def describe(folder: str | Path) -> dict[str, Any]:
    """Architecture, size and vocabulary of a saved stand-in (for the summary line)."""
    config = json.loads((Path(folder) / "config.json").read_text())
    return {"architectures": config.get("architectures"), "vocab_size": config.get("vocab_size"),
            "layers": config.get("num_hidden_layers")}
