"""The roofline cost model of ``kvcert plan`` (kvcert.generation.roofline)."""

from __future__ import annotations

import json
import math
import struct

import pytest

from kvcert.embedded import embedded_model_path
from kvcert.generation.plan import Run, Shard
from kvcert.generation.roofline import (ARCHITECTURES, GPUS, Architecture, architecture_from_config, generation_cost,
                                      gpu_of_device, model_architecture, shard_roofline_seconds)


def _safetensors_params(path) -> int:
    """Parameters of a safetensors file, from its header (8-byte length, then JSON of shapes)."""
    with open(path, "rb") as fh:
        (size,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(size))
    return sum(math.prod(t["shape"]) for name, t in header.items() if name != "__metadata__")


def test_parameter_count_equals_the_shipped_checkpoint():
    folder = embedded_model_path()
    arch = architecture_from_config(json.loads((folder / "config.json").read_text()))
    assert arch.params == _safetensors_params(folder / "model.safetensors")
    assert model_architecture("embedded", "embedded") == arch and arch.dtype_bytes == 4


@pytest.mark.parametrize("name,params,group", [
    ("llama-3.1-8b-instruct", 8.03e9, 4), ("mistral-7b-instruct", 7.25e9, 4),
    ("qwen2.5-7b-instruct", 7.62e9, 7), ("qwen2.5-1.5b-instruct", 1.54e9, 6),
])
def test_paper_models_match_their_published_sizes(name, params, group):
    arch = ARCHITECTURES[name]
    assert abs(arch.params - params) / params < 0.005  # the model cards' rounded totals
    assert arch.group == group and arch.head_dim == 128
    assert model_architecture(name, "/nonexistent/folder", "bfloat16") == arch


def test_generation_cost_terms():
    arch = Architecture(layers=2, heads=4, kv_heads=2, head_dim=8, hidden=32, intermediate=64, vocab=100)
    t, a = 100, 10
    one = generation_cost(arch, t, 0.5, a, 1, sketch_fraction=0.0)
    four = generation_cost(arch, t, 0.5, a, 4, sketch_fraction=0.0)
    assert one.prefill_flops == 2 * arch.params * t + 2 * 2 * 4 * 8 * t * t
    assert four.prefill_flops == one.prefill_flops / 4  # one prefill per example, shared by its forked runs
    cache = 2 * 2 * (0.5 * t + a / 2) * (2 * 8 * 2 + 4)  # layers · kv heads · tokens · (K + V + log π)
    assert one.decode_bytes == pytest.approx(a * (arch.params * 2 + cache))
    assert four.decode_bytes == pytest.approx(a * (arch.params * 2 / 4 + cache))  # weights read once per step
    full = generation_cost(arch, t, 0.5, a, 1, compressed=False, sketch_fraction=0.0)
    assert full.decode_bytes == pytest.approx(a * (arch.params * 2 + 2 * 2 * (t + a / 2) * 32))
    sketched = generation_cost(arch, t, 0.5, a, 1, sketch_fraction=0.01)
    assert sketched.decode_bytes - one.decode_bytes == pytest.approx(a * 0.01 * t * arch.kv_bytes_per_token())
    gpu = GPUS["h100-sxm"]
    assert one.seconds(gpu, 0.5) == pytest.approx(one.prefill_flops / (989e12 / 2) + one.decode_bytes / (3.35e12 / 2))


def test_shard_forks_all_but_chunked_streaming_runs():
    arch = ARCHITECTURES["llama-3.1-8b-instruct"]
    gpu = GPUS["h200"]
    runs = (Run("full", "full", 1.0), Run("aware", "m", 0.25), Run("streaming", "m", 0.25, chunk_tokens=512))
    shard = Shard("main", "llama-3.1-8b-instruct", "t", 6144, 0, 0, 3, runs)
    expect = 3 * (generation_cost(arch, 6144, 1.0, 32, 2, compressed=False).seconds(gpu)
                  + generation_cost(arch, 6144, 0.25, 32, 2).seconds(gpu)
                  + generation_cost(arch, 6144, 0.25, 32, 1).seconds(gpu))
    assert shard_roofline_seconds(shard, arch, 32, gpu) == pytest.approx(expect)


