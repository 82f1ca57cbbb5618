// docs/spec.md §8: tolerance policies (per-tensor rules with reasons) and verdicts.
#include "compare/policy.hpp"

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <toml++/toml.h>

#include "model/error.hpp"

namespace ced {
namespace {

// The numeric thresholds of a rule, their TOML keys and allowed ranges.
struct ThresholdKey {
  const char* key;
  std::optional<double> Thresholds::*member;
  double lo, hi;
};
constexpr double kInf = std::numeric_limits<double>::infinity();
const ThresholdKey kThresholdKeys[] = {
    {"atol", &Thresholds::atol, 0, kInf},
    {"rtol", &Thresholds::rtol, 0, kInf},
    {"max_rel_l2", &Thresholds::max_rel_l2, 0, kInf},
    {"max_nmse", &Thresholds::max_nmse, 0, kInf},
    {"min_cosine", &Thresholds::min_cosine, -1, 1},
    {"max_ulp", &Thresholds::max_ulp, 0, kInf},
    {"max_kl", &Thresholds::max_kl, 0, kInf},
    {"max_kl_mean", &Thresholds::max_kl_mean, 0, kInf},
    {"max_kl_p99", &Thresholds::max_kl_p99, 0, kInf},
    {"max_kl_p999", &Thresholds::max_kl_p999, 0, kInf},
    {"min_top1", &Thresholds::min_top1, 0, 1},
    {"min_top5", &Thresholds::min_top5, 0, 1},
    {"min_jaccard", &Thresholds::min_jaccard, 0, 1},
    {"near_tie", &Thresholds::near_tie, 0, kInf},
};

[[noreturn]] void fail_at(const std::string& origin, const toml::source_region& src, const std::string& what) {
  throw InputError(fmt::format("policy: {}:{}: {}", origin, src.begin.line, what));
}

double number_in(const std::string& origin, const std::string& key, const toml::node& n, double lo, double hi) {
  if (!n.is_number()) fail_at(origin, n.source(), fmt::format("'{}' must be a number", key));
  // value<double>() is empty for an integer beyond 2^53 (not exact as a double): round it instead.
  const double v = n.is_integer() ? static_cast<double>(*n.value_exact<int64_t>()) : *n.value<double>();
  if (!(v >= lo && v <= hi))
    fail_at(origin, n.source(),
            fmt::format("'{}' = {} is out of range [{}, {}]", key, v, lo, hi == kInf ? std::string("inf") : fmt::format("{}", hi)));
  return v;
}

// A whole number >= 1 (greedy_top_n: a count of tokens, so 2.5 or 0 is no N).
int64_t count_of(const std::string& origin, const std::string& key, const toml::node& n) {
  const auto v = n.value_exact<int64_t>();
  if (!v || *v < 1) fail_at(origin, n.source(), fmt::format("'{}' must be a whole number >= 1", key));
  return *v;
}

std::string string_of(const std::string& origin, const std::string& key, const toml::node& n) {
  const auto v = n.value_exact<std::string>();
  if (!v) fail_at(origin, n.source(), fmt::format("'{}' must be a string", key));
  if (v->empty()) fail_at(origin, n.source(), fmt::format("'{}' must not be empty", key));
  return *v;
}

Rule parse_rule(const toml::table& t, const std::string& origin, size_t number) {
  Rule rule;
  rule.origin = fmt::format("{}:{}", origin, t.source().begin.line);
  const toml::node* alpha = nullptr;
  const toml::node* floor = nullptr;
  const toml::node* abs_floor = nullptr;
  for (const auto& [k, v] : t) {
    const std::string key(k.str());
    if (key == "pattern") {
      rule.pattern = string_of(origin, key, v);
    } else if (key == "reason") {
      rule.reason = string_of(origin, key, v);
    } else if (key == "greedy_top_n") {
      rule.thresholds.greedy_top_n = count_of(origin, key, v);
    } else if (key == "calibrate") {
      const auto b = v.value_exact<bool>();
      if (!b) fail_at(origin, v.source(), "'calibrate' must be a boolean");
      rule.calibrate = *b;
    } else if (key == "alpha") {
      rule.alpha = number_in(origin, key, v, 0, kInf);
      alpha = &v;
    } else if (key == "floor") {
      rule.floor = number_in(origin, key, v, 0, kInf);
      floor = &v;
    } else if (key == "abs_floor") {
      rule.abs_floor = number_in(origin, key, v, 0, kInf);
      abs_floor = &v;
    } else {
      bool known = false;
      for (const auto& tk : kThresholdKeys)
        if (key == tk.key) {
          rule.thresholds.*tk.member = number_in(origin, key, v, tk.lo, tk.hi);
          known = true;
        }
      if (!known) fail_at(origin, k.source(), fmt::format("unknown key '{}' in [[rule]] {}", key, number));
    }
  }
  const std::string which =
      rule.pattern.empty() ? fmt::format("[[rule]] {}", number) : fmt::format("[[rule]] {} ('{}')", number, rule.pattern);
  if (rule.pattern.empty()) fail_at(origin, t.source(), fmt::format("{} has no 'pattern'", which));
  if (rule.reason.empty())
    fail_at(origin, t.source(), fmt::format("{} has no 'reason': every tolerance needs one", which));
  if (rule.calibrate) {
    if (!alpha) fail_at(origin, t.source(), fmt::format("{} has calibrate = true but no 'alpha'", which));
    if (rule.thresholds.atol || rule.thresholds.max_rel_l2)
      fail_at(origin, t.source(),
              fmt::format("{} has calibrate = true, which sets atol and max_rel_l2: remove them", which));
  } else {
    for (const toml::node* n : {alpha, floor, abs_floor})
      if (n) fail_at(origin, n->source(), fmt::format("{}: alpha, floor and abs_floor need calibrate = true", which));
  }
  return rule;
}

std::string fmt_value(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return fmt::format("{:.6g}", v);
}

}  // namespace

bool glob_match(std::string_view p, std::string_view s) {
  while (!p.empty()) {
    if (p[0] == '*') {
      const bool any = p.size() > 1 && p[1] == '*';
      const std::string_view rest = p.substr(any ? 2 : 1);
      for (size_t k = 0;; ++k) {
        if (glob_match(rest, s.substr(k))) return true;
        if (k == s.size() || (!any && s[k] == '/')) return false;
      }
    }
    if (s.empty()) return false;
    if (p[0] == '?' ? s[0] == '/' : p[0] != s[0]) return false;
    p.remove_prefix(1);
    s.remove_prefix(1);
  }
  return s.empty();
}

Calibration calibration_of(const TensorCompare& c) { return {c.rel_l2, c.max_abs_err}; }

Thresholds Rule::effective(std::string_view tensor, const std::optional<Calibration>& cal) const {
  Thresholds th = thresholds;
  if (!calibrate) return th;
  if (!cal)
    throw InputError(fmt::format("policy: rule '{}' ({}) for tensor '{}' is self-calibrating: it needs the "
                                 "reference's f32-vs-f64 error",
                                 pattern, origin, tensor));
  if (!(cal->rel_l2 >= 0 && cal->rel_l2 < kInf && cal->max_abs >= 0 && cal->max_abs < kInf))
    throw InputError(fmt::format("policy: calibration of tensor '{}' must be finite and >= 0 (rel_l2 {}, max_abs {})",
                                 tensor, cal->rel_l2, cal->max_abs));
  th.max_rel_l2 = alpha * cal->rel_l2 + floor;
  th.atol = alpha * cal->max_abs + abs_floor.value_or(floor);
  return th;
}

const Rule* Policy::match(std::string_view tensor) const {
  for (const auto& r : rules)
    if (glob_match(r.pattern, tensor)) return &r;
  return nullptr;
}

const Rule& Policy::rule_for(std::string_view tensor) const {
  if (const Rule* r = match(tensor)) return *r;
  throw InputError(fmt::format("policy: no rule of {} matches tensor '{}'", origin, tensor));
}

Thresholds Policy::thresholds_for(std::string_view tensor, const std::optional<Calibration>& cal) const {
  return rule_for(tensor).effective(tensor, cal);
}

Policy parse_policy_toml(std::string_view text, const std::string& origin) {
  toml::table tbl;
  try {
    tbl = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    throw InputError(fmt::format("policy: {}:{}:{}: {}", origin, e.source().begin.line, e.source().begin.column,
                                 e.description()));
  }
  Policy p;
  p.origin = origin;
  for (const auto& [k, v] : tbl) {
    if (k.str() != "rule") fail_at(origin, k.source(), fmt::format("unknown key '{}'", k.str()));
    const toml::array* arr = v.as_array();
    if (!arr) fail_at(origin, v.source(), "'rule' must be an array of tables: write each as [[rule]]");
    for (const auto& e : *arr) {
      const toml::table* t = e.as_table();
      if (!t) fail_at(origin, e.source(), "'rule' must be an array of tables: write each as [[rule]]");
      p.rules.push_back(parse_rule(*t, origin, p.rules.size() + 1));
    }
  }
  if (p.rules.empty()) throw InputError(fmt::format("policy: {}: no [[rule]]", origin));
  return p;
}

Policy load_policy_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("policy: cannot read '{}'", path.string()));
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_policy_toml(ss.str(), path.string());
}

