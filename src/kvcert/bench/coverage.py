"""``kvcert bench coverage``: the plug-in and the robust certificate on later queries, side by side.

A synthetic heavy-tailed harness (seeded; float64 through the public path:
:func:`kvcert.method.design.inclusion_probabilities`, :func:`kvcert.method.design.poisson_sample`, the
eviction sketch of :mod:`kvcert.method.sketch` and :func:`kvcert.method.attention.hajek_attention`):

* one head per (N, concentration β, instance): keys k_i = λ_i g_i with g_i ~ N(0, I_d) and
  λ_i = (χ²_ν/ν)^(−1/2), so that the logits q·k_i of any query are Student-t (ν = 3:
  heavy-tailed); values v_i ~ N(0, I_d); the setting query q0 = β u (u a random unit
  vector; β sets how concentrated the head is, from diffuse 0.5 to concentrated 2);
* π from q0's attention (the query that set π), the pre-registered design (sinks 4,
  window 32, top slice 0.25, floor 0.1) at budgets 12.5 / 25 / 50 %; ``draws`` Poisson
  samples per head and budget;
* queries: q0 itself ("setting") and, per ρ ∈ {0.9, 0.6, 0.3}, ``later`` queries
  q1 = ρ q0 + √(1 − ρ²) z, z ~ N(0, (β²/d) I), drawn independently of the samples;
* the eviction sketch of each draw: the shadow of :func:`kvcert.method.sketch.shadow_count`
  (the memory budget at fp32 keys and values), chosen by the library's selection score
  (:func:`kvcert.method.sketch.sketch_potential`; the observation window is q0 alone). Token
  order carries no information here, so the successor allowance spends part of the
  shadow on unrelated tokens: the harness measures the method as shipped.

Per budget × query kind it prints the coverage (share of draws × queries with
‖ô − o‖ ≤ ε) and the median ε/‖ô − o‖ of both certificates. Draws whose error is below
float64 resolution (‖ô − o‖ ≤ 1e-12 · max‖v_i‖: a head carried by one certain token) count
as covered and are left out of the tightness. The last line is
``plugin_later_rho09_min=… robust_later_rho09_min=… robust_setting_min=… robust_tightness_median=…``:
the lowest coverage over budgets on later queries at ρ = 0.9 (plug-in, robust), on
setting queries (robust), and the robust certificate's median ε/error on setting queries.
"""

from __future__ import annotations

import math
import time

# torch and the library are imported inside the functions, so `kvcert --help` stays fast.

BUDGETS = (0.125, 0.25, 0.5)
RHOS = (0.9, 0.6, 0.3)
SIZES = (1024, 2048, 4096, 8192)
BETAS = (0.5, 1.0, 1.5, 2.0)
DIM = 64
NU = 3
#: errors at or below this × max‖v_i‖ are float64 rounding, not eviction error
RESOLUTION = 1e-12


def make_head(gen, n: int, d: int, beta: float, nu: int = NU):
    """Keys with Student-t logits (a χ² scale mixture), Gaussian values, the setting query of norm β (float64)."""
    import torch

    f64 = torch.float64
    g = torch.randn(n, d, generator=gen, dtype=f64)
    lam = (torch.randn(n, nu, generator=gen, dtype=f64).pow(2).sum(-1) / nu).rsqrt()
    keys = g * lam.unsqueeze(-1)
    values = torch.randn(n, d, generator=gen, dtype=f64)
    u = torch.randn(d, generator=gen, dtype=f64)
    return keys, values, beta * u / torch.linalg.vector_norm(u)


def later_queries(gen, q0, rho: float, count: int):
    """q1 = ρ q0 + √(1 − ρ²) z with z ~ N(0, (‖q0‖²/d) I): ``count`` queries [count, d]."""
    import torch

    d = q0.shape[0]
    z = torch.randn(count, d, generator=gen, dtype=q0.dtype) * (torch.linalg.vector_norm(q0) / math.sqrt(d))
    return rho * q0 + math.sqrt(1.0 - rho * rho) * z


