// Runs every registered step on small shapes (ragged tails, causal with Sq ≠ Sk, GQA, both dtypes;
// softcapped, windowed and variable-length ones where the step has the feature),
// every step with a decoding entry on small decoding problems (paged caches, ragged lengths with 0
// and 1, forced splits), and every step with a backward pass on small backward problems (each tile
// configuration, GQA, causal with Sq ≠ Sk, both modes; variable-length ones where it has them), and checks each against the fp64 CPU reference. Small on purpose: tests/sanitize.sh runs it under
// compute-sanitizer's four tools. A step that refuses a shape it claims (Step::claims) fails.
//   sanitize_steps [--device-only]   (--device-only: only look for a usable device)
// FLASH_STEPS_ONLY=<prefix> runs only the steps whose id starts with it (as the GPU tests do).
// Exit code: 0 all pass, 1 a mismatch, an error or a device that is present but unusable, 77 no
// CUDA device.
#include <iostream>
#include <string>
#include <vector>

#include "common/backward/check.h"
#include "common/decode/check.h"
#include "common/forward/check.h"
#include "common/harness/tensors.h"
#include "gpu_test_config.h"

int main(int argc, char** argv) {
  const std::string why = fs::cuda_unavailable_reason();
  if (!why.empty()) {
    const bool absent = fs::cuda_device_absent();
    std::cout << (absent ? "SKIPPED: " : "FAILED: ") << why << "\n";
    return absent ? fs::test::kSkipCode : 1;
  }
  if (argc > 1 && std::string(argv[1]) == "--device-only") return 0;
  struct Shape {
    int64_t b, sq, sk, hq, hkv, d;
    fs::DType dtype;
    bool causal;
    float softcap = 0.0f;  // > 0: only the steps with softcapping (Step::softcap) run it
    int32_t window = 0, left = 0, right = 0;  // window 1: only the steps with windows (Step::window) run it
  };
  const Shape shapes[] = {
      {1, 65, 129, 2, 1, 64, fs::DType::fp16, true},   {1, 129, 65, 2, 2, 128, fs::DType::bf16, true},
      {2, 7, 7, 1, 1, 40, fs::DType::fp16, false},     {1, 64, 64, 4, 2, 128, fs::DType::fp16, false},
      {1, 1, 33, 2, 1, 64, fs::DType::bf16, true},     {1, 100, 130, 1, 1, 256, fs::DType::fp16, true},
      {1, 65, 129, 2, 1, 64, fs::DType::fp16, true, 15.0f}, {1, 129, 65, 2, 2, 128, fs::DType::bf16, false, 2.0f},
      {1, 200, 150, 2, 1, 64, fs::DType::fp16, false, 0.0f, 1, 40, 0},  // rows 0 … 49 see no key
      {1, 129, 300, 2, 2, 128, fs::DType::bf16, true, 2.0f, 1, 70, 5},
  };
  int failures = 0;
  // A problem the step's plan refuses is said and skipped: a failure only where the step claims it.
  auto refused = [&failures](const fs::Step& s, const fs::Plan& plan, auto claims, const std::string& what) {
    if (plan.accepted()) return false;
    const bool claimed = claims();
    std::cout << s.id << " " << what << ": refused (" << plan.refusal << ")"
              << (claimed ? " although the step claims this problem: FAILED" : "") << "\n";
    failures += claimed ? 1 : 0;
    return true;
  };
  try {
    const fs::DeviceInfo dev = fs::current_device();
    for (const fs::Step& s : fs::steps())
      for (const Shape& sh : shapes) {
        if (!s.forward.present() || !fs::test::step_selected(s.id)) break;  // a backward-only step has no forward
        if ((sh.softcap > 0 && !s.softcap) || (sh.window && !s.window)) continue;
        fs::Problem p = fs::make_problem(sh.b, sh.sq, sh.sk, sh.hq, sh.hkv, sh.d, sh.dtype, sh.causal);
        p.softcap = sh.softcap;
        p.window = sh.window, p.window_left = sh.left, p.window_right = sh.right;
        const fs::Plan plan = fs::plan(s, p, dev);
        if (refused(s, plan, [&] { return s.forward.claims(p, dev); }, fs::describe(p))) continue;
        fs::Workload w(p, 11);
        const fs::Reference ref = fs::reference_cpu(p, w.download_inputs());
        const fs::Comparison c = fs::run_and_compare(s, w, ref, plan);
        std::cout << s.id << " " << fs::describe(p) << ": " << c.summary() << "\n";
        failures += c.pass() ? 0 : 1;
      }
    // Variable-length batches, on the steps that have them (Step::varlen): empty and one-row sequences, a
    // query length unlike the key length, causal and a window per sequence.
    struct VarlenShape {
      std::vector<int32_t> lq, lk;
      int64_t hq, hkv, d;
      fs::DType dtype;
      bool causal;
      int32_t window = 0, left = 0, right = 0;
    };
    const VarlenShape varlen_shapes[] = {
        {{0, 1, 65, 130}, {7, 0, 129, 64}, 2, 1, 64, fs::DType::fp16, true},
        {{33, 0, 100}, {33, 5, 70}, 2, 2, 128, fs::DType::bf16, false, 1, 20, 3},
        {{9, 70}, {}, 1, 1, 256, fs::DType::fp16, true},
    };
    for (const fs::Step& s : fs::steps()) {
      if (!s.forward.present() || !s.varlen || !fs::test::step_selected(s.id)) continue;
      for (const VarlenShape& sh : varlen_shapes) {
        fs::Problem shape = fs::make_problem(1, 1, 1, sh.hq, sh.hkv, sh.d, sh.dtype, sh.causal);
        shape.window = sh.window, shape.window_left = sh.left, shape.window_right = sh.right;
        const fs::Offsets cu = fs::offsets_of(sh.lq, sh.lk);
        fs::Workload w(fs::varlen_problem(shape, cu), 14, fs::Layout::separate, cu);
        const fs::Reference ref = fs::reference_cpu(w.problem(), w.download_inputs());
        const fs::Comparison c = fs::run_and_compare(s, w, ref, dev);
        std::cout << s.id << " " << fs::describe(w.problem()) << ": " << c.summary() << "\n";
        failures += c.pass() ? 0 : 1;
      }
    }
    struct DecodeShape {
      int64_t b, sq, sk, hq, hkv, d, page;
      std::vector<int32_t> lengths;
      int splits;
      bool causal;
    };
    const DecodeShape decode_shapes[] = {
        {3, 1, 100, 8, 2, 64, 16, {100, 0, 1}, 0, false},
        {2, 4, 70, 4, 1, 128, 0, {70, 9}, 5, true},
        {2, 2, 90, 2, 2, 40, 32, {}, 3, true},
    };
    for (const fs::Step& s : fs::steps()) {
      if (!s.decode.present() || !fs::test::step_selected(s.id)) continue;
      for (const DecodeShape& sh : decode_shapes) {
        fs::DecodeProblem p = fs::make_decode_problem(sh.b, sh.sq, sh.sk, sh.hq, sh.hkv, sh.d, fs::DType::bf16,
                                                      sh.causal, sh.page);
        p.num_splits = sh.splits;
        fs::DecodeWorkload w(p, sh.lengths, 12);
        const fs::Reference ref = fs::reference_cpu(p, w.download_inputs());
        const fs::Prepared prepared(s, p, dev);
        const fs::Comparison c = fs::launch_and_compare(
            [&](cudaStream_t st) { prepared.launch(w.tensors(), st); }, w, ref);
        std::cout << s.id << " " << fs::describe(p) << ": " << c.summary() << "\n";
        failures += c.pass() ? 0 : 1;
      }
    }
    struct BackwardShape {
      int64_t b, sq, sk, hq, hkv, d;
      fs::DType dtype;
      bool causal;
      float softcap = 0.0f;
      int32_t window = 0, left = 0, right = 0;
    };
    const BackwardShape backward_shapes[] = {
        {1, 70, 150, 4, 2, 64, fs::DType::fp16, true},  {1, 150, 70, 2, 1, 128, fs::DType::bf16, true},
        {1, 33, 65, 2, 2, 96, fs::DType::fp16, false},  {1, 40, 30, 1, 1, 256, fs::DType::bf16, true},
        {1, 70, 150, 4, 2, 64, fs::DType::fp16, true, 15.0f}, {1, 150, 70, 2, 1, 128, fs::DType::bf16, false, 1.0f},
        {1, 150, 70, 2, 1, 64, fs::DType::fp16, false, 0.0f, 1, 20, 0},  // rows 0 … 79 see no key
        {1, 70, 150, 4, 2, 128, fs::DType::bf16, true, 1.0f, 1, 30, 3},
        {1, 40, 30, 1, 1, 256, fs::DType::bf16, false, 0.0f, 1, 5, 5},
    };
    for (const fs::Step& s : fs::steps()) {
      if (!s.backward.present() || !fs::test::step_selected(s.id)) continue;
      for (const BackwardShape& sh : backward_shapes)
        for (const bool deterministic : {false, true}) {
          if ((sh.softcap > 0 && !s.softcap) || (sh.window && !s.window)) continue;
          fs::BackwardProblem p =
              fs::make_backward_problem(sh.b, sh.sq, sh.sk, sh.hq, sh.hkv, sh.d, sh.dtype, sh.causal, deterministic);
          p.attention.softcap = sh.softcap;
          p.attention.window = sh.window, p.attention.window_left = sh.left, p.attention.window_right = sh.right;
          const fs::Plan plan = fs::plan(s, p, dev);
          if (refused(s, plan, [&] { return s.backward.claims(p, dev); }, "backward " + fs::describe(p.attention)))
            continue;
          fs::BackwardWorkload w(p, 13);
          const fs::BackwardHostInputs in = w.download_inputs();
          const fs::BackwardReferences ref{fs::reference_cpu(p, in, false),
                                           fs::reference_cpu(p, in, true)};
          for (const fs::GradComparison& g : fs::run_and_compare(s, w, ref, plan)) {
            std::cout << s.id << " backward" << (deterministic ? " deterministic " : " ") << fs::describe(p.attention)
                      << ": " << g.summary() << "\n";
            failures += g.pass() ? 0 : 1;
          }
        }
    }
    // The backward of variable-length batches, on the steps whose backward has them: empty and one-row
    // sequences, query lengths unlike the key lengths, causal, a window and softcapping per sequence,
    // both modes; head_dims above 128 too (step 11's kernels, column slices).
    const VarlenShape varlen_backward_shapes[] = {
        {{0, 1, 65, 130}, {7, 0, 129, 64}, 4, 2, 64, fs::DType::fp16, true},
        {{33, 0, 100}, {33, 5, 70}, 2, 1, 128, fs::DType::bf16, false, 1, 20, 3},
        {{0, 1, 65, 130}, {7, 0, 129, 64}, 2, 1, 192, fs::DType::fp16, true},
        {{33, 0, 100}, {33, 5, 70}, 2, 2, 256, fs::DType::bf16, false, 1, 20, 3},
    };
    for (const fs::Step& s : fs::steps()) {
      if (!s.backward.present() || !s.varlen || !fs::test::step_selected(s.id)) continue;
      for (const VarlenShape& sh : varlen_backward_shapes)
        for (const bool deterministic : {false, true}) {
          fs::Problem shape = fs::make_problem(1, 1, 1, sh.hq, sh.hkv, sh.d, sh.dtype, sh.causal);
          shape.window = sh.window, shape.window_left = sh.left, shape.window_right = sh.right;
          shape.softcap = sh.window ? 2.0f : 0.0f;
          const fs::Offsets cu = fs::offsets_of(sh.lq, sh.lk);
          fs::BackwardWorkload w(fs::backward_of(fs::varlen_problem(shape, cu), deterministic), 15,
                                 fs::Layout::separate, cu);
          const fs::BackwardProblem& p = w.problem();
          const fs::Plan plan = fs::plan(s, p, dev);
          if (refused(s, plan, [&] { return s.backward.claims(p, dev); }, "backward " + fs::describe(p.attention)))
            continue;
          const fs::BackwardHostInputs in = w.download_inputs();
          const fs::BackwardReferences ref{fs::reference_cpu(p, in, false), fs::reference_cpu(p, in, true)};
          for (const fs::GradComparison& g : fs::run_and_compare(s, w, ref, plan)) {
            std::cout << s.id << " backward" << (deterministic ? " deterministic " : " ") << fs::describe(p.attention)
                      << ": " << g.summary() << "\n";
            failures += g.pass() ? 0 : 1;
          }
        }
    }
  } catch (const std::exception& e) {
    std::cout << "error: " << e.what() << "\n";
    return 1;
  }
  std::cout << (failures ? "FAILED" : "all steps passed") << "\n";
  return failures ? 1 : 0;
}
