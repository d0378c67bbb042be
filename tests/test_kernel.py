"""The fused certified decode kernel (kernels/kvcert_kernels/, package kvcert_kernels) against float64 torch.

With a CUDA device (and TRITON_INTERPRET unset) the tests run the compiled kernels on
the GPU. Without one they run in Triton's CPU interpreter, which needs
``TRITON_INTERPRET=1`` before triton is first imported — and a plain ``pytest`` run has
imported it long before this file (transformers does, from conftest). So, unless the run
was started with TRITON_INTERPRET=1, the first kernel test runs this file once more in a
fresh ``python -m pytest`` subprocess with the variable set, and every kernel test here
reports its own outcome from that run (failures carry the inner run's message).

Inputs are fresh random draws each run (the seed is in every failure message). Output
buffers, and the split-K workspace, are filled with NaN before each launch, and every
element is checked: finite where the reference is, and within a relative tolerance
(1e-5 for fp32 inputs, 1e-2 for 16-bit ones) of the float64 reference.
"""

from __future__ import annotations

import functools
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

from kvcert.method import attention as attn  # noqa: E402
from kvcert.method.attention import hajek_attention, squared_deviation  # noqa: E402
from kvcert_kernels import certified_decode  # noqa: E402
from kvcert.method.kernel_reference import decode_reference, entropy_reference, sketch_reference, variance_scale  # noqa: E402
from kvcert.method.sketch import build_sketch  # noqa: E402


pytestmark = pytest.mark.kernel  # its own tier (tests/tiers.sh): about a minute under the interpreter

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1"
DEVICE = torch.device("cuda" if ON_GPU else "cpu")
RTOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}
BLOCK_N = 16  # small key blocks: several blocks per split even at interpreter-sized caches


IN_PROCESS = ON_GPU or isinstance(tl.zeros, InterpretedFunction)


@functools.lru_cache(maxsize=1)
def _interpreter_run() -> tuple[dict, str]:
    """Run this file under TRITON_INTERPRET=1 in a fresh process; {test name: (outcome, message)}."""
    root = Path(__file__).resolve().parents[1]
    report = Path(tempfile.mkdtemp(prefix="kvcert-kernel-")) / "interpreter.xml"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "kernel", str(Path(__file__).resolve()),
           f"--junitxml={report}"]
    try:
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=900)
        tail = (proc.stdout + proc.stderr)[-4000:]
        results = {}
        if report.exists():
            for case in ET.parse(report).getroot().iter("testcase"):
                outcome, message = "passed", ""
                for child in case:
                    if child.tag in ("failure", "error", "skipped"):
                        outcome, message = child.tag, (child.get("message") or "") + "\n" + (child.text or "")
                results[case.get("name")] = (outcome, message)
        return results, tail
    finally:
        shutil.rmtree(report.parent, ignore_errors=True)


