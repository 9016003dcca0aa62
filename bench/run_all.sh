#!/usr/bin/env bash
# One command for the results on a GPU: build, the GPU's own ceilings, the checked ladder, every step
# beside PyTorch SDPA over the shape sweep, the resource report, the plots and the README table.
#
#   bench/run_all.sh [--quick] [--commit HASH] [--build-dir DIR] [--no-build] [--gbench] [--forward-only]
#
#   --quick        a one-minute look: seqlen 1k, 2k, 4k at head_dim 128, fp16, fewer launches
#   --commit HASH  the commit measured (default: git describe; pass it where .git is missing)
#   --build-dir    default build-bench (Release, Ninja; tests off, so Catch2 is not needed)
#   --no-build     use the build directory as it is
#   --gbench       also run the Google Benchmark sweep (flash_steps_bench --sweep, or --quick), if built
#   --forward-only without the backward comparison and the GPT training (the README's forward results)
#
# Writes, under bench/results/ (names carry the UTC date and time):
#   ceilings-<date>.json        flash_steps_ceilings: mma.sync, wgmma, FMA, ex2, HBM peaks of this GPU
#   resources-<date>.json       flash-steps resources --json at the ladder shape: every kernel each step
#                               launches, with its blocks per SM and occupancy (the CUDA runtime's)
#   resource_report-<date>.md   registers, shared memory, spills of every kernel (cuobjdump), with the
#                               occupancy of the launches from resources-<date>.json
#   runner-<date>.json          flash-steps --json at the ladder shape (batch 8, seqlen 2048, 16 heads, d 128)
#   compare_torch-<date>.json   every step, PyTorch SDPA (flash, cuDNN, memory-efficient, math) and FA4 ...
#   compare_torch-<date>.csv    ... over the sweep, with GPU, driver, versions, date and commit
#   compare_torch_backward-<date>.json, .csv   the backward pass (steps with one) beside SDPA's
#   train_gpt-<date>.json, .png a small GPT trained with flash_steps.attention and with SDPA (PASS/FAIL)
#   sweep.png, ladder.png,      the plots (roofline.png: every step against the measured ceilings), and
#   roofline.png                README.md's results table rewritten between its markers
#   run_all-<date>.log          everything printed
# If $OUT is set, copies there (flat, at most 8 files): the plots, the log, the table, the runner,
# compare and ceilings JSON, and results.tar.gz holding every file above with its path (tar xzf
# results.tar.gz at the repo root).
# The full sweep takes a few minutes on an H200 (the slow early steps are skipped at long sequences).
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
commit=""
build="build-bench"
do_build=1
gbench=0
backward=1
while (($#)); do
  case "$1" in
    --quick) quick=1 ;;
    --commit) commit="${2:?--commit needs a value}"; shift ;;
    --commit=*) commit="${1#*=}" ;;
    --build-dir) build="${2:?--build-dir needs a value}"; shift ;;
    --build-dir=*) build="${1#*=}" ;;
    --no-build) do_build=0 ;;
    --gbench) gbench=1 ;;
    --forward-only) backward=0 ;;
    -h|--help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run_all.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ -n "$commit" ]] || commit="$(git describe --always --dirty --abbrev=12 2>/dev/null || echo unknown)"
stamp="$(date -u +%Y%m%d-%H%M%S)"
results=bench/results
mkdir -p "$results"
log="$results/run_all-$stamp.log"
if [[ -n "${OUT:-}" ]]; then
  mkdir -p "$OUT"
  exec > >(tee "$log" "$OUT/run_all.log") 2>&1
else
  exec > >(tee "$log") 2>&1
fi
tee_pid=$!
export PYTHONUNBUFFERED=1
t0=$SECONDS
phase() { echo; echo "== $* ($((SECONDS - t0)) s)"; }
failures=()
made=("$log")

phase "flash-steps $commit, $(date -u +%Y-%m-%dT%H:%M:%SZ), quick=$quick"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv || true

if ((do_build)); then
  phase "configure and build ($build)"
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASH_STEPS_COMMIT="$commit" \
        -DFLASH_STEPS_BUILD_TESTS=OFF
  cmake --build "$build" --target flash-steps flash_steps flash_steps_ceilings
  if ((gbench)); then
    cmake --build "$build" --target flash_steps_bench || echo "flash_steps_bench not built (no Google Benchmark?)"
  fi
fi

phase "the GPU's ceilings (flash_steps_ceilings)"
ceilings_json="$results/ceilings-$stamp.json"
ceilings_flag=(); ((quick)) && ceilings_flag=(--quick)
if "$build/bench/flash_steps_ceilings" "${ceilings_flag[@]}" --json "$ceilings_json"; then
  :
else
  failures+=("flash_steps_ceilings (exit $?)")
fi
if [[ -s "$ceilings_json" ]]; then made+=("$ceilings_json"); else rm -f "$ceilings_json"; ceilings_json=""; fi

ladder_shape=(--batch 8 --seqlen 2048 --heads 16 --head-dim 128)

phase "kernel resources at run time: flash-steps resources --json at the ladder shape"
resources_json="$results/resources-$stamp.json"
"$build/flash-steps" resources "${ladder_shape[@]}" --json > "$resources_json" || failures+=("flash-steps resources (exit $?)")
if [[ -s "$resources_json" ]]; then made+=("$resources_json"); else rm -f "$resources_json"; resources_json=""; fi

