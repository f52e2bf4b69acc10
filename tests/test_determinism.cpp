// Bitwise determinism of the CPU ops (docs/NUMERICS.md, "Determinism"): the same bits whatever
// the thread count (this executable runs the suite of tools/conform_determinism.h in child
// processes of 1, 2 and 3 threads), from run to run, and for a row alone or inside a batch.
// The reference of each comparison is the same op computed another way (other threads, other
// batch); the comparisons themselves are checked to see a one-ulp difference.

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "../tools/conform_determinism.h"
#include "bert_test_util.h"
#include "test_util.h"
#include "wick/cpu.h"
#include "wick/generator.h"
#include "wick/llama.h"
#include "wick/wick.h"

namespace {

using namespace wick;
using determinism::Diff;

// The child's request: "<threads>:<path>" (run the thread suite with that many threads and write
// its results to path).
const char* child_request() {
  const char* v = std::getenv("WICK_DETERMINISM_CHILD");
  return v != nullptr && *v != '\0' ? v : nullptr;
}

// This process (not a child) runs its own ops on 3 threads, whatever the machine has: a split
// that follows the thread count then differs from the children's 1 and 2.
const bool kThreadsSet = [] {
  if (child_request() == nullptr) set_cpu_threads(3);
  return true;
}();

std::string self_exe() {
  std::vector<char> buf(4096);
  ssize_t n = readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  return n > 0 ? std::string(buf.data(), static_cast<size_t>(n)) : std::string();
}

// Runs the thread suite in a child process with `threads` threads; its results.
std::vector<determinism::Result> suite_in_child(size_t threads, const std::string& tag) {
  std::string path =
      ::testing::TempDir() + "wick_determinism_" + std::to_string(getpid()) + "_" + tag + ".bin";
  std::string cmd = "WICK_DETERMINISM_CHILD=" + std::to_string(threads) + ":" + path + " '" +
                    self_exe() + "' --gtest_filter=DeterminismChild.Suite > /dev/null 2>&1";
  int rc = std::system(cmd.c_str());
  EXPECT_EQ(rc, 0) << cmd;
  auto results = determinism::read_results(path);
  std::remove(path.c_str());
  return results;
}

std::string describe(const Diff& d) {
  return d.op + " " + dtype_name(d.dtype) + " " + determinism::shape_str(d.shape) + ": " +
         std::to_string(d.count) + " elements differ, max " + std::to_string(d.max_abs) + " (" +
         std::to_string(d.max_ulps) + " ulps)";
}

// Runs `filter` of this executable in a child process with `env` ("NAME=value ..."); its exit
// status, and its output in *out.
int run_child(const std::string& env, const std::string& filter, std::string* out) {
  std::string cmd = env + " '" + self_exe() + "' --gtest_filter=" + filter + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out->append(buf, n);
  return pclose(p);
}

TEST(DeterminismChild, Suite) {
  const char* req = child_request();
  if (req == nullptr) GTEST_SKIP() << "runs in the child processes of ThreadCount tests";
  std::string r = req;
  size_t colon = r.find(':');
  ASSERT_NE(colon, std::string::npos);
  set_cpu_threads(std::stoul(r.substr(0, colon)));
  determinism::write_results(r.substr(colon + 1), determinism::thread_suite());
}

TEST(DeterminismChild, SwitchedRows) {
  if (child_request() == nullptr) GTEST_SKIP() << "runs in the child process of BatchInvariance";
  set_cpu_threads(3);
  for (const Diff& d : determinism::batch_suite_switched(64)) ADD_FAILURE() << describe(d);
}

TEST(Determinism, CompareSeesOneUlp) {
  Tensor a = Tensor::from_vec(std::vector<float>{1.0f, -2.0f, 3.0f}, {3}, Device::cpu());
  Tensor b = Tensor::from_vec(std::vector<float>{1.0f, std::nextafter(-2.0f, -3.0f), 3.0f}, {3},
                              Device::cpu());
  auto ba = determinism::bytes_of(a), bb = determinism::bytes_of(b);
  auto d = determinism::compare("x", DType::F32, {3}, ba.data(), bb.data(), 3);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->count, 1u);
  EXPECT_EQ(d->max_ulps, 1u);
  EXPECT_EQ(d->max_abs, std::nextafter(2.0f, 3.0f) - 2.0f);
  EXPECT_FALSE(determinism::compare("x", DType::F32, {3}, ba.data(), ba.data(), 3).has_value());
  // Across zero: +0 and the smallest negative subnormal are one ulp apart.
  Tensor z = Tensor::from_vec(std::vector<double>{0.0}, {1}, Device::cpu());
  Tensor nz = Tensor::from_vec(std::vector<double>{-std::numeric_limits<double>::denorm_min()}, {1},
                               Device::cpu());
  auto bz = determinism::bytes_of(z), bnz = determinism::bytes_of(nz);
  EXPECT_EQ(determinism::compare("z", DType::F64, {1}, bz.data(), bnz.data(), 1)->max_ulps, 1u);
  auto h = determinism::bytes_of(a.to_dtype(DType::BF16)),
       hb = determinism::bytes_of(b.to_dtype(DType::BF16));
  EXPECT_FALSE(determinism::compare("h", DType::BF16, {3}, h.data(), hb.data(), 3).has_value());
}

