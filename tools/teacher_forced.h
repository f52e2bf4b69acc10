#pragma once
// Teacher-forced comparison of two Llama models over one token sequence (wick-generate
// --teacher-forced, tests/test_qmatmul.cpp): the top-1 next-token agreement and each model's
// perplexity of the sequence.

#include <cmath>
#include <vector>

#include "wick/llama.h"
#include "wick/wick.h"

namespace wick::tools {

struct TeacherForced {
  double agreement = 0;     // fraction of positions whose argmax tokens are equal
  double perplexity_a = 0;  // exp(mean negative log-likelihood of the next token), model a
  double perplexity_b = 0;  // the same for model b
  size_t positions = 0;     // predictions compared (ids.size() - 1)
};

inline std::vector<float> prompt_logits(const models::Llama& m, const std::vector<uint32_t>& ids) {
  models::KvCache cache = m.make_cache(1, ids.size());
  Tensor t = Tensor::from_vec(ids, {1, ids.size()}, m.device());
  return m.forward(t, cache).to_dtype(DType::F32).flatten_all().to_vec1<float>();
}

inline TeacherForced teacher_forced(const models::Llama& a, const models::Llama& b,
                                    const std::vector<uint32_t>& ids) {
  size_t v = a.config().vocab_size;
  std::vector<float> la = prompt_logits(a, ids), lb = prompt_logits(b, ids);
  TeacherForced r;
  r.positions = ids.size() - 1;
  double nll_a = 0, nll_b = 0;
  size_t same = 0;
  for (size_t t = 0; t + 1 < ids.size(); ++t) {
    const float* pa = la.data() + t * v;
    const float* pb = lb.data() + t * v;
    size_t ia = 0, ib = 0;
    double ma = pa[0], mb = pb[0];
    for (size_t j = 1; j < v; ++j) {
      if (pa[j] > ma) ma = pa[j], ia = j;
      if (pb[j] > mb) mb = pb[j], ib = j;
    }
    same += ia == ib;
    double sa = 0, sb = 0;
    for (size_t j = 0; j < v; ++j) {
      sa += std::exp(pa[j] - ma);
      sb += std::exp(pb[j] - mb);
    }
    nll_a += ma + std::log(sa) - pa[ids[t + 1]];
    nll_b += mb + std::log(sb) - pb[ids[t + 1]];
  }
  r.agreement = static_cast<double>(same) / r.positions;
  r.perplexity_a = std::exp(nll_a / r.positions);
  r.perplexity_b = std::exp(nll_b / r.positions);
  return r;
}

}  // namespace wick::tools
