"""Roofline cost model of a generation: the time a GPU's peak rates allow, for ``kvcert plan``.

Per generation of a shard (context length T tokens, kept budget β, A answer tokens, forked
batch width W: the runs of an example decoded together, :func:`kvcert.generation.plan.shard_seconds`'s
rule; 1 on the batch-1 path):

* **prefill**, compute-bound, once per example and shared by its W runs::

      F = 2 · P · T  +  4 · layers · heads · head_dim · T² / 2      (matmuls; causal attention)

* **decode**, memory-bound, A steps; each step reads the weights once for the whole forked
  batch and, for each of its rows, the row's compacted cache (β·T + A/2 tokens on average,
  keys and values in the model's dtype, 4 bytes of log π per token of a compressed run) and
  its eviction sketch (:data:`kvcert.method.sketch.SKETCH_FRACTION` of the T-token cache's bytes)::

      bytes/step/row = P · dtype / W  +  layers · kv_heads · [(β·T + A/2)(2 · head_dim · dtype + 4) + sketch]

* **host**, A steps: what the host spends per decode step of a forked batch (the step's launches or graph
  replay, its one read back, the loop's bookkeeping), shared by the batch's W rows: h seconds per step.

  time = F / (W · flops · η_prefill) + A · bytes/step/row / (bandwidth · η_decode) + A · h / W. The
  efficiencies are the shares of peak a real run attains: η_prefill of the dense FLOPs (stated,
  :data:`EFFICIENCY`), η_decode of the bandwidth (stated, or measured on a GPU: ``kernels/gpu_check.sh``
  writes ``gpu_check.json`` (:func:`read_gpu_check`), whose ``efficiency`` is the fused kernel's roofline
  time over its device time, :func:`kernel_efficiency`; ``kvcert plan --gpu-check FILE`` uses it for the
  decode alone — a decode kernel's share of bandwidth says nothing of a prefill's GEMMs). h is stated
  (:data:`HOST_SECONDS_PER_STEP`) or measured by the same file (the real model's graph-replayed step).

The model's architecture comes from its ``config.json`` where the checkpoint is on disk, else
from :data:`ARCHITECTURES` (the official configs' numbers of the paper's models).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

#: share of peak bandwidth and peak FLOPs a run attains: a decode step of ~30 layers × a
#: dozen small kernels at batch ≤ 13 rarely passes half of HBM bandwidth, and long-prompt
#: prefill (FlashAttention-2, bf16 GEMMs) reaches 50–70 % of the dense peak
EFFICIENCY = 0.5

#: the host's seconds per decode step of a forked batch, stated: a graph-replayed step (one replay, one read back,
#: the loop's bookkeeping); an eager step of a ~30-layer model costs its ~2,000 dispatched operations at ~8 µs
#: each instead (``kvcert bench host`` counts them). Not measured on a GPU yet: ``gpu_check.json`` measures it
#: (:func:`read_gpu_check`)
HOST_SECONDS_PER_STEP = 2e-4

#: tokens of a task with its own length (LoCoMo conversations: 9k–26k tokens)
NATIVE_TOKENS = 16384


@dataclass(frozen=True)
class Architecture:
    """The numbers of a decoder-only transformer (Llama / Mistral / Qwen2 layout) the cost model needs."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int
    vocab: int
    tied: bool = False
    qkv_bias: bool = False
    dtype_bytes: int = 2

    @property
    def params(self) -> int:
        """Parameters: embeddings (and an untied head), per layer q/k/v/o (+ biases), the
        gated MLP (3 · hidden · intermediate) and two norms, and the final norm."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attn = self.hidden * (q + 2 * kv) + q * self.hidden + ((q + 2 * kv) if self.qkv_bias else 0)
        layer = attn + 3 * self.hidden * self.intermediate + 2 * self.hidden
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.layers * layer + self.hidden

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.heads // self.kv_heads

    def kv_bytes_per_token(self) -> int:
        """Keys and values of one token over every layer and KV head."""
        return self.layers * self.kv_heads * 2 * self.head_dim * self.dtype_bytes


#: the paper's models, from their official ``config.json`` (Hugging Face Hub)
ARCHITECTURES: dict[str, Architecture] = {
    "llama-3.1-8b-instruct": Architecture(32, 32, 8, 128, 4096, 14336, 128256),  # 8.03e9
    "mistral-7b-instruct": Architecture(32, 32, 8, 128, 4096, 14336, 32768),  # v0.3: 7.25e9
    "qwen2.5-7b-instruct": Architecture(28, 28, 4, 128, 3584, 18944, 152064, qkv_bias=True),  # 7.62e9
    "qwen2.5-1.5b-instruct": Architecture(28, 12, 2, 128, 1536, 8960, 151936, tied=True, qkv_bias=True),  # 1.54e9
    "smollm2-135m-instruct": Architecture(30, 9, 3, 64, 576, 1536, 49152, tied=True),  # 1.35e8 (kvcert model fetch)
}

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def architecture_from_config(cfg: dict, dtype: str | None = None) -> Architecture:
    """The architecture of a Hugging Face ``config.json`` (Llama, Mistral, Qwen2); ``dtype``
    (the run's, e.g. "bfloat16") sets the bytes per value, else the config's own dtype."""
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    dtype = dtype or cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16"
    return Architecture(
        layers=int(cfg["num_hidden_layers"]), heads=heads,
        kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads), hidden=hidden,
        intermediate=int(cfg["intermediate_size"]), vocab=int(cfg["vocab_size"]),
        tied=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=bool(cfg.get("attention_bias", cfg.get("model_type") == "qwen2")),
        dtype_bytes=_DTYPE_BYTES.get(str(dtype), 2),
    )


def model_architecture(name: str, path: str | None = None, dtype: str | None = None) -> Architecture | None:
    """``name``'s architecture: from ``path/config.json`` when the checkpoint is there (``path``
    "embedded": the shipped model; "fetch:NAME": the model cache's folder), else :data:`ARCHITECTURES`;
    None when neither knows it."""
    from ..config.digest import model_folder

    folder = model_folder(str(path)) if path else None  # the shipped, a fetched (fetch:NAME) or a local folder
    if folder is not None and (folder / "config.json").is_file():
        return architecture_from_config(json.loads((folder / "config.json").read_text()), dtype)
    arch = ARCHITECTURES.get(name)
    if arch is not None and dtype in _DTYPE_BYTES:
        return Architecture(**{**arch.__dict__, "dtype_bytes": _DTYPE_BYTES[dtype]})
    return arch


@dataclass(frozen=True)
class GPU:
    name: str
    bandwidth: float  # HBM bytes per second
    flops: float  # dense bf16 FLOPs per second (no sparsity)


GPUS: dict[str, GPU] = {
    "a100-80gb": GPU("A100 80GB SXM", 2.0e12, 312e12),
    "h100-sxm": GPU("H100 SXM", 3.35e12, 989e12),
    "h200": GPU("H200", 4.8e12, 989e12),
}
DEFAULT_GPU = "h100-sxm"  # the experiment configs' seconds_per_generation are for an H100-class GPU


def gpu_of_device(name: str) -> GPU | None:
    """The table's entry for a CUDA device name (``torch.cuda.get_device_properties().name``), if any."""
    name = name.upper()
    if "H200" in name:
        return GPUS["h200"]
    if "H100" in name and "PCIE" not in name:
        return GPUS["h100-sxm"]
    if "A100" in name and "80GB" in name.replace(" ", ""):
        return GPUS["a100-80gb"]
    return None


@dataclass(frozen=True)
class Generation:
    """One generation's share of the work: prefill FLOPs, decode bytes and decode steps of the host (per
    generation: a forked batch's step counts 1 / W for each of its W rows)."""

    prefill_flops: float
    decode_bytes: float
    host_steps: float = 0.0

    def seconds(self, gpu: GPU, efficiency: float = EFFICIENCY, prefill_efficiency: float = EFFICIENCY,
                host_step: float = 0.0) -> float:
        """Prefill at ``prefill_efficiency`` of the FLOPs, decode at ``efficiency`` of the bandwidth, and
        ``host_step`` seconds per host step."""
        return (self.prefill_flops / (gpu.flops * prefill_efficiency) + self.decode_bytes / (gpu.bandwidth * efficiency)
                + self.host_steps * host_step)


def generation_cost(arch: Architecture, tokens: int, budget: float, answer_tokens: int, width: int,
                    compressed: bool = True, sketch_fraction: float | None = None) -> Generation:
    """Prefill FLOPs and decode bytes of one generation (the module docstring's formulas)."""
    if sketch_fraction is None:
        from ..method.sketch import SKETCH_FRACTION

        sketch_fraction = SKETCH_FRACTION
    width = max(1, int(width))
    t, a = float(tokens), float(answer_tokens)
    prefill = 2.0 * arch.params * t + 2.0 * arch.layers * arch.heads * arch.head_dim * t * t
    per_head_token = 2 * arch.head_dim * arch.dtype_bytes + (4 if compressed else 0)
    kept = (budget if compressed else 1.0) * t + a / 2
    cache = arch.layers * arch.kv_heads * kept * per_head_token
    sketch = sketch_fraction * t * arch.kv_bytes_per_token() if compressed else 0.0
    step = arch.params * arch.dtype_bytes / width + cache + sketch
    return Generation(prefill / width, a * step, a / width)


def shard_roofline_seconds(shard, arch: Architecture, answer_tokens: int, gpu: GPU,
                           efficiency: float = EFFICIENCY, native_tokens: int = NATIVE_TOKENS,
                           prefill_efficiency: float = EFFICIENCY, host_step: float = 0.0) -> float:
    """The roofline seconds of one shard: every example × run, a forkable run (no chunked
    streaming, two or more in the shard) in a forked batch of the shard's forkable runs."""
    tokens = shard.length or native_tokens
    forkable = [r for r in shard.runs if r.chunk_tokens is None]
    width = len(forkable) if len(forkable) > 1 else 1
    total = 0.0
    for run in shard.runs:
        w = width if run.chunk_tokens is None else 1
        cost = generation_cost(arch, tokens, run.budget, answer_tokens, w, compressed=run.condition != "full")
        total += cost.seconds(gpu, efficiency, prefill_efficiency, host_step)
    return total * (shard.stop - shard.start)


def plan_roofline(plan, archs: dict, answers: dict, gpu: GPU, efficiency: float = EFFICIENCY,
                  native_tokens: int = NATIVE_TOKENS, prefill_efficiency: float = EFFICIENCY,
                  host_step: float = 0.0) -> dict:
    """Roofline seconds of every (model, length) of a plan, {(model, length): (seconds, generations)};
    models without an architecture in ``archs`` ({model: Architecture | None}) are left out.
    ``answers``: {task: answer tokens}."""
    out: dict = {}
    for shard in plan.shards:
        arch = archs.get(shard.model)
        if arch is None:
            continue
        sec = shard_roofline_seconds(shard, arch, answers[shard.task], gpu, efficiency, native_tokens,
                                     prefill_efficiency, host_step)
        old = out.get((shard.model, shard.length), (0.0, 0))
        out[(shard.model, shard.length)] = (old[0] + sec, old[1] + shard.generations)
    return out


#: the layout version of ``gpu_check.json`` (``kernels/gpu_check.sh``) that :func:`read_gpu_check` reads
GPU_CHECK_FORMAT = 1
#: the kernel benchmark's rows the measured efficiency comes from: retained tokens in this range
EFFICIENCY_RETAINED = (4096, 32768)


def kernel_efficiency(rows: list[dict], retained: tuple[int, int] = EFFICIENCY_RETAINED) -> tuple[float | None, int]:
    """The measured efficiency of ``kvcert bench kernel``'s rows (its ``bench.json``) and the number of rows
    it comes from: the median of ``roofline_ms / cert_ms`` — the certified kernel's roofline time (bytes read
    at the GPU's peak bandwidth) over its measured device time, i.e. the achieved share of peak bandwidth,
    1 / ``cert_over_roofline`` — clamped to (0, 1], over the rows where the device time dominates the host's
    (``device_dominates``: rows timed by CUDA-graph replay, every length and batch); a file of the earlier
    format, without that field, over rows with ``retained`` tokens in the given range. (None, 0) when no such
    row has a finite, positive time."""
    lo, hi = retained
    graph_timed = any("device_dominates" in row for row in rows)
    shares = []
    for row in rows:
        try:
            roof, cert, length = float(row["roofline_ms"]), float(row["cert_ms"]), int(row["retained"])
        except (KeyError, TypeError, ValueError):
            continue
        usable = bool(row.get("device_dominates")) if graph_timed else lo <= length <= hi
        if usable and math.isfinite(roof) and math.isfinite(cert) and roof > 0 and cert > 0:
            shares.append(roof / cert)
    if not shares:
        return None, 0
    shares.sort()
    mid = len(shares) // 2
    median = shares[mid] if len(shares) % 2 else (shares[mid - 1] + shares[mid]) / 2
    return min(1.0, median), len(shares)


@dataclass(frozen=True)
class MeasuredEfficiency:
    """The efficiency ``kernels/gpu_check.sh`` measured: its value, the GPU (CUDA device name), the file,
    and what the share is of ("peak": the table's peak bandwidth; "copy": a measured device-to-device
    copy, for a GPU not in :data:`GPUS`); and the host's seconds per decode step it measured, where it did
    (the real model's graph-replayed certified step, an upper bound: it includes that small model's device work)."""

    efficiency: float
    gpu: str
    path: str
    basis: str = "peak"
    host_step: float | None = None


def read_gpu_check(path: str | Path) -> MeasuredEfficiency:
    """The measured efficiency of a ``gpu_check.json``; a missing, unreadable or malformed file, or an
    efficiency outside (0, 1], raises ``ValueError`` (``FileNotFoundError`` when missing) in one line naming
    the file."""
    path = Path(path)
    rerun = "run kernels/gpu_check.sh OUTDIR on a GPU and give OUTDIR/gpu_check.json"
    if not path.is_file():
        raise FileNotFoundError(f"--gpu-check {path}: no such file; {rerun}")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"--gpu-check {path}: not readable JSON ({' '.join(str(exc).split())}); {rerun}") from None
    if not isinstance(data, dict):
        raise ValueError(f"--gpu-check {path}: not a gpu_check.json (a JSON object was expected); {rerun}")
    if data.get("format") != GPU_CHECK_FORMAT:
        raise ValueError(f"--gpu-check {path}: format {data.get('format')!r}, this kvcert reads format "
                         f"{GPU_CHECK_FORMAT}; {rerun}")
    gpu = data.get("gpu")
    if not isinstance(gpu, str) or not gpu.strip():
        raise ValueError(f"--gpu-check {path}: no GPU name (field 'gpu'); {rerun}")
    eff = data.get("efficiency")
    if eff is None:
        raise ValueError(f"--gpu-check {path}: no measured efficiency (the kernel benchmark on {gpu} did not "
                         "measure a 4k-32k row; see bench.txt beside it)")
    if isinstance(eff, bool) or not isinstance(eff, (int, float)) or not (0.0 < float(eff) <= 1.0):
        raise ValueError(f"--gpu-check {path}: efficiency {eff!r} is not a share in (0, 1]")
    basis = data.get("efficiency_basis", "peak")
    graph = (data.get("real_model_decode") or {}).get("ms_per_token_graph") or {}
    host = graph.get("poisson_certified")
    host = float(host) / 1e3 if isinstance(host, (int, float)) and not isinstance(host, bool) and host > 0 else None
    return MeasuredEfficiency(float(eff), gpu.strip(), str(path), basis if basis in ("peak", "copy") else "peak", host)


__all__ = ["ARCHITECTURES", "Architecture", "DEFAULT_GPU", "EFFICIENCY", "GPU", "GPUS", "GPU_CHECK_FORMAT", "Generation",
           "HOST_SECONDS_PER_STEP",
           "MeasuredEfficiency", "gpu_of_device", "kernel_efficiency", "read_gpu_check",
           "NATIVE_TOKENS", "architecture_from_config", "generation_cost", "model_architecture",
           "plan_roofline", "shard_roofline_seconds"]
