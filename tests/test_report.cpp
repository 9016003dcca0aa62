// The runner's reports (runner/report.h) from synthetic rows: the table, JSON and CSV of a run and
// of `flash-steps resources`, byte for byte, which a machine without a GPU never prints otherwise.
#include <sstream>
#include <string>
#include <vector>

#include "catch.h"
#include "runner/report.h"

namespace {

// A pass as print_run sees it: its mode, a tag and two cells (one not in the table).
struct Pass {
  static constexpr const char* mode = "decode";
  static std::vector<fs::Cell> tags(const fs::Row& r) { return {{"entry", r.entry}}; }
  static std::vector<fs::Cell> cells(const fs::Row& r) {
    return {{"ms", fs::num(r.ms), "ms", fs::fixed(r.ms, 3), 8}, {"max_abs_err", fs::num(r.cmp.max_abs_err)}};
  }
};

std::vector<fs::Row> rows() {
  std::vector<fs::Row> r{
      {.id = "01_naive", .lesson = "one thread per row", .status = "PASS", .entry = "decode", .ms = 1.5},
      {.id = "02_x", .lesson = "l", .status = "FAIL", .reason = "bad, \"O\"\nat (0, 1)", .entry = "forward", .ms = 0.25},
      {.id = "03_y", .lesson = "m", .status = "REFUSED", .reason = "needs sm_90", .entry = "decode"},
  };
  r[1].cmp.max_abs_err = 1e-3;
  return r;
}
const std::string kCommit = FLASH_STEPS_COMMIT;

std::string run(fs::OutputFormat format) {
  fs::RunnerOptions o;
  o.format = format;
  std::ostringstream out;
  fs::print_run<Pass>(out, rows(), o, "GPU", "DATE", "TITLE", ",\n  \"problem\": {}");
  return out.str();
}

}  // namespace

TEST_CASE("report: a run as a table, JSON and CSV", "[report]") {
  const std::string id(size_t(fs::id_width()) - 4, ' ');  // "step" padded to the id column
  const std::string pad(size_t(fs::id_width()), ' ');
  auto cell = [](std::string s, size_t w) { return std::string(w - s.size(), ' ') + s; };
  auto left = [](std::string s, size_t w) { return s + std::string(w - s.size(), ' '); };
  const size_t w = size_t(fs::id_width());
  CHECK(run(fs::OutputFormat::table) ==
        "flash-steps " + kCommit + " | GPU | DATE\nTITLE\n\nstep" + id + "result    " + cell("ms", 8) + "  lesson\n" +
            left("01_naive", w) + "PASS      " + cell("1.500", 8) + "  one thread per row\n" +
            left("02_x", w) + "FAIL      " + cell("0.250", 8) + "  [forward entry] l\n" + pad +
            "bad, \"O\"\nat (0, 1)\n" + left("03_y", w) + "REFUSED   " + cell("-", 8) + "  m\n" + pad +
            "needs sm_90\n");
  CHECK(run(fs::OutputFormat::json) ==
        "{\n  \"tool\": \"flash-steps\",\n  \"mode\": \"decode\",\n  \"commit\": \"" + kCommit +
            "\",\n  \"date\": \"DATE\",\n  \"device\": \"GPU\",\n  \"problem\": {},\n"
            "  \"timing\": {\"iters\": 20, \"warmup\": 2, \"l2_flush\": true, \"statistic\": \"median\"},\n"
            "  \"rows\": [\n"
            "    {\"id\": \"01_naive\", \"status\": \"PASS\", \"entry\": \"decode\", \"lesson\": \"one thread per row\", "
            "\"reason\": \"\", \"ms\": 1.5, \"max_abs_err\": 0},\n"
            "    {\"id\": \"02_x\", \"status\": \"FAIL\", \"entry\": \"forward\", \"lesson\": \"l\", "
            "\"reason\": \"bad, \\\"O\\\"\\nat (0, 1)\", \"ms\": 0.25, \"max_abs_err\": 0.001},\n"
            "    {\"id\": \"03_y\", \"status\": \"REFUSED\", \"entry\": \"decode\", \"lesson\": \"m\", "
            "\"reason\": \"needs sm_90\"}\n  ]\n}\n");
  CHECK(run(fs::OutputFormat::csv) ==
        "id,status,entry,ms,max_abs_err,reason\n"
        "01_naive,PASS,decode,1.5,0,\n"
        "02_x,FAIL,forward,0.25,0.001,bad; \"O\";at (0; 1)\n"
        "03_y,REFUSED,decode,,,needs sm_90\n");
}