def evaluate_head(keys, values, queries, pi, draws: int, gen, delta: float, slots: int, chunk: int = 25) -> dict:
    """Both certificates for ``queries`` [Q, d] on ``draws`` Poisson samples of π: errors and radii [draws, Q]."""
    import torch

    from ..method.attention import hajek_attention
    from ..method.certificate import bernstein_radius, robust_radius, unit_roundoff
    from ..method.design import poisson_sample
    from ..method.sketch import build_sketch, sketch_potential

    f64 = torch.float64
    n, d = keys.shape
    exact = torch.softmax(queries @ keys.T, -1) @ values  # [Q, d]
    sample = poisson_sample(pi.expand(draws, -1).contiguous(), gen)
    kept = sample.kept_mask()
    potential = sketch_potential(queries[:1].unsqueeze(0), keys.unsqueeze(0), 1.0)[0]  # q0 is the window
    out = {"error": [], "radius": [], "robust": []}
    for d0 in range(0, draws, chunk):
        d1 = min(draws, d0 + chunk)
        idx = sample.indices[d0:d1].unsqueeze(1)  # [nd, 1, K]
        ks = keys[idx]  # [nd, 1, K, d]
        vs = values[idx]
        lp = sample.log_pi[d0:d1].unsqueeze(1).to(f64)
        mask = kept[d0:d1].to(f64)
        centre = ((mask @ values) / mask.sum(-1, keepdim=True)).unsqueeze(1)  # [nd, 1, d]
        evicted = (~kept[d0:d1] & (pi < 1)).unsqueeze(1)
        nd = d1 - d0
        sketch = build_sketch(keys.expand(nd, 1, n, d), values.expand(nd, 1, n, d), evicted,
                              potential.expand(nd, 1, n), centre, slots)
        q = queries.expand(nd, 1, -1, -1)
        res = hajek_attention(q, ks, vs, lp, 1.0, causal=False, certificate=True, centre=centre, sketch=sketch)
        out["error"].append(torch.linalg.vector_norm(res.output[:, 0] - exact, dim=-1))
        out["radius"].append(bernstein_radius(res.variance, res.range_term, delta)[:, 0])
        floor = unit_roundoff(f64) * torch.linalg.vector_norm(res.output, dim=-1)
        out["robust"].append(robust_radius(res.variance, res.range_term, res.shadow_sum, delta, floor=floor)[:, 0])
    result = {k: torch.cat(v) for k, v in out.items()}
    result["floor"] = RESOLUTION * float(torch.linalg.vector_norm(values, dim=-1).max())
    return result


def run_harness(sizes=SIZES, betas=BETAS, instances: int = 3, draws: int = 200, later: int = 3, seed: int = 0,
                delta: float = 0.1, budgets=BUDGETS, rhos=RHOS) -> dict:
    """{(budget, kind): {"plugin": (covered, ratio), "robust": (covered, ratio), "beta": ...}} pooled over heads."""
    import torch

    from ..method.design import DEFAULT_DESIGN, inclusion_probabilities
    from ..method.sketch import shadow_count

    gen = torch.Generator().manual_seed(seed)
    cells: dict = {}
    for n in sizes:
        slots = shadow_count(n, 2 * DIM * 4, DIM)  # fp32 keys and values
        for beta in betas:
            for _ in range(instances):
                keys, values, q0 = make_head(gen, n, DIM, beta)
                kinds = {"setting": q0.unsqueeze(0)}
                for rho in rhos:
                    kinds[f"later_rho{rho:g}"] = later_queries(gen, q0, rho, later)
                queries = torch.cat(list(kinds.values()))
                importance = torch.softmax(keys @ q0, -1)
                for budget in budgets:
                    pi = inclusion_probabilities(importance, budget, DEFAULT_DESIGN)
                    res = evaluate_head(keys, values, queries, pi, draws, gen, delta, slots)
                    col = 0
                    for kind, q in kinds.items():
                        sl = slice(col, col + q.shape[0])
                        col += q.shape[0]
                        err = res["error"][:, sl].reshape(-1)
                        exact = err <= res["floor"]
                        cell = cells.setdefault((budget, kind), {"plugin": ([], []), "robust": ([], []), "beta": []})
                        for name, key in (("plugin", "radius"), ("robust", "robust")):
                            rad = res[key][:, sl].reshape(-1)
                            cell[name][0].append((err <= rad) | exact)
                            cell[name][1].append(torch.where(exact, float("nan"), rad / err))
                        cell["beta"].append(torch.full_like(err, beta))
    for cell in cells.values():
        for name in ("plugin", "robust"):
            cell[name] = tuple(torch.cat(x) for x in cell[name])
        cell["beta"] = torch.cat(cell["beta"])
    return cells


