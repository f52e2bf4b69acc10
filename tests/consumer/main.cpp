// A consumer of the installed package, through <wick/wick.h> alone: a matmul (BLAS), one f16
// rounding done by the header (this program's flags) and by the library (its own), which agree,
// the creation defaults, a loss with its gradient, a tokenizer (ICU, PCRE2) and an npz round trip
// (libzip), each checked against a result known by hand.

#include <unistd.h>
#include <wick/wick.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace {

int failures = 0;

void check(bool ok, const char* what) {
  if (!ok) {
    std::printf("consumer: %s failed\n", what);
    ++failures;
  }
}

}  // namespace

int main() {
  auto dev = wick::Device::cpu();
  auto a = wick::Tensor::arange(0.0f, 6.0f, dev).reshape({2, 3});
  auto b = wick::Tensor::arange(0.0f, 6.0f, dev).reshape({3, 2});
  auto c = a.matmul(b).to_vec2<float>();
  check(c == std::vector<std::vector<float>>{{10, 13}, {28, 40}}, "matmul [[10, 13], [28, 40]]");

  const float x = 0.1f;  // not a half: rounds
  auto h = wick::Tensor::from_vec(std::vector<float>{x}, {1}, dev).to_dtype(wick::DType::F16);
  check(h.to_vec1<wick::f16>()[0].bits == wick::f16(x).bits, "f16(0.1) of header and library");

  check(wick::Tensor::randn(0.0, 1.0, {4}, dev).dtype() == wick::DType::F32, "randn is f32");
  auto ids = wick::Tensor::arange(0, 4, dev);
  check(
      ids.dtype() == wick::DType::I64 && ids.to_vec1<int64_t>() == std::vector<int64_t>{0, 1, 2, 3},
      "arange(0, 4) is i64 [0, 1, 2, 3]");

  // Two equal logits: the loss is ln 2, its gradient (softmax - one-hot) is (0.5, -0.5).
  auto logits = wick::Tensor::zeros({1, 2}, wick::DType::F32, dev).requires_grad();
  auto target = wick::Tensor::from_vec(std::vector<int64_t>{1}, {1}, dev);
  auto loss = wick::loss::cross_entropy(logits, target);
  check(std::fabs(loss.to_scalar<float>() - std::log(2.0f)) < 1e-6f, "cross_entropy = ln 2");
  auto grad = loss.backward().get(logits);
  check(grad && grad->to_vec2<float>() == std::vector<std::vector<float>>{{0.5f, -0.5f}},
        "cross_entropy gradient (0.5, -0.5)");

  auto tok = wick::Tokenizer::from_json(R"({
    "normalizer": {"type": "Lowercase"},
    "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "\\s+"}, "behavior": "Removed",
                      "invert": false},
    "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
              "max_input_chars_per_word": 100, "vocab": {"[UNK]": 0, "hello": 1, "world": 2}}})");
  check(tok.encode("Hello  WORLD", false) == std::vector<uint32_t>{1, 2}, "tokenizer [1, 2]");

  auto path = std::filesystem::temp_directory_path() /
              ("wick-consumer-" + std::to_string(getpid()) + ".npz");
  wick::npz::save({{"a", a}}, path.string(), true);
  auto back = wick::npz::load(path.string(), dev);
  std::filesystem::remove(path);
  check(back.at("a").to_vec2<float>() == a.to_vec2<float>(), "npz round trip");

  if (failures) return 1;
  std::printf("consumer: matmul, f16, creation, loss, tokenizer and npz ok (CPU kernels: %s)\n",
              wick::cpu_isa().c_str());
  return 0;
}
