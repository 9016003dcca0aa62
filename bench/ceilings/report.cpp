#include "report.h"

#include <cmath>
#include <cstdio>
#include <iomanip>
#include <locale>
#include <ostream>
#include <sstream>

namespace fs::ceilings {

ParsedArgs parse_args(const std::vector<std::string>& args) {
  ParsedArgs r;
  Options& o = r.options;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--quick") {
      o.quick = true;
    } else if (a == "--help" || a == "-h") {
      o.help = true;
    } else if (a == "--json") {
      o.json = true;
      // The next argument is the file unless it is another flag.
      if (i + 1 < args.size() && (args[i + 1] == "-" || args[i + 1].rfind("-", 0) != 0)) {
        o.json_path = args[++i] == "-" ? "" : args[i];
      }
    } else if (a.rfind("--json=", 0) == 0) {
      o.json = true;
      o.json_path = a.substr(7);
      if (o.json_path.empty()) {
        r.error = "--json= needs a file name (or use --json alone for standard output)";
        return r;
      }
      if (o.json_path == "-") o.json_path.clear();
    } else {
      r.error = "unknown argument '" + a + "' (see --help)";
      return r;
    }
  }
  return r;
}

std::string usage() {
  return "flash_steps_ceilings: measures this GPU's ceilings with the project's own small kernels:\n"
         "  mma.sync m16n8k16 (fp16, bf16) and wgmma m64n256k16 (fp16, bf16; sm_90a) in TFLOP/s, FP32 FMA\n"
         "  in TFLOP/s, ex2.approx in Tex2/s, HBM read and device-to-device copy in TB/s. Each is the\n"
         "  best (the peak) and the median of several timed launches of a few milliseconds or more.\n"
         "\n"
         "usage: flash_steps_ceilings [--quick] [--json [FILE]]\n"
         "  --quick        fewer and shorter launches (a few seconds in all)\n"
         "  --json [FILE]  also write the results as JSON to FILE (without FILE, or with '-': the JSON\n"
         "                 on standard output and the table on standard error)\n"
         "  -h, --help     this text\n"
         "\n"
         "Exit codes: 0 measured (a ceiling this GPU cannot run is reported as not available), 1 a\n"
         "measurement failed, 2 bad argument, 77 no CUDA device (nothing is written).\n";
}

namespace {

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// Six significant digits; null for what JSON cannot hold.
std::string json_number(double x) {
  if (!std::isfinite(x)) return "null";
  std::ostringstream m;
  m.imbue(std::locale::classic());
  m << std::setprecision(6) << x;
  return m.str();
}

std::string fixed(double x, int digits) {
  std::ostringstream m;
  m << std::fixed << std::setprecision(digits) << x;
  return m.str();
}

}  // namespace

void write_json(std::ostream& out, const Header& h, const std::vector<Ceiling>& ceilings) {
  out << "{\n"
      << "  \"tool\": \"flash_steps_ceilings\",\n"
      << "  \"commit\": " << json_string(h.commit) << ",\n"
      << "  \"date\": " << json_string(h.date) << ",\n"
      << "  \"device\": " << json_string(h.device) << ",\n"
      << "  \"compute_capability\": " << h.compute_capability << ",\n"
      << "  \"sm_count\": " << h.sm_count << ",\n"
      << "  \"max_sm_clock_mhz\": " << h.max_sm_clock_mhz << ",\n"
      << "  \"quick\": " << (h.quick ? "true" : "false") << ",\n"
      << "  \"ceilings\": [";
  for (size_t i = 0; i < ceilings.size(); ++i) {
    const Ceiling& c = ceilings[i];
    out << (i ? ",\n" : "\n") << "    {\"id\": " << json_string(c.id) << ", \"what\": " << json_string(c.what)
        << ", \"value\": " << json_number(c.best) << ", \"unit\": " << json_string(c.unit)
        << ", \"best\": " << json_number(c.best) << ", \"median\": " << json_number(c.median)
        << ", \"launch_ms\": " << json_number(c.launch_ms) << ", \"repetitions\": " << c.repetitions
        << ", \"available\": " << (c.available ? "true" : "false") << ", \"reason\": " << json_string(c.reason)
        << ", \"method\": " << json_string(c.method) << "}";
  }
  out << "\n  ]\n}\n";
}

void print_table(std::ostream& out, const Header& h, const std::vector<Ceiling>& ceilings) {
  out << "flash_steps_ceilings on " << h.device << "\n"
      << "commit " << h.commit << ", " << h.date << (h.quick ? ", --quick" : "") << "\n"
      << "value = the best of the timed launches (the peak); median = the typical launch\n\n";
  out << std::left << std::setw(15) << "ceiling" << std::right << std::setw(10) << "value" << std::setw(10)
      << "median" << "  " << std::left << std::setw(9) << "unit" << "what\n";
  for (const Ceiling& c : ceilings) {
    out << std::left << std::setw(15) << c.id;
    if (c.available) {
      const int digits = c.best >= 100 ? 1 : c.best >= 10 ? 2 : 3;
      out << std::right << std::setw(10) << fixed(c.best, digits) << std::setw(10) << fixed(c.median, digits)
          << "  " << std::left << std::setw(9) << c.unit << c.what << "\n"
          << std::setw(15) << "" << "  " << c.method << "\n";
    } else {
      out << c.reason << "\n";
    }
  }
}

}  // namespace fs::ceilings
