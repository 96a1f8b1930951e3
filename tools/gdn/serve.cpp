// gdn serve MODEL_DIR [--host 127.0.0.1] [--port 8000] [--api-key K] [--max-sequences N] [--cache-bytes B]
//                     [--mtp K] [--backend cpu|cuda] [...]  (usage() lists every option)
//
// An OpenAI-compatible HTTP server on libgdn's public API (serve_engine.hpp: continuous batching, the
// prefix cache, MTP), cpp-httplib and nlohmann-json:
//   POST /v1/chat/completions   messages through the chat template (tools and tool calls too), streamed
//                               as server-sent events ending with `data: [DONE]` when "stream" is true
//   POST /v1/completions        a prompt string or token ids
//   GET  /v1/models             the one model served
//   GET  /health                503 while the model loads, 200 once it serves
//   GET  /metrics               Prometheus text
// With --api-key, /v1/* needs "Authorization: Bearer K" (401 otherwise). Errors use OpenAI's shape
// {"error": {"message", "type", "param", "code"}}. SIGTERM / SIGINT: no new requests (503), in-flight
// ones finish (cancelled after --shutdown-timeout), the port is closed, exit status 0.

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <httplib.h>

#include "commands.hpp"
#include "context_flags.hpp"
#include "load_flags.hpp"
#include "gdn/core/error.hpp"
#include "gdn/model/model.hpp"
#include "gdn/runtime/generator.hpp"
#include "serve_api.hpp"
#include "serve_engine.hpp"
#include "serve_text.hpp"

namespace gdn::serve {
namespace {

int usage() {
  std::fputs(
      "usage: gdn serve MODEL_DIR [--host 127.0.0.1] [--port 8000] [--api-key K] [--served-model-name NAME]\n"
      "                 [--max-sequences 8] [--max-context 4096] [--max-queue 64] [--cache-bytes 1G]\n"
      "                 [--cache-interval 512] [--mtp K [--mtp-fixed]] [--step-tokens 256] [--threads N] [--backend cpu|cuda]\n"
      "                 [--device N] [--max-body-bytes 8M] [--shutdown-timeout 10] [--http-threads N]\n"
      "                 [--state-dtype f32|bf16] [--kv-dtype f32|bf16]   the context's state and KV cache element types\n"
      "                 [--pack | --in-place | --image FILE] [--quant q8_0|q4_0|q4_k|q4_k_m] [--lm-head-quant auto|q8_0|q4_0|q4_k]   where the CPU backend reads the weights (gdn pack)\n"
      "  --port 0           pick a free port (printed on stdout: 'listening on http://HOST:PORT')\n"
      "  --cache-bytes B    memory for the prefix cache (snapshots and the KV pages they keep); 0 disables it\n"
      "  --mtp K            MTP speculative decoding with up to K drafts per round, where measured to pay\n"
      "  --mtp-fixed        draft K every round, never adapted (tests, measurements)\n"
      "  --step-tokens N    tokens per step: every running decode plus prefill chunks of new requests\n",
      stderr);
  return 2;
}

std::int64_t parse_bytes(std::string_view s) {
  if (s.empty()) throw Error(Status::invalid_argument, "a byte count is empty");
  std::int64_t mult = 1;
  switch (s.back()) {
    case 'k': case 'K': mult = std::int64_t{1} << 10; break;
    case 'm': case 'M': mult = std::int64_t{1} << 20; break;
    case 'g': case 'G': mult = std::int64_t{1} << 30; break;
    default: break;
  }
  if (mult != 1) s.remove_suffix(1);
  std::size_t used = 0;
  const double v = std::stod(std::string(s), &used);
  if (used != s.size() || v < 0) throw Error(Status::invalid_argument, fmt::format("'{}' is not a byte count", s));
  return static_cast<std::int64_t>(v * static_cast<double>(mult));
}

struct Options {
  std::string dir, host = "127.0.0.1", api_key, name;
  int port = 8000, http_threads = 0;
  std::int64_t max_body = std::int64_t{8} << 20;
  double shutdown_timeout = 10.0;
  bool verbose = false;
  EngineConfig engine;
  ModelParams load;  // --pack / --in-place / --image FILE (load_flags.hpp); backend and device come from engine
};

std::string random_id(std::string_view prefix) {
  static std::atomic<std::uint64_t> counter{0};
  static const std::uint64_t salt = (static_cast<std::uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  return fmt::format("{}{:016x}{:08x}", prefix, salt ^ (0x9e3779b97f4a7c15ULL * ++counter), static_cast<std::uint32_t>(counter));
}

// The client socket of a request: httplib does not hand it to handlers, so it is found by its peer
// address among this process's sockets. The engine polls it for a hang-up (a disconnect frees the slot
// before the next step).
int connection_fd(const httplib::Request& req, int local_port) {
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  int found = -1;
  while (const dirent* e = ::readdir(d)) {
    const int fd = std::atoi(e->d_name);
    if (fd <= 2) continue;
    sockaddr_storage local{}, peer{};
    socklen_t ll = sizeof local, pl = sizeof peer;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0 || ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0)
      continue;
    char addr[INET6_ADDRSTRLEN] = {};
    int lport = 0, pport = 0;
    if (peer.ss_family == AF_INET) {
      const auto* p = reinterpret_cast<const sockaddr_in*>(&peer);
      ::inet_ntop(AF_INET, &p->sin_addr, addr, sizeof addr);
      pport = ntohs(p->sin_port);
      lport = ntohs(reinterpret_cast<const sockaddr_in*>(&local)->sin_port);
    } else if (peer.ss_family == AF_INET6) {
      const auto* p = reinterpret_cast<const sockaddr_in6*>(&peer);
      ::inet_ntop(AF_INET6, &p->sin6_addr, addr, sizeof addr);
      pport = ntohs(p->sin6_port);
      lport = ntohs(reinterpret_cast<const sockaddr_in6*>(&local)->sin6_port);
    } else {
      continue;
    }
    if (lport == local_port && pport == req.remote_port && req.remote_addr == addr) {
      found = fd;
      break;
    }
  }
  ::closedir(d);
  return found;
}

class Server {
 public:
  explicit Server(Options o) : opt_(std::move(o)) {}
  int run();

