#!/usr/bin/env bash
# Step 10 (decoding) on a GPU in one command: build, the decoding GPU tests, the runner on one decoding
# problem (batch 8, 32768 keys, 32/8 heads: contiguous, then paged with ragged lengths, then the checked
# mode), and the 20 decoding problems of bench/compare_torch.py --decode (5 shapes, seqlen_q 1 and 4,
# fp16 and bf16) beside PyTorch SDPA flash and cuDNN.
#
#   bench/decode.sh [--build-dir DIR] [--no-build] [--no-tests] [--quick] [--commit HASH]
#
#   --build-dir    default build-decode (Release, Ninja, tests on, Google Benchmark off)
#   --no-build     use the build directory as it is
#   --no-tests     skip ctest (cpu, gpu.decode, gpu.step10, gpu.edge.step10, gpu.harness)
#   --quick        compare_torch.py at fp16 and seqlen_q 1 only (5 shapes instead of 20)
#   --commit HASH  the commit measured (default: git describe)
#
# Writes, under bench/results/ (names carry the UTC date and time):
#   decode-<date>.log                           everything printed
#   runner-decode-<date>.txt                    the runner's tables (GB/s of K+V, % of the HBM read ceiling)
#   compare_torch-decode-<date>.json / .csv     every shape, every implementation
# and copies them to $OUT when it is set. The HBM read ceiling is hbm_read of the newest
# bench/results/ceilings-*.json (on the H200: 4.64 TB/s).
set -euo pipefail
cd "$(dirname "$0")/.."

build="build-decode"
do_build=1
tests=1
quick=0
commit=""
while (($#)); do
  case "$1" in
    --build-dir) build="${2:?--build-dir needs a value}"; shift ;;
    --build-dir=*) build="${1#*=}" ;;
    --no-build) do_build=0 ;;
    --no-tests) tests=0 ;;
    --quick) quick=1 ;;
    --commit) commit="${2:?--commit needs a value}"; shift ;;
    --commit=*) commit="${1#*=}" ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "decode.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ -n "$commit" ]] || commit="$(git describe --always --dirty --abbrev=12 2>/dev/null || echo unknown)"
stamp="$(date -u +%Y%m%d-%H%M%S)"
results=bench/results
mkdir -p "$results"
log="$results/decode-$stamp.log"
exec > >(tee "$log") 2>&1
tee_pid=$!
export PYTHONUNBUFFERED=1
t0=$SECONDS
phase() { echo; echo "== $* ($((SECONDS - t0)) s)"; }
failures=()

phase "flash-steps $commit, $(date -u +%Y-%m-%dT%H:%M:%SZ), step 10 (decoding)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv || true

if ((do_build)); then
  phase "configure and build ($build)"
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASH_STEPS_COMMIT="$commit" \
        -DFLASH_STEPS_BUILD_BENCH=OFF
  cmake --build "$build"
fi

if ((tests)); then
  phase "tests: cpu, gpu.decode, gpu.step10, gpu.edge.step10, gpu.harness"
  ctest --test-dir "$build" --output-on-failure -R '^(cpu|gpu\.decode|gpu\.step10|gpu\.edge\.step10|gpu\.harness)$' ||
    failures+=("ctest")
fi

hbm="$(python3 - <<'EOF' || true
import sys
sys.path.insert(0, "bench")
import fs_results
h = fs_results.hbm_ceiling(None)
print(h.get("tbs", ""))
EOF
)"
hbm_flag=(); [[ -n "$hbm" ]] && hbm_flag=(--hbm-tbs "$hbm")
runner_txt="$results/runner-decode-$stamp.txt"
shape=(--batch 8 --seqlen-k 32768 --heads 32 --kv-heads 8 --head-dim 128)
phase "the runner: ${shape[*]}, contiguous; paged 64 with ragged lengths; checked"
for extra in "--decode" "--page-size 64 --ragged" "--page-size 16 --checked --step 10_decoding"; do
  # shellcheck disable=SC2086  # $extra is a list of flags
  "$build/flash-steps" "${shape[@]}" $extra "${hbm_flag[@]}" | tee -a "$runner_txt" || failures+=("flash-steps $extra")
  echo | tee -a "$runner_txt"
done

phase "every decoding shape beside PyTorch SDPA (bench/compare_torch.py --decode)"
latest() {  # the newest compare_torch-decode JSON (the names sort by date), or nothing
  local files=("$results"/compare_torch-decode-*.json)
  if [[ -e "${files[0]}" ]]; then echo "${files[-1]}"; fi
}
before="$(latest)"
quick_flags=(); ((quick)) && quick_flags=(--dtypes fp16 --decode-seqlens-q 1)
python3 bench/compare_torch.py --decode --lib "$build/libflash_steps.so" --commit "$commit" --out-dir "$results" \
  "${quick_flags[@]}" || failures+=("compare_torch.py --decode (exit $?)")
made=("$log" "$runner_txt")
compare_json="$(latest)"
if [[ -n "$compare_json" && "$compare_json" != "$before" ]]; then
  made+=("$compare_json" "${compare_json%.json}.csv")
else
  failures+=("compare_torch.py --decode wrote no results")
fi

phase "done"
for f in "${made[@]}"; do [[ -f "$f" ]] && echo "  $f"; done
if [[ -n "${OUT:-}" ]]; then
  mkdir -p "$OUT"
  for f in "${made[@]}"; do if [[ -f "$f" ]]; then cp "$f" "$OUT/"; fi; done
  echo "copied to \$OUT"
fi
if ((${#failures[@]})); then echo "problems: ${failures[*]}"; fi
echo "total $((SECONDS - t0)) s"
status=0
((${#failures[@]} == 0)) || status=1
exec 1>&- 2>&-
wait "$tee_pid" 2>/dev/null || true  # the log is complete before the command returns
exit "$status"
