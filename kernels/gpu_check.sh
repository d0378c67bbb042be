#!/usr/bin/env bash
# One-shot GPU check of the fused certified decode kernel (docs/gpu.md, kernels/NOTES.md):
#   1. the compile-only table for this GPU's architecture (`kvcert bench kernel --compile-only`:
#      registers, stack, shared memory, occupancy of every bf16 variant), into compile.txt;
#   2. the kernel tests, compiled on the GPU (TRITON_INTERPRET unset), into tests.txt;
#   3. the benchmark (`kvcert bench kernel`): certified vs plain vs SDPA, and each time over the
#      roofline time (bytes read / the GPU's peak bandwidth), into bench.txt;
#   4. the forked generation path against the batch-1 one (`kvcert bench generate` on the GPU),
#      into generate.txt;
#   5. a short sweep of launch parameters (block size, warps, stages, splits); QUICK=1 skips it.
# Usage: kernels/gpu_check.sh OUTDIR      (PYTHON=... to choose the interpreter)
# Writes OUTDIR/env.txt, compile.txt, compile.json, tests.txt, bench.txt, bench.json, generate.txt,
# tune.txt, tune.json. Installs nothing: if kvcert / kvcert_kernels are not importable it tries an
# editable install without dependencies or build isolation, else puts src/ and a kernels/ alias on
# PYTHONPATH. Exit status 0 only if the compile table, the tests and the benchmark all pass. The
# step timeouts add up to 450 s (under 8 minutes), inside one 600 s device command.
set -uo pipefail

out="${1:?usage: kernels/gpu_check.sh OUTDIR}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cd "$(dirname "$0")/.."
unset TRITON_INTERPRET
export TRITON_DEFAULT_FP_FUSION="${TRITON_DEFAULT_FP_FUSION:-1}"
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

if ! arch="$("$PY" -c "import torch, sys; sys.exit(1) if not torch.cuda.is_available() else print('%d%d' % torch.cuda.get_device_capability())")"; then
    echo "gpu_check: no CUDA device visible to $PY" | tee -a "$out/env.txt"
    exit 1
fi
case "$arch" in 80|90) archs="$arch" ;; *) archs="80 90" ;; esac  # the table's limits are sm_80's and sm_90's
echo "compute capability $arch; compile table for: $archs" | tee -a "$out/env.txt"

status=0
echo "== compile-only table (sm_$archs, bf16)"
# shellcheck disable=SC2086
timeout 60 "$PY" -m kvcert.cli bench kernel --compile-only --arch $archs --dtypes bfloat16 --jobs 8 \
    --cache "$out/triton-cache" --output "$out/compile.json" 2>&1 | tee "$out/compile.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== kernel tests (compiled, on the GPU)"
timeout 150 "$PY" -m pytest -q -p no:cacheprovider -m kernel tests/test_kernel.py 2>&1 | tee "$out/tests.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== benchmark (and kernel time over the roofline)"
timeout 110 "$PY" -m kvcert.cli bench kernel --batch 1 8 --retained 4096 32768 131072 --output "$out/bench.json" 2>&1 \
    | tee "$out/bench.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== forked generation vs batch-1 (kvcert bench generate, on the GPU)"
timeout 50 "$PY" -m kvcert.cli bench generate --device cuda --threads 4 --examples 2 --repeats 1 --long 16384 2>&1 \
    | tee "$out/generate.txt"

if [ -z "${QUICK:-}" ]; then
    echo "== launch-parameter sweep"
    timeout 80 "$PY" -m kvcert.cli bench kernel --batch 1 --retained 32768 --tune --output "$out/tune.json" 2>&1 \
        | tee "$out/tune.txt"
fi
exit "$status"