def kernel_test(fn):
    """Run the test here when the kernels can run in this process, else report its outcome
    from the interpreter subprocess (see the module docstring)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if IN_PROCESS:
            return fn(*args, **kwargs)
        current = os.environ.get("PYTEST_CURRENT_TEST", "")
        name = current.split("::")[-1].rsplit(" (", 1)[0]
        results, tail = _interpreter_run()
        if name not in results:
            pytest.fail(f"{name}: not run by the TRITON_INTERPRET=1 subprocess; its output:\n{tail}")
        outcome, message = results[name]
        if outcome == "skipped":
            pytest.skip(message.strip().splitlines()[0] if message.strip() else "skipped in the subprocess")
        if outcome != "passed":
            pytest.fail(f"{name} under TRITON_INTERPRET=1 ({outcome}):\n{message[-3000:]}", pytrace=False)

    return wrapper


@pytest.fixture
def seed():
    return int.from_bytes(os.urandom(4), "little")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def make_case(seed, dtype, group=2, batch=2, hkv=3, length=77, dim=32, poison_padding=True):
    """Ragged heads with padding, a certainty-only head and single-token heads.

    Heads (b, h): (0, 0) every slot, a few +inf padding slots inside; (0, 1) ragged
    (length − 23); (0, 2) one kept token (everything else padding); (1, 0) certainty tokens
    only; (1, 1) lengths = 1; (1, 2) ragged (length − 5). Keys and values of invalid slots
    are NaN (``poison_padding``): the kernel must never let them in.
    """
    g = _gen(seed)
    hq = hkv * group
    q = torch.randn(batch, hq, 1, dim, generator=g) * 1.5
    k = torch.randn(batch, hkv, length, dim, generator=g)
    v = torch.randn(batch, hkv, length, dim, generator=g) + torch.randn(batch, hkv, 1, dim, generator=g)
    u = torch.rand(batch, hkv, length, generator=g)
    lp = torch.where(u < 0.3, 0.0, torch.log(torch.rand(batch, hkv, length, generator=g) * 0.95 + 0.05))
    lengths = torch.full((batch, hkv), length, dtype=torch.int32)
    pad = torch.zeros(batch, hkv, length, dtype=torch.bool)
    pad[0, 0, torch.randperm(length, generator=g)[:5]] = True
    if hkv > 1:
        lengths[0, 1] = length - 23
    if hkv > 2:
        keep = int(torch.randint(length, (1,), generator=g))
        pad[0, 2] = True
        pad[0, 2, keep] = False
        lp[0, 2, keep] = -1.2
    if batch > 1:
        lp[1, 0] = 0.0
        lengths[1, 1 % hkv] = 1
        lp[1, 1 % hkv, 0] = -0.7
        if hkv > 2:
            lengths[1, 2] = length - 5
    lp = lp.masked_fill(pad, float("inf"))
    invalid = pad | (torch.arange(length) >= lengths.unsqueeze(-1))
    centre = torch.where(invalid.unsqueeze(-1), 0.0, v).sum(2) / (~invalid).sum(2, keepdim=True).clamp(min=1)
    centre = centre + 0.3 * torch.randn(centre.shape, generator=g)  # any centre: V̂ does not depend on it
    k, v, q = k.to(dtype), v.to(dtype), q.to(dtype)
    if poison_padding:
        k = k.masked_fill(invalid.unsqueeze(-1), float("nan"))
        v = v.masked_fill(invalid.unsqueeze(-1), float("nan"))
    to = lambda t: t.to(DEVICE)  # noqa: E731
    return to(q), to(k), to(v), to(lp), to(centre.float()), to(lengths)


def check(name, got, ref, rtol, seed, floor=None):
    """Every element finite where the reference is, and |got − ref| ≤ rtol·max(|ref|, floor)."""
    got = got.detach().to("cpu", torch.float64).reshape(ref.shape)
    ref = ref.to("cpu", torch.float64)
    finite = torch.isfinite(ref)
    assert torch.isfinite(got[finite]).all(), f"{name}: non-finite elements (unwritten?) [seed {seed}]"
    assert torch.equal(got[~finite], ref[~finite]), f"{name}: infinite elements differ [seed {seed}]"
    if floor is not None:
        floor = floor.to("cpu", torch.float64)
        floor = floor.reshape(ref.shape) if floor.numel() == ref.numel() else floor.expand_as(ref)
    scale = ref.abs() if floor is None else torch.maximum(ref.abs(), floor)
    err = ((got - ref).abs() / scale.clamp(min=1e-30)).where(finite, 0.0)
    worst = float(err.max())
    assert worst <= rtol, f"{name}: relative error {worst:.3g} > {rtol} [seed {seed}]"
    return worst


def check_rows(name, got, ref, rtol, seed):
    """Every element finite; per head ‖got − ref‖₂ ≤ rtol · ‖ref‖₂ (rows of zeros: exactly zero)."""
    got = got.detach().to("cpu", torch.float64).reshape(ref.shape)
    ref = ref.to("cpu", torch.float64)
    assert torch.isfinite(got).all(), f"{name}: non-finite elements (unwritten?) [seed {seed}]"
    err = torch.linalg.vector_norm(got - ref, dim=-1)
    size = torch.linalg.vector_norm(ref, dim=-1)
    worst = float((err / size.clamp(min=1e-30)).max())
    assert worst <= rtol, f"{name}: relative error {worst:.3g} > {rtol} [seed {seed}]"
    return worst


def check_all(res, ref, dtype, seed, certificate=True, var_scale=None):
    """Output per head in norm; lse relative to max(|lse|, 1);
    V̂ relative to max(V̂, S) with S the size of the terms its one-pass formula cancels
    (:func:`kvcert.method.kernel_reference.variance_scale`; V̂ ≈ 0 for a lone tail token); b̂_c plainly."""
    out, lse, var, rng = res
    r_out, r_lse, r_var, r_rng = ref
    rtol = RTOL[dtype]
    check_rows("output", out, r_out, rtol, seed)
    check("lse", lse, r_lse, rtol, seed, floor=torch.ones(()))
    if certificate:
        check("variance", var, r_var, rtol, seed, floor=var_scale)
        check("range_term", rng, r_rng, rtol, seed)
    else:
        assert var is None and rng is None


def reference(q, k, v, lp, c, scale, lengths=None):
    return decode_reference(q, k, v, lp, c, scale, lengths), variance_scale(q, k, v, lp, c, scale, lengths)


CASES = [  # dtype, group (query heads per KV head), num_splits
    (torch.float32, 2, 1),
    (torch.float32, 2, 3),
    (torch.float32, 4, 5),
    (torch.float32, 1, 2),
    (torch.bfloat16, 2, 1),
    (torch.bfloat16, 4, 3),
    (torch.float16, 2, 2),
]


@pytest.mark.parametrize("dtype,group,splits", CASES, ids=lambda x: str(x).replace("torch.", ""))
@kernel_test
def test_kernel_matches_float64_reference(seed, dtype, group, splits):
    q, k, v, lp, c, lengths = make_case(seed, dtype, group=group)
    scale = q.shape[-1] ** -0.5
    res = certified_decode(q, k, v, lp, c, scale, lengths=lengths, num_splits=splits, block_n=BLOCK_N, poison=True)
    assert res[0].shape == q.shape and res[0].dtype == dtype
    assert res[1].shape == res[2].shape == res[3].shape == q.shape[:3]
    ref, vs = reference(q, k, v, lp, c, scale, lengths)
    check_all(res, ref, dtype, seed, var_scale=vs)


@pytest.mark.parametrize("dtype,splits", [(torch.float32, 1), (torch.bfloat16, 3), (torch.float16, 2)],
                         ids=["float32", "bfloat16", "float16"])
@kernel_test
def test_values_far_from_the_centre(seed, dtype, splits):
    """Values 30 away from the origin, the centre among them: the pass sums B = Σ r v from the
    values as loaded and centres it (B − A c) in float64 at the end; V̂ and b̂_c keep the
    float64 reference's tolerance."""
    q, k, v, lp, c, lengths = make_case(seed, dtype, group=4)
    v, c = (v.float() + 30.0).to(dtype), c + 30.0
    scale = q.shape[-1] ** -0.5
    res = certified_decode(q, k, v, lp, c, scale, lengths=lengths, num_splits=splits, block_n=BLOCK_N, poison=True)
    ref, vs = reference(q, k, v, lp, c, scale, lengths)
    check_all(res, ref, dtype, seed, var_scale=vs)


