// gdn doctor: the report (JSON, table), the degeneration metrics, and the order the checks run in.
// The checks themselves: doctor_checkpoint.cpp (files) and doctor_probes.cpp (the running model).

#include <algorithm>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "backend/backend.hpp"
#include "doctor_impl.hpp"
#include "gdn/runtime/generator.hpp"

namespace gdn {

std::string_view verdict_name(Verdict v) noexcept {
  switch (v) {
    case Verdict::pass: return "PASS";
    case Verdict::warn: return "WARN";
    case Verdict::fail: return "FAIL";
    case Verdict::skip: return "SKIP";
  }
  return "?";
}

int DoctorReport::count(Verdict v) const noexcept {
  return static_cast<int>(std::count_if(checks.begin(), checks.end(), [&](const DoctorCheck& c) { return c.verdict == v; }));
}

const DoctorCheck* DoctorReport::find(std::string_view name) const noexcept {
  for (const auto& c : checks)
    if (c.name == name) return &c;
  return nullptr;
}

std::string DoctorReport::to_json(int indent) const {
  nlohmann::json j;
  j["model_dir"] = model_dir;
  j["ok"] = ok();
  j["seconds"] = seconds;
  j["counts"] = {{"PASS", count(Verdict::pass)}, {"WARN", count(Verdict::warn)}, {"FAIL", count(Verdict::fail)},
                 {"SKIP", count(Verdict::skip)}};
  j["checks"] = nlohmann::json::array();
  for (const auto& c : checks) {
    nlohmann::json e;
    e["name"] = c.name;
    e["verdict"] = std::string(verdict_name(c.verdict));
    e["metric"] = c.metric.empty() ? nlohmann::json() : nlohmann::json(c.metric);
    e["measured"] = c.metric.empty() || !std::isfinite(c.measured) ? nlohmann::json() : nlohmann::json(c.measured);
    e["threshold"] = c.threshold.empty() ? nlohmann::json() : nlohmann::json(c.threshold);
    e["message"] = c.message;
    e["details"] = c.details;
    e["seconds"] = c.seconds;
    j["checks"].push_back(std::move(e));
  }
  // Messages quote tensor names and decoded text; never fail on odd bytes.
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string DoctorReport::to_table() const {
  std::size_t w = 5;
  for (const auto& c : checks) w = std::max(w, c.name.size());
  std::string out = fmt::format("gdn doctor {}\n", model_dir);
  for (const auto& c : checks) {
    std::string fig;
    if (!c.metric.empty()) fig = fmt::format("{} = {}{}", c.metric, detail::figure(c.measured),
                                             c.threshold.empty() ? "" : fmt::format(", limit {}", c.threshold));
    out += fmt::format("{}  {:<{}}  {}\n", verdict_name(c.verdict), c.name, w, c.message);
    if (!fig.empty()) out += fmt::format("      {:<{}}  {}\n", "", w, fig);
    // WARN and FAIL show what they are about; PASS keeps to one or two lines.
    if (c.verdict == Verdict::warn || c.verdict == Verdict::fail || c.name == "generation.degeneration") {
      const std::size_t shown = 8;
      for (std::size_t i = 0; i < c.details.size() && i < shown; ++i) out += fmt::format("      {:<{}}  - {}\n", "", w, c.details[i]);
      if (c.details.size() > shown) out += fmt::format("      {:<{}}  - ... {} more (see --json)\n", "", w, c.details.size() - shown);
    }
  }
  out += fmt::format("summary: {} PASS, {} WARN, {} FAIL, {} SKIP in {:.1f} s: {}\n", count(Verdict::pass),
                     count(Verdict::warn), count(Verdict::fail), count(Verdict::skip), seconds,
                     ok() ? "no check failed" : "FAILED");
  return out;
}

GenerationStats generation_stats(std::span<const Token> tokens, int n) {
  GenerationStats s;
  s.tokens = static_cast<std::int64_t>(tokens.size());
  if (tokens.empty()) return s;
  std::unordered_map<Token, std::int64_t> counts;
  for (const Token t : tokens) ++counts[t];
  s.distinct_ratio = static_cast<double>(counts.size()) / static_cast<double>(tokens.size());
  for (const auto& [t, k] : counts) {
    const double p = static_cast<double>(k) / static_cast<double>(tokens.size());
    s.entropy_bits -= p * std::log2(p);
  }
  if (n >= 1 && tokens.size() >= static_cast<std::size_t>(n)) {
    std::set<std::vector<Token>> seen;
    std::int64_t repeated = 0, total = 0;
    for (std::size_t i = 0; i + static_cast<std::size_t>(n) <= tokens.size(); ++i) {
      std::vector<Token> g(tokens.begin() + static_cast<std::ptrdiff_t>(i), tokens.begin() + static_cast<std::ptrdiff_t>(i) + n);
      repeated += !seen.insert(std::move(g)).second;
      ++total;
    }
    s.repeated_ngram_rate = static_cast<double>(repeated) / static_cast<double>(total);
  }
  return s;
}

Verdict classify_generation(const GenerationStats& s) noexcept {
  namespace lim = doctor_limits;
  if (s.tokens < 8) return Verdict::pass;  // nothing to judge
  if (s.entropy_bits < lim::degenerate_entropy_bits) return Verdict::fail;
  if (s.repeated_ngram_rate > lim::looping_repeated_4gram_rate || s.distinct_ratio < lim::degenerate_distinct_ratio)
    return Verdict::warn;
  return Verdict::pass;
}

DoctorReport run_doctor(const std::string& dir, const DoctorOptions& options) {
  // A doctor asked to check the CUDA backend where it cannot run is the caller's error, not a
  // finding about the checkpoint.
  if (options.backend == Backend::cuda) require_cuda_device(0);
  const auto t0 = std::chrono::steady_clock::now();
  DoctorReport report;
  report.model_dir = dir;
  detail::DoctorSubject s;
  s.dir = dir;
  s.options = options;
  detail::CheckRecorder rec(report);
  detail::check_checkpoint(s, rec);
  if (s.model) {
    try {
      s.eos = load_eos_token_ids(dir);
    } catch (const Error&) {
      s.eos = s.model->config().eos_token_ids;
    }
  }
  detail::check_probes(s, rec);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

}  // namespace gdn
