#!/usr/bin/env bash
# Runs compute-sanitizer's memcheck, racecheck, synccheck and initcheck over every step on small
# shapes (tests/sanitize_steps.cpp) and fails on any report.
#   tests/sanitize.sh [build-dir] [log-file]
set -uo pipefail
build=${1:-build}
log=${2:-/dev/stdout}
bin="$build/tests/sanitize_steps"
[ -x "$bin" ] || { echo "sanitize: $bin not found (build the project first)"; exit 2; }
command -v compute-sanitizer >/dev/null || { echo "sanitize: compute-sanitizer not found"; exit 2; }
status=0
for tool in memcheck racecheck synccheck initcheck; do
  extra=()
  [ "$tool" = memcheck ] && extra=(--leak-check full)
  echo "== compute-sanitizer --tool $tool" | tee -a "$log"
  if compute-sanitizer --tool "$tool" "${extra[@]}" --error-exitcode 1 "$bin" >>"$log" 2>&1; then
    echo "   clean" | tee -a "$log"
  else
    echo "   FAILED (see $log)" | tee -a "$log"
    status=1
  fi
done
exit $status