// WICK_BATCH_INVARIANT takes 0 or 1; anything else is an Error naming it at the first matmul.
TEST(DeterminismDeathTest, SwitchRejectsOtherValues) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("WICK_BATCH_INVARIANT", "yes", 1);
        auto a = Tensor::ones({2, 2}, DType::F32, Device::cpu());
        try {
          (void)a.matmul(a).to_vec2<float>();
        } catch (const Error& e) {
          std::exit(std::string(e.what()) == "WICK_BATCH_INVARIANT=yes: expected 0 or 1" ? 0 : 1);
        }
        std::exit(2);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(Determinism, ResultsRoundTripThroughTheirFile) {
  std::vector<determinism::Result> rs = {{"a b", DType::F32, {2, 1}, {1, 2, 3, 4, 5, 6, 7, 8}},
                                         {"c", DType::U8, {}, {9}}};
  std::string path = ::testing::TempDir() + "wick_determinism_roundtrip.bin";
  determinism::write_results(path, rs);
  auto back = determinism::read_results(path);
  std::remove(path.c_str());
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].op, "a b");
  EXPECT_EQ(back[0].shape, (std::vector<size_t>{2, 1}));
  EXPECT_EQ(back[0].bytes, rs[0].bytes);
  EXPECT_EQ(back[1].dtype, DType::U8);
  EXPECT_EQ(back[1].bytes, rs[1].bytes);
  EXPECT_THROW(determinism::read_results(path), Error);
}

// Every op family (reductions, softmax, norms, matmul, quantized matmul, attention, indexing,
// backward) gives the same bits with 1, 2 and 3 threads, and twice with 2.
TEST(ThreadCount, EveryOpBitwiseWith1To3Threads) {
  auto one = suite_in_child(1, "t1");
  ASSERT_FALSE(one.empty());
  for (auto [threads, tag] : {std::pair<size_t, const char*>{2, "t2"}, {3, "t3"}, {2, "t2b"}}) {
    auto other = suite_in_child(threads, tag);
    for (const Diff& d : determinism::compare_runs(
             one, other, "1 vs " + std::to_string(threads) + " threads, " + tag)) {
      ADD_FAILURE() << describe(d);
    }
  }
}

// This process (3 threads) against a 1-thread child: the same bits.
TEST(ThreadCount, InProcessEqualsOneThreadChild) {
  auto here = determinism::thread_suite();
  auto one = suite_in_child(1, "t1here");
  for (const Diff& d : determinism::compare_runs(one, here, "1 thread vs this process's 3")) {
    ADD_FAILURE() << describe(d);
  }
}

