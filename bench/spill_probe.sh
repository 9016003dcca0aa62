#!/usr/bin/env bash
# Which tiles of step 07's kernel ptxas compiles without spilling: the kernel instantiated at the
# tiles the table uses and at the ones note 07 says it does not use because they spill
# (FlashAttention-2's 128 x 64 at head_dim 128 and 128 x 128 at 64, 128 x 64 with one buffer at 96,
# the sub-steps 07a-07f at 07g's 128 x 48). Compiles one translation unit for sm_90 with the
# build's flags and prints, per kernel, ptxas's registers, stack frame and spill bytes. No GPU.
#
#   bench/spill_probe.sh > bench/results/spills-07-tiles-<commit12>.txt
#
# Environment: NVCC (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc), ARCH (default: 90).
set -euo pipefail
case "${1:-}" in
  -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) echo "spill_probe.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
esac
root="$(cd "$(dirname "$0")/.." && pwd)"
nvcc="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
arch="${ARCH:-90}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# Traits<HEAD_DIM, BLOCK_Q, BLOCK_KV, NUM_WARPS, KV_STAGES, IDEAS>, and what each one is.
probes=(
  "128, 128, 32, 4, 2, 7|128 x 32 (kD128_K32's tile) with 07g's ideas"
  "128, 128, 48, 4, 2, 7|kD128_S2: 07g at head_dim 128"
  "128, 128, 64, 4, 2, 7|FlashAttention-2's tile at head_dim 128 (note 07, exercise 1)"
  "64, 128, 64, 4, 2, 7|kD64: 07g at head_dim 64"
  "64, 128, 128, 4, 2, 7|FlashAttention-2's tile at head_dim 64"
  "96, 128, 32, 4, 2, 7|kD96: 07g at head_dim 96"
  "96, 128, 64, 4, 1, 7|128 x 64 with one K/V buffer at head_dim 96"
  "128, 128, 48, 4, 2, 1|07a's ideas at 128 x 48"
  "128, 128, 48, 4, 2, 2|07b's ideas at 128 x 48"
  "128, 128, 48, 4, 2, 3|07c's ideas at 128 x 48"
  "128, 128, 48, 4, 2, 4|07d's ideas at 128 x 48"
  "128, 128, 48, 4, 2, 5|07e's ideas at 128 x 48"
  "128, 128, 48, 4, 2, 6|07f's ideas at 128 x 48"
)
{
  echo '#include "steps/07_flash_attention2/kernel.cuh"'
  echo 'namespace fs::step07 {'
  echo 'void* probes[] = {'
  for p in "${probes[@]}"; do
    echo "    reinterpret_cast<void*>(&flash_attention2_kernel<__half, Traits<${p%%|*}>>),"
  done
  echo '};'
  echo '}  // namespace fs::step07'
} > "$work/probe.cu"

flags=(-I"$root" -I"$root/common" -O3 -DNDEBUG "--generate-code=arch=compute_$arch,code=sm_$arch" -lineinfo
       --expt-relaxed-constexpr -std=c++17 -Xptxas=-v)
"$nvcc" "${flags[@]}" -c "$work/probe.cu" -o "$work/probe.o" > "$work/ptxas.txt" 2>&1

commit="$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
git -C "$root" diff --quiet HEAD -- steps/07_flash_attention2 2>/dev/null || commit="$commit (steps/07_flash_attention2 modified)"
echo "# bench/spill_probe.sh, commit $commit"
echo "# compiled by $nvcc: $("$nvcc" --version | tail -2 | head -1)"
echo "# flags: ${flags[*]//$root/<repo>}"
echo "# fp16, one kernel per line: Traits<HEAD_DIM, BLOCK_Q, BLOCK_KV, NUM_WARPS, KV_STAGES, IDEAS>"
echo
printf '%-28s %9s %7s %12s %11s  %s\n' "Traits<...>" registers "stack" "spill stores" "spill loads" "what"
for p in "${probes[@]}"; do
  t="${p%%|*}"
  mangled="TraitsILi$(echo "$t" | sed 's/, /ELi/g')E"
  block="$(awk -v m="$mangled" 'index($0, "Compiling entry") && index($0, m) {f = 1; next} f && /Compiling entry/ {f = 0} f' "$work/ptxas.txt")"
  stack="$(sed -n 's/.* \([0-9]*\) bytes stack frame.*/\1/p' <<< "$block" | head -1)"
  stores="$(sed -n 's/.* \([0-9]*\) bytes spill stores.*/\1/p' <<< "$block" | head -1)"
  loads="$(sed -n 's/.* \([0-9]*\) bytes spill loads.*/\1/p' <<< "$block" | head -1)"
  regs="$(sed -n 's/.*Used \([0-9]*\) registers.*/\1/p' <<< "$block" | head -1)"
  printf '%-28s %9s %7s %12s %11s  %s\n' "<$t>" "${regs:-?}" "${stack:-?}" "${stores:-?}" "${loads:-?}" "${p#*|}"
done
