// Generator::sample's options (penalties, min-p, greedy ties, non-finite logits) against values
// worked out by hand, its seeded draws against a plain full-sort sampler written here, and stop
// strings through generate() on the tiny Llama of tests/data/llama.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "wick/generator.h"
#include "wick/llama.h"
#include "wick/wick.h"

namespace {

using wick::Error;
using wick::GenerateOptions;
using wick::Generator;
using wick::models::Llama;

const Llama& tiny() {
  static const Llama model =
      Llama::load(std::string(WICK_TEST_DATA_DIR) + "/llama/tiny_llama", wick::Device::cpu());
  return model;
}

Generator make(const GenerateOptions& o) {
  return Generator(tiny(), o);
}

TEST(Sampling, GreedyTakesTheLowestIdAmongEqualLogits) {
  Generator g = make({});
  EXPECT_EQ(g.sample({1.0f, 5.0f, 5.0f, 2.0f}), 1u);
  EXPECT_EQ(g.sample({-std::numeric_limits<float>::infinity(), -3.0f, -2.0f}), 2u);
}

TEST(Sampling, RepeatPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  GenerateOptions o;
  o.repeat_penalty = 1.1;
  Generator g = make(o);
  // 3.0 / 1.1 = 2.727 < 2.9.
  EXPECT_EQ(g.sample({3.0f, 2.9f, -1.0f}, {0}), 1u);
  // 3.0 / 1.1 > 2.7.
  EXPECT_EQ(g.sample({3.0f, 2.7f, -1.0f}, {0}), 0u);
  // -1.0 * 1.1 = -1.1 < -1.05.
  EXPECT_EQ(g.sample({-1.0f, -1.05f}, {0}), 1u);
  // Once per distinct token, however often it occurs.
  EXPECT_EQ(g.sample({3.0f, 2.7f}, {0, 0, 0, 0}), 0u);
  // Without history, plain greedy.
  EXPECT_EQ(g.sample({3.0f, 2.9f}), 0u);
}

TEST(Sampling, PenaltiesLookOnlyAtTheLastPositions) {
  GenerateOptions o;
  o.repeat_penalty = 2.0;
  o.repeat_last_n = 2;
  Generator g = make(o);
  // Token 0 is three positions back: outside the window.
  EXPECT_EQ(g.sample({3.0f, 2.0f, 0.0f}, {0, 2, 2}), 0u);
  EXPECT_EQ(g.sample({3.0f, 2.0f, 0.0f}, {2, 0, 2}), 1u);
}

TEST(Sampling, PresenceAndFrequencyPenalties) {
  GenerateOptions f;
  f.frequency_penalty = 0.2;
  Generator gf = make(f);
  EXPECT_EQ(gf.sample({2.0f, 1.5f}, {0, 0, 0}), 1u);  // 2 - 3 * 0.2 = 1.4 < 1.5
  EXPECT_EQ(gf.sample({2.0f, 1.5f}, {0, 0}), 0u);     // 2 - 2 * 0.2 = 1.6 > 1.5
  GenerateOptions p;
  p.presence_penalty = 0.6;
  Generator gp = make(p);
  EXPECT_EQ(gp.sample({2.0f, 1.5f}, {0, 0, 0}), 1u);  // 2 - 0.6 = 1.4, once
  EXPECT_EQ(gp.sample({2.0f, 1.3f}, {0, 0, 0}), 0u);
}

TEST(Sampling, MinPKeepsTokensAtLeastThatFractionOfTheTop) {
  GenerateOptions o;
  o.temperature = 1.0;
  o.min_p = 0.2;  // keeps p >= 0.1: the first three
  Generator g = make(o);
  const std::vector<double> p = {0.5, 0.3, 0.15, 0.05};
  std::vector<float> logits;
  for (double v : p) logits.push_back(static_cast<float>(std::log(v)));
  const int n = 40000;
  std::vector<int> counts(4, 0);
  for (int i = 0; i < n; ++i) counts[g.sample(logits)]++;
  EXPECT_EQ(counts[3], 0);
  for (int k = 0; k < 3; ++k) {
    double expected = p[k] / 0.95;
    double sigma = std::sqrt(expected * (1 - expected) / n);
    EXPECT_NEAR(counts[k] / double(n), expected, 5 * sigma) << k;
  }
}

// The sampler's definition, written plainly: the tokens in logit order, weights exp(logit / T -
// top), the top_k first, those of weight >= min_p, the shortest prefix whose probabilities reach
// top_p (top_p = 1: all of them), then one splitmix64 draw u = (r >> 11) * 2^-53 times the prefix's
// weight, the token where the running sum passes u.
struct ReferenceSampler {
  GenerateOptions o;
  uint64_t state;

