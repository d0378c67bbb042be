"""The Python steps of ``kernels/gpu_check.sh``: the real model's decode, and the summary ``gpu_check.json``.

``decode``: SmolLM2-135M-Instruct (``kvcert model fetch smollm2-135m-instruct``) in bf16 on the GPU
prefills a random prompt of 4096 tokens four times, under a :class:`~kvcert.method.cache.CertifiedCache`:

* ``full``: no press (every token kept);
* ``topk``: SnapKV scores, 25 % kept, top-k (deterministic; no certificate);
* ``poisson``: SnapKV, 25 %, the Poisson design, certificates not recorded;
* ``poisson_certified``: the same cache with certificates recorded and folded, step by step, into a
  :class:`~kvcert.generation.signals.CertificateTrace` as a generation does.

Each cache then decodes ``steps`` tokens as the engine does (the next token's log-probabilities and
argmax every step, the step log popped), is put back as it was after the prefill (the decoded tokens
dropped, as :func:`kvcert.bench.timing.decode_steps` does), and decodes again: the variants interleaved,
``repeats`` times, one untimed warm-up round first (the Triton kernels compile there). ms/token is the
minimum over the repeats, between ``torch.cuda.synchronize()`` calls. The model folder: ``--folder``, else
``$KVCERT_REAL_MODEL`` (the model's folder itself), else the model cache's (``$KVCERT_MODEL_DIR/NAME`` or
the default cache, :func:`kvcert.config.model_store.fetched_folder`). The GPU machine has no network: without a
folder the step says how to provide one, writes ``status: skipped`` and exits 0.

``summary OUTDIR``: reads ``compile.json``, ``bench.json`` and ``real_decode.json`` of one run and writes
``OUTDIR/gpu_check.json`` (format :data:`kvcert.generation.roofline.GPU_CHECK_FORMAT`; docs/gpu.md lists
its fields), which ``kvcert plan --gpu-check`` reads. Imports no torch.

Run: ``python -m kvcert.bench.real_decode_gpu decode --output real_decode.json`` /
``python -m kvcert.bench.real_decode_gpu summary OUTDIR --gpu NAME --steps compile=0 ...``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

REAL_MODEL = "smollm2-135m-instruct"
#: variant: (sampler, record certificates); sampler None = the full cache
VARIANTS: dict[str, tuple[str | None, bool]] = {
    "full": (None, False),
    "topk": ("topk", False),
    "poisson": ("poisson", False),
    "poisson_certified": ("poisson", True),
}
#: how the decode steps run: eagerly (the default path: SDPA over an uncompressed or top-k cache), and replayed
#: from a CUDA graph (every variant on the fused kernel's plans, ``static_decode``)
MODES = ("eager", "graph")
#: what ``kernels/gpu_check.sh`` writes per step besides its exit status
STEP_FILES = {"compile": "compile.json", "bench": "bench.json", "real_decode": "real_decode.json",
              "ablation": "ablation.json", "splits": "splits.json"}


def model_folder(folder: str | None = None, name: str = REAL_MODEL) -> tuple[Path | None, str]:
    """The real model's folder and a note on it, or (None, why not and how to provide one)."""
    from ..config.model_store import fetched_folder, folder_problem, read_receipt

    given = folder or os.environ.get("KVCERT_REAL_MODEL") or None
    path = Path(given).expanduser() if given else fetched_folder(name)
    how = (f"on a machine with network run `kvcert model fetch {name}`, copy the folder it names along, and set "
           f"KVCERT_MODEL_DIR=<the folder holding {name}/> (or KVCERT_REAL_MODEL=<the model folder itself>)")
    if not (path / "config.json").is_file():
        return None, f"no {name} folder at {path} (no config.json there): {how}"
    if read_receipt(path) is None:
        return path, "no kvcert-fetch.json receipt: the folder is used as it is"
    problem = folder_problem(name, path)
    if problem is not None:
        return None, f"{problem}; or {how}"
    return path, "kvcert-fetch.json receipt: sizes match"