TEST(RunToRun, SuiteTwiceInOneProcess) {
  auto a = determinism::thread_suite();
  auto b = determinism::thread_suite();
  for (const Diff& d : determinism::compare_runs(a, b, "run to run")) ADD_FAILURE() << describe(d);
}

// Each row alone and inside batches of 1..64 rows: quantized matmul, norms, softmax, row
// reductions, attention's sequences.
TEST(BatchInvariance, RowsAloneEqualRowsInBatches) {
  for (const Diff& d : determinism::batch_suite(64)) ADD_FAILURE() << describe(d);
}

// Matmul rows alone and inside batches of 1..64 rows, and attention queries alone and inside
// their prefill, with WICK_BATCH_INVARIANT=1 (read once per process: a child process).
TEST(BatchInvariance, MatmulAndAttentionRowsWithTheSwitch) {
  std::string out;
  int rc = run_child("WICK_DETERMINISM_CHILD=1 WICK_BATCH_INVARIANT=1",
                     "DeterminismChild.SwitchedRows", &out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("[  PASSED  ] 1 test"), std::string::npos) << out;
}

// A sentence embedded alone equals it inside batches of every size 1..128 (MiniLM, short
// sentences of different lengths: padding, batch lengths and the products' row counts all
// differ), with WICK_BATCH_INVARIANT=1 (in a child process).
TEST(DeterminismChild, Sentences) {
  if (child_request() == nullptr) GTEST_SKIP() << "runs in the child process of BatchInvariance";
  WICK_REQUIRE_MINILM(dir);
  for (const Diff& d : determinism::embedding_suite(dir.string(), Device::cpu(), 128)) {
    ADD_FAILURE() << describe(d);
  }
}

TEST(BatchInvariance, SentenceAloneEqualsItInBatchesOf1To128) {
  WICK_REQUIRE_MINILM(dir);
  std::string out;
  int rc = run_child(
      "WICK_DETERMINISM_CHILD=1 WICK_BATCH_INVARIANT=1 WICK_MINILM_DIR='" + dir.string() + "'",
      "DeterminismChild.Sentences", &out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("[  PASSED  ] 1 test"), std::string::npos) << out;
}

// Sampling is per stream: a Generator's draws depend on its seed and its own calls only, so a
// request's tokens at temperature 0.8 are the same alone or beside other streams sampling in
// between (the serving engine keeps one Generator per request).
TEST(BatchInvariance, SeededSamplingPerStream) {
  const auto model =
      models::Llama::load(std::string(WICK_TEST_DATA_DIR) + "/llama/tiny_llama", Device::cpu());
  GenerateOptions o;
  o.temperature = 0.8;
  o.top_p = 0.95;
  o.seed = 1234;
  std::vector<std::vector<float>> logits(64);
  std::mt19937_64 gen(9);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  for (auto& l : logits) {
    l.resize(50);
    for (float& x : l) x = dist(gen);
  }
  Generator alone(model, o);
  std::vector<uint32_t> want;
  for (const auto& l : logits) want.push_back(alone.sample(l));
  GenerateOptions other = o;
  other.seed = 99;
  Generator a(model, o), b(model, other), c(model, o);
  std::vector<uint32_t> got, got_c, got_b;
  for (const auto& l : logits) {
    got_b.push_back(b.sample(l));
    got.push_back(a.sample(l));
    got_b.push_back(b.sample(l));
  }
  for (const auto& l : logits) got_c.push_back(c.sample(l));
  EXPECT_EQ(got, want);
  EXPECT_EQ(got_c, want);
  // The draws are random: another seed gives other tokens.
  EXPECT_NE(std::vector<uint32_t>(got_b.begin(), got_b.begin() + 64), want);
}

}  // namespace
