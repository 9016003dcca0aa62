#!/usr/bin/env bash
# Step 13b's sliding window on a GPU: the runner (flash-steps, checked against the reference, then timed)
# on the shapes of note 13, forward and backward, one problem per file, every run on the same seed, so
# that every run of one shape reads the same tensors.
#
#   bench/window_sweep.sh [--build-dir DIR] [--out DIR] [--seqlens "4096 ..."] [--head-dims "64 128"]
#
#   --build-dir   where flash-steps is (default build)
#   --out         the folder the files go to (default bench/results/window-13b-<commit>)
#   --seqlens     default "4096 8192 16384"; batch = 16384 / seqlen, heads = 2048 / head_dim
#   --head-dims   default "64 128"
#
# Per shape and pass (fwd, bwd: --backward, atomic dQ), fp16, one file each (the runner's --json):
#   <pass>-off-d<D>-n<N>[-causal].out   no window: 13b beside step 09f (forward) or 12c (backward)
#   <pass>-w<L>-d<D>-n<N>-causal.out    causal with window (L, 0), L = 1024 and 4096 (when below N)
#   <pass>-w512,512-d<D>-n<N>.out       window (512, 512), not causal
# TFLOP/s count the visible pairs (fs_problem_flops), so a window's row compares with a full one's.
set -euo pipefail
cd "$(dirname "$0")/.."

build=build
out=""
seqlens="4096 8192 16384"
head_dims="64 128"
while (($#)); do
  case "$1" in
    --build-dir) build="${2:?--build-dir needs a value}"; shift ;;
    --out) out="${2:?--out needs a value}"; shift ;;
    --seqlens) seqlens="${2:?--seqlens needs a value}"; shift ;;
    --head-dims) head_dims="${2:?--head-dims needs a value}"; shift ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "window_sweep.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
runner="$build/flash-steps"
[[ -x "$runner" ]] || { echo "window_sweep.sh: no $runner (build first, or --build-dir)" >&2; exit 2; }
[[ -n "$out" ]] || out="bench/results/window-13b-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
mkdir -p "$out"

status=0
run() {  # run FILE ARGS...: one runner call, its JSON in FILE
  local file="$out/$1"
  shift
  echo "window_sweep.sh: $file: flash-steps $*" >&2
  "$runner" run --json "$@" > "$file" || status=1
}
for d in $head_dims; do
  for n in $seqlens; do
    shape=(--batch $((16384 / n)) --heads $((2048 / d)) --head-dim "$d" --seqlen "$n")
    for pass in fwd bwd; do
      # the forward's cuBLAS row is left out (the backward has none)
      if [[ $pass == fwd ]]; then flags=(--no-baseline); base=09f_persistent; else flags=(--backward); base=12c_bulk_dq; fi
      run "$pass-off-d$d-n$n.out" "${shape[@]}" "${flags[@]}" --step "$base,13b_window"
      run "$pass-off-d$d-n$n-causal.out" "${shape[@]}" "${flags[@]}" --causal --step "$base,13b_window"
      for w in 1024 4096; do
        if ((w < n)); then
          run "$pass-w$w-d$d-n$n-causal.out" "${shape[@]}" "${flags[@]}" --causal --window "$w,0" --step 13b_window
        fi
      done
      run "$pass-w512,512-d$d-n$n.out" "${shape[@]}" "${flags[@]}" --window 512,512 --step 13b_window
    done
  done
done
exit $status
