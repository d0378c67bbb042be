"""Ahead-of-time compilation of the decode kernels for sm_80 and sm_90 on a machine without a GPU.

The ``gpu_compile`` tier runs ``kvcert bench kernel --compile-only`` once (a subprocess with
TRITON_INTERPRET unset, Triton's kernel cache in a per-run folder, or in
``$KVCERT_COMPILE_CACHE`` to keep it between runs): every variant the wrapper can launch,
through its own launch plan (``plan_decode``), compiled to a cubin and read with
``cuobjdump -res-usage``. It fails on a compile error or a spill anywhere, and in the paper
profile (what kvcert's attention launches for the paper's models: lengths from the device, the
cache's 1 − π and ‖v − c‖, the statistics at a device step index) on fewer resident programs per
SM than the launch configuration counts on.
The other tests check the occupancy arithmetic and the variant enumeration (no compiling).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

from kvcert_kernels import compile_check as cc  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PAPER_SHAPES = [(128, 4), (128, 6), (128, 7)]


def test_occupancy_follows_the_cuda_occupancy_calculator():
    # 168 registers × 128 threads: 5376 per warp → 12 warps → 3 blocks of 4 warps
    assert cc.occupancy(168, 25344, 4, 80) == (12 / 64, 3)
    # 255 → 256 per thread, 8192 per warp: 8 warps, 2 blocks; 107776 B of shared memory: 1 block on sm_80, 2 on sm_90
    assert cc.occupancy(255, 1024, 4, 80) == (8 / 64, 2)
    assert cc.occupancy(96, 107776, 4, 80)[1] == 1 and cc.occupancy(96, 107776, 4, 90)[1] == 2
    # the 2048-thread and the 32-block limits
    assert cc.occupancy(32, 0, 4, 90) == (1.0, 16)
    assert cc.occupancy(16, 0, 1, 90) == (0.5, 32)


def test_variants_enumerate_every_launchable_combination():
    vs = cc.variants(PAPER_SHAPES, archs=(80, 90), dtypes=("bfloat16",), extras=False)
    assert len(vs) == 2 * 3 * 12  # per arch and shape: 8 with the certificate (sketch × entropy × split), 4 without
    assert not any(v.sketch and not v.certificate for v in vs)
    assert len({(v.certificate, v.sketch, v.entropy, v.split) for v in vs}) == 12
    assert all(v.kvcert and v.lengths and v.aux == v.certificate and v.stats == (v.certificate or v.entropy) for v in vs)
    extras = cc.variants(PAPER_SHAPES, archs=(90,), dtypes=("float16",))
    assert {v.flags for v in extras} - {v.flags for v in vs} == {
        "cert+direct", "cert+split+direct", "plain+direct", "plain+split+direct", "cert+no-logpi", "cert+unpacked",
        "cert+split+unpacked"}
    assert not any(v.kvcert for v in extras if v.flags not in {u.flags for u in vs})


def _needs_compiler():
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        pytest.skip("TRITON_INTERPRET is set in this process; the compile tier runs its own subprocess")
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("Triton's wheel ships ptxas and cuobjdump for Linux x86-64")


@pytest.mark.gpu_compile  # Triton's compiler in this process: the compile tier's (TRITON_INTERPRET unset)
def test_groups_that_pad_alike_share_one_compile_and_group_1_does_not():
    """The group is a runtime argument: groups whose rows pad alike share one compile key. Without the
    certificate 4, 6 and 7 query heads per KV head pad to the same 16 rows; with it (bf16) a group of 4 packs
    [p; r_hi; r_lo] into 12 of 16 rows (``PACKED``) while 6 and 7 keep the separate products on 16 rows; a
    group of 1 is an int the JIT specialises (equal to 1), so it compiles apart."""
    _needs_compiler()
    for certificate in (True, False):
        keys = {}
        for group in (4, 6, 7, 1):
            v = cc.kvcert_variant(90, "bfloat16", 128, group, certificate, False, True, False)
            (launch,) = cc.variant_launches(v)
            assert launch.kwargs["PACKED"] == (certificate and group in (1, 4))
            _, src, options = cc._specialise(launch, v.arch)
            keys[group] = cc._compile_key(src, options, v.arch)
        assert keys[6] == keys[7] != keys[1] and keys[1] != keys[4]
        assert (keys[4] == keys[6]) == (not certificate)


@pytest.mark.gpu_compile
@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_every_variant_compiles_for_sm80_and_sm90_without_spills(tmp_path_factory):
    _needs_compiler()
    cache = os.environ.get("KVCERT_COMPILE_CACHE") or str(tmp_path_factory.mktemp("triton-cache"))
    out = tmp_path_factory.mktemp("compile") / "variants.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    proc = subprocess.run([sys.executable, "-m", "kvcert.cli", "bench", "kernel", "--compile-only", "--cache", cache,
                           "--output", str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=1400)
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert lines[-1] == (f"variants={len(rows)} failed=0 spilled=0 "
                         f"max_regs={max(r['regs'] for r in rows)}"), lines[-3:]
    paper = [r for r in rows if r["paper"]]
    # per arch: stage 1 with the certificate 4 × 2 (sketch × entropy, with and without splits) packed (group 4) and
    # as many not packed (groups 6, 7), without it 4 (every group); the merge (any group, packed or not) 4 with the
    # certificate and 2 without: 26
    assert len(paper) == 2 * 26, [(r["kernel"], r["arch"], r["flags"]) for r in paper]
    assert {r["arch"] for r in paper} == {80, 90} and {r["dtype"] for r in paper} == {"bfloat16"}
    for r in paper:
        assert set(r["groups"]) <= {4, 6, 7}, r
        assert not r["spilled"] and r["stack"] == 0 and r["fits"], r
        if r["kernel"] == "stage1":
            # ≥ 2 resident programs of 64-key tiles: ≥ 58 KB of keys and values in flight per SM, twice the
            # ~29 KB an H200 needs by Little's law (docs/gpu.md)
            assert r["blocks_per_sm"] >= r["ctas_claimed"] >= 2 and r["block_n"] == 64, r
            assert r["inflight"] >= 58 * 1024, r
    stage1 = [r for r in paper if r["kernel"] == "stage1"]
    assert {g for r in stage1 if "cert" in r["flags"] for g in r["groups"]} == {4, 6, 7}
    assert all(r["error"] is None for r in rows)
    assert {(r["dtype"], r["head_dim"]) for r in rows} >= {(d, h) for d in cc.DTYPES for h in (64, 128)}


def test_compile_only_without_triton_says_how_to_install(monkeypatch, capsys):
    from types import SimpleNamespace

    from kvcert.bench.kernel_compile import run_compile_only

    monkeypatch.setitem(sys.modules, "triton", None)  # import triton now raises ImportError
    assert run_compile_only(SimpleNamespace()) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and "pip install" in lines[0] and "triton" in lines[0]