def test_device_names_map_to_the_table():
    assert gpu_of_device("NVIDIA H200") is GPUS["h200"]
    assert gpu_of_device("NVIDIA H100 80GB HBM3") is GPUS["h100-sxm"]
    assert gpu_of_device("NVIDIA A100-SXM4-80GB") is GPUS["a100-80gb"]
    assert gpu_of_device("NVIDIA H100 PCIe") is None and gpu_of_device("NVIDIA L4") is None


# --- the measured efficiency: kernels/gpu_check.sh's gpu_check.json and `kvcert plan --gpu-check` ---------

from kvcert.generation.roofline import (EFFICIENCY, GPU_CHECK_FORMAT, kernel_efficiency, plan_roofline,  # noqa: E402
                                      read_gpu_check)


def _check_file(tmp_path, **fields):
    data = {"format": GPU_CHECK_FORMAT, "gpu": "NVIDIA H200", "efficiency": 0.25, "efficiency_basis": "peak", **fields}
    path = tmp_path / "gpu_check.json"
    path.write_text(json.dumps(data))
    return path


def test_kernel_efficiency_is_the_median_share_at_4k_to_32k():
    rows = [{"batch": 1, "retained": n, "roofline_ms": 1.0, "cert_ms": ms}
            for n, ms in ((4096, 4.0), (8192, 2.0), (16384, 1.6), (32768, 1.25), (131072, 1.0))]
    assert kernel_efficiency(rows) == (pytest.approx(0.5 * (0.5 + 0.625)), 4)  # 128k left out; median of 4
    assert kernel_efficiency(rows[:3]) == (pytest.approx(0.5), 3)
    assert kernel_efficiency([{"retained": 4096, "roofline_ms": 2.0, "cert_ms": 1.0}]) == (1.0, 1)  # clamped to 1
    broken = [{"retained": 4096, "roofline_ms": 1.0, "cert_ms": math.nan}, {"retained": 8192, "cert_ms": 1.0},
              {"retained": 8192, "roofline_ms": 1.0, "cert_ms": None}, rows[-1]]
    assert kernel_efficiency(broken) == (None, 0) and kernel_efficiency([]) == (None, 0)


def test_read_gpu_check(tmp_path):
    m = read_gpu_check(_check_file(tmp_path, efficiency=0.375))
    assert (m.efficiency, m.gpu, m.basis) == (0.375, "NVIDIA H200", "peak")
    assert read_gpu_check(_check_file(tmp_path, efficiency=1, efficiency_basis="copy")).basis == "copy"


@pytest.mark.parametrize("content,words", [
    (None, "no such file"),
    ("{not json", "not readable JSON"),
    ("[0.5]", "a JSON object was expected"),
    ({"format": 99}, "format 99, this kvcert reads format 1"),
    ({"gpu": ""}, "no GPU name"),
    ({"efficiency": None}, "no measured efficiency"),
    ({"efficiency": 0}, "efficiency 0 is not a share in (0, 1]"),
    ({"efficiency": 1.5}, "efficiency 1.5 is not a share in (0, 1]"),
    ({"efficiency": -0.2}, "is not a share in (0, 1]"),
    ({"efficiency": "0.5"}, "is not a share in (0, 1]"),
    ({"efficiency": True}, "is not a share in (0, 1]"),
    ("NaN", "is not a share in (0, 1]"),
])
def test_read_gpu_check_refuses_in_one_line(tmp_path, content, words):
    path = tmp_path / "gpu_check.json"
    if isinstance(content, dict):
        path = _check_file(tmp_path, **content)
    elif content == "NaN":
        path.write_text('{"format": 1, "gpu": "NVIDIA H200", "efficiency": NaN}')
    elif content is not None:
        path.write_text(content)
    with pytest.raises((ValueError, FileNotFoundError)) as err:
        read_gpu_check(path)
    message = str(err.value)
    assert words in message and str(path) in message and "\n" not in message


