// train-mlp: a 2-layer MLP learns a generated 2-D spiral (3 classes) with AdamW and minibatches,
// printing the mean loss of each epoch and the final training accuracy.
//
//   train-mlp [cpu|cuda|cuda:N] [epochs]
//
// Exits with status 1 when the final training accuracy is below 95%.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "wick/wick.h"

using wick::Device;
using wick::DType;
using wick::Shape;
using wick::Tensor;

namespace {

constexpr size_t kClasses = 3;
constexpr size_t kPerClass = 100;
constexpr size_t kHidden = 100;
constexpr size_t kBatch = 32;

// The classic spiral set: class j winds from the centre out along angle 4j..4(j+1), with noise.
void make_spiral(std::vector<float>& points, std::vector<uint32_t>& labels) {
  std::mt19937 gen(7);
  std::normal_distribution<float> noise(0.0f, 0.2f);
  for (size_t c = 0; c < kClasses; ++c) {
    for (size_t i = 0; i < kPerClass; ++i) {
      float r = static_cast<float>(i) / static_cast<float>(kPerClass - 1);
      float t = 4.0f * (static_cast<float>(c) + r) + noise(gen);
      points.push_back(r * std::sin(t));
      points.push_back(r * std::cos(t));
      labels.push_back(static_cast<uint32_t>(c));
    }
  }
}

struct Mlp {
  Tensor w1, b1, w2, b2;

  Mlp(const Device& dev) {
    dev.set_seed(1);
    // He initialisation for the ReLU layer, Glorot-like for the output layer.
    w1 = Tensor::randn(0.0f, std::sqrt(2.0f / 2.0f), {2, kHidden}, dev).requires_grad();
    b1 = Tensor::zeros({kHidden}, DType::F32, dev).requires_grad();
    w2 = Tensor::randn(0.0f, std::sqrt(1.0f / kHidden), {kHidden, kClasses}, dev).requires_grad();
    b2 = Tensor::zeros({kClasses}, DType::F32, dev).requires_grad();
  }

  std::vector<Tensor> params() const { return {w1, b1, w2, b2}; }

  Tensor logits(const Tensor& x) const {
    Tensor h = x.matmul(w1).broadcast_add(b1).relu();
    return h.matmul(w2).broadcast_add(b2);
  }
};

// Mean negative log-likelihood of `labels` (u32, [n, 1]) under softmax(logits).
Tensor cross_entropy(const Tensor& logits, const Tensor& labels) {
  Tensor shifted = logits.broadcast_sub(logits.max_keepdim(1).detach());
  Tensor log_probs = shifted.broadcast_sub(shifted.exp().sum_keepdim({1}).log());
  return log_probs.gather(labels, 1).mean_all().neg();
}

double accuracy(const Mlp& model, const Tensor& x, const Tensor& labels) {
  wick::NoGradGuard no_grad;
  Tensor predicted = model.logits(x).argmax(1);
  Tensor correct = predicted.eq(labels.flatten_all()).to_dtype(DType::F32);
  return correct.mean_all().to_scalar<float>();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Device dev = Device::parse(argc > 1 ? argv[1] : "cpu");
    size_t epochs = argc > 2 ? std::stoul(argv[2]) : 100;
    if (dev.is_cuda() && !wick::cuda_is_available()) {
      std::fprintf(stderr, "train-mlp: no CUDA device available\n");
      return 2;
    }

    std::vector<float> points;
    std::vector<uint32_t> label_values;
    make_spiral(points, label_values);
    size_t n = label_values.size();
    Tensor x = Tensor::from_vec(points, {n, 2}, dev);
    Tensor labels = Tensor::from_vec(label_values, {n, 1}, dev);

    Mlp model(dev);
    wick::optim::AdamW opt(model.params(), {.lr = 0.02, .weight_decay = 1e-4});
    std::mt19937 shuffle_gen(3);
    std::vector<uint32_t> order(n);
    std::iota(order.begin(), order.end(), 0u);

    std::printf("train-mlp on %s: %zu points, %zu classes, hidden %zu, batch %zu\n",
                dev.to_string().c_str(), n, kClasses, kHidden, kBatch);
    auto start = std::chrono::steady_clock::now();
    for (size_t epoch = 1; epoch <= epochs; ++epoch) {
      std::shuffle(order.begin(), order.end(), shuffle_gen);
      Tensor perm = Tensor::from_vec(order, {n}, dev);
      std::vector<Tensor> losses;
      for (size_t begin = 0; begin < n; begin += kBatch) {
        Tensor ids = perm.narrow(0, begin, std::min(kBatch, n - begin));
        Tensor loss =
            cross_entropy(model.logits(x.index_select(ids, 0)), labels.index_select(ids, 0));
        opt.step(loss.backward());
        losses.push_back(loss.detach().reshape({1}));
      }
      // One read-back per epoch: the batches' losses stay on the device until here.
      float mean_loss = Tensor::cat(losses, 0).mean_all().to_scalar<float>();
      std::printf("epoch %3zu  loss %.4f\n", epoch, mean_loss);
    }
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    double acc = accuracy(model, x, labels);
    std::printf("final training accuracy: %.2f%% (%.2f s on %s)\n", 100 * acc, seconds,
                dev.to_string().c_str());
    if (acc < 0.95) {
      std::fprintf(stderr, "train-mlp: accuracy below 95%%\n");
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train-mlp: %s\n", e.what());
    return 2;
  }
}
