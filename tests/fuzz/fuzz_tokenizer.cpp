// libFuzzer target: tokenizer.json loading on arbitrary text. A refusal must be gdn::Error with
// invalid_file or unsupported_model. A tokenizer that loads is then used: a few texts are encoded
// (with and without special tokens), every id of the result decodes, and streaming decode of the
// first ids equals decode() of them, as include/gdn/io/tokenizer.hpp promises.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_check.hpp"
#include "gdn/core/error.hpp"
#include "gdn/io/tokenizer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::optional<gdn::Tokenizer> tok;
  try {
    tok.emplace(gdn::Tokenizer::from_json(text, "fuzz/tokenizer.json"));
  } catch (const gdn::Error& e) {
    GDN_FUZZ_CHECK(e.status() == gdn::Status::invalid_file || e.status() == gdn::Status::unsupported_model);
    return 0;
  }
  const std::int32_t vocab = tok->vocab_size();
  GDN_FUZZ_CHECK(vocab >= 0);
  for (const std::string_view sample : {std::string_view("Hello, world! 123 <|im_start|>user\n  tabs\tand  spaces"),
                                        std::string_view("caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80 ab<sep>[MASK]"),
                                        std::string_view("")}) {
    for (const bool special : {true, false}) {
      const std::vector<std::int32_t> ids = tok->encode(sample, special);
      for (const auto id : ids) GDN_FUZZ_CHECK(id >= 0 && id < vocab);
      const std::string whole = tok->decode(ids);
      gdn::StreamDecoder stream(*tok);
      std::string streamed;
      for (const auto id : ids) streamed += stream.push(id);
      streamed += stream.flush();
      GDN_FUZZ_CHECK(streamed == whole);
    }
  }
  // Every id either decodes or is refused as invalid_token.
  for (std::int32_t id = 0; id < std::min<std::int32_t>(vocab, 512); ++id) {
    try {
      const std::int32_t one[] = {id};
      (void)tok->decode(one, id % 2 == 0);
      (void)tok->id_to_token(id);
    } catch (const gdn::Error& e) {
      GDN_FUZZ_CHECK(e.status() == gdn::Status::invalid_token);
    }
  }
  return 0;
}
