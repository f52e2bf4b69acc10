// Index ops (index_select, gather, embedding, index_add, scatter_add) against double-precision
// references, with u32 and i64 ids, strided inputs and ids, empty tensors and every error.

#include <cstdint>
#include <string>

#include "test_util.h"

namespace wick {
namespace {

using testing::random_tensor;

const Device cpu = Device::cpu();
const std::vector<DType> id_dtypes{DType::U32, DType::I64};

std::vector<int64_t> random_ids(size_t n, size_t size) {
  std::uniform_int_distribution<int64_t> dist(0, static_cast<int64_t>(size) - 1);
  std::vector<int64_t> v(n);
  for (auto& x : v) x = dist(testing::rng());
  return v;
}

Tensor ids_tensor(const std::vector<int64_t>& ids, const Shape& shape, DType dt) {
  Tensor t = Tensor::from_vec(ids, shape, cpu);
  return dt == DType::I64 ? t : t.to_dtype(dt);
}

// The same ids laid out with gaps (stride 2): a row of a transposed [n, 2] tensor.
Tensor strided_ids(const std::vector<int64_t>& ids, DType dt) {
  std::vector<int64_t> both;
  for (int64_t x : ids) {
    both.push_back(x);
    both.push_back(-1);
  }
  Tensor t = ids_tensor(both, {ids.size(), 2}, dt).t().get(0);
  EXPECT_FALSE(t.is_contiguous() && ids.size() > 1);
  return t;
}

// Row-major multi-index helpers.
std::vector<size_t> unravel(size_t flat, const std::vector<size_t>& dims) {
  std::vector<size_t> idx(dims.size());
  for (size_t i = dims.size(); i-- > 0;) {
    idx[i] = flat % dims[i];
    flat /= dims[i];
  }
  return idx;
}

size_t ravel(const std::vector<size_t>& idx, const std::vector<size_t>& dims) {
  size_t flat = 0;
  for (size_t i = 0; i < dims.size(); ++i) flat = flat * dims[i] + idx[i];
  return flat;
}

std::vector<double> index_select_ref(const std::vector<double>& v, const std::vector<size_t>& dims,
                                     const std::vector<int64_t>& ids, size_t dim) {
  std::vector<size_t> out_dims = dims;
  out_dims[dim] = ids.size();
  std::vector<double> out(Shape(out_dims).elem_count());
  for (size_t i = 0; i < out.size(); ++i) {
    auto idx = unravel(i, out_dims);
    idx[dim] = static_cast<size_t>(ids[idx[dim]]);
    out[i] = v[ravel(idx, dims)];
  }
  return out;
}

std::vector<double> gather_ref(const std::vector<double>& v, const std::vector<size_t>& dims,
                               const std::vector<int64_t>& ids, const std::vector<size_t>& ids_dims,
                               size_t dim) {
  std::vector<double> out(ids.size());
  for (size_t i = 0; i < out.size(); ++i) {
    auto idx = unravel(i, ids_dims);
    idx[dim] = static_cast<size_t>(ids[i]);
    out[i] = v[ravel(idx, dims)];
  }
  return out;
}

// Sums of several terms (the destination's value and the added ones): per element the value, the
// sum of the terms' magnitudes and their count, what numerics::index_add_bound reads.
struct Accumulated {
  std::vector<double> values, abs_sum;
  std::vector<size_t> terms;
};

Accumulated start_sums(const std::vector<double>& v) {
  Accumulated a{v, std::vector<double>(v.size()), std::vector<size_t>(v.size(), 1)};
  for (size_t i = 0; i < v.size(); ++i) a.abs_sum[i] = std::abs(v[i]);
  return a;
}

void add_term(Accumulated& a, size_t at, double x) {
  a.values[at] += x;
  a.abs_sum[at] += std::abs(x);
  ++a.terms[at];
}

Accumulated index_add_ref(const std::vector<double>& v, const std::vector<size_t>& dims,
                          const std::vector<int64_t>& ids, const std::vector<double>& src,
                          size_t dim) {
  Accumulated a = start_sums(v);
  std::vector<size_t> src_dims = dims;
  src_dims[dim] = ids.size();
  for (size_t i = 0; i < src.size(); ++i) {
    auto idx = unravel(i, src_dims);
    idx[dim] = static_cast<size_t>(ids[idx[dim]]);
    add_term(a, ravel(idx, dims), src[i]);
  }
  return a;
}

Accumulated scatter_add_ref(const std::vector<double>& v, const std::vector<size_t>& dims,
                            const std::vector<int64_t>& ids, const std::vector<size_t>& ids_dims,
                            const std::vector<double>& src, size_t dim) {
  Accumulated a = start_sums(v);
  for (size_t i = 0; i < src.size(); ++i) {
    auto idx = unravel(i, ids_dims);
    idx[dim] = static_cast<size_t>(ids[i]);
    add_term(a, ravel(idx, dims), src[i]);
  }
  return a;
}

// Every element within numerics::index_add_bound of the float64 sums (integers: exact; they wrap
// only where the reference's terms wrap, which these tests' small values never do).
::testing::AssertionResult close_to(const std::vector<double>& actual, const Accumulated& ref,
                                    DType dt) {
  return testing::within_bounds(actual, ref.values, [&](size_t i, double want) {
    return numerics::index_add_bound(dt, ref.terms[i], want, ref.abs_sum[i]);
  });
}

std::string where(DType dt, DType id_dt, const std::string& name, size_t dim) {
  return std::string(dtype_name(dt)) + " ids " + dtype_name(id_dt) + " " + name + " dim " +
         std::to_string(dim);
}

// Runs fn, expects IndexOutOfRange whose message names everything a user needs.
template <class F>
void expect_bad_id(F&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no IndexOutOfRange thrown";
  } catch (const IndexOutOfRange& e) {
    std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << msg << " lacks " << p;
  }
}

// ---- index_select / embedding ----

TEST(IndexSelect, EveryDTypeLayoutAndDim) {
  const Shape s{4, 5, 6};
  for (DType dt : testing::all_dtypes()) {
    for (auto& [name, t] : testing::layout_variants(s, dt, false)) {
      std::vector<double> in = t.to_vec_f64();
      for (size_t d = 0; d < 3; ++d) {
        for (DType id_dt : id_dtypes) {
          std::vector<int64_t> ids = random_ids(7, s[d]);  // more ids than rows: repeats
          for (Tensor idt : {ids_tensor(ids, {ids.size()}, id_dt), strided_ids(ids, id_dt)}) {
            Tensor out = t.index_select(idt, d);
            std::vector<size_t> out_dims = s.dims();
            out_dims[d] = ids.size();
            ASSERT_EQ(out.shape(), Shape(out_dims)) << where(dt, id_dt, name, d);
            ASSERT_EQ(out.dtype(), dt);
            EXPECT_EQ(out.to_vec_f64(), index_select_ref(in, s.dims(), ids, d))
                << where(dt, id_dt, name, d);
          }
        }
      }
    }
  }
}

TEST(IndexSelect, LargeThreadedAndEmpty) {
  Tensor t = random_tensor({300, 257}, DType::F32);
  std::vector<int64_t> ids = random_ids(500, 300);
  EXPECT_EQ(t.index_select(ids_tensor(ids, {500}, DType::U32), 0).to_vec_f64(),
            index_select_ref(t.to_vec_f64(), {300, 257}, ids, 0));
  std::vector<int64_t> cols = random_ids(400, 257);
  EXPECT_EQ(t.t().index_select(ids_tensor(cols, {400}, DType::I64), 0).to_vec_f64(),
            index_select_ref(t.t().contiguous().to_vec_f64(), {257, 300}, cols, 0));

  Tensor none = ids_tensor({}, {0}, DType::U32);
  EXPECT_EQ(t.index_select(none, 1).shape(), Shape({300, 0}));
  Tensor empty = Tensor::zeros({0, 3}, DType::F64, cpu);
  EXPECT_EQ(empty.index_select(ids_tensor({2, 0}, {2}, DType::I64), 1).shape(), Shape({0, 2}));
}

TEST(IndexSelect, Errors) {
  Tensor t = random_tensor({4, 5}, DType::F32);
  for (DType id_dt : id_dtypes) {
    expect_bad_id(
        [&] {
          t.index_select(ids_tensor({0, 5, 1}, {3}, id_dt), 1);
        },
        {"index_select", "5", "dim 1", "size 5"});
    expect_bad_id([&] { t.index_select(ids_tensor({4}, {1}, id_dt), 0); },
                  {"index_select", "4", "dim 0", "size 4"});
  }
  expect_bad_id(
      [&] {
        t.index_select(ids_tensor({1, -1}, {2}, DType::I64), 0);
      },
      {"index_select", "-1", "dim 0"});
  // Even when the result is empty, every id is checked.
  expect_bad_id(
      [&] {
        Tensor::zeros({0, 3}, DType::F32, cpu).index_select(ids_tensor({3}, {1}, DType::U32), 1);
      },
      {"index_select", "3", "size 3"});
  EXPECT_THROW(t.index_select(ids_tensor({0}, {1}, DType::U32), 2), IndexOutOfRange);
  EXPECT_THROW(t.index_select(Tensor::from_vec<float>({0, 1}, {2}, cpu), 0), UnsupportedDType);
  EXPECT_THROW(t.index_select(Tensor::from_vec<uint8_t>({0, 1}, {2}, cpu), 0), UnsupportedDType);
  EXPECT_THROW(t.index_select(ids_tensor({0, 1}, {1, 2}, DType::U32), 0), ShapeMismatch);
  EXPECT_THROW(t.index_select(Tensor::scalar<uint32_t>(0, cpu), 0), ShapeMismatch);
}

TEST(Embedding, RowsOfTheTable) {
  for (DType dt : testing::float_dtypes()) {
    Tensor table = random_tensor({10, 4}, dt);
    std::vector<double> tv = table.to_vec_f64();
    for (DType id_dt : id_dtypes) {
      std::vector<int64_t> ids = random_ids(6, 10);
      Tensor out = table.embedding(ids_tensor(ids, {2, 3}, id_dt));
      ASSERT_EQ(out.shape(), Shape({2, 3, 4}));
      EXPECT_EQ(out.to_vec_f64(), index_select_ref(tv, {10, 4}, ids, 0));
      // A transposed table and transposed ids.
      Tensor tt = random_tensor({4, 10}, dt).t();
      Tensor idt = ids_tensor(ids, {3, 2}, id_dt).t();
      std::vector<int64_t> flat_ids;
      for (size_t i = 0; i < 2; ++i)
        for (size_t j = 0; j < 3; ++j) flat_ids.push_back(ids[j * 2 + i]);
      EXPECT_EQ(tt.embedding(idt).to_vec_f64(),
                index_select_ref(tt.to_vec_f64(), {10, 4}, flat_ids, 0));
    }
  }
  Tensor table = random_tensor({10, 4}, DType::F32);
  expect_bad_id(
      [&] {
        table.embedding(ids_tensor({3, 10}, {2}, DType::U32));
      },
      {"10", "dim 0", "size 10"});
  EXPECT_THROW(random_tensor({10}, DType::F32).embedding(ids_tensor({1}, {1}, DType::U32)),
               ShapeMismatch);
  EXPECT_THROW(table.embedding(Tensor::from_vec<double>({1}, {1}, cpu)), UnsupportedDType);
  EXPECT_EQ(table.embedding(ids_tensor({}, {0}, DType::I64)).shape(), Shape({0, 4}));
}

// ---- gather ----

TEST(Gather, EveryDTypeLayoutAndDim) {
  const Shape s{4, 5, 6};
  for (DType dt : testing::all_dtypes()) {
    for (auto& [name, t] : testing::layout_variants(s, dt, false)) {
      std::vector<double> in = t.to_vec_f64();
      for (size_t d = 0; d < 3; ++d) {
        for (DType id_dt : id_dtypes) {
          for (size_t k : {size_t{1}, size_t{3}, size_t{8}}) {  // fewer or more than the dim
            std::vector<size_t> ids_dims = s.dims();
            ids_dims[d] = k;
            std::vector<int64_t> ids = random_ids(Shape(ids_dims).elem_count(), s[d]);
            Tensor out = t.gather(ids_tensor(ids, Shape(ids_dims), id_dt), d);
            ASSERT_EQ(out.shape(), Shape(ids_dims)) << where(dt, id_dt, name, d);
            EXPECT_EQ(out.to_vec_f64(), gather_ref(in, s.dims(), ids, ids_dims, d))
                << where(dt, id_dt, name, d);
          }
        }
      }
    }
  }
}

TEST(Gather, StridedIdsLargeAndEmpty) {
  // ids stored transposed.
  Tensor t = random_tensor({6, 5}, DType::F64);
  std::vector<int64_t> raw = random_ids(5 * 6, 5);  // ids for shape [6, 5] stored as [5, 6]
  Tensor ids = ids_tensor(raw, {5, 6}, DType::I64).t();
  std::vector<int64_t> logical;
  for (size_t i = 0; i < 6; ++i)
    for (size_t j = 0; j < 5; ++j) logical.push_back(raw[j * 6 + i]);
  EXPECT_EQ(t.gather(ids, 1).to_vec_f64(), gather_ref(t.to_vec_f64(), {6, 5}, logical, {6, 5}, 1));

  // Large enough to be split between threads.
  Tensor big = random_tensor({256, 300}, DType::F32);
  std::vector<int64_t> bids = random_ids(256 * 300, 256);
  EXPECT_EQ(big.gather(ids_tensor(bids, {256, 300}, DType::U32), 0).to_vec_f64(),
            gather_ref(big.to_vec_f64(), {256, 300}, bids, {256, 300}, 0));

  EXPECT_EQ(t.gather(ids_tensor({}, {6, 0}, DType::U32), 1).shape(), Shape({6, 0}));
  EXPECT_EQ(
      Tensor::zeros({0, 4}, DType::F32, cpu).gather(ids_tensor({}, {0, 2}, DType::U32), 1).shape(),
      Shape({0, 2}));
}

TEST(Gather, Errors) {
  Tensor t = random_tensor({3, 4}, DType::F32);
  for (DType id_dt : id_dtypes) {
    expect_bad_id(
        [&] {
          t.gather(ids_tensor({0, 1, 2, 4, 0, 0}, {3, 2}, id_dt), 1);
        },
        {"gather", "4", "dim 1", "size 4"});
    expect_bad_id(
        [&] {
          t.gather(ids_tensor({0, 3, 1, 1}, {1, 4}, id_dt), 0);
        },
        {"gather", "3", "dim 0", "size 3"});
  }
  expect_bad_id(
      [&] {
        t.gather(ids_tensor({0, -2, 1}, {3, 1}, DType::I64), 1);
      },
      {"gather", "-2", "dim 1"});
  EXPECT_THROW(t.gather(ids_tensor({0, 0}, {2, 1}, DType::U32), 1), ShapeMismatch);
  EXPECT_THROW(t.gather(ids_tensor({0, 0, 0}, {3}, DType::U32), 1), ShapeMismatch);
  EXPECT_THROW(t.gather(ids_tensor({0, 0, 0}, {3, 1, 1}, DType::U32), 1), ShapeMismatch);
  EXPECT_THROW(t.gather(ids_tensor({0, 0, 0}, {3, 1}, DType::U32), 2), IndexOutOfRange);
  EXPECT_THROW(t.gather(Tensor::zeros({3, 1}, DType::F32, cpu), 1), UnsupportedDType);
}

// ---- index_add ----

TEST(IndexAdd, EveryDTypeLayoutAndDim) {
  const Shape s{4, 5, 6};
  for (DType dt : testing::all_dtypes()) {
    for (auto& [name, t] : testing::layout_variants(s, dt, false)) {
      std::vector<double> in = t.to_vec_f64();
      for (size_t d = 0; d < 3; ++d) {
        for (DType id_dt : id_dtypes) {
          std::vector<int64_t> ids = random_ids(7, s[d]);  // repeats accumulate
          std::vector<size_t> src_dims = s.dims();
          src_dims[d] = ids.size();
          // A transposed source.
          std::vector<size_t> rev(src_dims.rbegin(), src_dims.rend());
          Tensor src = random_tensor(Shape(rev), dt).permute({2, 1, 0});
          Tensor out = t.index_add(strided_ids(ids, id_dt), src, d);
          ASSERT_EQ(out.shape(), s);
          ASSERT_EQ(out.dtype(), dt);
          EXPECT_TRUE(
              close_to(out.to_vec_f64(), index_add_ref(in, s.dims(), ids, src.to_vec_f64(), d), dt))
              << where(dt, id_dt, name, d);
        }
      }
    }
  }
}

TEST(IndexAdd, IsTheAdjointOfIndexSelectAndLeavesInputAlone) {
  // Embedding backward: a wide table, few ids, threads over the hidden dim.
  Tensor table = random_tensor({5, 20000}, DType::F32);
  std::vector<double> before = table.to_vec_f64();
  std::vector<int64_t> ids{3, 0, 3, 3, 1};
  Tensor grad = random_tensor({5, 20000}, DType::F32);
  Tensor out = table.index_add(ids_tensor(ids, {5}, DType::I64), grad, 0);
  EXPECT_TRUE(close_to(out.to_vec_f64(),
                       index_add_ref(before, {5, 20000}, ids, grad.to_vec_f64(), 0), DType::F32));
  EXPECT_EQ(table.to_vec_f64(), before);  // a copy, not in place
  // Integers wrap.
  auto u8 = Tensor::from_vec<uint8_t>({250, 1}, {2}, cpu);
  EXPECT_EQ(u8.index_add(ids_tensor({0, 0}, {2}, DType::U32),
                         Tensor::from_vec<uint8_t>({5, 3}, {2}, cpu), 0)
                .to_vec1<uint8_t>(),
            (std::vector<uint8_t>{2, 1}));
  // No ids: a plain copy.
  Tensor t = random_tensor({3, 2}, DType::F64);
  EXPECT_EQ(t.index_add(ids_tensor({}, {0}, DType::U32), Tensor::zeros({0, 2}, DType::F64, cpu), 0)
                .to_vec_f64(),
            t.to_vec_f64());
}

TEST(IndexAdd, Errors) {
  Tensor t = random_tensor({4, 5}, DType::F32);
  Tensor src = random_tensor({4, 2}, DType::F32);
  for (DType id_dt : id_dtypes) {
    expect_bad_id(
        [&] {
          t.index_add(ids_tensor({1, 5}, {2}, id_dt), src, 1);
        },
        {"index_add", "5", "dim 1", "size 5"});
  }
  expect_bad_id(
      [&] {
        t.index_add(ids_tensor({-1, 0}, {2}, DType::I64), src, 1);
      },
      {"index_add", "-1"});
  Tensor ids = ids_tensor({1, 2}, {2}, DType::U32);
  EXPECT_THROW(t.index_add(ids, random_tensor({4, 3}, DType::F32), 1), ShapeMismatch);
  EXPECT_THROW(t.index_add(ids, random_tensor({3, 2}, DType::F32), 1), ShapeMismatch);
  EXPECT_THROW(t.index_add(ids_tensor({1, 2}, {1, 2}, DType::U32), src, 1), ShapeMismatch);
  EXPECT_THROW(t.index_add(ids, random_tensor({4, 2}, DType::F64), 1), DTypeMismatch);
  EXPECT_THROW(t.index_add(ids, src, 2), IndexOutOfRange);
  EXPECT_THROW(t.index_add(Tensor::from_vec<float>({1, 2}, {2}, cpu), src, 1), UnsupportedDType);
}

// ---- scatter_add ----

TEST(ScatterAdd, EveryDTypeLayoutAndDim) {
  const Shape s{4, 5, 6};
  for (DType dt : testing::all_dtypes()) {
    for (auto& [name, t] : testing::layout_variants(s, dt, false)) {
      std::vector<double> in = t.to_vec_f64();
      for (size_t d = 0; d < 3; ++d) {
        for (DType id_dt : id_dtypes) {
          for (size_t k : {size_t{2}, size_t{9}}) {
            std::vector<size_t> ids_dims = s.dims();
            ids_dims[d] = k;
            std::vector<int64_t> ids = random_ids(Shape(ids_dims).elem_count(), s[d]);
            std::vector<size_t> rev(ids_dims.rbegin(), ids_dims.rend());
            Tensor src = random_tensor(Shape(rev), dt).permute({2, 1, 0});
            Tensor out = t.scatter_add(ids_tensor(ids, Shape(ids_dims), id_dt), src, d);
            ASSERT_EQ(out.shape(), s);
            EXPECT_TRUE(close_to(out.to_vec_f64(),
                                 scatter_add_ref(in, s.dims(), ids, ids_dims, src.to_vec_f64(), d),
                                 dt))
                << where(dt, id_dt, name, d);
          }
        }
      }
    }
  }
}

TEST(ScatterAdd, AdjointOfGatherLargeAndEmpty) {
  Tensor t = random_tensor({2000, 64}, DType::F64);
  std::vector<int64_t> ids = random_ids(2000 * 50, 64);
  Tensor src = random_tensor({2000, 50}, DType::F64);
  Tensor ids_t = ids_tensor(ids, {2000, 50}, DType::I64);
  EXPECT_TRUE(
      close_to(t.scatter_add(ids_t, src, 1).to_vec_f64(),
               scatter_add_ref(t.to_vec_f64(), {2000, 64}, ids, {2000, 50}, src.to_vec_f64(), 1),
               DType::F64));
  // Strided ids (a transposed copy).
  Tensor ids_tt = ids_tensor(ids, {2000, 50}, DType::U32).t().contiguous().t();
  EXPECT_FALSE(ids_tt.is_contiguous());
  EXPECT_EQ(t.scatter_add(ids_tt, src, 1).to_vec_f64(), t.scatter_add(ids_t, src, 1).to_vec_f64());
  Tensor e = t.scatter_add(ids_tensor({}, {2000, 0}, DType::U32),
                           Tensor::zeros({2000, 0}, DType::F64, cpu), 1);
  EXPECT_EQ(e.to_vec_f64(), t.to_vec_f64());
}

TEST(ScatterAdd, Errors) {
  Tensor t = random_tensor({3, 4}, DType::F32);
  Tensor src = random_tensor({3, 2}, DType::F32);
  for (DType id_dt : id_dtypes) {
    expect_bad_id(
        [&] {
          t.scatter_add(ids_tensor({0, 1, 2, 3, 4, 0}, {3, 2}, id_dt), src, 1);
        },
        {"scatter_add", "4", "dim 1", "size 4"});
  }
  expect_bad_id(
      [&] {
        t.scatter_add(ids_tensor({0, 1, 2, 3, -4, 0}, {3, 2}, DType::I64), src, 1);
      },
      {"scatter_add", "-4"});
  Tensor ids = ids_tensor({0, 1, 2, 3, 0, 0}, {3, 2}, DType::U32);
  EXPECT_THROW(t.scatter_add(ids, random_tensor({3, 3}, DType::F32), 1), ShapeMismatch);
  EXPECT_THROW(t.scatter_add(ids_tensor({0, 1, 2, 3, 0, 0}, {2, 3}, DType::U32),
                             random_tensor({2, 3}, DType::F32), 1),
               ShapeMismatch);
  EXPECT_THROW(t.scatter_add(ids, random_tensor({3, 2}, DType::F16), 1), DTypeMismatch);
  EXPECT_THROW(t.scatter_add(ids, src, 2), IndexOutOfRange);
  EXPECT_THROW(t.scatter_add(Tensor::zeros({3, 2}, DType::F32, cpu), src, 1), UnsupportedDType);
}

}  // namespace
}  // namespace wick