 private:
  void routes();
  bool authorized(const httplib::Request& req, httplib::Response& res);
  bool ready(httplib::Response& res);
  void generate(const httplib::Request& req, httplib::Response& res, bool chat);
  void load();
  std::string metrics_text();
  void count_status(int status) {
    std::lock_guard lk(status_m_);
    ++statuses_[status];
  }

  Options opt_;
  httplib::Server http_;
  int port_ = 0;
  std::atomic<int> phase_{0};  // 0 loading, 1 serving, 2 failed, 3 shutting down
  std::unique_ptr<Tokenizer> tok_;
  std::unique_ptr<Engine> engine_;
  ServeInfo info_;
  std::time_t created_ = std::time(nullptr);
  std::mutex status_m_;
  std::map<int, std::int64_t> statuses_;
};

void send_error(httplib::Response& res, int status, const std::string& message, const std::string& type = "invalid_request_error",
                const std::string& param = {}, const std::string& code = {}) {
  res.status = status;
  res.set_content(error_body(message, type, param, code), "application/json");
}

bool Server::authorized(const httplib::Request& req, httplib::Response& res) {
  if (opt_.api_key.empty()) return true;
  const std::string want = "Bearer " + opt_.api_key;
  const std::string got = req.get_header_value("Authorization");
  // Constant time in the key's length.
  unsigned diff = static_cast<unsigned>(got.size() ^ want.size());
  for (std::size_t i = 0; i < want.size(); ++i) diff |= static_cast<unsigned>(want[i] ^ (i < got.size() ? got[i] : 0));
  if (diff == 0) return true;
  send_error(res, 401, got.empty() ? "You didn't provide an API key: send 'Authorization: Bearer YOUR_KEY'" : "Incorrect API key provided",
             "invalid_request_error", {}, "invalid_api_key");
  return false;
}

bool Server::ready(httplib::Response& res) {
  const int p = phase_.load();
  if (p == 1) return true;
  res.set_header("Retry-After", "5");
  send_error(res, 503, p == 0 ? "the model is still loading" : p == 3 ? "the server is shutting down" : "the server failed",
             "server_error");
  return false;
}

ojson usage_json(std::int64_t prompt, std::int64_t completion, std::int64_t cached) {
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

ojson tool_calls_json(const std::vector<ParsedToolCall>& calls) {
  ojson arr = ojson::array();
  for (const auto& c : calls)
    arr.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  return arr;
}

std::string sse(const ojson& j) { return "data: " + j.dump(-1, ' ', false, ojson::error_handler_t::replace) + "\n\n"; }

const char* finish_name(Finish f, bool tool_calls) {
  if (f == Finish::length) return "length";
  return tool_calls ? "tool_calls" : "stop";
}

// The state of one streamed response, shared with httplib's content provider.
struct Stream {
  std::shared_ptr<Request> req;
  ApiRequest api;
  std::unique_ptr<ChatOutput> parser;
  std::string id, model;
  std::time_t created = 0;
  bool started = false;
  std::size_t tools_sent = 0;
  std::int64_t prompt_tokens = 0;
};

void Server::generate(const httplib::Request& hreq, httplib::Response& res, bool chat) {
  if (!authorized(hreq, res) || !ready(res)) return;
  if (const auto bad_at = invalid_utf8_at(hreq.body); bad_at != std::string_view::npos)
    return send_error(res, 400, fmt::format("the request body is not valid UTF-8 (byte {})", bad_at));
  ojson body;
  try {
    body = ojson::parse(hreq.body);
  } catch (const ojson::exception& e) {
    return send_error(res, 400, fmt::format("the request body is not valid JSON: {}", e.what()));
  }
  ApiRequest api;
  try {
    api = chat ? parse_chat_request(body, info_) : parse_completion_request(body, info_);
  } catch (const ApiError& e) {
    return send_error(res, e.status, e.what(), e.type, e.param, e.code);
  } catch (const std::exception& e) {
    return send_error(res, 400, e.what());
  }
  const std::shared_ptr<Request> r = api.req;
  r->fd = connection_fd(hreq, port_);
  switch (engine_->submit(r)) {
    case Engine::Submit::ok: break;
    case Engine::Submit::queue_full:
      res.set_header("Retry-After", "1");
      return send_error(res, 503, "the server is at capacity (its queue is full); retry shortly", "server_error", {}, "overloaded");
    case Engine::Submit::shutting_down:
      res.set_header("Retry-After", "5");
      return send_error(res, 503, "the server is shutting down", "server_error");
    case Engine::Submit::unhealthy:
      return send_error(res, 503, "the engine failed; see the server's log", "server_error");
  }
  const std::string id = random_id(chat ? "chatcmpl-" : "cmpl-");
  const std::time_t created = std::time(nullptr);
  const auto P = static_cast<std::int64_t>(r->prompt.size());

  if (!api.stream) {
    std::unique_lock lk(r->m);
    r->cv.wait(lk, [&] { return r->done; });
    if (r->finish == Finish::cancelled) {
      res.status = 499;  // the client is gone; nobody reads this
      return;
    }
    if (r->finish == Finish::error) return send_error(res, 500, "generation failed: " + r->error, "server_error");
    const ojson usage = usage_json(P, r->completion_tokens, r->cached_tokens);
    ojson out;
    if (chat) {
      ChatOutput parser(api.thinking, api.tools_json);
      parser.push(r->text);
      parser.finish();
      ojson msg = {{"role", "assistant"}, {"content", parser.content()}};
      if (api.thinking) msg["reasoning_content"] = parser.reasoning();
      if (!parser.tool_calls().empty()) {
        msg["tool_calls"] = tool_calls_json(parser.tool_calls());
        if (parser.content().empty()) msg["content"] = nullptr;
      }
      out = {{"id", id}, {"object", "chat.completion"}, {"created", created}, {"model", info_.model_name},
             {"choices", ojson::array({{{"index", 0}, {"message", msg}, {"logprobs", nullptr},
                                        {"finish_reason", finish_name(r->finish, !parser.tool_calls().empty())}}})},
             {"usage", usage}};
    } else {
      out = {{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", info_.model_name},
             {"choices", ojson::array({{{"index", 0}, {"text", r->text}, {"logprobs", nullptr},
                                        {"finish_reason", finish_name(r->finish, false)}}})},
             {"usage", usage}};
    }
    res.set_content(out.dump(-1, ' ', false, ojson::error_handler_t::replace), "application/json");
    return;
  }

  auto st = std::make_shared<Stream>();
  st->req = r;
  st->api = api;
  st->id = id;
  st->model = info_.model_name;
  st->created = created;
  st->prompt_tokens = P;
  if (chat) st->parser = std::make_unique<ChatOutput>(api.thinking, api.tools_json);
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider("text/event-stream", [st, chat](std::size_t, httplib::DataSink& sink) {
    Request& q = *st->req;
    std::string text, error;
    bool done = false;
    Finish finish = Finish::none;
    std::int64_t completion = 0, cached = 0;
    {
      std::unique_lock lk(q.m);
      q.cv.wait_for(lk, std::chrono::milliseconds(100), [&] { return !q.text.empty() || q.done; });
      text.swap(q.text);
      done = q.done;
      finish = q.finish;
      error = q.error;
      completion = q.completion_tokens;
      cached = q.cached_tokens;
    }
    if (done && finish == Finish::cancelled) return false;
    const auto chunk = [&](ojson choice) {
      ojson c{{"id", st->id}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"created", st->created},
              {"model", st->model}, {"choices", ojson::array({std::move(choice)})}};
      if (st->api.continuous_usage) c["usage"] = usage_json(st->prompt_tokens, completion, cached);
      return c;
    };
    std::string out;
    if (chat && !st->started) out += sse(chunk({{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}},
                                                {"logprobs", nullptr}, {"finish_reason", nullptr}}));
    st->started = true;
    if (chat) {
      ChatDelta d = st->parser->push(text);
      if (done && finish != Finish::error) {
        ChatDelta f = st->parser->finish();
        d.reasoning += f.reasoning;
        d.content += f.content;
        for (auto& c : f.tool_calls) d.tool_calls.push_back(std::move(c));
      }
      if (!d.reasoning.empty())
        out += sse(chunk({{"index", 0}, {"delta", {{"reasoning_content", d.reasoning}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}}));
      if (!d.content.empty())
        out += sse(chunk({{"index", 0}, {"delta", {{"content", d.content}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}}));
      for (const auto& c : d.tool_calls) {
        // A call in two deltas, as OpenAI streams them: id, type and name, then the arguments.
        const ojson head = {{"index", st->tools_sent}, {"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", ""}}}};
        const ojson args = {{"index", st->tools_sent}, {"function", {{"arguments", c.arguments}}}};
        out += sse(chunk({{"index", 0}, {"delta", {{"tool_calls", ojson::array({head})}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}}));
        out += sse(chunk({{"index", 0}, {"delta", {{"tool_calls", ojson::array({args})}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}}));
        ++st->tools_sent;
      }
    } else if (!text.empty()) {
      out += sse(chunk({{"index", 0}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", nullptr}}));
    }
    if (done) {
      if (finish == Finish::error) {
        out += "data: " + error_body("generation failed: " + error, "server_error") + "\n\n";
      } else {
        const char* reason = finish_name(finish, st->tools_sent > 0);
        out += sse(chat ? chunk({{"index", 0}, {"delta", ojson::object()}, {"logprobs", nullptr}, {"finish_reason", reason}})
                        : chunk({{"index", 0}, {"text", ""}, {"logprobs", nullptr}, {"finish_reason", reason}}));
        if (st->api.include_usage) {
          ojson u = chunk({});
          u["choices"] = ojson::array();
          u["usage"] = usage_json(st->prompt_tokens, completion, cached);
          out += sse(u);
        }
      }
      out += "data: [DONE]\n\n";
    }
    if (!out.empty() && !sink.write(out.data(), out.size())) {
      q.cancelled = true;
      return false;
    }
    if (done) sink.done();
    return true;
  }, [st](bool) { st->req->cancelled = true; });  // the response is over: a request still running is not wanted
}

std::string Server::metrics_text() {
  std::string out;
  const auto metric = [&](const char* name, const char* type, const char* help, auto value) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, value);
  };
  const auto histogram = [&](const char* name, const char* help, const Histogram& h) {
    out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
    std::int64_t cum = 0;
    for (std::size_t i = 0; i < h.bounds.size(); ++i) {
      cum += h.counts[i];
      out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, h.bounds[i], cum);
    }
    cum += h.counts.back();
    out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, cum, name, h.sum, name, h.n);
  };
  const bool up = engine_ != nullptr;
  const EngineMetrics m = up ? engine_->metrics() : EngineMetrics{};
  metric("gdn_up", "gauge", "1 once the model serves.", phase_.load() == 1 ? 1 : 0);
  metric("gdn_prompt_tokens_total", "counter", "Prompt tokens of admitted requests, cached ones included.", m.prompt_tokens);
  metric("gdn_prompt_cached_tokens_total", "counter", "Prompt tokens served from the prefix cache (not prefilled).", m.cached_tokens);
  metric("gdn_generation_tokens_total", "counter", "Tokens generated.", m.generated_tokens);
  metric("gdn_mtp_draft_tokens_total", "counter", "MTP draft tokens verified.", m.drafted);
  metric("gdn_mtp_accepted_tokens_total", "counter", "MTP draft tokens accepted.", m.accepted);
  metric("gdn_queue_depth", "gauge", "Requests waiting for a slot.", m.queue_depth);
  metric("gdn_slots_in_use", "gauge", "Sequence slots running a request.", m.running);
  metric("gdn_slots_total", "gauge", "Sequence slots (--max-sequences).", m.max_sequences);
  metric("gdn_steps_total", "counter", "Context steps run.", m.steps);
  metric("gdn_step_tokens_total", "counter", "Tokens in those steps (decode, drafts to verify, prefill).", m.step_rows);
  metric("gdn_prefix_cache_bytes", "gauge", "Memory the prefix cache is charged.", m.cache_bytes);
  metric("gdn_prefix_cache_budget_bytes", "gauge", "The prefix cache's budget (--cache-bytes).", m.cache_budget);
  metric("gdn_prefix_cache_snapshots", "gauge", "Snapshots in the prefix cache.", m.cache_nodes);
  metric("gdn_prefix_cache_hits_total", "counter", "Requests that started from a cached prefix.", m.cache_hits);
  metric("gdn_prefix_cache_misses_total", "counter", "Requests that found no cached prefix.", m.cache_misses);
  metric("gdn_prefix_cache_evictions_total", "counter", "Snapshots evicted.", m.cache_evicted);
  out += "# HELP gdn_requests_total Requests by outcome.\n# TYPE gdn_requests_total counter\n";
  out += fmt::format("gdn_requests_total{{outcome=\"finished\"}} {}\ngdn_requests_total{{outcome=\"cancelled\"}} {}\n"
                     "gdn_requests_total{{outcome=\"failed\"}} {}\ngdn_requests_total{{outcome=\"rejected\"}} {}\n",
                     m.finished, m.cancelled, m.failed, m.rejected);
  {
    std::lock_guard lk(status_m_);
    out += "# HELP gdn_http_responses_total HTTP responses by status.\n# TYPE gdn_http_responses_total counter\n";
    for (const auto& [code, n] : statuses_) out += fmt::format("gdn_http_responses_total{{code=\"{}\"}} {}\n", code, n);
  }
  histogram("gdn_time_to_first_token_seconds", "From arrival to the first generated token.", m.ttft);
  histogram("gdn_inter_token_latency_seconds", "Between consecutive generated tokens.", m.itl);
  return out;
}

void Server::routes() {
  http_.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const int p = phase_.load();
    res.status = p == 1 ? 200 : 503;
    res.set_content(p == 1 ? R"({"status":"ok"})" : p == 0 ? R"({"status":"loading"})" : R"({"status":"unavailable"})",
                    "application/json");
  });
  http_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_text(), "text/plain; version=0.0.4");
  });
  http_.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res) || !ready(res)) return;
    const ojson m = {{"id", info_.model_name}, {"object", "model"}, {"created", created_}, {"owned_by", "libgdn"},
                     {"max_model_len", info_.max_context}};
    res.set_content(ojson{{"object", "list"}, {"data", ojson::array({m})}}.dump(), "application/json");
  });
  http_.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) { generate(req, res, true); });
  http_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) { generate(req, res, false); });
  http_.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (res.body.empty()) {
      if (res.status == 404)
        send_error(res, 404, fmt::format("no route {} {} (see /v1/chat/completions, /v1/completions, /v1/models)", req.method, req.path),
                   "invalid_request_error", {}, "not_found");
      else if (res.status == 413)
        send_error(res, 413, fmt::format("the request body is larger than {} bytes (--max-body-bytes)", opt_.max_body));
      else
        send_error(res, res.status, fmt::format("HTTP {}", res.status), res.status >= 500 ? "server_error" : "invalid_request_error");
    }
  });
  http_.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, 500, what, "server_error");
  });
  http_.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    count_status(res.status);
    if (opt_.verbose) fmt::print(stderr, "{} {} -> {}\n", req.method, req.path, res.status);
  });
}

