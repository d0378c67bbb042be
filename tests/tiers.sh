#!/usr/bin/env bash
# The test suite, tier by tier, in order (docs/testing.md): a failing tier is named, and the run stops there.
#   bash tests/tiers.sh            every tier
#   bash tests/tiers.sh unit slow  some of them
# A tier that selects no test fails (pytest exit 5), unless named in KVCERT_TIERS_MAY_BE_EMPTY.
set -uo pipefail
cd "$(dirname "$0")/.."
declare -A SELECT=(
    [unit]="not kernel and not pipeline and not slow and not slurm and not gpu_compile"
    [kernel]="kernel and not pipeline and not slow"
    [pipeline]="pipeline and not slow and not slurm and not gpu_compile"
    [slow]="slow and not slurm and not gpu_compile"
    [slurm]="slurm"
    [compile]="gpu_compile"
)
ORDER=(unit kernel pipeline slow slurm compile)
# the compile tier's Triton cache: one per run unless the caller keeps one (KVCERT_COMPILE_CACHE)
export KVCERT_COMPILE_CACHE=${KVCERT_COMPILE_CACHE:-$(mktemp -d)}
tiers=("$@")
[[ ${#tiers[@]} -eq 0 ]] && tiers=("${ORDER[@]}")
summary=()
for tier in "${tiers[@]}"; do
    if [[ -z ${SELECT[$tier]+x} ]]; then
        echo "tests/tiers.sh: unknown tier '$tier'; the tiers are: ${ORDER[*]}" >&2
        exit 2
    fi
    echo "=== tier $tier: pytest -m \"${SELECT[$tier]}\""
    start=$SECONDS
    python -m pytest -q -p no:cacheprovider -m "${SELECT[$tier]}" 2>&1 | tee ".tier-$tier.log"
    rc=${PIPESTATUS[0]}
    line=$(grep -E '(passed|failed|error|no tests ran|deselected)' ".tier-$tier.log" | tail -1)
    rm -f ".tier-$tier.log"
    summary+=("tier $tier ($((SECONDS - start)) s): ${line:-no summary}")
    if [[ $rc -eq 5 && " ${KVCERT_TIERS_MAY_BE_EMPTY:-} " == *" $tier "* ]]; then
        rc=0  # 5: no test selected, and the caller said this tier may select none
    elif [[ $rc -eq 5 ]]; then
        summary+=("tier $tier selected no test: a tier that runs nothing does not pass"
                  "(KVCERT_TIERS_MAY_BE_EMPTY=\"$tier\" allows it)")
    fi
    if [[ $rc -ne 0 ]]; then
        printf '%s\n' "${summary[@]}"
        echo "tier $tier failed (pytest exit code $rc)"
        exit "$rc"
    fi
done
printf '%s\n' "${summary[@]}"