  explicit ReferenceSampler(const GenerateOptions& options) : o(options), state(options.seed) {}

  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

  // `logits` penalised already; `order`: every token id, sorted by logit (the lower id first among
  // equals).
  uint32_t sample(const std::vector<double>& logits, std::vector<uint32_t> order) {
    if (o.top_k > 0 && o.top_k < order.size()) order.resize(o.top_k);
    const double top = logits[order[0]] / o.temperature;
    std::vector<double> w;
    for (uint32_t id : order) {
      const double x = std::exp(logits[id] / o.temperature - top);
      if (x < o.min_p) break;
      w.push_back(x);
    }
    double total = 0;
    for (double x : w) total += x;
    size_t kept = w.size();
    if (o.top_p < 1) {
      double cumulative = 0;
      for (size_t i = 0; i < w.size(); ++i) {
        cumulative += w[i] / total;
        if (cumulative >= o.top_p) {
          kept = i + 1;
          break;
        }
      }
    }
    double mass = 0;
    for (size_t i = 0; i < kept; ++i) mass += w[i];
    double u = static_cast<double>(next() >> 11) * 0x1.0p-53 * mass;
    for (size_t i = 0; i < kept; ++i) {
      u -= w[i];
      if (u < 0) return order[i];
    }
    return order[kept - 1];
  }
};

// Logits of `vocab` tokens: normal with spread `sigma`, rounded to steps of `step` (0: not
// rounded; coarse steps make many equal logits), a few of them -inf.
std::vector<float> random_logits(std::mt19937_64& gen, size_t vocab, float sigma, float step) {
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> l(vocab);
  for (float& x : l) {
    x = dist(gen);
    if (step > 0) x = std::round(x / step) * step;
  }
  for (size_t i = 0; i < vocab / 50; ++i)
    l[gen() % vocab] = -std::numeric_limits<float>::infinity();
  return l;
}

// Generator::sample selects only as much of the order as it reads: the same tokens as the
// full-sort reference for every seed, temperature, top_p, top_k, min_p and penalty tried
// (vocabularies from 7 to 49152 tokens, with ties), and the same tokens again from a second
// generator (run to run).
TEST(Sampling, SeededDrawsEqualAFullSortReference) {
  std::mt19937_64 gen(52);
  const size_t vocabs[] = {7, 300, 4096, 49152};
  const double temperatures[] = {0.3, 0.8, 1.7};
  const double top_ps[] = {0.05, 0.5, 0.9, 0.95, 1.0};
  size_t draws = 0, distinct_cases = 0;
  for (size_t vocab : vocabs) {
    for (int round = 0; round < 4; ++round) {
      const float step = round == 1 ? 0.25f : 0.0f;
      const float sigma = round == 2 ? 0.5f : 3.0f;
      const std::vector<float> logits = random_logits(gen, vocab, sigma, step);
      // Round 3: a frequency penalty over a history holding some tokens up to three times (the
      // sampler's double logits).
      std::vector<uint32_t> history;
      for (uint32_t i = 0; round == 3 && i < 60; ++i)
        history.push_back(i * 7919 % vocab / (i % 3 + 1));
      std::vector<double> penalised(logits.begin(), logits.end());
      for (uint32_t id : history) penalised[id] -= 0.75;
      std::vector<uint32_t> sorted(vocab);
      std::iota(sorted.begin(), sorted.end(), 0u);
      std::sort(sorted.begin(), sorted.end(), [&](uint32_t a, uint32_t b) {
        return penalised[a] > penalised[b] || (penalised[a] == penalised[b] && a < b);
      });
      for (double t : temperatures) {
        for (double p : top_ps) {
          GenerateOptions o;
          o.temperature = t;
          o.top_p = p;
          o.seed = gen();
          o.top_k = round == 1 ? vocab / 3 : 0;
          o.min_p = round == 2 ? 0.05 : 0.0;
          o.frequency_penalty = round == 3 ? 0.75 : 0.0;
          ReferenceSampler ref(o);
          Generator a = make(o), b = make(o);
          std::set<uint32_t> seen;
          for (int i = 0; i < 4; ++i) {
            const uint32_t want = ref.sample(penalised, sorted);
            ASSERT_EQ(a.sample(logits, history), want)
                << "vocab " << vocab << " round " << round << " T " << t << " top_p " << p
                << " draw " << i;
            ASSERT_EQ(b.sample(logits, history), want);
            seen.insert(want);
            ++draws;
          }
          distinct_cases += seen.size() > 1;
        }
      }
    }
  }
  // The cases sample: most give more than one token in four draws.
  EXPECT_GT(distinct_cases, draws / 4 / 2);
}

TEST(Sampling, NonFiniteLogitsAreErrorsNamingTheToken) {
  Generator greedy = make({});
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  try {
    greedy.sample({1.0f, 2.0f, nan});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(greedy.sample({inf, 1.0f}), Error);
  EXPECT_THROW(greedy.sample({-inf, -inf}), Error);
  GenerateOptions tiny_t;
  tiny_t.temperature = 5e-324;
  Generator g = make(tiny_t);
  try {
    g.sample({25.375f, 25.0f, -3.0f});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token 0"), std::string::npos) << e.what();
  }
  // A small temperature that does not overflow samples the top token.
  GenerateOptions small;
  small.temperature = 1e-6;
  Generator s = make(small);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(s.sample({1.0f, 3.0f, 2.999f}), 1u);
}

TEST(Sampling, BadOptionsAreErrors) {
  GenerateOptions o;
  o.min_p = 1.5;
  EXPECT_THROW(make(o).sample({1.0f}), Error);
  o = {};
  o.repeat_penalty = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THROW(make(o).sample({1.0f}), Error);
  o = {};
  o.repeat_penalty = 0;
  EXPECT_THROW(make(o).sample({1.0f}), Error);
  o = {};
  o.temperature = 1.0;
  o.top_p = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THROW(make(o).sample({1.0f}), Error);
  o = {};
  o.frequency_penalty = std::numeric_limits<double>::infinity();
  EXPECT_THROW(make(o).sample({1.0f}), Error);
}

std::string bracketed(uint32_t id) {
  // Appended piece by piece: g++ 12 warns (-Wrestrict) on "[" + std::to_string(id) + "]" here.
  std::string s = "[";
  s += std::to_string(id);
  s += ']';
  return s;
}

std::vector<uint32_t> prompt() {
  return {1, 5, 9, 14};
}

TEST(Sampling, PresencePenaltyInGenerateAvoidsEveryTokenSeen) {
  GenerateOptions o;
  o.max_new_tokens = 30;
  o.stop_tokens = {100000};
  o.presence_penalty = 1e6;
  o.repeat_last_n = 0;
  auto out = make(o).generate(prompt());
  ASSERT_EQ(out.size(), 30u);
  const std::vector<uint32_t> p = prompt();
  std::set<uint32_t> seen(p.begin(), p.end());
  for (uint32_t t : out) EXPECT_TRUE(seen.insert(t).second) << t;
  // Plain greedy repeats on this model: the penalty made the difference.
  o.presence_penalty = 0;
  auto plain = make(o).generate(prompt());
  std::set<uint32_t> distinct(plain.begin(), plain.end());
  EXPECT_LT(distinct.size(), plain.size());
}

TEST(Sampling, StopStringEndsGenerationAndLeavesItsTokensOut) {
  GenerateOptions o;
  o.max_new_tokens = 20;
  o.stop_tokens = {100000};
  auto all = make(o).generate(prompt());
  ASSERT_EQ(all.size(), 20u);
  o.token_text = bracketed;
  // The text of one token: the result ends before its first occurrence.
  const uint32_t target = all[7];
  size_t first = std::find(all.begin(), all.end(), target) - all.begin();
  o.stop_strings = {"zz", bracketed(target)};
  size_t calls = 0;
  auto stopped = make(o).generate(prompt(), [&](uint32_t) {
    ++calls;
    return true;
  });
  EXPECT_EQ(stopped, std::vector<uint32_t>(all.begin(), all.begin() + first));
  EXPECT_EQ(calls, first + 1);  // on_token saw the token that held it
  // Across two tokens ("][" at the first boundary): both tokens are left out.
  o.stop_strings = {"]["};
  calls = 0;
  auto none = make(o).generate(prompt(), [&](uint32_t) {
    ++calls;
    return true;
  });
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(calls, 2u);
  // Stop strings without token_text: an error.
  o.token_text = nullptr;
  EXPECT_THROW(make(o).generate(prompt()), Error);
}

}  // namespace
