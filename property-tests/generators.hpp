#pragma once
// RapidCheck generators over valid configs (docs/spec.md §1) and over the awkward
// prompt lengths of docs/spec.md §4.4. A failing case prints its seed; replay it
// with RC_PARAMS="seed=<seed>".
#include <rapidcheck.h>

#include <algorithm>
#include <set>

#include "models/lab/config.hpp"
#include "models/lab/plan.hpp"

namespace ced::prop {

inline int64_t pick(std::vector<int64_t> v) { return *rc::gen::elementOf(v); }

// A small random config: L, E, W, ratios, sources, pool and top-k all vary;
// every layer kind can appear. Widths stay tiny so a case runs in milliseconds.
inline rc::Gen<Config> gen_config(int max_layers = 6, int max_window = 5) {
  return rc::gen::exec([=] {
    Config c;
    c.name = "generated";
    c.vocab_size = 31;
    c.d_model = pick({8, 16});
    c.n_heads = pick({1, 2});
    c.head_dim = pick({4, 8});
    c.rope_dim = pick({2, 4});
    c.q_lora_rank = 8;
    c.index_n_heads = pick({1, 2});
    c.index_head_dim = pick({4, 8});
    c.index_topk = *rc::gen::inRange<int64_t>(1, 5);
    c.o_groups = c.n_heads;
    c.o_lora_rank = 4;
    c.n_routed_experts = pick({0, 3});
    c.n_active_experts = c.n_routed_experts ? *rc::gen::inRange<int64_t>(1, c.n_routed_experts + 1) : 0;
    c.n_shared_experts = c.n_routed_experts ? pick({0, 1}) : 1;
    c.moe_dim = 8;
    c.routed_scaling_factor = 1.5;
    c.rms_eps = 1e-6;
    c.rope_theta = 10000.0;
    const int64_t L = *rc::gen::inRange<int64_t>(2, max_layers + 1);
    const int64_t E = *rc::gen::inRange<int64_t>(1, L);
    c.n_layers = L;
    c.n_encoder_layers = E;
    c.window = *rc::gen::inRange<int64_t>(1, max_window + 1);
    const int64_t r_enc = *rc::gen::inRange<int64_t>(1, 4);
    const int64_t r_dec = *rc::gen::inRange<int64_t>(1, 3);
    // encoder: SWA-only below the first source (if any), then ratio r_enc or 0
    const int64_t first_src = *rc::gen::inRange<int64_t>(0, E + 1);  // E = no encoder source
    c.compress_ratios.assign(size_t(L), 0);
    for (int64_t l = first_src; l < E; ++l) c.compress_ratios[size_t(l)] = (l == first_src || *rc::gen::arbitrary<bool>()) ? r_enc : 0;
    for (int64_t l = E; l < L; ++l) c.compress_ratios[size_t(l)] = (l == E || *rc::gen::arbitrary<bool>()) ? r_dec : 0;
    std::set<int64_t> kv, idx;
    if (first_src < E) kv.insert(first_src);
    kv.insert(E);
    for (int64_t l = 0; l < L; ++l)
      if (c.compress_ratios[size_t(l)] > 0 && l != first_src && l != E) {
        const int pick = *rc::gen::inRange(0, 4);  // 0: kv source, 1: index source, else Reuse
        if (pick == 0) kv.insert(l);
        if (pick <= 1) idx.insert(l);
      }
    idx.insert(kv.begin(), kv.end());
    c.kv_source_layers.assign(kv.begin(), kv.end());
    c.index_source_layers.assign(idx.begin(), idx.end());
    c.tie_decoder_kv = *rc::gen::arbitrary<bool>();
    // candidate source: none, or a decoder index source (later ones share its ratio)
    std::vector<int64_t> dec_idx;
    for (int64_t l : idx)
      if (l >= E) dec_idx.push_back(l);
    c.candidate_source_layer = *rc::gen::arbitrary<bool>() ? *rc::gen::elementOf(dec_idx) : -1;
    c.candidate_block_size = *rc::gen::inRange<int64_t>(1, 4);
    c.candidate_topk_blocks = *rc::gen::inRange<int64_t>(1, 4);
    validate(c);
    return c;
  });
}

// Prompt lengths where replay and caches break: 1, around W, around R,
// around the decode bound D(W-1), or anything up to 3R.
inline rc::Gen<int64_t> gen_length(const Plan& p) {
  const int64_t R = p.exact_replay(), Db = p.exact_decode_replay();
  std::vector<int64_t> awkward = {1, p.W - 1, p.W, p.W + 1, R - 1, R, R + 1, Db - 1, Db, Db + 1, 2 * R + 1};
  std::vector<int64_t> ok;
  for (int64_t n : awkward)
    if (n >= 1) ok.push_back(n);
  return rc::gen::oneOf(rc::gen::elementOf(ok), rc::gen::inRange<int64_t>(1, 3 * R + 2));
}

}  // namespace ced::prop