TEST_CASE("report: flash-steps resources as a table and JSON", "[report]") {
  const fs::Step& step = fs::steps().front();
  fs::KernelResources k{.name = "void fs::step01::attention_kernel<__half>(fs_problem, __half const*)",
                        .mangled = "_Z1k",
                        .registers = 40,
                        .static_smem = 0,
                        .local_bytes = 8,
                        .dynamic_smem = 1024,
                        .threads = 128,
                        .blocks = 4096,
                        .blocks_per_sm = 8,
                        .warps_per_sm = 32,
                        .max_warps_per_sm = 64};
  const std::vector<fs::StepResources> steps{{.step = &step, .kernels = {k}},
                                             {.step = &step, .status = "refused", .reason = "needs sm_90"},
                                             {.step = &step}};
  fs::DeviceInfo dev;
  dev.name = "GPU";
  dev.compute_capability = 90;
  const std::string device = fs::describe(dev);
  const fs::Problem shape = fs::make_problem(2, 1024, 1000, 8, 2, 64, fs::DType::bf16, true);
  auto print = [&](fs::OutputFormat format, const std::string& pass) {
    std::ostringstream out;
    fs::print_resources(out, steps, format, dev, "DATE", shape, pass);
    return out.str();
  };
  const std::string title = " | per kernel each step launches: registers and local memory per thread, shared memory "
                            "per block, occupancy = resident warps per SM / the SM's limit\n";
  const std::string head = "\n== " + step.id + ": " + step.lesson + "\n";
  CHECK(print(fs::OutputFormat::table, "forward") ==
        "flash-steps " + kCommit + " | " + device + " | DATE\nb2 h8/2 sq1024 sk1000 d64 bf16 causal" + title + head +
            "    regs   local static smem    dyn smem  threads    blocks  blocks/SM  occupancy  kernel\n"
            "      40       8           0        1024      128      4096          8       50 %  "
            "attention_kernel<__half>\n" +
            head + "   refused: needs sm_90\n" + head + "   this step lists no kernels (Plan::kernels is empty)\n");
  const std::string id = "{\"id\": \"" + step.id + "\", \"dir\": \"" + step.dir + "\", ";
  CHECK(print(fs::OutputFormat::table, "backward").rfind(
            "flash-steps " + kCommit + " | " + device + " | DATE\nb2 h8/2 sq1024 sk1000 d64 bf16 causal, backward pass" +
                title,
            0) == 0);
  CHECK(print(fs::OutputFormat::json, "backward") ==
        "{\n  \"tool\": \"flash-steps resources\",\n  \"commit\": \"" + kCommit + "\",\n  \"date\": \"DATE\",\n"
            "  \"device\": \"" + device + "\",\n  \"compute_capability\": 90,\n  \"problem\": {\"batch\": 2, "
            "\"seqlen_q\": 1024, \"seqlen_k\": 1000, \"heads_q\": 8, \"heads_kv\": 2, \"head_dim\": 64, "
            "\"dtype\": \"bf16\", \"causal\": true},\n  \"pass\": \"backward\",\n  \"steps\": [\n    " + id +
            "\"status\": \"ok\", \"reason\": \"\", \"kernels\": [\n"
            "      {\"name\": \"void fs::step01::attention_kernel<__half>(fs_problem, __half const*)\", "
            "\"mangled\": \"_Z1k\", \"registers\": 40, \"static_smem\": 0, \"local_bytes\": 8, \"dynamic_smem\": 1024, "
            "\"threads\": 128, \"blocks\": 4096, \"blocks_per_sm\": 8, \"warps_per_sm\": 32, \"max_warps_per_sm\": 64, "
            "\"occupancy\": 0.5}\n    ]},\n    " +
            id + "\"status\": \"refused\", \"reason\": \"needs sm_90\", \"kernels\": []},\n    " + id +
            "\"status\": \"ok\", \"reason\": \"\", \"kernels\": []}\n  ]\n}\n");
}

TEST_CASE("the runner's JSON writes sizes as integers", "[report]") {
  fs::Problem p = fs::make_problem(1, 1048576, 2097152, 8, 8, 128, fs::DType::bf16, true);
  CHECK(fs::problem_json(p, "") ==
        "{\"batch\": 1, \"seqlen_q\": 1048576, \"seqlen_k\": 2097152, \"heads_q\": 8, \"heads_kv\": 8, \"head_dim\": 128, "
        "\"dtype\": \"bf16\", \"causal\": true}");
  CHECK(fs::num(0.25) == "0.25");
  // A sliding window as its two bounds, after softcap (each only when set).
  p.window = 1, p.window_left = -1, p.window_right = 128;
  p.softcap = 30.0f;
  CHECK(fs::problem_json(p, ", \"more\": 1") ==
        "{\"batch\": 1, \"seqlen_q\": 1048576, \"seqlen_k\": 2097152, \"heads_q\": 8, \"heads_kv\": 8, \"head_dim\": 128, "
        "\"dtype\": \"bf16\", \"causal\": true, \"softcap\": 30, \"window\": [-1, 128], \"more\": 1}");
}