def _decode(step, cache, steps: int, first: int, position: int, trace) -> list[int]:
    """``steps`` tokens decoded as the generation path decodes (:class:`~kvcert.generation.decode_step.DecodeStep`:
    the forward, the greedy token, one read per step), then a certified run's statistics folded into ``trace`` once
    (:func:`~kvcert.generation.signals.fold_recorded`); the greedy tokens."""
    from ..generation.signals import fold_recorded

    step.reset([first], position)
    tokens = [int(step()[0][0]) for _ in range(steps)]
    if trace is not None:
        fold_recorded(cache.recorder, [trace], [_NoSignals()])
        trace.read()  # the one read of the certificates: what writing the record costs
    return tokens


class _NoSignals:
    def add_attention_steps(self, values) -> None:
        pass


def real_model_decode(*args, **kwargs) -> dict:
    """:func:`_real_model_decode` without autograd (a scope, not the process's setting: a caller's grad mode,
    a test's, is left as it was)."""
    import torch

    with torch.no_grad():
        return _real_model_decode(*args, **kwargs)


def _real_model_decode(folder: str | Path, *, prompt_tokens: int = 4096, budget: float = 0.25, steps: int = 32,
                      repeats: int = 3, device: str = "cuda", dtype: str = "bfloat16", seed: int = 0,
                      name: str = REAL_MODEL, modes: tuple[str, ...] = MODES) -> dict:
    """ms/token of the :data:`VARIANTS` on the model in ``folder``, eager and graph-replayed (the module
    docstring), the ratios, and whether each variant's graph-replayed tokens are the eager ones."""
    import torch

    from ..generation.decode_step import DecodeStep
    from ..generation.signals import CertificateTrace
    from ..generation.spec import CertificateSpec
    from ..method.cache import CertifiedCache
    from ..method.certificate import unit_roundoff
    from ..method.models import ModelSpec, load_model
    from ..method.press import EvictionPress

    if steps < 1 or repeats < 2 or prompt_tokens < 2:
        raise ValueError("real-model decode: needs steps >= 1, repeats >= 2 and a prompt of 2 tokens or more")
    t_load = time.perf_counter()
    model, _ = load_model(ModelSpec(name=name, path=str(folder), dtype=dtype, device=device))
    dev = next(model.parameters()).device
    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    load_s = time.perf_counter() - t_load
    cfg = model.config.get_text_config()
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab_size, (1, prompt_tokens), generator=gen).to(dev)
    first = int(ids[0, -1])
    spec = CertificateSpec()
    roundoff = unit_roundoff(next(model.parameters()).dtype)
    runs, kept, prefill_ms = {}, {}, {}
    for mode in modes:
        for variant, (sampler, record) in VARIANTS.items():
            press = None if sampler is None else EvictionPress(scorer="snapkv", budget=budget, sampler=sampler, seed=seed)
            cache = CertifiedCache(press=press, record_certificates=record, reserve=steps + 8,
                                   record_entropy=False, static_decode=mode == "graph")
            sync()
            t0 = time.perf_counter()
            model(input_ids=ids[:, :-1], cache=cache, use_cache=True, logits_to_keep=1)
            sync()
            prefill_ms[variant] = (time.perf_counter() - t0) * 1e3
            cache.pop_steps()
            position = cache.get_seq_length()
            step = DecodeStep(model, cache, [first], position, dev, graph=mode == "graph")
            runs[mode, variant] = (cache, step, cache.snapshot(), position)
            kept[variant] = sum(la.length for la in cache.layers) / (len(cache.layers) * (prompt_tokens - 1))

    def trace_for(variant):
        return (CertificateTrace(spec.delta, spec.aggregations, cfg.num_hidden_layers, roundoff)
                if VARIANTS[variant][1] else None)

    times: dict[str, dict[str, list[float]]] = {m: {v: [] for v in VARIANTS} for m in modes}
    tokens: dict[str, dict[str, list[int]]] = {m: {} for m in modes}
    replayed: dict[str, bool] = {}
    certified_steps = 0
    for rep in range(repeats + 1):  # rep 0: the untimed warm-up (kernel compiles, plans, the graphs' capture)
        for (mode, variant), (cache, step, mark, position) in runs.items():
            trace = trace_for(variant)
            sync()
            t0 = time.perf_counter()
            out = _decode(step, cache, steps, first, position, trace)
            sync()
            if rep:
                times[mode][variant].append((time.perf_counter() - t0) * 1e3 / steps)
                if trace is not None:
                    certified_steps = trace.count
            tokens[mode][variant] = out
            if mode == "graph":
                replayed[variant] = step.replaying
            cache.restore(mark)
    ms = {m: {v: min(t) for v, t in per.items()} for m, per in times.items()}
    kernel = None
    if cuda:
        from ..method.attention import _decode_kernel

        kernel = _decode_kernel() is not None and os.environ.get("KVCERT_DECODE_KERNEL", "1") != "0"
    ratio = lambda m, a, b: ms[m][a] / ms[m][b] if ms[m][b] > 0 else math.nan  # noqa: E731
    out = {
        "status": "measured", "model": name, "folder": Path(folder).name, "dtype": dtype,
        "device": torch.cuda.get_device_name(dev) if cuda else str(dev), "decode_kernel": kernel,
        "prompt_tokens": prompt_tokens, "budget": budget, "scorer": "snapkv", "steps": steps, "repeats": repeats,
        "load_seconds": load_s, "prefill_ms": prefill_ms, "kept_fraction": kept, "modes": list(modes),
        "certified_steps": certified_steps,
    }
    for m in modes:
        tail = "" if m == "eager" else f"_{m}"
        out[f"ms_per_token{tail}"] = ms[m]
        out[f"ms_per_token_repeats{tail}"] = times[m]
        out[f"certified_over_topk{tail}"] = ratio(m, "poisson_certified", "topk")
        out[f"poisson_over_topk{tail}"] = ratio(m, "poisson", "topk")
        out[f"certified_over_poisson{tail}"] = ratio(m, "poisson_certified", "poisson")
        out[f"topk_over_full{tail}"] = ratio(m, "topk", "full")
    if "graph" in modes:
        out["graph_replayed"] = replayed
        if "eager" in modes:
            out["graph_tokens_equal_eager"] = {v: tokens["graph"][v] == tokens["eager"][v] for v in VARIANTS}
            out["graph_over_eager"] = {v: ms["graph"][v] / ms["eager"][v] if ms["eager"][v] > 0 else math.nan
                                       for v in VARIANTS}
    return out