def test_measured_efficiency_scales_the_roofline(tmp_path):
    arch = ARCHITECTURES["llama-3.1-8b-instruct"]
    runs = (Run("full", "full", 1.0), Run("aware", "m", 0.25))

    class _Plan:
        shards = [Shard("main", "llama-3.1-8b-instruct", "t", 16384, 0, 0, 2, runs)]

    archs, answers, gpu = {"llama-3.1-8b-instruct": arch}, {"t": 32}, GPUS["h200"]
    assumed = plan_roofline(_Plan, archs, answers, gpu)
    measured = plan_roofline(_Plan, archs, answers, gpu, read_gpu_check(_check_file(tmp_path)).efficiency)
    key = ("llama-3.1-8b-instruct", 16384)
    # the measured decode efficiency scales the decode alone: a prefill's GEMMs keep their own
    costs = [generation_cost(arch, 16384, 1.0, 32, 2, compressed=False), generation_cost(arch, 16384, 0.25, 32, 2)]
    prefill = 2 * sum(c.prefill_flops for c in costs) / (gpu.flops * EFFICIENCY)
    decode = 2 * sum(c.decode_bytes for c in costs) / gpu.bandwidth
    assert assumed[key][0] == pytest.approx(prefill + decode / EFFICIENCY)
    assert measured[key][0] == pytest.approx(prefill + decode / 0.25) and measured[key][1] == 4
    # the host's time per decode step, shared by a forked batch's rows: 2 examples × 2 runs × 32 steps / 2 rows
    host = plan_roofline(_Plan, archs, answers, gpu, host_step=1e-3)
    assert host[key][0] == pytest.approx(assumed[key][0] + 2 * 2 * 32 / 2 * 1e-3)
    slow_prefill = plan_roofline(_Plan, archs, answers, gpu, prefill_efficiency=0.25)
    assert slow_prefill[key][0] == pytest.approx(2 * prefill + decode / EFFICIENCY)


def _plan_cli(capsys, *extra):
    from kvcert.cli import main

    status = main(["plan", "--experiment", "paper", *extra])
    out, err = capsys.readouterr()
    return status, out, err


def test_plan_gpu_check_replaces_the_assumed_efficiency(tmp_path, capsys):
    status, out, _ = _plan_cli(capsys)
    assumed = float(out.strip().splitlines()[-1].split("gpu_hours_roofline=")[1])
    path = _check_file(tmp_path)
    status, out, _ = _plan_cli(capsys, "--gpu-check", str(path))
    assert status == 0
    lines = out.strip().splitlines()
    said = [line for line in lines if line.startswith("roofline: decode efficiency 0.25 measured on NVIDIA H200")]
    assert len(said) == 1 and str(path) in said[0] and "replacing the assumed 0.5" in said[0]
    assert "--gpu h200 for the measured one" in said[0]  # the plan's --gpu (h100-sxm) is another GPU
    assert any("decode at 0.25 of the bandwidth, prefill at 0.5 of the FLOPs" in line for line in lines)
    measured = float(lines[-1].split("gpu_hours_roofline=")[1])
    assert assumed < measured < 2 * assumed  # the decode's share doubles, the prefill's stays


@pytest.mark.parametrize("extra,words", [
    (["--efficiency", "0.4"], "give --efficiency or --gpu-check, not both"),
    ([], "efficiency 7 is not a share in (0, 1]"),
])
def test_plan_gpu_check_refused_in_one_line(tmp_path, capsys, extra, words):
    status, out, err = _plan_cli(capsys, "--gpu-check", str(_check_file(tmp_path, efficiency=7)), *extra)
    assert status == 2 and out == "" and words in err and len(err.strip().splitlines()) == 1
    status, out, err = _plan_cli(capsys, "--gpu-check", str(tmp_path / "missing.json"))
    assert status == 2 and out == "" and err.startswith("kvcert plan: error: --gpu-check") and "no such file" in err


# --- the GPU check's Python steps (kvcert.bench.real_decode_gpu), on the CPU ----------------------------


