#!/usr/bin/env bash
# tests/sanitize.sh without a GPU or without compute-sanitizer: a clear skip (exit 77), never a
# failure and never a pass. Stand-ins for the tool and the binary, so it runs anywhere.
set -uo pipefail
script="$(cd "$(dirname "$0")" && pwd)/sanitize.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/build/tests"
fail=0
expect() {  # expect CODE TEXT -- command...: the exit code and a line of the output
  local code=$1 text=$2 out rc
  shift 3
  out=$("$@" 2>&1)
  rc=$?
  if [ "$rc" -ne "$code" ] || ! grep -qF -- "$text" <<<"$out"; then
    echo "FAIL: $* exited $rc (expected $code) with:"; echo "$out"; echo "(expected a line with: $text)"
    fail=1
  else
    echo "ok: $* -> $rc ($text)"
  fi
}

# No compute-sanitizer: skipped, and it says so.
printf '#!/bin/sh\nexit 0\n' >"$tmp/build/tests/sanitize_steps"
chmod +x "$tmp/build/tests/sanitize_steps"
COMPUTE_SANITIZER="$tmp/no-such-tool" expect 77 "SKIPPED: $tmp/no-such-tool not found" -- "$script" "$tmp/build"

# A tool that runs the program, and a program that finds no CUDA device (exit 77): skipped.
printf '#!/bin/sh\nwhile [ "$#" -gt 1 ]; do shift; done\nexec "$1"\n' >"$tmp/compute-sanitizer"
chmod +x "$tmp/compute-sanitizer"
printf '#!/bin/sh\necho "SKIPPED: no CUDA device was found"\nexit 77\n' >"$tmp/build/tests/sanitize_steps"
COMPUTE_SANITIZER="$tmp/compute-sanitizer" expect 77 "SKIPPED: no CUDA device" -- "$script" "$tmp/build"

# A device that is present but broken (exit 1): a failure.
printf '#!/bin/sh\nexit 1\n' >"$tmp/build/tests/sanitize_steps"
COMPUTE_SANITIZER="$tmp/compute-sanitizer" expect 1 "FAILED" -- "$script" "$tmp/build"

# A clean run: 0, every tool "clean".
printf '#!/bin/sh\nexit 0\n' >"$tmp/build/tests/sanitize_steps"
COMPUTE_SANITIZER="$tmp/compute-sanitizer" expect 0 "clean" -- "$script" "$tmp/build"
exit $fail
