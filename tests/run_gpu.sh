#!/usr/bin/env bash
# Every test on a GPU in one command: configure and build (Release, Ninja), every ctest entry (the large
# and sanitizer ones included), then compute-sanitizer's four tools over every step (tests/sanitize.sh).
#   tests/run_gpu.sh [--build-dir DIR] [--no-sanitize] [--ctest-args "..."]
# Writes bench/results/ctest-<commit>.log and sanitize-<commit>.log (and copies them to $OUT when set).
# Exit status: 0 when every test passed and the sanitizer is clean, else 1.
set -uo pipefail
cd "$(dirname "$0")/.."
build=build
sanitize=1
ctest_args=""
while (($#)); do
  case "$1" in
    --build-dir) build="${2:?--build-dir needs a value}"; shift ;;
    --no-sanitize) sanitize=0 ;;
    --ctest-args) ctest_args="${2:?--ctest-args needs a value}"; shift ;;
    -h|--help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run_gpu.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
commit="$(git describe --always --dirty --abbrev=12 2>/dev/null || echo unknown)"
results=bench/results
mkdir -p "$results"
status=0
cmake -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASH_STEPS_COMMIT="$commit" > "$build.configure.log" 2>&1 &&
  cmake --build "$build" > "$build.build.log" 2>&1 || { tail -40 "$build.configure.log" "$build.build.log"; exit 1; }
log="$results/ctest-$commit.log"
# shellcheck disable=SC2086
(cd "$build" && ctest --output-on-failure $ctest_args) 2>&1 | tee "$log" | tail -30 || status=1
grep -q "100% tests passed" "$log" || status=1
if ((sanitize)); then
  slog="$results/sanitize-$commit.log"
  tests/sanitize.sh "$build" "$slog" || status=1
fi
if [[ -n "${OUT:-}" ]]; then
  cp "$log" "$OUT/"
  ((sanitize)) && cp "$slog" "$OUT/"
fi
exit $status
