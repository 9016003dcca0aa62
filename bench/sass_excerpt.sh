#!/usr/bin/env bash
# The SASS evidence a note quotes, regenerated from a build: for every kernel of one step, its
# resource usage and how many of each instruction of interest it has; then, for one kernel, every
# line holding one of them with a few lines of context (the main loop's shape).
#
#   bench/sass_excerpt.sh STEP [KERNEL_REGEX] > bench/results/sass-STEP-<commit12>.txt
#   bench/sass_excerpt.sh 08_tma_wgmma 'tma_wgmma_kernelI6__halfLi128E'
#
# KERNEL_REGEX (an extended regex on the mangled name) picks the kernel of the excerpt: the first
# one that matches (default: the step's first kernel).
# Environment:
#   FLASH_STEPS_BUILD  the build directory (default: build)
#   CUOBJDUMP          the cuobjdump to use (default: cuobjdump on PATH, else beside nvcc)
#   SASS_CONTEXT       lines of context around each excerpted instruction (default: 2)
#   SASS_SHOW          the instructions the excerpt shows, an extended regex on the opcode
#                      (default: the Hopper and barrier instructions, DEPBAR, LDL, STL)
#   SASS_LOOPS=1       also, for the excerpt's kernel, every innermost loop (a backward branch whose
#                      range holds no other one): its address range, its instruction count and the
#                      count of every opcode in it, the static instructions of one iteration
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
if [[ $# -lt 1 || "$1" == -* ]]; then
  sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
step="$1"
pick="${2:-.}"
build="${FLASH_STEPS_BUILD:-$root/build}"
context="${SASS_CONTEXT:-2}"
cuobjdump="${CUOBJDUMP:-$(command -v cuobjdump || true)}"
[[ -n "$cuobjdump" ]] || cuobjdump="$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")/cuobjdump"
[[ -x "$cuobjdump" ]] || { echo "sass_excerpt.sh: cuobjdump not found (set CUOBJDUMP)" >&2; exit 1; }

prefix="${step%%_*}"
mapfile -t objects < <(find "$build/steps/" -path "*step_${prefix}_*" -name '*.o' 2>/dev/null | sort)
((${#objects[@]})) || { echo "sass_excerpt.sh: no object files of step $prefix under $build/steps" >&2; exit 1; }

# Counted in every kernel (not the never-executed "@!PT" instructions the compiler pads with, such as
# the "@!PT LDS RZ, [RZ]" before each LDGSTS); the excerpt shows all but the exponentials by default.
counted='HGMMA[.A-Za-z0-9x]*|HMMA[.A-Za-z0-9]*|LDSM[.A-Za-z0-9]*|UTMALDG[.A-Za-z0-9]*|UTMASTG[.A-Za-z0-9]*|UTMACMDFLUSH|UBLKCP[.A-Za-z0-9]*|UBLKRED[.A-Za-z0-9]*|SYNCS[.A-Za-z0-9]*|WARPGROUP[.A-Za-z0-9]*|BAR\.SYNC[.A-Za-z_]*|BAR\.ARV|USETMAXREG[.A-Za-z0-9_]*|MUFU\.EX2|LDGSTS[.A-Za-z0-9]*|LDGDEPBAR|DEPBAR[.A-Za-z0-9]*|LDL[.A-Za-z0-9]*|STL[.A-Za-z0-9]*|LDG\.[.A-Za-z0-9]*|STG\.[.A-Za-z0-9]*|LDS\.[.A-Za-z0-9]*|STS\.[.A-Za-z0-9]*|LDS |STS '
shown="${SASS_SHOW:-HGMMA|UTMALDG|UTMASTG|UTMACMDFLUSH|UBLKCP|UBLKRED|SYNCS|WARPGROUP|BAR\.SYNC|BAR\.ARV|USETMAXREG|DEPBAR|LDL|STL}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# One object at a time: cuobjdump stops at the first file without device code.
for o in "${objects[@]}"; do "$cuobjdump" --dump-sass "$o" 2>/dev/null || true; done > "$work/sass"
for o in "${objects[@]}"; do "$cuobjdump" --dump-resource-usage "$o" 2>/dev/null || true; done > "$work/usage"

commit="$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
git -C "$root" diff --quiet HEAD -- "steps/$step" 2>/dev/null || commit="$commit (steps/$step modified)"
# The command line that wrote this, with the settings that change the output, so the file can be
# regenerated from its first line.
settings=""
for v in SASS_SHOW SASS_CONTEXT SASS_LOOPS; do
  [[ -n "${!v:-}" ]] && settings+="$v='${!v}' "
done
echo "# ${settings}bench/sass_excerpt.sh $step${2:+ '$2'}, commit $commit"
nvcc_used="$(sed -n 's/^CMAKE_CUDA_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null || true)"
[[ -x "$nvcc_used" ]] && echo "# compiled by $nvcc_used: $("$nvcc_used" --version | tail -2 | head -1)"
echo "# disassembled by $cuobjdump: $("$cuobjdump" --version | tail -2 | head -1)"
echo "# objects: ${objects[*]#"$build/"}"
echo

# Per kernel: its name, resource usage and instruction counts.
mapfile -t kernels < <(sed -n 's/^[[:space:]]*Function : \([A-Za-z0-9_]*\)$/\1/p' "$work/sass")
for k in "${kernels[@]}"; do
  echo "== $(echo "$k" | c++filt)"
  grep -A1 "Function $k:" "$work/usage" | tail -1 | sed 's/^ */   /'
  awk -v k="$k" '$0 ~ "Function : " k "$" {f = 1; next} /Function : / {f = 0} f' "$work/sass" > "$work/one"
  grep -v '@!PT ' "$work/one" | grep -oE "$counted" | sort | uniq -c | awk '{printf "   %5d %s\n", $1, $2}'
  grep -qE '\b(LDL|STL)\b' "$work/one" || echo "   no local memory (no LDL/STL)"
done

# The excerpt: one kernel, addresses and encodings dropped.
for k in "${kernels[@]}"; do
  [[ "$k" =~ $pick ]] || continue
  awk -v k="$k" '$0 ~ "Function : " k "$" {f = 1; next} /Function : / {f = 0} f' "$work/sass" |
    grep -E '^\s+/\*[0-9a-f]{4,}\*/' | sed -E 's@^\s+/\*([0-9a-f]+)\*/\s+@\1  @; s@\s*/\* 0x[0-9a-f]+ \*/\s*$@@; s@\s+;\s*$@ ;@' \
    > "$work/listing"
  echo
  echo "== excerpt of $(echo "$k" | c++filt): lines with ${shown//\\/}, $context lines of context"
  grep -E -C "$context" "$shown" "$work/listing" || echo "   (none)"
  if [[ "${SASS_LOOPS:-0}" == 1 ]]; then
    echo
    echo "== innermost loops of $(echo "$k" | c++filt): a backward branch and the instructions from its"
    echo "   target to it, one iteration's static instructions; every opcode counted (modifiers dropped)"
    awk '
      function hex(x,   v, i) { v = 0; sub(/^0x/, "", x)
        for (i = 1; i <= length(x); i++) v = 16 * v + index("0123456789abcdef", substr(x, i, 1)) - 1
        return v }
      / @!PT / { next }  # never executed (the predicate is false): padding the compiler inserts
      { addr = hex($1); text = $0; sub(/^[0-9a-f]+  +/, "", text); sub(/^@!?U?P[T0-9]+ +/, "", text)
        n++; at[n] = addr; op[n] = text; sub(/[ .].*/, "", op[n])
        if (op[n] == "BRA" && match(text, /0x[0-9a-f]+/)) { target = hex(substr(text, RSTART, RLENGTH))
          if (target <= addr) { loops++; from[loops] = target; to[loops] = addr } } }
      END {
        for (i = 1; i <= loops; i++) {
          inner = 1
          for (j = 1; j <= loops; j++)
            if (j != i && from[j] >= from[i] && to[j] <= to[i] && (from[j] > from[i] || to[j] < to[i])) inner = 0
          if (!inner || from[i] == to[i]) continue  # not the BRA-to-itself after EXIT
          delete count; total = 0; list = ""
          for (m = 1; m <= n; m++) if (at[m] >= from[i] && at[m] <= to[i]) { count[op[m]]++; total++ }
          printf "   loop %04x-%04x: %d instructions\n", from[i], to[i], total
          cmd = "sort -k1,1nr -k2"
          for (o in count) printf "      %5d %s\n", count[o], o | cmd
          close(cmd)
        }
      }' "$work/listing"
  fi
  break
done
