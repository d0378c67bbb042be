#!/usr/bin/env bash
# One-shot GPU check of the fused certified decode kernel (issue 5; see kernels/NOTES.md):
#   1. the kernel tests, compiled on the GPU (TRITON_INTERPRET unset);
#   2. the benchmark (`kvcert bench kernel`, run as `python -m kvcert.cli bench kernel`);
#   3. the forked generation path against the batch-1 one (`kvcert bench generate` on the GPU:
#      one prefill per example, its 13 runs decoded together; issue 16), into generate.txt;
#   4. a short sweep of launch parameters (block size, warps, stages, splits); QUICK=1 skips it.
# Usage: kernels/gpu_check.sh OUTDIR      (PYTHON=... to choose the interpreter)
# Writes OUTDIR/env.txt, tests.txt, bench.txt, bench.json, generate.txt, tune.txt, tune.json.
# Installs nothing: if kvcert / kvcert_kernels are not importable it tries an editable
# install without dependencies or build isolation, else puts src/ and a kernels/ alias on
# PYTHONPATH. Exit status 0 only if the tests pass and the benchmark ran. The step timeouts
# add up to 570 s, inside one 600 s device command; expect about 4-5 minutes in all.
set -uo pipefail

out="${1:?usage: kernels/gpu_check.sh OUTDIR}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cd "$(dirname "$0")/.."
unset TRITON_INTERPRET
PY="${PYTHON:-python}"

{
    date -u
    git rev-parse HEAD 2>/dev/null || true
    nvidia-smi || true
    "$PY" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
} > "$out/env.txt" 2>&1

if ! "$PY" -c "import kvcert, kvcert_kernels" > /dev/null 2>&1; then
    if ! "$PY" -m pip install --no-deps --no-build-isolation -e . > "$out/install.txt" 2>&1 \
        || ! "$PY" -c "import kvcert, kvcert_kernels" > /dev/null 2>&1; then
        shim="$out/.pyshim"
        mkdir -p "$shim"
        ln -sfn "$PWD/kernels" "$shim/kvcert_kernels"
        export PYTHONPATH="$PWD/src:$shim${PYTHONPATH:+:$PYTHONPATH}"
        echo "using PYTHONPATH=$PYTHONPATH" >> "$out/env.txt"
    fi
fi

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA device visible to $PY" | tee -a "$out/env.txt"
    exit 1
fi

status=0
echo "== kernel tests (compiled, on the GPU)"
timeout 200 "$PY" -m pytest -q -p no:cacheprovider tests/test_kernel.py 2>&1 | tee "$out/tests.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== benchmark"
timeout 220 "$PY" -m kvcert.cli bench kernel --output "$out/bench.json" 2>&1 | tee "$out/bench.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== forked generation vs batch-1 (kvcert bench generate, on the GPU)"
timeout 60 "$PY" -m kvcert.cli bench generate --device cuda --threads 4 --examples 2 --repeats 1 --long 16384 2>&1 \
    | tee "$out/generate.txt"

if [ -z "${QUICK:-}" ]; then
    echo "== launch-parameter sweep"
    timeout 90 "$PY" -m kvcert.cli bench kernel --batch 1 --retained 4096 --tune --output "$out/tune.json" 2>&1 \
        | tee "$out/tune.txt"
fi
exit "$status"