void Server::load() {
  const std::string tok_path = (std::filesystem::path(opt_.dir) / "tokenizer.json").string();
  if (!std::filesystem::exists(tok_path))
    throw Error(Status::io_error, fmt::format("'{}' has no tokenizer.json; gdn serve needs one", opt_.dir));
  tok_ = std::make_unique<Tokenizer>(Tokenizer::load(tok_path));
  // The load makes the backend's form of the weights (packed for the CPU, uploaded to the device for
  // CUDA); prefetching the mapping only helps the CPU, which may read weights in place.
  ModelParams mp = opt_.load;
  mp.backend = opt_.engine.backend;
  mp.device = opt_.engine.device;
  auto model = Model::load(opt_.dir, mp);
  if (mp.backend == Backend::cpu) model->prefetch();
  info_.tokenizer = tok_.get();
  info_.eos = load_eos_token_ids(opt_.dir);
  info_.im_start = tok_->token_to_id("<|im_start|>");
  info_.im_end = tok_->token_to_id("<|im_end|>");
  info_.vocab = model->config().vocab_size;
  info_.max_context = opt_.engine.max_context;
  info_.defaults = generation_defaults(opt_.dir);
  if (opt_.engine.mtp > 0 && !model->has_mtp())
    fmt::print(stderr, "gdn serve: '{}' has no MTP head; --mtp {} is ignored\n", opt_.dir, opt_.engine.mtp);
  engine_ = std::make_unique<Engine>(std::move(model), *tok_, opt_.engine);
}