def _strict(obj):
    """``obj`` with every NaN or ±inf replaced by None (strict JSON)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_strict(v) for v in obj]
    return obj


def _write_json(path: str | Path, data: dict) -> None:
    from ..atomic import write_text

    write_text(path, json.dumps(_strict(data), indent=1, allow_nan=False) + "\n")


def decode_command(args) -> int:
    folder, note = model_folder(args.folder)
    if folder is None:
        print(f"real-model decode skipped: {note}", flush=True)
        if args.output:
            _write_json(args.output, {"status": "skipped", "model": REAL_MODEL, "reason": note})
        return 0
    print(f"real-model decode: {REAL_MODEL} from {folder} ({note}); {args.prompt_tokens}-token random prompt, "
          f"SnapKV at {args.budget:.0%}, {args.steps} steps, min of {args.repeats} repeats", flush=True)
    try:
        res = real_model_decode(folder, prompt_tokens=args.prompt_tokens, budget=args.budget, steps=args.steps,
                                repeats=args.repeats, device=args.device, dtype=args.dtype)
    except Exception as exc:  # noqa: BLE001 - recorded in the JSON, the script goes on
        if args.output:
            _write_json(args.output, {"status": "failed", "model": REAL_MODEL,
                                      "reason": f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"})
        raise
    res["folder_note"] = note
    print(f"device {res['device']}, {res['dtype']}, fused decode kernel: {res['decode_kernel']}; "
          f"model load {res['load_seconds']:.1f} s")
    graph = res.get("ms_per_token_graph")
    print(f"{'variant':<18} {'ms/token':>9} {'graph ms/token':>15} {'same tokens':>12} {'kept':>6} {'prefill ms':>11}")
    for v, t in res["ms_per_token"].items():
        g = "" if graph is None else f"{graph[v]:.3f}" + ("" if res["graph_replayed"].get(v) else " (eager)")
        same = "" if graph is None else str(res["graph_tokens_equal_eager"][v])
        print(f"{v:<18} {t:>9.3f} {g:>15} {same:>12} {res['kept_fraction'][v]:>6.3f} {res['prefill_ms'][v]:>11.1f}")
    print(" ".join(f"{k}={res[k]:.3f}" for k in ("certified_over_topk", "poisson_over_topk", "certified_over_poisson",
                                                  "topk_over_full", "certified_over_topk_graph") if k in res))
    if args.output:
        _write_json(args.output, res)
    return 0


def _read_list(path: Path, key: str) -> list:
    data = _read(path)
    rows = data.get(key) if isinstance(data, dict) else None
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def _read(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _status(code: str | None) -> str:
    if code is None:
        return "not run"
    if code == "skipped":
        return "skipped"
    return {"0": "pass", "124": "timeout", "137": "timeout"}.get(code, "fail")


def compile_summary(table, code: str | None) -> dict:
    """The compile table's verdict (its exit status) and counts (its ``compile.json``)."""
    out = {"status": _status(code)}
    if isinstance(table, list):
        ok = [r for r in table if not r.get("error")]
        paper = [r for r in table if r.get("paper")]
        out.update(variants=len(table), failed=len(table) - len(ok), spilled=sum(bool(r.get("spilled")) for r in table),
                   paper_variants=len(paper), paper_spilled=sum(bool(r.get("spilled")) for r in paper),
                   paper_under_occupied=sum(not r.get("fits", True) for r in paper if not r.get("error")),
                   max_regs=max((int(r.get("regs", 0)) for r in ok), default=0))
    return out


