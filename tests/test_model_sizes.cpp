// Every size the loader accepts runs correctly (docs/reliability.md, "Sizes"): small random
// checkpoints with the sizes no fixture has — value heads of 600 and 1024, head dims 48 and 96,
// conv kernels 1, 2, 5 and 8, 1 to 80 query heads per kv head, odd hidden / key / FFN sizes, stacks
// of GDN layers only or attention only (with an MTP head), the Qwen3-Next fused layout — written in
// the Hugging Face layout (random_checkpoint.hpp), loaded like any checkpoint, and held to the
// identities the model must satisfy, with no transformers output to compare against:
//   prefill == token-by-token decode (the per-token recurrence: bit for bit),
//   chunked GDN == recurrent GDN (float32 rounding),
//   a batch of three sequences == each alone (bit for bit), also for the decode steps after,
//   packed weights == weights read in place (bit for bit), finite logits everywhere,
//   the same identities for each quantised format (its mapped image == quantising at load),
//   and the MTP head and a bf16 state run.
// ctest runs this file once per CPU target the machine has (GDN_CPU_KERNEL=avx2, scalar too).

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gdn/model/packed_image.hpp"
#include "random_checkpoint.hpp"
#include "test_util.hpp"

using namespace gdn;

namespace {

struct Variant {
  const char* name;
  test::RandomModelSpec spec;
};

std::vector<Variant> variants() {
  using LK = LayerKind;
  const LK L = LK::linear_attention, F = LK::full_attention;
  std::vector<Variant> v;
  const auto add = [&](const char* name, auto edit) {
    test::RandomModelSpec s;
    s.seed = v.size() + 11;
    edit(s);
    v.push_back({name, s});
  };
  add("value head dim 600", [](auto& s) { s.lin_v_dim = 600, s.lin_k_dim = 8, s.lin_k_heads = 1, s.lin_v_heads = 2; });
  add("value head dim 1024", [](auto& s) { s.lin_v_dim = 1024, s.lin_k_dim = 16, s.lin_k_heads = 1, s.lin_v_heads = 1; });
  add("head dim 48", [](auto& s) { s.head_dim = 48, s.q_heads = 4, s.kv_heads = 2, s.partial_rotary = 0.25; });
  add("head dim 96", [](auto& s) { s.head_dim = 96, s.q_heads = 2, s.kv_heads = 1, s.partial_rotary = 1.0; });
  add("conv kernel 1", [](auto& s) { s.conv_kernel = 1; });
  add("conv kernel 2", [](auto& s) { s.conv_kernel = 2; });
  add("conv kernel 5", [](auto& s) { s.conv_kernel = 5; });
  add("conv kernel 8", [](auto& s) { s.conv_kernel = 8; });
  add("1 q head, 1 kv head", [](auto& s) { s.q_heads = 1, s.kv_heads = 1; });
  add("64 q heads, 64 kv heads", [](auto& s) { s.q_heads = 64, s.kv_heads = 64, s.head_dim = 8; });
  add("64 q heads per kv head", [](auto& s) { s.q_heads = 64, s.kv_heads = 1, s.head_dim = 8; });
  add("80 q heads per kv head", [](auto& s) { s.q_heads = 80, s.kv_heads = 1, s.head_dim = 4, s.partial_rotary = 0.5; });
  add("3 q heads per kv head, 3 value heads per key head", [](auto& s) { s.q_heads = 6, s.kv_heads = 2, s.lin_k_heads = 2, s.lin_v_heads = 6; });
  add("64 value heads per key head", [](auto& s) { s.lin_k_heads = 1, s.lin_v_heads = 64, s.lin_v_dim = 4, s.lin_k_dim = 4; });
  add("odd hidden, key dim, ffn, vocab", [](auto& s) { s.hidden = 33, s.lin_k_dim = 17, s.lin_v_dim = 9, s.ffn = 47, s.vocab = 61; });
  add("GDN layers only, MTP head", [&](auto& s) { s.layers = {L, L, L}, s.mtp = true; });
  add("attention layers only, MTP head, untied", [&](auto& s) { s.layers = {F, F}, s.mtp = true, s.tied = false; });
  add("Qwen3-Next fused layout, 3 value heads per key head", [](auto& s) {
    s.fused = true, s.lin_k_heads = 2, s.lin_v_heads = 6, s.lin_v_dim = 12, s.lin_k_dim = 10;
  });
  return v;
}

std::vector<Token> tokens(int vocab, int n, int seed) {
  std::vector<Token> t;
  for (int i = 0; i < n; ++i) t.push_back(static_cast<Token>((seed * 131 + i * 17 + i * i * 7) % vocab));
  return t;
}

ContextParams params(int chunk_min = 1 << 30) {
  ContextParams p;
  p.max_sequences = 3;
  p.max_context = 160;
  p.max_batch_tokens = 160;
  p.threads = 2;
  p.gdn_chunk_min_tokens = chunk_min;
  return p;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

bool all_finite(const std::vector<float>& v) {
  for (const float x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

double rms(const std::vector<float>& v) {
  double s = 0;
  for (const float x : v) s += static_cast<double>(x) * x;
  return std::sqrt(s / static_cast<double>(std::max<std::size_t>(v.size(), 1)));
}

// Logits of the last token of each prompt and of `steps` decode steps after it, the prompts run
// together in one batch or each alone.
std::vector<std::vector<float>> batch_run(Context& ctx, const std::vector<std::vector<Token>>& prompts, int steps, bool together) {
  const int V = ctx.model().config().vocab_size;
  std::vector<std::vector<float>> out(prompts.size());
  std::vector<SeqId> seqs;
  for (std::size_t i = 0; i < prompts.size(); ++i) seqs.push_back(ctx.create_sequence());
  Batch b;
  const auto run = [&](const std::vector<std::size_t>& which, int step) {
    b.clear();
    for (const std::size_t i : which) {
      if (step < 0) b.add(seqs[i], prompts[i], LogitsFor::last);
      else b.add(seqs[i], static_cast<Token>((step * 7 + static_cast<int>(i) * 3) % V), LogitsFor::last);
    }
    ctx.step(b);
    for (std::size_t k = 0; k < which.size(); ++k) {
      const auto l = ctx.logits(b.last_row(k));
      out[which[k]].insert(out[which[k]].end(), l.begin(), l.end());
    }
  };
  for (int step = -1; step < steps; ++step) {
    if (together) {
      run({0, 1, 2}, step);
    } else {
      for (std::size_t i = 0; i < prompts.size(); ++i) run({i}, step);
    }
  }
  for (const SeqId s : seqs) ctx.free_sequence(s);
  return out;
}

}  // namespace

TEST_CASE("every accepted size runs: prefill == decode, chunked == recurrent, batch == alone, packed == in place",
          "[sizes]") {
  for (const Variant& variant : variants()) {
    SECTION(variant.name) {
      INFO("variant: " << variant.name << ", kernel " << (std::getenv("GDN_CPU_KERNEL") ? std::getenv("GDN_CPU_KERNEL") : "best"));
      test::TempDir dir("sizes");
      test::write_random_checkpoint(variant.spec, dir.str());
      ModelParams in_place;
      in_place.weights = WeightPlacement::in_place;
      const auto packed = Model::load(dir.str());
      const auto mapped = Model::load(dir.str(), in_place);
      const int V = packed->config().vocab_size;
      const auto prompt = tokens(V, 70, 1);  // crosses a 64-token chunk boundary

      Context recurrent(packed, params());
      const auto prefill = test::prefill_logits(recurrent, prompt);
      REQUIRE(all_finite(prefill));
      CHECK(rms(prefill) > 1e-3);  // not degenerate

      // Token by token runs the same per-token recurrence: bit for bit.
      const auto decode = test::decode_logits(recurrent, prompt);
      CHECK(same_bits(prefill, decode));

      // The chunked (WY) form agrees to float32 rounding.
      Context chunked(packed, params(1));
      const auto pc = test::prefill_logits(chunked, prompt);
      const double scale = std::max(1.0, rms(prefill));
      CHECK(test::max_abs_diff(pc.data(), prefill.data(), pc.size()) <= 5e-4 * scale);

      // Weights read in place give the same bits as packed ones.
      Context ctx_in_place(mapped, params());
      CHECK(same_bits(test::prefill_logits(ctx_in_place, prompt), prefill));

      // A batch of three mixed-length sequences, then decode steps, == each alone.
      Context bctx(packed, params(16));
      const std::vector<std::vector<Token>> prompts = {tokens(V, 5, 2), tokens(V, 40, 3), tokens(V, 1, 4)};
      const auto together = batch_run(bctx, prompts, 3, true);
      const auto alone = batch_run(bctx, prompts, 3, false);
      for (std::size_t i = 0; i < prompts.size(); ++i) {
        CHECK(all_finite(together[i]));
        CHECK(same_bits(together[i], alone[i]));
      }

      // A bf16 recurrent state runs (and stays finite).
      ContextParams bp = params(16);
      bp.state_dtype = DType::bf16;
      Context bf(packed, bp);
      CHECK(all_finite(test::prefill_logits(bf, prompt)));

      // Quantised weights at this size, every format (docs/quantization.md): finite; prefill ==
      // token-by-token decode and a batch == each alone, bit for bit (activations are quantised per
      // row, so a row's result never depends on the others); the image `gdn pack` writes, mapped,
      // == quantising at load, bit for bit; near the float logits (test_quant_model bounds the
      // error against an independent dequantised reference).
      for (const WeightQuant wq : {WeightQuant::q8_0, WeightQuant::q4_0, WeightQuant::q4_k, WeightQuant::q4_k_m}) {
        INFO("quant " << weight_quant_name(wq));
        ModelParams qp;
        qp.quant = wq;
        qp.weights = WeightPlacement::packed;
        const auto qm = Model::load(dir.str(), qp);
        Context qc(qm, params());
        const auto ql = test::prefill_logits(qc, prompt);
        REQUIRE(all_finite(ql));
        CHECK(same_bits(ql, test::decode_logits(qc, prompt)));
        Context qb(qm, params(16));
        const auto qt = batch_run(qb, prompts, 2, true), qa = batch_run(qb, prompts, 2, false);
        for (std::size_t i = 0; i < prompts.size(); ++i) CHECK(same_bits(qt[i], qa[i]));
        std::vector<float> diff(ql.size());
        for (std::size_t i = 0; i < ql.size(); ++i) diff[i] = ql[i] - prefill[i];
        UNSCOPED_INFO("logit RMS error " << rms(diff) / rms(prefill) << " of the float logits' RMS");
        // Measured over these sizes: q8_0 0.005–0.023 of the float logits' RMS, the 4-bit formats
        // 0.04–0.22 (a wrong scale or nibble order gives about 1).
        CHECK(rms(diff) <= (wq == WeightQuant::q8_0 ? 0.06 : 0.5) * rms(prefill));
        PackImageOptions po;
        po.quant = wq;
        write_packed_image(dir.str(), po);
        ModelParams ip = qp;
        ip.weights = WeightPlacement::image;
        const auto im = Model::load(dir.str(), ip);
        REQUIRE(im->weight_placement() == WeightPlacement::image);
        Context ic(im, params());
        CHECK(same_bits(test::prefill_logits(ic, prompt), ql));
      }

      if (packed->has_mtp()) {
        Context m(packed, params());
        const SeqId s = m.create_sequence();
        Batch b;
        b.add(s, std::span(prompt).first(8), LogitsFor::all);
        m.step(b);
        std::vector<float> hidden;
        for (int r = 0; r < 8; ++r) {
          const auto h = m.hidden(r);
          hidden.insert(hidden.end(), h.begin(), h.end());
        }
        b.clear();
        b.add(s, std::span(prompt).subspan(1, 8), LogitsFor::all);
        m.step_mtp(b, hidden);
        for (int r = 0; r < 8; ++r) {
          const auto l = m.logits(r);
          CHECK(all_finite(std::vector<float>(l.begin(), l.end())));
        }
        CHECK(m.mtp_length(s) == 8);
      }
    }
  }
}