std::string Violation::line() const {
  // Lower bounds (min_*) fail when measured < limit, everything else when measured > limit.
  const bool lower = threshold.rfind("min_", 0) == 0;
  std::string s = fmt::format("{}: measured {} {} limit {}", threshold, fmt_value(measured), lower ? "<" : ">",
                              fmt_value(limit));
  if (!detail.empty()) s += " (" + detail + ")";
  return s;
}

std::vector<std::string> Verdict::lines() const {
  std::vector<std::string> out;
  std::string head = fmt::format("{} {}", pass ? "PASS" : "FAIL", tensor);
  if (!pattern.empty()) head += fmt::format(" (rule {}: {})", pattern, reason);
  out.push_back(head);
  for (const auto& v : violations) out.push_back("  " + v.line());
  if (!unchecked.empty()) out.push_back(fmt::format("  unchecked: {}", fmt::join(unchecked, ", ")));
  return out;
}

Verdict judge(std::string_view tensor, const Thresholds& th, const Comparison& c) {
  if (!c.tensor && !c.logits && !c.selection)
    throw std::logic_error(fmt::format("judge {}: the comparison holds no metrics", tensor));
  Verdict v;
  v.tensor = std::string(tensor);
  auto violate = [&](const char* name, double measured, double limit, std::string detail = {}) {
    v.violations.push_back({name, measured, limit, std::move(detail)});
  };
  auto unchecked = [&](const auto& t, const char* name, const char* why) {
    if (t) v.unchecked.push_back(fmt::format("{} ({})", name, why));
  };
  // Measured must be <= limit; NaN measured never passes.
  auto upper = [&](const std::optional<double>& limit, const char* name, double measured, std::string detail = {}) {
    if (limit && !(measured <= *limit)) violate(name, measured, *limit, std::move(detail));
  };
  auto lower = [&](const std::optional<double>& limit, const char* name, double measured, std::string detail = {}) {
    if (limit && !(measured >= *limit)) violate(name, measured, *limit, std::move(detail));
  };

  if (const auto& t = c.tensor) {
    if (th.atol.value_or(0.0) != t->atol || th.rtol.value_or(0.0) != t->rtol)
      throw std::logic_error(fmt::format("judge {}: compared with atol {} rtol {}, thresholds say atol {} rtol {}",
                                         tensor, t->atol, t->rtol, th.atol.value_or(0.0), th.rtol.value_or(0.0)));
    const int64_t nans = t->t_nonfinite.nan + t->r_nonfinite.nan;
    if (nans > 0)
      violate("nan", static_cast<double>(nans), 0,
              fmt::format("t has {}, r has {}; a NaN never passes", t->t_nonfinite.nan, t->r_nonfinite.nan));
    if (t->inf_mismatches > 0)
      violate("inf_mismatch", static_cast<double>(t->inf_mismatches), 0,
              fmt::format("first at [{}]", fmt::join(unravel_index(t->first_inf_mismatch, t->shape), ",")));
    if ((th.atol || th.rtol) && t->mismatches - t->nan_pairs > 0) {
      // NaN pairs are reported by the nan line; the rest by their smallest passing atol.
      std::string detail = fmt::format("{} of {} elements exceed atol + rtol*|r| with rtol {}",
                                       t->mismatches - t->nan_pairs, t->n, fmt_value(t->rtol));
      if (t->nan_pairs == 0) detail += fmt::format("; first at [{}]", fmt::join(t->first_mismatch.index, ","));
      violate("atol", t->min_passing_atol, t->atol, std::move(detail));
    }
    upper(th.max_rel_l2, "max_rel_l2", t->rel_l2);
    upper(th.max_nmse, "max_nmse", t->nmse);
    lower(th.min_cosine, "min_cosine", t->cosine);
    upper(th.max_ulp, "max_ulp", static_cast<double>(t->max_ulp),
          fmt::format("{} ulp in {} at [{}]", t->max_ulp, dtype_name(t->dtype), fmt::join(t->max_ulp_at.index, ",")));
  } else {
    const char* why = "no tensor metrics";
    unchecked(th.atol, "atol", why);
    unchecked(th.rtol, "rtol", why);
    unchecked(th.max_rel_l2, "max_rel_l2", why);
    unchecked(th.max_nmse, "max_nmse", why);
    unchecked(th.min_cosine, "min_cosine", why);
    unchecked(th.max_ulp, "max_ulp", why);
  }

  if (const auto& l = c.logits) {
    upper(th.max_kl, "max_kl", l->max_kl, fmt::format("row {}; mean {}", l->max_kl_row, fmt_value(l->mean_kl)));
    const KlDistribution& kd = l->kl_distribution;
    upper(th.max_kl_mean, "max_kl_mean", kd.mean, fmt::format("over {} rows; max {} at row {}", kd.count,
                                                               fmt_value(kd.max), kd.max_row));
    upper(th.max_kl_p99, "max_kl_p99", kd.p99, fmt::format("nearest rank of {} rows: row {}", kd.count, kd.p99_row));
    upper(th.max_kl_p999, "max_kl_p999", kd.p999,
          fmt::format("nearest rank of {} rows: row {}", kd.count, kd.p999_row));
    if (th.greedy_top_n && !l->greedy.passes(*th.greedy_top_n))
      violate("greedy_top_n", static_cast<double>(l->greedy.worst_rank()), static_cast<double>(*th.greedy_top_n),
              summary(l->greedy, {}, "t", "r"));
    lower(th.min_top1, "min_top1", l->top1_fraction,
          fmt::format("{} of {} rows agree; first disagreement row {}", l->top1_agree, l->rows,
                      l->first_top1_disagreement));
    lower(th.min_top5, "min_top5", l->min_topk_overlap,
          fmt::format("row {}; mean {}", l->min_topk_overlap_row, fmt_value(l->topk_overlap)));
  } else {
    unchecked(th.max_kl, "max_kl", "no logits metrics");
    unchecked(th.min_top1, "min_top1", "no logits metrics");
    unchecked(th.min_top5, "min_top5", "no logits metrics");
    unchecked(th.max_kl_mean, "max_kl_mean", "no logits metrics");
    unchecked(th.max_kl_p99, "max_kl_p99", "no logits metrics");
    unchecked(th.max_kl_p999, "max_kl_p999", "no logits metrics");
    unchecked(th.greedy_top_n, "greedy_top_n", "no logits metrics");
  }

  if (const auto& s = c.selection) {
    if (s->invalid_t + s->invalid_r > 0)
      violate("invalid_selection", static_cast<double>(s->invalid_t + s->invalid_r), 0,
              fmt::format("entries < -1 or duplicated in a row: t has {}, r has {}", s->invalid_t, s->invalid_r));
    lower(th.min_jaccard, "min_jaccard", s->min_jaccard, fmt::format("row {}; mean {}", s->min_jaccard_row,
                                                                     fmt_value(s->mean_jaccard)));
    if (th.near_tie) {
      if (!s->scored) {
        unchecked(th.near_tie, "near_tie", "no scores");
      } else if (s->real_disagreements > 0) {
        violate("near_tie", s->worst_gap, *th.near_tie,
                fmt::format("{} real disagreements, {} near-ties; worst gap at row {} entry {}",
                            s->real_disagreements, s->near_ties, s->worst_gap_row, s->worst_gap_entry));
      }
    }
  } else {
    unchecked(th.min_jaccard, "min_jaccard", "no selection metrics");
    unchecked(th.near_tie, "near_tie", "no selection metrics");
  }
  v.pass = v.violations.empty();
  return v;
}

Verdict judge(const Policy& policy, std::string_view tensor, const Comparison& c,
              const std::optional<Calibration>& cal) {
  const Rule& rule = policy.rule_for(tensor);
  Verdict v = judge(tensor, rule.effective(tensor, cal), c);
  v.pattern = rule.pattern;
  v.reason = rule.reason;
  return v;
}

std::string to_json(const Verdict& v) {
  std::string s = fmt::format(R"({{"tensor":{},"pattern":{},"reason":{},"pass":{},"violations":[)", json_string(v.tensor),
                              json_string(v.pattern), json_string(v.reason), v.pass ? "true" : "false");
  for (size_t i = 0; i < v.violations.size(); ++i) {
    const auto& x = v.violations[i];
    if (i) s += ",";
    s += fmt::format(R"({{"threshold":{},"measured":{},"limit":{},"detail":{}}})", json_string(x.threshold),
                     json_number(x.measured), json_number(x.limit), json_string(x.detail));
  }
  s += R"(],"unchecked":[)";
  for (size_t i = 0; i < v.unchecked.size(); ++i) s += (i ? "," : "") + json_string(v.unchecked[i]);
  s += "]}";
  return s;
}

}  // namespace ced