def _ratio(a, b):
    try:
        a, b = float(a), float(b)
    except (TypeError, ValueError):
        return None
    return a / b if math.isfinite(a) and math.isfinite(b) and b > 0 else None


def kernel_rows(bench) -> list[dict]:
    """Per (batch, retained) row of ``bench.json``: the kernel's times, its ratios over SDPA and the roofline."""
    rows = []
    for r in (bench or {}).get("rows", []) if isinstance(bench, dict) else []:
        rows.append({
            "batch": r.get("batch"), "retained": r.get("retained"),
            **{k: _finite(r.get(k)) for k in ("cert_ms", "plain_ms", "sdpa_ms", "sdpa_bias_ms", "roofline_ms",
                                              "cert_host_us", "plain_host_us")},
            **({"device_dominates": bool(r["device_dominates"])} if "device_dominates" in r else {}),
            "cert_over_sdpa": _ratio(r.get("cert_ms"), r.get("sdpa_ms")),
            "plain_over_sdpa": _ratio(r.get("plain_ms"), r.get("sdpa_ms")),
            "cert_over_sdpa_bias": _ratio(r.get("cert_ms"), r.get("sdpa_bias_ms")),
            "cert_over_roofline": _ratio(r.get("cert_ms"), r.get("roofline_ms")),
        })
    return rows


