// The runner's reports: one row model (Cells) printed as a table, JSON or CSV, and the lines every report
// shares. A header of its own so that a CPU test prints synthetic rows.
#pragma once

#include <algorithm>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "backward/check.h"
#include "forward/check.h"
#include "runner/cli.h"
#include "runner/resources.h"
#include "version.h"

namespace fs {

// One row of a run: a step (or the baseline), its status and what its pass measured.
struct Row {
  std::string id = "", lesson = "";
  std::string status = "";  // PASS, FAIL, REFUSED, ERROR
  std::string reason = "";  // why it was refused, or the error
  std::string entry = "";   // decoding: "decode" (the step's decoding entry) or "forward"
  double ms = 0, rate = 0;  // rate: TFLOP/s, or GB/s of K and V read when decoding
  double x_step01 = 0, x_prev = 0, hbm_pct = 0;
  int splits = 0;
  Comparison cmp = {};                     // forward, decoding: O and LSE
  std::vector<GradComparison> grads = {};  // backward: dQ, dK, dV
  bool timed() const { return status == "PASS" || status == "FAIL"; }
};

// One value of a row: its key and value (as JSON writes it) in JSON and CSV and, where the table
// shows it, its column's header, width and text.
struct Cell {
  std::string key, value, header = "", text = "";
  int width = 0;
};

// x as a stream writes it after the manipulators given: num(x), num(x, std::scientific, std::setprecision(2)).
template <typename... Manipulators>
std::string num(double x, Manipulators... m) {
  std::ostringstream out;
  (out << ... << m) << x;
  return out.str();
}
// Integers (sizes, counts) as integers: 1048576, not 1.04858e+06.
inline std::string num(int64_t x) { return std::to_string(x); }
inline std::string fixed(double x, int digits) { return num(x, std::fixed, std::setprecision(digits)); }
inline std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) out += c == '\n' ? std::string("\\n") : c == '"' || c == '\\' ? std::string("\\") + c : std::string(1, c);
  return out + "\"";
}
inline const char* boolean(bool b) { return b ? "true" : "false"; }

// {"key": value, ...}
inline std::string json(const std::vector<Cell>& cells) {
  std::string out = "{";
  for (const Cell& c : cells) out += (out.size() > 1 ? ", " : "") + quoted(c.key) + ": " + c.value;
  return out + "}";
}

// The attention problem's fields in JSON, then the pass's own.
inline std::string problem_json(const Problem& p, const std::string& more) {
  return "{\"batch\": " + num(p.batch) + ", \"seqlen_q\": " + num(p.seqlen_q) + ", \"seqlen_k\": " + num(p.seqlen_k) +
         ", \"heads_q\": " + num(p.heads_q) + ", \"heads_kv\": " + num(p.heads_kv) + ", \"head_dim\": " +
         num(p.head_dim) + ", \"dtype\": \"" + dtype_name(p.dtype) + "\", \"causal\": " + boolean(p.causal) +
         (p.softcap > 0 ? ", \"softcap\": " + num(p.softcap) : std::string()) +
         (p.window ? ", \"window\": [" + num(int64_t(p.window_left)) + ", " + num(int64_t(p.window_right)) + "]"
                   : std::string()) +
         more +
         "}";
}

// Width of the id column: the longest step id plus two spaces.
inline int id_width() {
  size_t w = std::string("cublas").size();
  for (const Step& s : steps()) w = std::max(w, s.id.size());
  return int(w) + 2;
}

// The first lines of a report: in JSON the members that open it (the tool, its mode, the commit, the
// date and the device; the caller's follow), in the table the tool's line and the title.
inline void print_head(std::ostream& out, OutputFormat format, const std::string& tool, const std::string& mode,
                       const std::string& device, const std::string& date, const std::string& title) {
  if (format == OutputFormat::json)
    out << "{\n  \"tool\": " << quoted(tool) << ",\n" << (mode.empty() ? "" : "  \"mode\": " + quoted(mode) + ",\n")
        << "  \"commit\": \"" << FLASH_STEPS_COMMIT << "\",\n  \"date\": \"" << date << "\",\n  \"device\": "
        << quoted(device);
  else if (format == OutputFormat::table)
    out << "flash-steps " << FLASH_STEPS_COMMIT << " | " << device << " | " << date << "\n" << title << "\n";
}