int Server::run() {
  info_.model_name = opt_.name;
  const int threads = opt_.http_threads > 0 ? opt_.http_threads
                                            : std::max(32, 2 * (opt_.engine.max_sequences + opt_.engine.max_queue) + 8);
  http_.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<std::size_t>(threads)); };
  http_.set_payload_max_length(static_cast<std::size_t>(opt_.max_body));
  // SO_REUSEADDR, not httplib's default SO_REUSEPORT: a restarted server binds at once (closed
  // connections in TIME_WAIT do not block it), and a second server on a port in use fails instead of
  // silently sharing it.
  http_.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  http_.set_keep_alive_timeout(2);
  http_.set_read_timeout(30);
  http_.set_write_timeout(30);
  routes();
  port_ = opt_.port == 0 ? http_.bind_to_any_port(opt_.host) : (http_.bind_to_port(opt_.host, opt_.port) ? opt_.port : -1);
  if (port_ <= 0) {
    fmt::print(stderr, "gdn serve: cannot listen on {}:{}\n", opt_.host, opt_.port);
    return 1;
  }
  std::thread listener([this] { http_.listen_after_bind(); });
  fmt::print("gdn serve: listening on http://{}:{} (model '{}' loading)\n", opt_.host, port_, opt_.name);
  std::fflush(stdout);
  int status = 0;
  try {
    load();
    phase_ = 1;
    const ContextParams& cp = engine_->context_params();
    fmt::print("gdn serve: ready: {} slots x {} positions, step {} tokens, MTP {}, prefix cache {:.0f} MiB ({:.2f} MiB GDN state "
               "per snapshot, {} bytes KV per token)\n",
               cp.max_sequences, cp.max_context, cp.max_batch_tokens, cp.max_rollback_tokens > 0 ? opt_.engine.mtp : 0,
               static_cast<double>(opt_.engine.cache_bytes) / (1 << 20), static_cast<double>(engine_->snapshot_bytes()) / (1 << 20),
               engine_->kv_bytes_per_token());
    std::fflush(stdout);
  } catch (const std::exception& e) {
    fmt::print(stderr, "gdn serve: cannot load '{}': {}\n", opt_.dir, e.what());
    phase_ = 2;
    status = 1;
  }
  if (status == 0) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    int sig = 0;
    sigwait(&set, &sig);
    fmt::print(stderr, "gdn serve: {} received: finishing in-flight requests (at most {:.0f} s)\n", sig == SIGTERM ? "SIGTERM" : "SIGINT",
               opt_.shutdown_timeout);
    phase_ = 3;
    engine_->shutdown(std::chrono::milliseconds(static_cast<std::int64_t>(opt_.shutdown_timeout * 1000)));
  }
  // httplib's stop() does nothing until the listener thread has entered its accept loop, and the
  // loop would then run forever: a load that fails at once (no CUDA device) raced it and hung here.
  while (!http_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  http_.stop();
  listener.join();
  engine_.reset();
  fmt::print(stderr, "gdn serve: stopped\n");
  return status;
}

}  // namespace
}  // namespace gdn::serve

