#!/usr/bin/env bash
# The test suite, tier by tier, in order (docs/testing.md); a failing tier is named, and the run stops there.
#   bash tests/tiers.sh            every tier
#   bash tests/tiers.sh unit slow  some of them
# Every tier but compile runs in one pytest process (tests/tier_order.py orders the tests by tier, stops after a
# failing tier and prints a line per tier); compile runs in its own, since Triton's compiler needs
# TRITON_INTERPRET unset, while without a GPU the kernel tier runs the kernels in Triton's CPU interpreter, which
# needs TRITON_INTERPRET=1 before triton is first imported.
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
pytest_tiers() {  # $1: comma-separated tiers; the rest: environment assignments for that run
    local list=$1
    shift
    echo "=== tiers ${list//,/, }"
    env "$@" python -m pytest -q -p no:cacheprovider -p tier_order -m "" --tiers "$list"
}
if [[ ${#together[@]} -gt 0 ]]; then
    interpret=()
    if [[ " ${together[*]} " == *" kernel "* ]] && ! nvidia-smi -L >/dev/null 2>&1; then
        interpret=(TRITON_INTERPRET=1)  # no GPU: the kernel tier runs in Triton's CPU interpreter, in this process
    fi
    list=$(IFS=,; echo "${together[*]}")
    pytest_tiers "$list" "${interpret[@]}"
    rc=$?
    if [[ $rc -ne 0 ]]; then
        echo "tests/tiers.sh: tiers $list: pytest exit code $rc (the tier summary above names the failing tier)"
        exit "$rc"
    fi
fi
if [[ $compile -eq 1 ]]; then
    pytest_tiers compile -u TRITON_INTERPRET
    rc=$?
    if [[ $rc -ne 0 ]]; then
        echo "tests/tiers.sh: tier compile: pytest exit code $rc"
        exit "$rc"
    fi
fi