def _finite(x):
    return x if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def build_summary(outdir: str | Path, gpu: str, steps: dict[str, str], arch: str | None = None,
                  budget_s: int | None = None, elapsed_s: int | None = None) -> dict:
    """The content of ``gpu_check.json`` from one run's files in ``outdir`` and its steps' exit statuses."""
    from ..generation.roofline import EFFICIENCY_RETAINED, GPU_CHECK_FORMAT, GPUS, gpu_of_device, kernel_efficiency

    outdir = Path(outdir)
    bench = _read(outdir / STEP_FILES["bench"])
    real = _read(outdir / STEP_FILES["real_decode"])
    rows = kernel_rows(bench)
    eff, used = kernel_efficiency([r for r in rows if r["cert_ms"] is not None])
    table = gpu_of_device(gpu)
    if real is None:  # no real_decode.json: the step did not run, ran out of time or broke before writing it
        code = steps.get("real_decode")
        real = {"status": "not run" if code is None else _status(code)}
        if code == "skipped":
            real["reason"] = "too little of the script's time budget was left"
    real_out = {k: real.get(k) for k in ("status", "reason", "model", "dtype", "decode_kernel", "prompt_tokens",
                                        "budget", "scorer", "steps", "repeats") if k in real}
    if real.get("status") == "measured":
        for tail in ("", "_graph"):
            if f"ms_per_token{tail}" in real:
                real_out[f"ms_per_token{tail}"] = {k: _finite(v) for k, v in real[f"ms_per_token{tail}"].items()}
            for k in ("certified_over_topk", "poisson_over_topk", "certified_over_poisson", "topk_over_full"):
                if f"{k}{tail}" in real or not tail:
                    real_out[f"{k}{tail}"] = _finite(real.get(f"{k}{tail}"))
        for k in ("graph_replayed", "graph_tokens_equal_eager"):
            if k in real:
                real_out[k] = real[k]
    return {
        "format": GPU_CHECK_FORMAT,
        "gpu": gpu,
        "gpu_table": next((k for k, g in GPUS.items() if g is table), None),
        "compute_capability": arch,
        "commit": _commit(),
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "budget_s": budget_s, "elapsed_s": elapsed_s,
        "steps": {k: _status(v) for k, v in steps.items()},
        "compile_table": compile_summary(_read(outdir / STEP_FILES["compile"]), steps.get("compile")),
        "kernel_vs_sdpa": rows,
        "efficiency": eff,
        "efficiency_rows": used,
        "efficiency_retained": list(EFFICIENCY_RETAINED),
        "efficiency_basis": "peak" if table is not None else "copy",
        "roofline_bandwidth": _finite((bench or {}).get("roofline_bandwidth")) if isinstance(bench, dict) else None,
        "real_model_decode": real_out,
        "ablation": [{k: _finite(v) if isinstance(v, float) else v for k, v in r.items()}
                     for r in _read_list(outdir / STEP_FILES["ablation"], "ablation")],
        "split_sweep": [{k: _finite(v) if isinstance(v, float) else v for k, v in r.items()}
                        for r in _read_list(outdir / STEP_FILES["splits"], "split_sweep")],
    }


def _commit() -> str | None:
    import subprocess

    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def summary_command(args) -> int:
    steps = {}
    for item in args.steps:
        key, _, value = item.partition("=")
        steps[key] = value
    data = build_summary(args.outdir, args.gpu, steps, args.arch, args.budget, args.elapsed)
    path = Path(args.outdir) / "gpu_check.json"
    _write_json(path, data)
    eff = data["efficiency"]
    real = data["real_model_decode"]
    print(f"{path}: gpu={data['gpu']} compile_table={data['compile_table']['status']} "
          f"efficiency={'none' if eff is None else f'{eff:.3f}'} ({data['efficiency_rows']} rows, share of "
          f"{data['efficiency_basis']} bandwidth) real_model_decode={real.get('status')}"
          + (f" certified_over_topk={real['certified_over_topk']:.3f}"
             if real.get("certified_over_topk") is not None else ""))
    for r in data["kernel_vs_sdpa"]:
        c = r["cert_over_sdpa"]
        print(f"  batch {r['batch']} retained {r['retained']}: cert/sdpa "
              f"{'n/a' if c is None else f'{c:.3f}'}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvcert.bench.real_decode_gpu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("decode", help="the real model's bf16 decode: full, top-k, Poisson, Poisson + certificate")
    p.add_argument("--folder", default=None, help="the model folder (default: $KVCERT_REAL_MODEL, else the model cache's)")
    p.add_argument("--prompt-tokens", type=int, default=4096)
    p.add_argument("--budget", type=float, default=0.25)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--output", default=None, help="write the measurements (or the skip) as JSON here")
    p.set_defaults(func=decode_command)
    p = sub.add_parser("summary", help="write OUTDIR/gpu_check.json from one gpu_check.sh run")
    p.add_argument("outdir")
    p.add_argument("--gpu", required=True, help="the CUDA device name")
    p.add_argument("--arch", default=None, help="compute capability, e.g. 90")
    p.add_argument("--budget", type=int, default=None, help="the script's time budget (s)")
    p.add_argument("--elapsed", type=int, default=None, help="seconds the script had run before the summary")
    p.add_argument("--steps", nargs="*", default=[], metavar="STEP=EXIT", help="each step's exit status, or skipped")
    p.set_defaults(func=summary_command)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
