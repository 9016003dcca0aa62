#!/usr/bin/env bash
# Nsight Compute on one step: the metrics the notes cite (bench/ncu_table.py lists them), for that
# step's kernels only, printed as a table (one row per metric, one column per kernel).
#
#   bench/profile.sh STEP [runner flags...]
#   bench/profile.sh 06_ldmatrix_mma --seqlen 4096 --causal --dtype bf16
#   bench/profile.sh fa4 [BATCH SEQLEN HEADS HEAD_DIM [causal]]   FlashAttention-4's forward (flash_attn.cute,
#                                            where installed), default 2 2048 16 128: the runner's problem
#   cmake -DFLASH_STEPS_PROFILE_STEP=06_ldmatrix_mma -DFLASH_STEPS_PROFILE_ARGS="--seqlen 4096" build
#   cmake --build build --target profile                                  (the same, through CMake)
#
# It runs `flash-steps --step STEP --iters 1 --warmup 0 --no-baseline [flags]` under
#   ncu --clock-control none --kernel-name-base mangled --kernel-name regex:^(<the step's kernels>)$
# The step's kernels are read from its object files with cuobjdump, so the reference, the input
# generator and cuBLAS are never profiled. The runner launches the step twice (check, then timing);
# the table shows the last launch of each kernel. The GPU's clocks are left as they are.
#
# Environment:
#   FLASH_STEPS_BUILD     the build directory (default: build)
#   NCU                   the ncu to use (default: ncu on PATH)
#   FLASH_STEPS_METRICS   a comma-separated metric list instead of bench/ncu_table.py's
#   FLASH_STEPS_PROFILE_OUT  a directory to keep the .ncu-rep report and a CSV of the table in
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
if [[ $# -lt 1 || "$1" == -* ]]; then
  sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
step="$1"
shift
build="${FLASH_STEPS_BUILD:-$root/build}"
ncu="${NCU:-ncu}"
runner="$build/flash-steps"
[[ "$step" == fa4 ]] || [[ -x "$runner" ]] || { echo "profile.sh: $runner not found (cmake --build $build --target flash-steps)" >&2; exit 1; }
command -v "$ncu" >/dev/null || { echo "profile.sh: ncu not found (Nsight Compute; set NCU=/path/to/ncu)" >&2; exit 1; }

if [[ "$step" == fa4 ]]; then  # its third launch of the same tensors (0.25 + N(0, 1), fp16), as compare_torch.py times it
  target=(python3 -c "import torch; from flash_attn.cute import flash_attn_func
b, n, h, d, causal = ${1:-2}, ${2:-2048}, ${3:-16}, ${4:-128}, '${5:-}' == 'causal'
q, k, v = (torch.randn(b, n, h, d, device='cuda', dtype=torch.float16) + 0.25 for _ in range(3))
for _ in range(3): flash_attn_func(q, k, v, causal=causal)
torch.cuda.synchronize()")
  filter=(--kernel-name "regex:.*FlashAttentionForward.*" --launch-skip 2 --launch-count 1)
  what="FlashAttention-4's flash_attn_func, batch ${1:-2}, seqlen ${2:-2048}, heads ${3:-16}, head_dim ${4:-128}${5:+, $5}"
else
  target=("$runner" --step "$step" --iters 1 --warmup 0 --no-baseline "$@")
  what="flash-steps $*"
  # The step's kernels: every function in the object files of its directory (steps/NN_*, NN = the
  # step's first two characters: 07b_work_order lives in steps/07_flash_attention2).
  prefix="${step:0:2}"
  mapfile -t objects < <(find "$build/steps/" -path "*step_${prefix}_*" -name '*.o' 2>/dev/null | sort)
  kernels=""
  if ((${#objects[@]})); then
    cuobjdump="$(command -v cuobjdump || true)"
    [[ -n "$cuobjdump" ]] || cuobjdump="$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")/cuobjdump"
    # One object at a time: cuobjdump stops at the first file without device code (a launcher-only .cu).
    kernels="$(for o in "${objects[@]}"; do "$cuobjdump" --dump-resource-usage "$o" 2>/dev/null || true; done |
               sed -n 's/^ *Function \([A-Za-z0-9_]*\):$/\1/p' | sort -u | paste -sd '|' -)"
  fi
  filter=()
  if [[ -n "$kernels" ]]; then
    filter=(--kernel-name-base mangled --kernel-name "regex:^(${kernels})\$")
  else
    echo "profile.sh: no object files of step ${prefix} under $build/steps; profiling every kernel" >&2
  fi
fi

metrics="${FLASH_STEPS_METRICS:-$(python3 "$here/ncu_table.py" --list-metrics)}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
report="$work/profile"
for _ in 1 2 3; do
  set +e
  "$ncu" --clock-control none "${filter[@]}" --metrics "$metrics" --export "$report" --force-overwrite \
    "${target[@]}" 2>&1 | tee "$work/log"
  set -e
  [[ -f "$report.ncu-rep" ]] && break
  fewer="$(python3 "$here/ncu_table.py" --metrics "$metrics" --drop-unknown "$work/log")"
  [[ "$fewer" != "$metrics" && -n "$fewer" ]] || { echo "profile.sh: ncu wrote no report (see above)" >&2; exit 1; }
  echo "profile.sh: retrying without the metrics ncu rejected" >&2
  metrics="$fewer"
done
[[ -f "$report.ncu-rep" ]] || { echo "profile.sh: ncu wrote no report (see above)" >&2; exit 1; }

"$ncu" --import "$report.ncu-rep" --csv --page raw > "$work/raw.csv"
echo
echo "ncu, step $step, $what (clocks as found; last launch of each kernel)"
csv_args=()
if [[ -n "${FLASH_STEPS_PROFILE_OUT:-}" ]]; then
  mkdir -p "$FLASH_STEPS_PROFILE_OUT"
  stamp="$(date -u +%Y%m%d-%H%M%S)"
  cp "$report.ncu-rep" "$FLASH_STEPS_PROFILE_OUT/profile-$step-$stamp.ncu-rep"
  csv_args=(--csv-out "$FLASH_STEPS_PROFILE_OUT/profile-$step-$stamp.csv")
fi
python3 "$here/ncu_table.py" "$work/raw.csv" --metrics "$metrics" "${csv_args[@]}"