phase "resource report"
if FLASH_STEPS_RESOURCES_JSON="${resources_json:+$PWD/$resources_json}" cmake --build "$build" --target resource_report; then
  cp "$build/resource_report.md" "$results/resource_report-$stamp.md"
  made+=("$results/resource_report-$stamp.md")
  grep -q "resources:begin" notes/README.md 2>/dev/null && made+=(notes/README.md)
else
  failures+=("resource report")
fi

phase "the ladder: flash-steps --json at batch 8, seqlen 2048, 16 heads, head_dim 128, fp16"
runner_json="$results/runner-$stamp.json"
iters=(); ((quick)) && iters=(--iters 5 --warmup 1)
if "$build/flash-steps" "${ladder_shape[@]}" "${iters[@]}" --json > "$runner_json"; then
  :
else
  failures+=("flash-steps (exit $?)")
fi
if [[ -s "$runner_json" ]]; then made+=("$runner_json"); else rm -f "$runner_json"; runner_json=""; fi
[[ -z "$runner_json" ]] || python3 - "$runner_json" <<'EOF' || true
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    t = f"{r['ms']:10.3f} ms {r['tflops']:8.1f} TFLOP/s" if "ms" in r else " " * 30
    print(f"  {r['id']:22} {r['status']:8} {t}  {r.get('reason', '')[:80]}")
EOF

quick_flag=(); ((quick)) && quick_flag=(--quick)
newest() {  # the newest file matching a glob under $results (the names sort by date), or nothing
  local files=("$results"/$1)
  if [[ -e "${files[0]}" ]]; then echo "${files[-1]}"; fi
}
# measure NAME GLOB SIBLING SCRIPT [FLAGS...]: bench/SCRIPT with FLAGS and the flags every run shares; the
# newest results file matching GLOB, if the run wrote it, in $measured (and made, with its .SIBLING file).
measure() {
  local name=$1 glob=$2 sibling=$3 script=$4 before
  shift 4
  before="$(newest "$glob")"
  python3 "bench/$script" "$@" --lib "$build/libflash_steps.so" --commit "$commit" --out-dir "$results" \
    "${quick_flag[@]}" || failures+=("$name (exit $?)")
  measured="$(newest "$glob")"
  if [[ -n "$measured" && "$measured" != "$before" ]]; then
    made+=("$measured" "${measured%.json}.$sibling")
  else
    measured=""
    failures+=("$name wrote no results")
  fi
}

phase "PyTorch comparison (bench/compare_torch.py; FlashAttention-4 too where it imports)"
measure compare_torch.py 'compare_torch-[0-9]*.json' csv compare_torch.py  # the sweep's, not --decode's
compare_json="$measured"

if ((backward)); then
  phase "the backward pass beside SDPA's (bench/compare_torch.py --backward)"
  measure "compare_torch.py --backward" 'compare_torch_backward-*.json' csv compare_torch.py --backward

  phase "a small GPT trained with flash_steps.attention and with SDPA (bench/train_gpt.py)"
  measure train_gpt.py 'train_gpt-*.json' png train_gpt.py
fi

if ((gbench)); then
  phase "Google Benchmark sweep"
  if [[ -x "$build/bench/flash_steps_bench" ]]; then
    mode=--sweep; ((quick)) && mode=--quick
    "$build/bench/flash_steps_bench" "$mode" --benchmark_out="$results/bench_steps-$stamp.json" \
      --benchmark_out_format=json || failures+=("flash_steps_bench")
    made+=("$results/bench_steps-$stamp.json")
  else
    echo "flash_steps_bench was not built (Google Benchmark missing on this machine); skipped"
  fi
fi

phase "plots and the README table (bench/plot.py)"
plot_args=()
[[ -n "$runner_json" ]] && plot_args+=(--runner "$runner_json")
[[ -n "$compare_json" ]] && plot_args+=(--compare "$compare_json")
table="$results/results_table-$stamp.md"
if ((${#plot_args[@]})) && python3 bench/plot.py "${plot_args[@]}" > "$table"; then
  made+=("$table" "$results/sweep.png" "$results/ladder.png" "$results/roofline.png" README.md)
  cat "$table"
else
  rm -f "$table"
  failures+=("plot.py")
fi

phase "done"
for f in "${made[@]}"; do [[ -f "$f" ]] && echo "  $f"; done
if ((${#failures[@]})); then
  echo "problems: ${failures[*]}"
fi
if [[ -n "${OUT:-}" ]]; then
  existing=(); for f in "${made[@]}"; do [[ -f "$f" ]] && existing+=("$f"); done
  tar czf "$OUT/results.tar.gz" "${existing[@]}"
  for f in "$results/sweep.png" "$results/ladder.png" "$table" "$runner_json" "$compare_json" "$ceilings_json"; do
    if [[ -n "$f" && -f "$f" ]]; then cp "$f" "$OUT/"; fi
  done
  echo "copied to \$OUT: results.tar.gz, run_all.log, the plots, the table, the runner, compare and ceilings JSON"
fi
echo "total $((SECONDS - t0)) s"
status=0
((${#failures[@]} == 0)) || status=1
exec 1>&- 2>&-
wait "$tee_pid" 2>/dev/null || true  # the log is complete before the command returns
exit "$status"