@kernel_test
def test_special_heads_are_exact(seed):
    """Certainty-only head: V̂ = b̂_c = 0 exactly; a single kept token: ô = v_i, V̂ = 0."""
    q, k, v, lp, c, lengths = make_case(seed, torch.float32)
    out, lse, var, rng = certified_decode(q, k, v, lp, c, 0.2, lengths=lengths, num_splits=2, block_n=BLOCK_N, poison=True)
    group = q.shape[1] // k.shape[1]
    heads = lambda h: slice(h * group, (h + 1) * group)  # noqa: E731
    assert torch.all(var[1, heads(0)] == 0) and torch.all(rng[1, heads(0)] == 0)
    keep = int(torch.isfinite(lp[0, 2]).nonzero())
    torch.testing.assert_close(out[0, heads(2), 0], v[0, 2, keep].expand(group, -1), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out[1, heads(1), 0], v[1, 1, 0].expand(group, -1), rtol=1e-6, atol=1e-6)
    for b, h, slot in ((0, 2, keep), (1, 1, 0)):  # V̂ = 0 up to rounding of its one-pass terms
        size = -torch.expm1(lp[b, h, slot]) * 2 * (v[b, h, slot] - c[b, h]).pow(2).sum()
        assert float(var[b, heads(h)].abs().max()) <= 1e-5 * float(size)
    assert torch.all(rng[0, heads(2)] > 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@kernel_test
def test_without_certificate(seed, dtype):
    q, k, v, lp, c, lengths = make_case(seed, dtype)
    scale = q.shape[-1] ** -0.5
    res = certified_decode(
        q, k, v, lp, c, scale, lengths=lengths, certificate=False, num_splits=3, block_n=BLOCK_N, poison=True
    )
    check_all(res, reference(q, k, v, lp, c, scale, lengths)[0], dtype, seed, certificate=False)


@kernel_test
def test_layouts_strides_and_caller_buffers(seed):
    """3-d query, strided cache views (a capacity buffer, as in CompactLayer), head dim 40, no
    lengths, caller-provided NaN-filled output buffers, log π given as None in a second call."""
    g = _gen(seed)
    b, hkv, group, length, cap, d = 2, 2, 3, 50, 64, 40
    q = torch.randn(b, hkv * group, d, generator=g).to(DEVICE)
    kbuf = torch.randn(b, hkv, cap, d, generator=g).to(DEVICE)
    vbuf = torch.randn(b, hkv, cap, d, generator=g).to(DEVICE)
    lpbuf = torch.log(torch.rand(b, hkv, cap, generator=g) * 0.9 + 0.1).to(DEVICE)
    k, v, lp = kbuf[:, :, :length], vbuf[:, :, :length], lpbuf[:, :, :length]
    c = v.mean(2)
    scale = d**-0.5
    bufs = (
        torch.full((b, hkv * group, d), float("nan"), device=DEVICE),
        *(torch.full((b, hkv * group), float("nan"), device=DEVICE) for _ in range(3)),
    )
    res = certified_decode(q, k, v, lp, c, scale, num_splits=2, block_n=BLOCK_N, out=bufs)
    assert all(r is o for r, o in zip(res, bufs))
    ref, vs = reference(q, k, v, lp, c, scale)
    check_all(res, ref, torch.float32, seed, var_scale=vs)
    res = certified_decode(q, k, v, None, None, scale, num_splits=1, block_n=BLOCK_N, poison=True)
    ref, vs = reference(q, k, v, None, None, scale)
    check_all(res, ref, torch.float32, seed, var_scale=vs)
    assert torch.all(res[2] == 0) and torch.all(res[3] == 0)


@kernel_test
def test_calls_that_share_a_workspace_each_match_the_reference(seed):
    """The split-K partial state lives in a workspace later calls of the same shape reuse (no poison): a
    second call on other inputs, with and without the certificate and the entropy, still matches float64;
    every part of the workspace, and each of the three statistics the call returns from one allocation,
    starts on a 16-byte boundary for any row count (the kernels are compiled for aligned pointers: the
    compile tier checks that groups 4, 6 and 7 share one compile); a poisoned call takes fresh buffers,
    never the shared ones."""
    module = importlib.import_module("kvcert_kernels.certified_decode")
    for i, (certificate, entropy) in enumerate(((True, False), (True, False), (False, True), (True, True))):
        q, k, v, lp, c, lengths = make_case(seed + i, torch.float32, group=7)  # 42 rows: not a multiple of 4
        scale = q.shape[-1] ** -0.5
        res = certified_decode(q, k, v, lp, c, scale, lengths=lengths, num_splits=3, block_n=BLOCK_N,
                               certificate=certificate, entropy=entropy)
        ref, vs = reference(q, k, v, lp, c, scale, lengths)
        check_all(res[:4], ref, torch.float32, seed + i, certificate=certificate, var_scale=vs)
    assert all(t.data_ptr() % 16 == 0 for t in res[1:4])  # lse, V̂, b̂_c: slices of one allocation, aligned
    rows = q.shape[0] * k.shape[1] * 3 * 7
    shared = module._workspace(q.device, rows, v.shape[-1], True, True, False)
    assert module._workspace(q.device, rows, v.shape[-1], True, True, False) is shared
    assert all(t.data_ptr() % 16 == 0 for t in shared)
    assert len({t.data_ptr() for t in shared}) == 9
    fresh = module._workspace(q.device, rows, v.shape[-1], True, True, True)
    assert all(torch.isnan(t).all() for t in fresh)
    assert not {t.data_ptr() for t in fresh} & {t.data_ptr() for t in shared}


@kernel_test
def test_empty_head_convention(seed):
    """A head with no valid slot: output 0, lse −inf, V̂ = b̂_c = 0 (no NaN)."""
    q, k, v, lp, c, lengths = make_case(seed, torch.float32, batch=1, hkv=2)
    lengths[0, 1] = 0
    scale = q.shape[-1] ** -0.5
    for splits in (1, 3):
        res = certified_decode(q, k, v, lp, c, scale, lengths=lengths, num_splits=splits, block_n=BLOCK_N, poison=True)
        ref, vs = reference(q, k, v, lp, c, scale, lengths)
        check_all(res, ref, torch.float32, seed, var_scale=vs)
        assert torch.all(res[0][0, 2:] == 0) and torch.all(torch.isneginf(res[1][0, 2:]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@kernel_test
def test_kernel_equals_torch_hajek_attention(seed, dtype):
    """The kernel and the library's torch path agree, certificate included (the torch path
    reads the cached ‖v_i − c‖², the kernel recomputes it from the values)."""
    q, k, v, lp, c, _ = make_case(seed, dtype, poison_padding=False)
    scale = q.shape[-1] ** -0.5
    sq = squared_deviation(v, c)
    torch_res = hajek_attention(q, k, v, lp, scale, certificate=True, sq_dev=sq, centre=c)
    out, _, var, rng = certified_decode(q, k, v, lp, c, scale, num_splits=2, block_n=BLOCK_N, poison=True)
    # two fp32 results, or two bf16-level ones (the torch path also rounds ô to bf16 before
    # ‖ô − c‖, which the centre, near ô, amplifies in b̂_c), not one result vs float64
    rtol = 1e-5 if dtype == torch.float32 else 3e-2
    check_rows("output", out, torch_res.output.double(), rtol, seed)
    vs = variance_scale(q, k, v, lp, c, scale)
    check("variance", var, torch_res.variance.double(), rtol, seed, floor=vs)
    check("range_term", rng, torch_res.range_term.double(), rtol, seed)


@kernel_test
def test_dispatch_uses_kernel_for_decode_steps(seed, monkeypatch):
    """hajek_attention runs the kernel for a decode step on a kernel device and the torch
    code otherwise; the device test is forced on here so the kernel really runs on the CPU."""
    calls = []
    real = attn._decode_kernel()
    assert real is not None

    def spy(*args, **kwargs):
        calls.append(kwargs.get("certificate"))
        return real(*args, **kwargs)

    monkeypatch.setattr(attn, "_kernel_fn", spy)
    q, k, v, lp, c, _ = make_case(seed, torch.float32, poison_padding=False)
    scale = q.shape[-1] ** -0.5

    monkeypatch.setattr(attn, "_on_kernel_device", lambda t: False)
    torch_res = hajek_attention(q, k, v, lp, scale, certificate=True, centre=c)
    assert calls == [] and not attn.use_decode_kernel(q, k, v, None)

    monkeypatch.setattr(attn, "_on_kernel_device", lambda t: True)
    assert attn.use_decode_kernel(q, k, v, None)
    kern_res = hajek_attention(q, k, v, lp, scale, certificate=True, centre=c)
    assert calls == [True]
    ref_out = torch_res.output.double()
    check_rows("output", kern_res.output, ref_out, 1e-5, seed)
    check("variance", kern_res.variance, torch_res.variance.double(), 1e-5, seed, floor=variance_scale(q, k, v, lp, c, scale))
    check("range_term", kern_res.range_term, torch_res.range_term.double(), 1e-5, seed)
    plain = hajek_attention(q, k, v, lp, scale)
    assert calls == [True, False] and plain.variance is None
    check_rows("output", plain.output, ref_out, 1e-5, seed)

    # not a decode step, an extra mask, the environment switch, autograd: the torch path
    q2 = torch.cat([q, q], dim=2)
    hajek_attention(q2, k, v, lp, scale, certificate=True, centre=c)
    mask = torch.ones(1, 1, 1, k.shape[2], dtype=torch.bool, device=DEVICE)
    hajek_attention(q, k, v, lp, scale, extra_mask=mask)
    monkeypatch.setenv("KVCERT_DECODE_KERNEL", "0")
    hajek_attention(q, k, v, lp, scale)
    monkeypatch.delenv("KVCERT_DECODE_KERNEL")
    hajek_attention(q.clone().requires_grad_(), k, v, lp, scale)
    assert calls == [True, False]


ENTROPY_CASES = [  # dtype, group, num_splits, certificate
    (torch.float32, 2, 1, True),
    (torch.float32, 4, 3, True),
    (torch.float32, 1, 5, False),
    (torch.float32, 2, 2, False),
    (torch.bfloat16, 2, 3, True),
]


@pytest.mark.parametrize("dtype,group,splits,certificate", ENTROPY_CASES, ids=lambda x: str(x).replace("torch.", ""))
@kernel_test
def test_entropy_matches_float64_reference(seed, dtype, group, splits, certificate):
    """entropy=True: H of each query's attention over the valid slots against float64 (padding with
    +inf log π and NaN keys, ragged lengths, a lone-token head (H = 0), an empty head (0), split-K
    merges, GQA groups), appended last; every other output as with entropy=False (to fp32 rounding)."""
    q, k, v, lp, c, lengths = make_case(seed, dtype, group=group)
    lengths[-1, 0] = 0  # an empty head
    q = q * 2.0  # peaked and flat rows alike
    scale = q.shape[-1] ** -0.5
    kw = dict(lengths=lengths, certificate=certificate, num_splits=splits, block_n=BLOCK_N, poison=True)
    plain = certified_decode(q, k, v, lp, c, scale, **kw)
    res = certified_decode(q, k, v, lp, c, scale, entropy=True, **kw)
    assert len(res) == len(plain) + 1 and res[-1].shape == q.shape[:3] and res[-1].dtype == torch.float32
    for a, b in zip(plain, res):
        assert (a is None) == (b is None)
        if a is not None:  # the same arithmetic; bits are not promised across CPUs' BLAS kernels
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, equal_nan=True)
    ref = entropy_reference(q, k, lp, scale, lengths)
    # fp32: H = ln2 (log2 l − E/l), two non-negative terms: ~1e-6 relative, a few ulps of 1 near 0;
    # bf16 logits round the same in both (products of bf16 are exact in fp32), so no looser bound
    check("entropy", res[-1], ref, 1e-5, seed, floor=torch.full((), 0.1))
    group_of = lambda h: slice(h * group, (h + 1) * group)  # noqa: E731
    assert torch.all(res[-1][-1, group_of(0)] == 0)  # the empty head
    assert float(res[-1][0, group_of(2)].abs().max()) <= 1e-6  # one kept token: p = 1, H = 0
    if certificate:
        sketch = make_sketch(seed, k, c)
        both = certified_decode(q, k, v, lp, c, scale, entropy=True, sketch=sketch, **kw)
        assert len(both) == 7
        torch.testing.assert_close(both[-1], res[-1], rtol=1e-6, atol=1e-7)


@kernel_test
def test_hajek_attention_kernel_path_returns_entropy(seed, monkeypatch):
    """hajek_attention(entropy=True) on the kernel path: AttentionResult.entropy from the kernel,
    the other fields as without it (with and without the certificate and a sketch)."""
    monkeypatch.setattr(attn, "_on_kernel_device", lambda t: True)
    q, k, v, lp, c, _ = make_case(seed, torch.float32, poison_padding=False)
    scale = q.shape[-1] ** -0.5
    ref = entropy_reference(q, k, lp, scale).reshape(q.shape[:3])
    for kw in (dict(), dict(certificate=True, centre=c), dict(certificate=True, centre=c, sketch=make_sketch(seed, k, c))):
        base = hajek_attention(q, k, v, lp, scale, **kw)
        res = hajek_attention(q, k, v, lp, scale, entropy=True, **kw)
        assert base.entropy is None and res.entropy.shape == q.shape[:3]
        check("entropy", res.entropy, ref, 1e-5, seed, floor=torch.full((), 0.1))
        for name in ("output", "variance", "range_term", "shadow_sum", "shadow_range"):
            a, b = getattr(base, name), getattr(res, name)
            assert (a is None) == (b is None), name
            if a is not None:
                torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=name)


def make_sketch(seed, k, c, slots=37, evicted_tokens=90):
    """An eviction sketch for the heads of ``k``/``c``: random evicted keys (larger than the kept ones) and
    values, one head with a partial shadow (5 slots) and, with several KV heads, one with none."""
    g = _gen(seed + 1)
    b, hkv, _, d = k.shape
    ek = torch.randn(b, hkv, evicted_tokens, d, generator=g) * 1.5
    ev = torch.randn(b, hkv, evicted_tokens, d, generator=g)
    evicted = torch.rand(b, hkv, evicted_tokens, generator=g) < 0.7
    sketch = build_sketch(ek, ev, evicted, torch.randn(b, hkv, evicted_tokens, generator=g), c.cpu(), slots)
    sketch.count[0, 0] = min(5, int(sketch.count[0, 0]))
    if hkv > 1:
        sketch.count[b - 1, 1] = 0
    for name in ("codes", "scale", "key_error", "value_dev", "potential", "count"):
        setattr(sketch, name, getattr(sketch, name).to(DEVICE))
    return sketch


@pytest.mark.parametrize("dtype,group,splits", [(torch.float32, 2, 1), (torch.float32, 4, 3), (torch.bfloat16, 2, 2)],
                         ids=lambda x: str(x).replace("torch.", ""))
@kernel_test
def test_sketch_terms_match_float64_reference(seed, dtype, group, splits):
    """The shadow terms Σ t_j and max t_j of the robust certificate, in the kernel's finalisation (one split) and in
    the merge kernel (several), against float64; the plug-in outputs are unchanged by the sketch."""
    q, k, v, lp, c, lengths = make_case(seed, dtype, group=group)
    scale = q.shape[-1] ** -0.5
    sketch = make_sketch(seed, k, c)
    res = certified_decode(q, k, v, lp, c, scale, lengths=lengths, num_splits=splits, block_n=BLOCK_N, poison=True,
                           sketch=sketch)
    assert len(res) == 6 and res[4].shape == res[5].shape == q.shape[:3]
    ref, vs = reference(q, k, v, lp, c, scale, lengths)
    check_all(res[:4], ref, dtype, seed, var_scale=vs)
    sv, sr = sketch_reference(q, sketch, c, scale, ref)
    rtol = RTOL[dtype] * (3 if dtype != torch.float32 else 1)  # t_j = e^{U − lse}: the 16-bit lse error, exponentiated
    check("shadow_sum", res[4], sv, 2 * rtol, seed)
    check("shadow_range", res[5], sr, rtol, seed)
    assert torch.all(res[4][q.shape[0] - 1, group:2 * group] == 0)  # the head without a shadow


@kernel_test
def test_kernel_sketch_equals_torch_path(seed):
    q, k, v, lp, c, _ = make_case(seed, torch.float32, poison_padding=False)
    scale = q.shape[-1] ** -0.5
    sketch = make_sketch(seed, k, c)
    torch_res = hajek_attention(q, k, v, lp, scale, certificate=True, centre=c, sketch=sketch)
    res = certified_decode(q, k, v, lp, c, scale, num_splits=2, block_n=BLOCK_N, poison=True, sketch=sketch)
    check("shadow_sum", res[4], torch_res.shadow_sum.double(), 1e-5, seed)
    check("shadow_range", res[5], torch_res.shadow_range.double(), 1e-5, seed)


def cache_aux(k, v, lp, c, lengths):
    """What a cache keeps per slot beside log π: 1 − π and ‖v − c‖ (fp32; 0 on padding and past a head's length)."""
    invalid = ~torch.isfinite(lp) | (torch.arange(lp.shape[-1], device=lp.device) >= lengths.unsqueeze(-1))
    om = (-torch.expm1(lp.float())).clamp(min=0).masked_fill(invalid, 0.0)
    dev = torch.linalg.vector_norm(v.float() - c.unsqueeze(-2), dim=-1).masked_fill(invalid, 0.0)
    return om.contiguous(), dev.contiguous()


@pytest.mark.parametrize("dtype,splits", [(torch.float32, 1), (torch.float32, 3), (torch.bfloat16, 2)],
                         ids=["float32-1", "float32-3", "bfloat16-2"])
@kernel_test
def test_the_caches_one_minus_pi_and_deviation_are_read_not_recomputed(seed, dtype, splits):
    """Given the cache's 1 − π and ‖v − c‖, the kernel reads them (halving 1 − π halves V̂ and b̂_c exactly in
    the reference's terms) and matches float64 as when it recomputes them."""
    q, k, v, lp, c, lengths = make_case(seed, dtype, group=4)
    scale = q.shape[-1] ** -0.5
    om, dev = cache_aux(k, v, lp, c, lengths)
    res = certified_decode(q, k, v, lp, c, scale, lengths=lengths, num_splits=splits, block_n=BLOCK_N, poison=True,
                           one_minus=om, dev=dev)
    ref, vs = reference(q, k, v, lp, c, scale, lengths)
    check_all(res, ref, dtype, seed, var_scale=vs)
    half = certified_decode(q, k, v, lp, c, scale, lengths=lengths, num_splits=splits, block_n=BLOCK_N, poison=True,
                            one_minus=om * 0.5, dev=dev)
    check_all((res[0], res[1], half[2] * 2, half[3] * 2), ref, dtype, seed, var_scale=vs)
    with pytest.raises(ValueError, match="give both"):
        certified_decode(q, k, v, lp, c, scale, one_minus=om)


def stat_buffers(steps, b, hq, names=("variance", "range_term", "output_norm", "entropy")):
    """Per-step statistics buffers as a recorder keeps them: views of one tensor [T, F, B, Hq], NaN-filled."""
    flat = torch.full((steps, len(names), b, hq), float("nan"), device=DEVICE)
    return {name: flat[:, i] for i, name in enumerate(names)}


@pytest.mark.parametrize("splits", [1, 3])
@kernel_test
def test_a_plan_writes_each_steps_statistics_at_the_device_step_index(seed, splits):
    """A decode plan runs again over new queries, each run writing V̂, b̂_c, ‖ô‖ and the entropy at the row its
    device step index names (the other rows untouched), equal to what one call of the kernel returns; a query
    of another layout is refused (the compiled kernel is specialised for the planned one)."""
    from kvcert_kernels.certified_decode import decode_plan
    from kvcert_kernels.launch import QueryMismatch

    q, k, v, lp, c, lengths = make_case(seed, torch.float32, group=2)
    scale = q.shape[-1] ** -0.5
    b, hq = q.shape[:2]
    stats = stat_buffers(4, b, hq)
    step = torch.ones(1, dtype=torch.int32, device=DEVICE)
    plan = decode_plan(q, k, v, lp, c, scale, lengths, num_splits=splits, block_n=BLOCK_N, entropy=True,
                       stats=stats, step=step)
    queries = [q, torch.randn(q.shape, generator=_gen(seed + 1)).to(DEVICE)]
    for t, query in zip((1, 2), queries):
        step.fill_(t)
        out = plan.run(query)[0].clone()
        one = certified_decode(query, k, v, lp, c, scale, lengths=lengths, num_splits=splits, block_n=BLOCK_N,
                               entropy=True)
        assert torch.equal(out, one[0])
        for name, got in (("variance", one[2]), ("range_term", one[3]), ("entropy", one[4])):
            assert torch.equal(stats[name][t], got.reshape(b, hq)), name
        ref = decode_reference(query, k, v, lp, c, scale, lengths)[0]
        check("output_norm", stats["output_norm"][t], torch.linalg.vector_norm(ref, dim=-1), 1e-5, seed)
    assert all(torch.isnan(buf[0]).all() and torch.isnan(buf[3]).all() for buf in stats.values())
    with pytest.raises(QueryMismatch, match="layout or alignment"):
        plan.run(q[:, :, 0])
    with pytest.raises(ValueError, match="stats: entropy missing"):
        decode_plan(q, k, v, lp, c, scale, entropy=True, stats={n: stats[n] for n in ("variance", "range_term")},
                    step=step)


#: every group size packs (1, 2, 4, 5) or takes the 32-row tile (6, 7) in some dtype; each dtype both ways
PACKED_CASES = [(torch.float32, 1), (torch.float32, 5), (torch.float32, 7), (torch.bfloat16, 2), (torch.bfloat16, 4),
                (torch.bfloat16, 6), (torch.float16, 4), (torch.float16, 7)]


@pytest.mark.parametrize("dtype,group", PACKED_CASES, ids=lambda x: str(x).replace("torch.", ""))
@kernel_test
def test_packed_certificate_rows_match_float64_reference(seed, dtype, group):
    """The certificate packed into the p·V product's rows ([p; r_hi; r_lo], or [p; r] in fp32: 16 rows up to a group
    of 5 in a 16-bit cache, 8 in fp32, 32 beyond) and the separate products (``packed=False``), one split and
    several, against float64 with padding, ragged and lone-token heads; plan_decode packs by default exactly where
    the packed rows fit 16."""
    from kvcert_kernels.certified_decode import packs, plan_decode, tile_rows

    q, k, v, lp, c, lengths = make_case(seed, dtype, group=group, hkv=3)
    scale = q.shape[-1] ** -0.5
    ref, vs = reference(q, k, v, lp, c, scale, lengths)
    kinds = 2 if dtype == torch.float32 else 3
    assert packs(group, dtype, True) == (kinds * group <= 16) and not packs(group, dtype, False)
    for packed in (True, False):
        launches, _ = plan_decode(q, k, v, lp, c, scale, lengths, num_splits=3, block_n=BLOCK_N, packed=packed)
        assert launches[0].kwargs["PACKED"] is packed
        rows = kinds * group if packed else group
        assert launches[0].kwargs["G_PAD"] == tile_rows(group, dtype, packed) == max(16, 1 << (rows - 1).bit_length())
        for splits in ((1, 3) if packed else (2,)):
            res = certified_decode(q, k, v, lp, c, scale, lengths=lengths, num_splits=splits, block_n=BLOCK_N,
                                   poison=True, packed=packed)
            check_all(res, ref, dtype, seed, var_scale=vs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@kernel_test
def test_parallel_merge_at_many_splits(seed, dtype):
    """The merge (a program per query row, the splits' state read BLOCK_S at a time) at 1 to 5 and 60 splits (two
    blocks of 32, the last partly masked, several splits past a ragged head's length and an empty head), with the
    entropy, the sketch, the cache's 1 − π and ‖v − c‖, and the statistics written at a device step index:
    every result against float64 (the sketch's terms as in test_sketch_terms_match_float64_reference)."""
    from kvcert_kernels.certified_decode import chunking, decode_plan

    rtol = RTOL[dtype]
    # 60 splits (two blocks of the merge's 32) in the dtype the paper's runs use; 1 to 5 in fp32
    for splits in ((1, 2, 3, 4, 5) if dtype == torch.float32 else (1, 3, 60)):
        if splits in (1, 60):  # 77 keys: at most 5 blocks of 16; 950 keys: 60 splits of one block (hkv 2: fewer programs)
            q, k, v, lp, c, lengths = make_case(seed, dtype, group=4, batch=2, hkv=3 if splits == 1 else 2,
                                                length=77 if splits == 1 else 950)
            lengths[1, 0] = 0  # an empty head
            scale = q.shape[-1] ** -0.5
            om, dev = cache_aux(k, v, lp, c, lengths)
            sketch = make_sketch(seed, k, c)
            b, hq = q.shape[:2]
            ref, vs = reference(q, k, v, lp, c, scale, lengths)
            sv, sr = sketch_reference(q, sketch, c, scale, ref)
            ent = entropy_reference(q, k, lp, scale, lengths)
        if splits == 60:
            assert chunking(k.shape[2], splits, BLOCK_N) == (16, 60)
        stats = stat_buffers(3, b, hq, names=("variance", "range_term", "output_norm", "shadow_sum", "shadow_range",
                                              "entropy"))
        step = torch.full((1,), 2, dtype=torch.int32, device=DEVICE)
        plan = decode_plan(q, k, v, lp, c, scale, lengths, num_splits=splits, block_n=BLOCK_N, entropy=True,
                           sketch=sketch, one_minus=om, dev=dev, stats=stats, step=step, poison=True)
        assert len(plan.launches) == (1 if splits == 1 else 2)
        assert all(launch.args[0] is q for launch in plan.launches)
        out, lse = plan.run()[:2]
        got = (out, lse, stats["variance"][2], stats["range_term"][2])
        check_all(got, ref, dtype, seed, var_scale=vs)
        check("output_norm", stats["output_norm"][2], torch.linalg.vector_norm(ref[0], dim=-1), rtol, seed)
        check("entropy", stats["entropy"][2], ent, 1e-5, seed, floor=torch.full((), 0.1))
        srtol = rtol * (3 if dtype != torch.float32 else 1)
        check("shadow_sum", stats["shadow_sum"][2], sv, 2 * srtol, seed)
        check("shadow_range", stats["shadow_range"][2], sr, srtol, seed)
        assert all(torch.isnan(t[[0, 1]]).all() for t in stats.values())  # only the step's row is written


def test_wave_efficiency_of_the_split_policy_on_the_paper_shapes():
    """The split policy fills the resident program slots of an H100 / H200 (132 SMs × the configuration's programs
    per SM) to ≥ 0.85 at every paper shape — KV heads 8 (Llama-3.1-8B, Mistral-7B: 32 query heads), 4 (Qwen2.5-7B:
    28), 2 (Qwen2.5-1.5B: 12), head size 128, bf16; batch 1, 8, 13; 4k, 32k, 128k retained; with and without the
    certificate — wherever its grid can fill one wave at all (B·Hkv·most splits ≥ slots). Skipped, as no split
    count can fill a wave there: 4k tokens at batch 1 (every model) and batch 8 with 2 KV heads, and 32k at batch 1
    with 2 KV heads (64-key tiles, ≥ 4 a split: at most 16 splits at 4k, 128 at 32k, on 264 slots)."""
    from kvcert_kernels import wave_efficiency
    from kvcert_kernels.certified_decode import launch_config, max_splits, split_policy
    from kvcert_kernels.launch import emulating

    checked, skipped = [], []
    with emulating(sms=132):
        for kv_heads, query_heads in ((8, 32), (4, 28), (2, 12)):
            for certificate in (True, False):
                cfg = launch_config(128, 128, query_heads // kv_heads, torch.bfloat16, certificate=certificate,
                                    sketch=False, entropy=False, arch=90)
                slots = 132 * cfg.ctas_per_sm
                for batch in (1, 8, 13):
                    for retained in (4096, 32768, 131072):
                        shape = (kv_heads, certificate, batch, retained)
                        if batch * kv_heads * max_splits(retained, cfg.block_n) < slots:
                            skipped.append(shape)
                            continue
                        eff = wave_efficiency(batch, kv_heads, retained, cfg, 132)
                        splits = split_policy(batch, kv_heads, retained, cfg.block_n, slots)
                        assert eff == wave_efficiency(batch, kv_heads, retained, cfg, 132, splits)
                        assert eff >= 0.85, (shape, splits, eff)
                        checked.append(shape)
    assert len(checked) == 44 and {(kv, b, n) for kv, _, b, n in skipped} == {
        (8, 1, 4096), (4, 1, 4096), (2, 1, 4096), (2, 8, 4096), (2, 1, 32768)}
    # the definition: programs / (waves × slots), the splits chunked as plan_decode chunks them (33 requested over
    # 512 blocks of 64 keys: 16 blocks a split, 32 splits; 35: 15 blocks, 35 splits, two waves)
    cfg = launch_config(128, 128, 4, torch.bfloat16, certificate=True, sketch=False, entropy=False, arch=90)
    slots = 132 * cfg.ctas_per_sm
    assert cfg.block_n == 64 and slots == 264
    assert wave_efficiency(1, 8, 32768, cfg, 132, num_splits=33) == 8 * 32 / slots
    assert wave_efficiency(1, 8, 32768, cfg, 132, num_splits=35) == 8 * 35 / (2 * slots)


def test_an_emulated_gpu_records_the_planned_launches_and_runs_none():
    """Under ``emulating`` a plan is made as for the emulated GPU (its split policy) and its launches go to the
    recorder, on any device; nothing is computed (the buffers keep what they held)."""
    from kvcert_kernels.certified_decode import decode_plan, default_num_splits, launch_config
    from kvcert_kernels.launch import emulating

    b, hq, hkv, length, d = 1, 32, 8, 32768, 128
    q = torch.randn(b, hq, 1, d, dtype=torch.bfloat16)
    k = torch.zeros(b, hkv, length, d, dtype=torch.bfloat16)
    lp = torch.zeros(b, hkv, length)
    seen = []
    with emulating(arch=90, sms=132, record=seen.append):
        plan = decode_plan(q, k, k, lp, torch.zeros(b, hkv, d), d**-0.5)
        assert all(launch.args[0] is q for launch in plan.launches)  # a plan swaps argument 0 only
        plan.results[0].fill_(7.0)
        plan.run(q)
        plan.run(q.clone())
        cfg = launch_config(d, d, hq // hkv, torch.bfloat16, certificate=True, sketch=False, entropy=False, arch=90)
        splits = default_num_splits(b, hkv, length, q.device, cfg.block_n, cfg.ctas_per_sm)
    assert splits > 1
    assert [launch.grid for launch in seen] == [(b * hkv, splits), (b * hq,)] * 2  # the merge: a program per query row
    assert seen[2].args[0] is not q and seen[2].args[1:] == seen[0].args[1:]
    assert torch.all(plan.results[0] == 7.0)  # nothing ran


def test_the_kernels_package_imports_nothing_of_kvcert():
    """kvcert imports kvcert_kernels (kvcert.method.attention), never the other way round."""
    import ast

    for path in sorted((Path(__file__).resolve().parents[1] / "kernels").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            assert not [n for n in names if n == "kvcert" or n.startswith("kvcert.")], (path.name, names)


def test_kernel_module_is_importable_by_package_name():
    mod = importlib.import_module("kvcert_kernels.certified_decode")
    assert mod.certified_decode is certified_decode
    assert importlib.import_module("kvcert.bench.kernel_timing").run_benchmark


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU this is the benchmark itself (kernels/gpu_check.sh)")
def test_bench_kernel_without_gpu_says_so(capsys):
    from kvcert.cli import main

    assert main(["bench", "kernel"]) != 0  # nothing measured is a failure
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "GPU" in lines[0] and "nothing measured" in lines[0]