namespace gdn::cli {

int serve(int argc, char** argv) {
  using namespace gdn::serve;
  if (argc < 1) return usage();
  Options o;
  o.dir = argv[0];
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const bool v = i + 1 < argc;
    if (a == "--host" && v) o.host = argv[++i];
    else if (a == "--port" && v) o.port = std::stoi(argv[++i]);
    else if (a == "--api-key" && v) o.api_key = argv[++i];
    else if (a == "--served-model-name" && v) o.name = argv[++i];
    else if (a == "--max-sequences" && v) o.engine.max_sequences = std::stoi(argv[++i]);
    else if (a == "--max-context" && v) o.engine.max_context = std::stoi(argv[++i]);
    else if (a == "--max-queue" && v) o.engine.max_queue = std::stoi(argv[++i]);
    else if (a == "--cache-bytes" && v) o.engine.cache_bytes = parse_bytes(argv[++i]);
    else if (a == "--cache-interval" && v) o.engine.cache_interval = std::stoi(argv[++i]);
    else if (a == "--mtp" && v) o.engine.mtp = std::stoi(argv[++i]);
    else if (a == "--mtp-fixed") o.engine.mtp_adaptive = false;
    else if (a == "--step-tokens" && v) o.engine.step_tokens = std::stoi(argv[++i]);
    else if (a == "--threads" && v) o.engine.threads = std::stoi(argv[++i]);
    else if (a == "--device" && v) o.engine.device = std::stoi(argv[++i]);
    else if (a == "--max-body-bytes" && v) o.max_body = parse_bytes(argv[++i]);
    else if (a == "--shutdown-timeout" && v) o.shutdown_timeout = std::stod(argv[++i]);
    else if (a == "--http-threads" && v) o.http_threads = std::stoi(argv[++i]);
    else if (a == "--verbose") o.verbose = true;
    else if (a == "--backend" && v) o.engine.backend = parse_backend(argv[++i]);
    else if (parse_load_flag(argc, argv, i, o.load)) continue;
    else if (parse_context_flag(argc, argv, i, o.engine.state_dtype, o.engine.kv_dtype)) continue;
    else {
      fmt::print(stderr, "gdn serve: unknown argument '{}'\n", a);
      return usage();
    }
  }
  if (o.name.empty()) o.name = std::filesystem::path(o.dir).lexically_normal().filename().string();
  if (o.name.empty()) o.name = std::filesystem::path(o.dir).lexically_normal().parent_path().filename().string();
  if (o.engine.max_queue < 0 || o.engine.max_context < 2 || o.engine.cache_interval < 0)
    throw Error(Status::invalid_argument, "--max-queue, --max-context and --cache-interval must be non-negative (max-context >= 2)");
  // Signals are taken by sigwait in the main thread; every thread started from here inherits the mask.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  Server s(std::move(o));
  return s.run();
}

}  // namespace gdn::cli