def test_gpu_check_summary_is_what_plan_reads(tmp_path):
    from kvcert.bench.real_decode_gpu import main as step

    rows = [{"batch": b, "retained": n, "cert_ms": 2.0, "plain_ms": 1.8, "sdpa_ms": 1.6 if n > 4096 else math.nan,
             "sdpa_bias_ms": 4.0, "roofline_ms": 1.0 if n <= 32768 else 1.9} for b in (1, 8)
            for n in (4096, 8192, 16384, 32768, 131072)]
    (tmp_path / "bench.json").write_text(json.dumps({"device": "NVIDIA H200", "rows": rows,
                                                     "roofline_bandwidth": 4.8e12}))
    (tmp_path / "compile.json").write_text(json.dumps([
        {"kernel": "stage1", "regs": 150, "paper": True, "spilled": False, "fits": True, "error": None},
        {"kernel": "merge", "regs": 0, "paper": False, "spilled": False, "fits": True, "error": "boom"}]))
    (tmp_path / "real_decode.json").write_text(json.dumps({
        "status": "measured", "model": "smollm2-135m-instruct", "ms_per_token": {
            "full": 9.0, "topk": 8.0, "poisson": 8.4, "poisson_certified": 10.0},
        "certified_over_topk": 1.25, "poisson_over_topk": 1.05}))
    assert step(["summary", str(tmp_path), "--gpu", "NVIDIA H200", "--arch", "90",
                 "--steps", "compile=1", "tests=0", "bench=0", "real_decode=0", "generate=124", "tune=skipped"]) == 0
    data = json.loads((tmp_path / "gpu_check.json").read_text())  # strict JSON: no NaN
    assert data["steps"] == {"compile": "fail", "tests": "pass", "bench": "pass", "real_decode": "pass",
                             "generate": "timeout", "tune": "skipped"}
    assert data["compile_table"]["status"] == "fail" and data["compile_table"]["failed"] == 1
    assert data["gpu_table"] == "h200" and data["efficiency_basis"] == "peak" and data["efficiency_rows"] == 8
    first = data["kernel_vs_sdpa"][0]
    assert (first["retained"], first["sdpa_ms"], first["cert_over_sdpa"]) == (4096, None, None)
    assert data["kernel_vs_sdpa"][1]["cert_over_sdpa"] == pytest.approx(1.25)
    assert data["real_model_decode"]["certified_over_topk"] == 1.25
    m = read_gpu_check(tmp_path / "gpu_check.json")
    assert m.efficiency == pytest.approx(0.5) and m.gpu == "NVIDIA H200"


def test_gpu_check_summary_without_a_benchmark_is_refused_by_plan(tmp_path):
    from kvcert.bench.real_decode_gpu import main as step

    assert step(["summary", str(tmp_path), "--gpu", "NVIDIA L4", "--steps", "bench=124", "real_decode=skipped"]) == 0
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    assert data["efficiency"] is None and data["efficiency_basis"] == "copy" and data["gpu_table"] is None
    assert data["real_model_decode"]["status"] == "skipped" and data["compile_table"] == {"status": "not run"}
    with pytest.raises(ValueError, match="no measured efficiency"):
        read_gpu_check(tmp_path / "gpu_check.json")


def test_real_decode_step_skips_without_a_model_folder(tmp_path, monkeypatch, capsys):
    from kvcert.bench.real_decode_gpu import main as step

    monkeypatch.delenv("KVCERT_REAL_MODEL", raising=False)
    monkeypatch.setenv("KVCERT_MODEL_DIR", str(tmp_path / "models"))
    assert step(["decode", "--output", str(tmp_path / "real_decode.json")]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("real-model decode skipped: no smollm2-135m-instruct folder") and "\n" not in line
    assert "kvcert model fetch smollm2-135m-instruct" in line and "KVCERT_MODEL_DIR" in line
    assert json.loads((tmp_path / "real_decode.json").read_text())["status"] == "skipped"


def test_real_model_decode_times_every_variant_on_the_cpu():
    """The decode step's logic on the shipped model (the GPU run uses SmolLM2 in bf16 on CUDA)."""
    from kvcert.bench.real_decode_gpu import VARIANTS, real_model_decode

    res = real_model_decode(embedded_model_path(), prompt_tokens=256, steps=2, repeats=2, device="cpu",
                            dtype="float32")
    assert set(res["ms_per_token"]) == set(VARIANTS) and all(t > 0 for t in res["ms_per_token"].values())
    assert res["kept_fraction"]["full"] == 1.0 and res["kept_fraction"]["topk"] < 0.5
    assert res["certified_steps"] == 2  # every decoded step folded a certificate
    assert res["certified_over_topk"] == pytest.approx(res["ms_per_token"]["poisson_certified"]
                                                       / res["ms_per_token"]["topk"])