def _median(ratio) -> float:
    import torch

    r = ratio[torch.isfinite(ratio)]
    return float(r.median()) if r.numel() else math.nan


def summary(cells: dict, budgets=BUDGETS, rhos=RHOS) -> dict:
    """The last line's four numbers."""
    import torch

    rho09 = f"later_rho{0.9:g}"
    setting = [cells[(b, "setting")]["robust"] for b in budgets]
    return {
        "plugin_later_rho09_min": min(float(cells[(b, rho09)]["plugin"][0].double().mean()) for b in budgets),
        "robust_later_rho09_min": min(float(cells[(b, rho09)]["robust"][0].double().mean()) for b in budgets),
        "robust_setting_min": min(float(c[0].double().mean()) for c in setting),
        "robust_tightness_median": _median(torch.cat([c[1] for c in setting])),
    }


def run(args) -> int:
    from . import check_counts

    check_counts(args, sizes=1, instances=1, draws=1, later=1, threads=1)
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads or 1)
    t0 = time.perf_counter()
    try:
        with torch.no_grad():
            cells = run_harness(sizes=args.sizes, instances=args.instances, draws=args.draws, later=args.later,
                                seed=args.seed)
    finally:
        torch.set_num_threads(threads)
    print(f"heavy-tailed harness: d={DIM}, t_{NU} logits, N {args.sizes}, β {list(BETAS)}, {args.instances} heads each, "
          f"{args.draws} Poisson draws per head and budget, {args.later} later queries per ρ; δ = 0.1")
    print(f"{'budget':>6} {'query':>14} {'n':>6} {'plugin cov':>10} {'ε/err':>6} {'robust cov':>10} {'ε/err':>6}"
          f"   robust cov by β")
    for b in BUDGETS:
        for kind in ["setting", *[f"later_rho{r:g}" for r in RHOS]]:
            c = cells[(b, kind)]
            pc, pr = c["plugin"]
            rc, rr = c["robust"]
            by_beta = " ".join(f"{beta:g}:{float(rc[c['beta'] == beta].double().mean()):.3f}" for beta in BETAS)
            print(f"{b:>6g} {kind:>14} {pc.numel():>6} {float(pc.double().mean()):>10.3f} {_median(pr):>6.2f} "
                  f"{float(rc.double().mean()):>10.3f} {_median(rr):>6.2f}   {by_beta}")
    s = summary(cells)
    print(f"({time.perf_counter() - t0:.0f} s)")
    print(" ".join(f"{k}={v:.3f}" for k, v in s.items()))
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("coverage", help="plug-in vs robust certificate coverage on later queries (synthetic, CPU)")
    p.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="token counts N of the heads")
    p.add_argument("--instances", type=int, default=3, help="heads per (N, β)")
    p.add_argument("--draws", type=int, default=200, help="Poisson draws per head and budget")
    p.add_argument("--later", type=int, default=3, help="later queries per ρ and head")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.set_defaults(func=run)
