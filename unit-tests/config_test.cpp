// docs/spec.md §1: built-ins, TOML files, validation messages.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>

#include "models/lab/config.hpp"
#include "model/error.hpp"
#include "models/lab/plan.hpp"

using namespace ced;

namespace {
std::string error_of(const Config& c) {
  try {
    validate(c);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Builtins, AllValidate) {
  for (const auto& n : builtin_names()) EXPECT_NO_THROW(builtin_config(n)) << n;
}

TEST(Builtins, TinyHasEveryLayerKind) {
  const Config c = builtin_config("tiny");
  const Plan p = make_plan(c);
  bool swa = false, r1 = false, r2 = false, full = false, reindex = false, reuse = false;
  for (const auto& lp : p.layers) {
    swa |= lp.ratio == 0;
    r1 |= lp.ratio == 1;
    r2 |= lp.ratio == 2;
    full |= lp.role == Role::Full;
    reindex |= lp.role == Role::Reindex;
    reuse |= lp.role == Role::Reuse;
  }
  EXPECT_TRUE(swa && r1 && r2 && full && reindex && reuse);
  EXPECT_GE(p.candidate_source, 0);
  EXPECT_EQ(c.vocab_size % 2, 1);
  EXPECT_LE(c.d_model, 64);
}

TEST(Builtins, V41ShapeHasTheExactDsv41Schedule) {
  const Config c = builtin_config("v41-shape");
  const Config f = builtin_config("lab-flash");
  EXPECT_EQ(c.compress_ratios, f.compress_ratios);
  EXPECT_EQ(c.kv_source_layers, f.kv_source_layers);
  EXPECT_EQ(c.index_source_layers, f.index_source_layers);
  EXPECT_EQ(c.candidate_source_layer, 20);
  EXPECT_EQ(c.window, 128);
  EXPECT_EQ(make_plan(c).exact_replay(), 2541);
}

TEST(Plan, V41RolesFollowTheSources) {
  const Plan p = make_plan(builtin_config("v41-shape"));
  EXPECT_EQ(p[0].role, Role::SwaOnly);
  EXPECT_EQ(p[2].role, Role::Full);
  EXPECT_EQ(p[3].role, Role::Reuse);
  EXPECT_EQ(p[3].kv_src, 2);
  EXPECT_EQ(p[20].role, Role::Full);
  EXPECT_TRUE(p[20].candidate_source);
  EXPECT_EQ(p[24].role, Role::Reindex);
  EXPECT_EQ(p[24].kv_src, 20);
  EXPECT_TRUE(p[24].selects_in_pool);
  EXPECT_EQ(p[25].idx_src, 24);
  EXPECT_EQ(p.decoder_kv_sources, std::vector<int64_t>{20});
}

TEST(Validation, NamesTheOffendingKey) {
  Config c = builtin_config("tiny");
  c.n_encoder_layers = 8;
  EXPECT_NE(error_of(c).find("n_encoder_layers"), std::string::npos);
  c = builtin_config("tiny");
  c.o_groups = 3;
  // the message gives both numbers, each in its place
  EXPECT_NE(error_of(c).find("o_groups: must divide n_heads = 4 (got 3)"), std::string::npos) << error_of(c);
  c = builtin_config("tiny");
  // layer 1 (r = 2) lies below the first kv source once that is layer 4 (E): named, never indexed at -1
  c.kv_source_layers = {4};
  EXPECT_NE(error_of(c).find("kv_source_layers: layer 1 has r = 2 but no kv source at or below it"), std::string::npos)
      << error_of(c);
  c = builtin_config("tiny");
  c.rope_dim = 7;
  EXPECT_NE(error_of(c).find("rope_dim"), std::string::npos);
  c = builtin_config("tiny");
  c.kv_source_layers = {4, 1};
  EXPECT_NE(error_of(c).find("kv_source_layers"), std::string::npos);
  c = builtin_config("tiny");
  c.kv_source_layers = {1};
  EXPECT_NE(error_of(c).find("kv_source_layers"), std::string::npos);  // layer E must be a source
  c = builtin_config("tiny");
  c.compress_ratios[2] = 1;  // kv_src(2) = 1 has r = 2
  EXPECT_NE(error_of(c).find("compress_ratios"), std::string::npos);
  c = builtin_config("tiny");
  c.n_active_experts = 5;
  EXPECT_NE(error_of(c).find("n_active_experts"), std::string::npos);
  c = builtin_config("tiny");
  c.candidate_source_layer = 5;  // not an index source
  EXPECT_NE(error_of(c).find("candidate_source_layer"), std::string::npos);
  c = builtin_config("tiny");
  c.rms_eps = 0;
  EXPECT_NE(error_of(c).find("rms_eps"), std::string::npos);
}

// A repeated source layer breaks "sorted without duplicates" and is refused naming its list. Each repeat is
// one every other rule accepts (layer 1 and E = 4 still kv sources, every kv source an index source), so a
// check weakened to "sorted" lets it through.
TEST(Validation, ARepeatedSourceLayerIsRefusedNamingItsList) {
  Config c = builtin_config("tiny");
  c.kv_source_layers = {1, 1, 4};
  EXPECT_EQ(error_of(c), "config: kv_source_layers: must be sorted without duplicates");
  c = builtin_config("tiny");
  c.index_source_layers = {1, 2, 2, 4, 6};
  EXPECT_EQ(error_of(c), "config: index_source_layers: must be sorted without duplicates");
}

// The expert count's bounds name both numbers, each in its place: the number of routed experts is the bound,
// the number of active ones what was given (a message with the two swapped reads as a different config).
TEST(Validation, ActiveExpertsMessageGivesTheRoutedCountAsTheBoundAndTheActiveCountAsGiven) {
  Config c = builtin_config("tiny");
  c.n_active_experts = c.n_routed_experts + 1;
  EXPECT_EQ(error_of(c), fmt::format("config: n_active_experts: must satisfy 1 <= n_active_experts <= "
                                     "n_routed_experts = {} (got {})",
                                     c.n_routed_experts, c.n_routed_experts + 1));
}

// routed_scaling_factor is any positive number: the lab built-ins use 1.5, the released model 1.5 too, and a
// factor below one (scaling the routed experts down) is as valid as one above it.
TEST(Validation, RoutedScalingFactorIsAnyPositiveNumber) {
  for (const double good : {0.25, 1.0, 1.5, 2.5}) {
    Config c = builtin_config("tiny");
    c.routed_scaling_factor = good;
    EXPECT_EQ(error_of(c), "") << good;
  }
  for (const double bad : {0.0, -1.0, std::nan("")}) {
    Config c = builtin_config("tiny");
    c.routed_scaling_factor = bad;
    EXPECT_NE(error_of(c).find("routed_scaling_factor: must be > 0"), std::string::npos) << bad << ": " << error_of(c);
  }
}

TEST(Toml, RoundTripsEveryBuiltin) {
  for (const auto& n : builtin_names()) {
    const Config c = builtin_config(n);
    Config back = parse_config_toml(to_toml(c), "x.toml");
    back.name = c.name;
    EXPECT_EQ(to_toml(back), to_toml(c)) << n;
  }
}

TEST(Toml, UnknownKeyIsAnErrorNamingIt) {
  const std::string t = to_toml(builtin_config("tiny")) + "wrong_key = 3\n";
  try {
    parse_config_toml(t, "x.toml");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("wrong_key"), std::string::npos);
  }
}

TEST(Toml, MissingKeyIsAnErrorNamingIt) {
  std::string t = to_toml(builtin_config("tiny"));
  t.erase(t.find("window"), t.find('\n', t.find("window")) - t.find("window") + 1);
  try {
    parse_config_toml(t, "x.toml");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("window"), std::string::npos);
  }
}

