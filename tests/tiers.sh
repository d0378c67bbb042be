#!/usr/bin/env bash
# The test suite, tier by tier, in order (docs/testing.md); a failing tier is named, and the run stops there.
#   bash tests/tiers.sh            every tier
#   bash tests/tiers.sh unit slow  some of them
# Every tier but compile runs in one pytest run (tests/tier_order.py orders the tests by tier, stops after a
# failing tier and prints a line per tier), on KVCERT_TEST_WORKERS pytest-xdist workers (default: one per CPU; 0
# runs in one process) that take whole test modules in tier order. Compile runs in a pytest of its own, started
# first and beside the others (it compiles on one CPU; its output is printed when it ends), since Triton's compiler
# needs TRITON_INTERPRET unset, while without a GPU the kernel tier runs the kernels in Triton's CPU interpreter,
# which needs TRITON_INTERPRET=1 before triton is first imported.
# A tier that selects no test fails (exit 5), unless named in KVCERT_TIERS_MAY_BE_EMPTY.
set -uo pipefail
cd "$(dirname "$0")/.."
ORDER=(unit kernel pipeline slow slurm compile)
# the compile tier's Triton cache: one per run unless the caller keeps one (KVCERT_COMPILE_CACHE)
export KVCERT_COMPILE_CACHE=${KVCERT_COMPILE_CACHE:-$(mktemp -d)}
export PYTHONPATH="tests${PYTHONPATH:+:$PYTHONPATH}"  # the tier plugin, tests/tier_order.py
tiers=("$@")
[[ ${#tiers[@]} -eq 0 ]] && tiers=("${ORDER[@]}")
together=() compile=0
for tier in "${tiers[@]}"; do
    if [[ " ${ORDER[*]} " != *" $tier "* ]]; then
        echo "tests/tiers.sh: unknown tier '$tier'; the tiers are: ${ORDER[*]}" >&2
        exit 2
    fi
    if [[ $tier == compile ]]; then compile=1; else together+=("$tier"); fi
done
WORKERS=${KVCERT_TEST_WORKERS:-$(nproc 2>/dev/null || echo 1)}
pytest_tiers() {  # $1: comma-separated tiers; $2: xdist workers (0: none); the rest: environment assignments
    local list=$1 workers=$2
    shift 2
    local parallel=()
    [[ $workers -gt 1 ]] && parallel=(-n "$workers" --dist loadscope)
    echo "=== tiers ${list//,/, }${parallel:+ ($workers workers)}"
    env "$@" python -m pytest -q -p no:cacheprovider -p tier_order -m "" --tiers "$list" "${parallel[@]}"
}
compile_log="" compile_pid=""
if [[ $compile -eq 1 ]]; then
    if [[ ${#together[@]} -gt 0 ]]; then  # beside the others; its output when it ends
        compile_log=$(mktemp)
        pytest_tiers compile 0 -u TRITON_INTERPRET >"$compile_log" 2>&1 &
        compile_pid=$!
    else
        pytest_tiers compile 0 -u TRITON_INTERPRET
        rc=$?
        [[ $rc -ne 0 ]] && echo "tests/tiers.sh: tier compile: pytest exit code $rc"
        exit "$rc"
    fi
fi
if [[ ${#together[@]} -gt 0 ]]; then
    interpret=()
    if [[ " ${together[*]} " == *" kernel "* ]] && ! nvidia-smi -L >/dev/null 2>&1; then
        interpret=(TRITON_INTERPRET=1)  # no GPU: the kernel tier runs in Triton's CPU interpreter, in this run
    fi
    list=$(IFS=,; echo "${together[*]}")
    pytest_tiers "$list" "$WORKERS" "${interpret[@]}"
    rc=$?
    if [[ $rc -ne 0 ]]; then
        if [[ -n $compile_pid ]]; then  # the run has failed: the compile tier is not waited for
            pkill -TERM -P "$compile_pid" 2>/dev/null
            kill "$compile_pid" 2>/dev/null
            wait "$compile_pid" 2>/dev/null
            rm -f "$compile_log"
        fi
        echo "tests/tiers.sh: tiers $list: pytest exit code $rc (the tier summary above names the failing tier)"
        exit "$rc"
    fi
fi
if [[ -n $compile_pid ]]; then
    wait "$compile_pid"
    rc=$?
    cat "$compile_log"
    rm -f "$compile_log"
    if [[ $rc -ne 0 ]]; then
        echo "tests/tiers.sh: tier compile: pytest exit code $rc"
        exit "$rc"
    fi
fi
