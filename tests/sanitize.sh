#!/usr/bin/env bash
# Runs compute-sanitizer's memcheck, racecheck, synccheck and initcheck over every step on small
# shapes (tests/sanitize_steps.cpp) and fails on any report.
#   tests/sanitize.sh [build-dir] [log-file]
# Exit status: 0 clean; 1 a report, a failed check or a broken GPU; 2 not built; 77 skipped (no CUDA
# device, or no compute-sanitizer: set COMPUTE_SANITIZER to its path if it is not on PATH).
set -uo pipefail
build=${1:-build}
log=${2:-/dev/stdout}
bin="$build/tests/sanitize_steps"
tool_bin=${COMPUTE_SANITIZER:-compute-sanitizer}
[ -x "$bin" ] || { echo "sanitize: $bin not found (build the project first)"; exit 2; }
command -v "$tool_bin" >/dev/null || {
  echo "sanitize: SKIPPED: $tool_bin not found (it ships with the CUDA toolkit; set COMPUTE_SANITIZER)"
  exit 77
}
# Is there a device? 0 yes, 77 none (skip), anything else a device that is present but fails.
"$bin" --device-only
case $? in
  0) ;;
  77) echo "sanitize: SKIPPED: no CUDA device, nothing to sanitize"; exit 77 ;;
  *) echo "sanitize: FAILED: the CUDA device is present but unusable"; exit 1 ;;
esac
status=0
for tool in memcheck racecheck synccheck initcheck; do
  extra=()
  [ "$tool" = memcheck ] && extra=(--leak-check full)
  echo "== compute-sanitizer --tool $tool" | tee -a "$log"
  "$tool_bin" --tool "$tool" "${extra[@]}" --error-exitcode 1 "$bin" >>"$log" 2>&1
  case $? in
    0) echo "   clean" | tee -a "$log" ;;
    77) echo "   SKIPPED (no CUDA device)" | tee -a "$log"; status=77 ;;
    *) echo "   FAILED (see $log)" | tee -a "$log"; status=1 ;;
  esac
done
exit $status
