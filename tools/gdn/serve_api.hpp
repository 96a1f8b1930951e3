#pragma once
// gdn serve's OpenAI API surface: a request body (already parsed JSON) becomes an engine Request, with
// every field checked — types, ranges, fields that change the answer but are not supported (n > 1,
// logprobs, logit_bias, ...), unknown fields — so that a client is told what is wrong instead of getting
// an answer to a different question. Errors carry the HTTP status and OpenAI's error shape.

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gdn/io/tokenizer.hpp"
#include "gdn/runtime/sampling.hpp"
#include "serve_engine.hpp"

namespace gdn::serve {

using ojson = nlohmann::ordered_json;

struct ApiError : std::runtime_error {
  ApiError(int status_, const std::string& message, std::string param_ = {}, std::string type_ = "invalid_request_error",
           std::string code_ = {})
      : std::runtime_error(message), status(status_), param(std::move(param_)), type(std::move(type_)), code(std::move(code_)) {}
  int status;
  std::string param, type, code;
};

// {"error": {"message", "type", "param", "code"}}
std::string error_body(const std::string& message, const std::string& type, const std::string& param = {},
                       const std::string& code = {});

struct ServeInfo {
  std::string model_name;
  const Tokenizer* tokenizer = nullptr;
  std::vector<Token> eos;
  std::optional<Token> im_start, im_end;
  int vocab = 0;
  int max_context = 0;
  SamplingParams defaults;  // from generation_config.json (do_sample false: greedy), else OpenAI's
};

// generation_config.json's sampling defaults (temperature 1 when there is none, as OpenAI's API).
SamplingParams generation_defaults(const std::string& model_dir);

struct ApiRequest {
  std::shared_ptr<Request> req;
  bool chat = false, stream = false, include_usage = false;
  bool continuous_usage = false;  // stream_options.continuous_usage_stats (vLLM's): usage in every chunk
  bool thinking = false;    // the prompt ends in an open <think> block
  std::string tools_json;   // tools the output is parsed for (empty: none)
};

ApiRequest parse_chat_request(const ojson& body, const ServeInfo& info);
ApiRequest parse_completion_request(const ojson& body, const ServeInfo& info);

// Offset of the first byte that is not valid UTF-8, or npos.
std::size_t invalid_utf8_at(std::string_view s);

}  // namespace gdn::serve
