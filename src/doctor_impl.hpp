#pragma once
// Internals of gdn doctor (include/gdn/diagnostics/doctor.hpp), shared by its three sources:
// doctor.cpp (report, JSON, table, orchestration), doctor_checkpoint.cpp (what the files say:
// config, tensor names and shapes, weight fingerprints) and doctor_probes.cpp (what the model
// does: identities, value-head grouping, backends, degeneration).

#include <chrono>
#include <cmath>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gdn/core/error.hpp"
#include "gdn/diagnostics/doctor.hpp"
#include "gdn/io/tokenizer.hpp"
#include "gdn/model/model.hpp"

namespace gdn::detail {

// What the checkpoint checks learned, for the probes.
struct DoctorSubject {
  std::string dir;
  DoctorOptions options;
  std::optional<ModelConfig> config;   // absent when config.json did not parse
  std::shared_ptr<const Model> model;  // null when the weights did not load
  std::string not_loaded;              // why model is null
  DType state_dtype = DType::f32;      // what a Context uses: options.state_dtype, else the config's
  // Ids usable as ordinary text: the tokenizer's vocabulary without its added (special) tokens,
  // else [0, vocab_size).
  std::int32_t text_vocab = 0;
  std::set<std::int32_t> added_ids;
  std::optional<Tokenizer> tokenizer;  // when tokenizer.json loads: probes then use text
  std::vector<Token> eos;              // config.json and generation_config.json
};

// Appends checks to a report, timing each; an exception inside a check is that check's FAIL.
class CheckRecorder {
 public:
  explicit CheckRecorder(DoctorReport& r) : report_(r) {}

  template <typename F>
  DoctorCheck& run(const std::string& name, F&& fn) {
    DoctorCheck c;
    c.name = name;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      fn(c);
    } catch (const Error& e) {
      c.verdict = Verdict::fail;
      c.message = fmt::format("the check itself failed: {} ({})", e.what(), status_name(e.status()));
    } catch (const std::exception& e) {
      c.verdict = Verdict::fail;
      c.message = fmt::format("the check itself failed: {}", e.what());
    }
    c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    report_.checks.push_back(std::move(c));
    return report_.checks.back();
  }

  void skip(const std::string& name, std::string why) {
    DoctorCheck c;
    c.name = name;
    c.verdict = Verdict::skip;
    c.message = std::move(why);
    report_.checks.push_back(std::move(c));
  }

 private:
  DoctorReport& report_;
};

// Figures as the table and messages print them.
inline std::string figure(double v) {
  if (!std::isfinite(v)) return fmt::format("{}", v);
  if (v == 0.0) return "0";
  const double a = std::fabs(v);
  if (a >= 1e-2 && a < 1e4) return fmt::format("{:.3g}", v);
  return fmt::format("{:.2e}", v);
}

inline void measure(DoctorCheck& c, std::string metric, double value, std::string threshold) {
  c.metric = std::move(metric);
  c.measured = value;
  c.threshold = std::move(threshold);
}

// "a, b, c and 7 more".
inline std::string name_list(const std::vector<std::string>& names, std::size_t shown = 4) {
  std::string s;
  for (std::size_t i = 0; i < names.size() && i < shown; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > shown) s += fmt::format(" and {} more", names.size() - shown);
  return s;
}

void check_checkpoint(DoctorSubject& s, CheckRecorder& rec);  // config.*, weights.*
void check_probes(DoctorSubject& s, CheckRecorder& rec);      // gdn.*, identity.*, backend.*, generation.*

}  // namespace gdn::detail