TEST(Toml, SyntaxErrorIsAnInputError) { EXPECT_THROW(parse_config_toml("a = [", "x.toml"), InputError); }

TEST(Tokens, OutOfRangeTokenIsAnInputError) {
  const Config c = builtin_config("tiny");
  EXPECT_THROW(validate_tokens(c, {1, 97}), InputError);
  EXPECT_THROW(validate_tokens(c, {-1}), InputError);
  EXPECT_NO_THROW(validate_tokens(c, {0, 96}));
}

TEST(MemoryEstimate, V41FlashNeedsFarMoreThanThisMachine) {
  // 24 GiB here; the real model's weights alone are hundreds of GB in f32.
  EXPECT_GT(estimate_run_bytes(builtin_config("lab-flash"), 1, 4), 100e9);
}

TEST(Override, SetsOneKeyAndRevalidates) {
  const Config c = with_override(builtin_config("v41-shape"), "window=64");
  EXPECT_EQ(c.window, 64);
  EXPECT_EQ(make_plan(c).exact_replay(), 1 + 20 * 63);
  EXPECT_EQ(with_override(builtin_config("tiny"), "rms_eps=1e-5").rms_eps, 1e-5);
  EXPECT_EQ(with_override(builtin_config("tiny"), "compress_ratios=0,2,2,2,1,1,1,1").compress_ratios,
            builtin_config("tiny").compress_ratios);
  EXPECT_THROW(with_override(builtin_config("tiny"), "window=0"), InputError);
  EXPECT_THROW(with_override(builtin_config("tiny"), "window=x"), InputError);
  EXPECT_THROW(with_override(builtin_config("tiny"), "nosuch=1"), InputError);
  EXPECT_THROW(with_override(builtin_config("tiny"), "window"), InputError);
}