// A run's rows: S (the pass's Session) gives the mode and each row's tags (strings) and cells; `title`
// heads the table, `problem` (JSON members) follows the device in JSON.
template <typename S>
void print_run(std::ostream& out, const std::vector<Row>& rows, const RunnerOptions& o, const std::string& device,
               const std::string& date, const std::string& title, const std::string& problem) {
  Row blank;  // its cells name the columns
  for (const char* name : {"dQ", "dK", "dV"}) blank.grads.push_back(GradComparison{.name = name});
  const std::vector<Cell> columns = S::cells(blank);
  print_head(out, o.format, "flash-steps", S::mode, device, date, title);
  if (o.format == OutputFormat::json) {
    out << problem << ",\n  \"timing\": "
        << json({{"iters", std::to_string(o.iters)}, {"warmup", std::to_string(o.warmup)},
                 {"l2_flush", boolean(o.flush_l2)}, {"statistic", quoted("median")}})
        << ",\n  \"rows\": [\n";
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::vector<Cell> members{{"id", quoted(r.id)}, {"status", quoted(r.status)}};
      for (const Cell& c : S::tags(r)) members.push_back({c.key, quoted(c.value)});
      members.insert(members.end(), {{"lesson", quoted(r.lesson)}, {"reason", quoted(r.reason)}});
      if (r.timed())
        for (const Cell& c : S::cells(r)) members.push_back(c);
      out << "    " << json(members) << (i + 1 < rows.size() ? "," : "") << "\n";
    }
    out << "  ]\n}\n";
  } else if (o.format == OutputFormat::csv) {
    out << "id,status";
    for (const Cell& c : S::tags(blank)) out << "," << c.key;
    for (const Cell& c : columns) out << "," << c.key;
    out << ",reason\n";
    for (const Row& r : rows) {
      out << r.id << "," << r.status;
      for (const Cell& c : S::tags(r)) out << "," << c.value;
      if (r.timed())
        for (const Cell& c : S::cells(r)) out << "," << c.value;
      else
        out << std::string(columns.size(), ',');
      std::string reason = r.reason;
      std::replace_if(reason.begin(), reason.end(), [](char c) { return c == ',' || c == '\n'; }, ';');
      out << "," << reason << "\n";
    }
  } else {
    out << "\n" << std::left << std::setw(id_width()) << "step" << std::setw(10) << "result" << std::right;
    for (const Cell& c : columns)
      if (c.width) out << std::setw(c.width) << c.header;
    out << "  " << std::left << "lesson\n";
    for (const Row& r : rows) {
      out << std::left << std::setw(id_width()) << r.id << std::setw(10) << r.status << std::right;
      const std::vector<Cell> cells = S::cells(r);
      for (size_t i = 0; i < columns.size(); ++i)
        if (columns[i].width) out << std::setw(columns[i].width) << (r.timed() ? cells[i].text : "-");
      out << "  " << (r.entry == "forward" ? "[forward entry] " : "") << r.lesson << "\n";
      if (!r.reason.empty()) out << std::string(size_t(id_width()), ' ') << r.reason << "\n";
    }
  }
}

// One step of `flash-steps resources`: "ok", "refused" or "error" and why, and the kernels its plan launches.
struct StepResources {
  const Step* step;
  std::string status = "ok", reason = "";
  std::vector<KernelResources> kernels = {};
};

// The report of `flash-steps resources` on `dev` for the problem `shape` in `pass` ("forward", "backward").
inline void print_resources(std::ostream& out, const std::vector<StepResources>& steps, OutputFormat format,
                            const DeviceInfo& dev, const std::string& date, const Problem& shape,
                            const std::string& pass) {
  print_head(out, format, "flash-steps resources", "", describe(dev), date,
             describe(shape) + (pass == "forward" ? "" : ", " + pass + " pass") +
                 " | per kernel each step launches: registers and local memory per thread, shared memory per "
                 "block, occupancy = resident warps per SM / the SM's limit");
  if (format == OutputFormat::json)
    out << ",\n  \"compute_capability\": " << dev.compute_capability << ",\n  \"problem\": " << problem_json(shape, "")
        << ",\n  \"pass\": " << quoted(pass) << ",\n  \"steps\": [\n";
  for (size_t i = 0; i < steps.size(); ++i) {
    const StepResources& s = steps[i];
    if (format == OutputFormat::json) {
      std::string kernels;  // one a line
      const auto n = [](auto v) { return std::to_string(v); };
      for (const KernelResources& k : s.kernels)
        kernels += (kernels.empty() ? "\n      " : ",\n      ") +
                   json({{"name", quoted(k.name)}, {"mangled", quoted(k.mangled)}, {"registers", n(k.registers)},
                         {"static_smem", n(k.static_smem)}, {"local_bytes", n(k.local_bytes)},
                         {"dynamic_smem", n(k.dynamic_smem)}, {"threads", n(k.threads)}, {"blocks", n(k.blocks)},
                         {"blocks_per_sm", n(k.blocks_per_sm)}, {"warps_per_sm", n(k.warps_per_sm)},
                         {"max_warps_per_sm", n(k.max_warps_per_sm)}, {"occupancy", num(k.occupancy())}});
      out << "    "
          << json({{"id", quoted(s.step->id)}, {"dir", quoted(s.step->dir)}, {"status", quoted(s.status)},
                   {"reason", quoted(s.reason)}, {"kernels", "[" + kernels + (kernels.empty() ? "]" : "\n    ]")}})
          << (i + 1 < steps.size() ? "," : "") << "\n";
      continue;
    }
    out << "\n== " << s.step->id << ": " << s.step->lesson << "\n";
    if (s.status != "ok" || s.kernels.empty()) {
      out << "   " << (s.status != "ok" ? s.status + ": " + s.reason : "this step lists no kernels (Plan::kernels is empty)")
          << "\n";
      continue;
    }
    out << std::right << std::setw(8) << "regs" << std::setw(8) << "local" << std::setw(12) << "static smem"
        << std::setw(12) << "dyn smem" << std::setw(9) << "threads" << std::setw(10) << "blocks" << std::setw(11)
        << "blocks/SM" << std::setw(11) << "occupancy" << "  kernel\n";
    for (const KernelResources& k : s.kernels)
      out << std::setw(8) << k.registers << std::setw(8) << k.local_bytes << std::setw(12) << k.static_smem
          << std::setw(12) << k.dynamic_smem << std::setw(9) << k.threads << std::setw(10) << k.blocks
          << std::setw(11) << k.blocks_per_sm << std::setw(11) << fixed(100 * k.occupancy(), 0) + " %" << "  "
          << short_kernel_name(k.name) << "\n";
  }
  if (format == OutputFormat::json) out << "  ]\n}\n";
}

}  // namespace fs
