// Decode attention (attn_decode_kernel): flash-decoding of one query per head against the KV
// cache with tensor cores, f16/bf16, d 16 to 256. A block takes one k/v head's keys for up to 8
// of its query heads (the N of an m16n8k16 tile whose rows are keys); key tiles are dealt
// round-robin to the blocks and warps so that any prefix of visible keys is spread evenly; each
// warp streams its tiles through its own cp.async ring. Split-KV, the splits merged by the last
// block of each head group (one kernel); the split is a function of the key count alone, so a
// sequence's bits do not depend on its batch. Compiled per mode (plain, device last key, mask,
// paged). History: docs/perf/decode-attention.md.

#include <algorithm>
#include <cmath>

#include "cuda/attention_kernels.h"
#include "cuda/attention_mma.cuh"
#include "cuda/attention_operands.h"
#include "cuda/device_timeline.cuh"
#include "cuda/kernel_utils.cuh"
#include "cuda/paged_attention.h"
#include "cuda_config.h"

WICK_TIMELINE_TU(attention)

namespace wick::cuda {
namespace {

using namespace attn;

// Decode path (flash-decoding): one query (s = 1) per head against a long KV cache; f16/bf16, d 16,
// 32, 64, 96, 128 or 256, any number of query heads per k/v head, an optional additive mask. Grid
// (splits, b x h_kv x head chunks): a block reads K and V of one k/v head once for up to 8 of its
// query heads, the columns of an m16n8k16 tensor-core tile whose 16 rows are keys (missing heads
// are zeros: keys as the rows take half the mma instructions of heads as the rows). Keys come in
// tiles of 16, dealt round-robin to the blocks of a head and within a block to its warps, so that
// any prefix of visible keys is spread evenly: the graph-captured Llama step hides the cache rows
// past its position (a device last key, or a mask of -inf), and tiles with no visible key are
// neither read nor computed. Each warp streams its tiles through its own shared-memory ring
// (cp.async, kDecStages deep, no block barrier), keeps S^T = K Q^T, the online softmax and
// O^T += V^T P^T in registers (P's fragments transposed by movmatrix), then the warps merge in
// shared memory. With several splits each block leaves (max, sum, output) and the last block of
// its head group (an atomic count) merges them in split order: one kernel. The split count is a
// function of the key count (s_kv) alone: neither the batch nor the SM count changes a result. In
// the graph-captured decode step the cache rows before the position start loading before pdl_wait.
//
// Paged mode (the serving engine's nn::paged_attention): the rows of grid.y are (query token, k/v
// head, head chunk) of a ragged batch; a token's keys are its sequence's positions up to its own
// (a window's last ones), its 16-key tiles read through the sequence's page-table row (a page holds
// whole tiles), and its split count a function of its own key count: the grid has the most any
// token can need and a block past its token's count returns at once.

constexpr int kDecKeys = 16;   // keys per tile: one k-step of P V
constexpr int kDecStages = 3;  // tiles in flight per warp
constexpr int kDecRows = 8;    // query heads per block: the mma's N
constexpr int kDecMaxSplits = 128;
// Warps a block: 8 (at d 128 one block a multiprocessor), 4 at d 256 (whose rings of 8 warps
// would not fit in shared memory).
__host__ __device__ constexpr int dec_warps(int d) {
  return d > 128 ? 4 : 8;
}
constexpr int kDecMerge = 16;            // splits merged per round trip by the last block
constexpr int kDecCounterSlots = 65535;  // one per block row: grid.y's limit

// Blocks done per (b, k/v head, head chunk). Zero at load; the merging block sets its slot back
// to zero, so no memset is needed per call (one attention at a time on the device's stream).
__device__ unsigned int g_decode_done[kDecCounterSlots];

// What a decode kernel is compiled for: without a mask or a last key (Plain), with a last key and
// no mask (LastKey: the graph-captured decode step), with a mask (Masked, a last key or not): each
// compiles out what it is not asked for.
enum class DecodeMode { Plain, LastKey, Masked, Paged };

struct DecodeArgs {
  const uint16_t* q;
  const uint16_t* k;
  const uint16_t* v;
  const uint16_t* mask;      // null when absent
  const uint32_t* last_key;  // null when absent: keys after it are hidden
  uint16_t* out;
  float* part_ml;  // (b, h, splits, 2): max (base 2) and sum per split, when splits > 1
  float* part_o;   // (b, h, splits, d): unnormalised outputs
  int64_t qs[3], ks[3], vs[3], ms[4];
  int h, h_kv, group, chunks, s_kv, splits;
  float scale_log2;        // scale * log2(e): the softmax runs in base 2
  bool launch_next_early;  // AttentionArgs::launch_next_early
  bool q_pairs;            // q's rows 4-byte aligned: read 32 bits at a time
  // Paged mode: k and v are pools (pages, h_kv, page_size, d); token i's sequence, position and
  // the sequences' page tables (n_seqs, width) as PagedAttentionArgs has them.
  const uint32_t* table;
  const uint32_t* seq;
  const uint32_t* pos;
  int n_seqs, width, page_size, pages, window;
  bool indices_ready;  // PagedAttentionArgs::indices_ready: table, seq and pos read before pdl_wait
};

// Key tiles up to which one block takes them all: the last block's merge of the splits costs
// more than a few more tiles a warp (docs/perf/decode-attention.md).
constexpr int64_t kDecOneSplitTiles = 16;

// The split count of `tiles` key tiles at head dim d: one up to kDecOneSplitTiles, else one split
// per two tiles a warp, at most `most` (and at most one a tile): a function of the key count alone.
__host__ __device__ constexpr int decode_splits(int64_t tiles, int64_t most, int d) {
  const int64_t per_split = 2 * dec_warps(d);
  const int64_t want = tiles <= kDecOneSplitTiles ? 1 : (tiles + per_split - 1) / per_split;
  const int64_t cap = most < tiles ? most : tiles;
  return static_cast<int>(want < 1 ? 1 : want > cap ? (cap < 1 ? 1 : cap) : want);
}

template <class T, int D, DecodeMode M>
__global__ void __launch_bounds__(dec_warps(D) * 32) attn_decode_kernel(DecodeArgs p) {
  constexpr int kDecWarps = dec_warps(D);
  constexpr int LD = D + kPad;              // halves per shared row (no ldmatrix conflicts)
  constexpr int KSTEPS = D / 16;            // k-steps of Q K^T
  constexpr int PIECES = D / 8;             // 16-byte pieces per K or V row
  constexpr int STAGE = 2 * kDecKeys * LD;  // halves per ring stage: K tile, then V tile
  constexpr int OLD = D + 8;                // floats per row of the merge buffer
  extern __shared__ __align__(16) unsigned char dec_smem[];
  auto q_tile = reinterpret_cast<uint16_t(*)[LD]>(dec_smem);
  uint16_t* ring = reinterpret_cast<uint16_t*>(dec_smem + kDecRows * LD * 2);
  __shared__ float s_m[kDecWarps][kDecRows], s_l[kDecWarps][kDecRows];
  __shared__ bool s_last;

  WICK_TL_START();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, tg = lane & 3, mi = lane >> 3, ri = lane & 7;
  constexpr bool paged = M == DecodeMode::Paged;
  const int split = blockIdx.x, unit = blockIdx.y;
  const int chunk = unit % p.chunks, bkv = unit / p.chunks;  // paged: bi is the query token
  const int bi = bkv / p.h_kv, hk = bkv % p.h_kv;
  const int head0 = hk * p.group + chunk * kDecRows;  // this block's first query head
  const int rows = min(kDecRows, p.group - chunk * kDecRows);
  const uint16_t* kb = p.k + bi * p.ks[0] + hk * p.ks[1];
  const uint16_t* vb = p.v + bi * p.vs[0] + hk * p.vs[1];
  constexpr bool masked = M == DecodeMode::Masked;
  const uint16_t* mb = masked ? p.mask + bi * p.ms[0] + head0 * p.ms[1] : nullptr;
  const int mask_rows = p.ms[1] == 0 ? 1 : rows;  // a mask shared by the heads is read once

  // With a device last key and no mask (the graph-captured decode step), the key itself and the
  // cache rows before it were written before the kernel before this one (the caller's promise,
  // AttentionArgs::last_key): they are read before pdl_wait, and only q, the last key's row and
  // a mask wait for that kernel. Paged, the same when the indices were ready before.
  const bool rows_before = M == DecodeMode::LastKey || (paged && p.indices_ready);
  if (!rows_before) {
    pdl_wait();
    WICK_TL_WAITED();
  }
  // Keys [lo, keys) are read: all, or up to the last visible one; paged, the token's window.
  int keys, lo = 0, splits = p.splits;
  const uint32_t* table_row = nullptr;
  if constexpr (paged) {
    const uint32_t seq = p.seq[bi], pos = p.pos[bi];
    const bool valid = seq < static_cast<uint32_t>(p.n_seqs) &&
                       pos / static_cast<uint32_t>(p.page_size) < static_cast<uint32_t>(p.width);
    keys = valid ? static_cast<int>(pos) + 1 : 0;
    lo = p.window > 0 && keys > p.window ? keys - p.window : 0;
    table_row = p.table + static_cast<int64_t>(valid ? seq : 0) * p.width;
    splits = decode_splits((keys + kDecKeys - 1) / kDecKeys - lo / kDecKeys, p.splits, D);
    if (split >= splits) return;
  } else {
    keys = M == DecodeMode::Plain || p.last_key == nullptr
               ? p.s_kv
               : static_cast<int>(min(*p.last_key, static_cast<uint32_t>(p.s_kv - 1))) + 1;
  }
  const int tiles = (keys + kDecKeys - 1) / kDecKeys, tile_lo = lo / kDecKeys;
  // This warp's tiles: tile_lo + first + step * i for i < count.
  const int first = split + splits * warp, step = splits * kDecWarps;
  const int count = tile_lo + first < tiles ? (tiles - 1 - tile_lo - first) / step + 1 : 0;
  auto tile_of = [&](int i) { return tile_lo + first + step * i; };
  uint16_t* my_ring = ring + warp * kDecStages * STAGE;

  // Whether this lane sees a visible key of tile t (a mask value of -inf hides a key); a tile is
  // loaded and computed when some lane does. Without a mask every tile is, with no warp vote or
  // record of the loaded stages (compiled out).
  auto lane_sees = [&](int t) {
    if constexpr (!masked) return true;
    const int key = t * kDecKeys + (lane & 15);
    bool vis = false;
    if (key < keys) {
      for (int r = lane >> 4; r < mask_rows; r += 2) {
        vis = vis || bits_to_float<T>(mb[r * p.ms[1] + key * p.ms[3]]) != neg_inf();
      }
    }
    return vis;
  };
  auto visible = [&](int t) { return !masked || __any_sync(0xffffffffu, lane_sees(t)) != 0; };
  // Tile t into ring stage st: 16-byte copies, zeros past the last key (0 * garbage could be nan).
  // A lane copies the same 16-byte piece of every RSTEP-th row of a tile (d other than 96): its
  // addresses step by a stride fixed at the start, and only the last tile checks its rows
  // (fewer instructions a tile than an address computed per copy). Paged, a tile's rows are
  // consecutive rows of one page (strides d), and a tile whose page is missing is all zeros.
  constexpr int RSTEP = 32 % PIECES == 0 ? 32 / PIECES : 1;
  const int lane_row = lane / PIECES, lane_col = (lane % PIECES) * 8;
  const int64_t k_step = RSTEP * p.ks[2], v_step = RSTEP * p.vs[2];
  unsigned absent = 0;  // paged, bit st: the tile in ring stage st has no page
  auto issue = [&](int st, int t) {
    uint16_t* kt = my_ring + st * STAGE;
    uint16_t* vt = kt + kDecKeys * LD;
    const int k0 = t * kDecKeys;
    const uint16_t* k_rows = kb + static_cast<int64_t>(k0) * p.ks[2];
    const uint16_t* v_rows = vb + static_cast<int64_t>(k0) * p.vs[2];
    int rows_there = keys - k0;  // rows [0, rows_there) of the tile are keys
    if constexpr (paged) {
      const uint32_t page = table_row[k0 / p.page_size];
      const bool there = page < static_cast<uint32_t>(p.pages);
      const int64_t at = ((static_cast<int64_t>(there ? page : 0) * p.h_kv + hk) * p.page_size +
                          k0 % p.page_size) *
                         D;
      k_rows = p.k + at;
      v_rows = p.v + at;
      absent = there ? absent & ~(1u << st) : absent | (1u << st);
      if (!there) rows_there = 0;
    }
    if constexpr (32 % PIECES == 0) {
      const uint16_t* ksrc = k_rows + static_cast<int64_t>(lane_row) * p.ks[2] + lane_col;
      const uint16_t* vsrc = v_rows + static_cast<int64_t>(lane_row) * p.vs[2] + lane_col;
      const bool whole = rows_there >= kDecKeys;
#pragma unroll
      for (int j = 0; j < kDecKeys / RSTEP; ++j) {
        const int r = lane_row + RSTEP * j;
        const bool valid = whole || r < rows_there;
        cp_async16(kt + r * LD + lane_col, valid ? ksrc + j * k_step : kb, valid);
        cp_async16(vt + r * LD + lane_col, valid ? vsrc + j * v_step : vb, valid);
      }
    } else {
#pragma unroll
      for (int j = 0; j < kDecKeys * PIECES / 32; ++j) {
        const int i = lane + 32 * j, r = i / PIECES, c = (i % PIECES) * 8;
        const bool valid = r < rows_there;
        const int64_t row = valid ? r : 0;
        cp_async16(kt + r * LD + c, (valid ? k_rows : kb) + row * p.ks[2] + c, valid);
        cp_async16(vt + r * LD + c, (valid ? v_rows : vb) + row * p.vs[2] + c, valid);
      }
    }
  };
  // The first tiles start streaming before anything else, ring stages [from, to). Every lane
  // commits one group per tile slot, loaded or not, so that cp.async.wait_group counts tiles.
  unsigned live = 0;  // bit st: the tile in ring stage st was loaded (it has a visible key)
  auto start_tiles = [&](int from, int to) {
    bool sees[kDecStages - 1];  // the mask reads of these tiles are in flight together
#pragma unroll
    for (int st = 0; st < kDecStages - 1; ++st) {
      sees[st] = st >= from && st < to && st < count && lane_sees(tile_of(st));
    }
#pragma unroll
    for (int st = 0; st < kDecStages - 1; ++st) {
      if (st < from || st >= to) continue;
      if (st < count && (!masked || __any_sync(0xffffffffu, sees[st]))) {
        issue(st, tile_of(st));
        live |= 1u << st;
      }
      cp_async_commit();
    }
  };
  // The tile of the last key (the last tile) waits for the kernel before, in the one warp whose
  // first tiles hold it.
  int early_stages = kDecStages - 1;
  if (rows_before && count > 0 && count - 1 < kDecStages - 1 && tile_of(count - 1) == tiles - 1) {
    early_stages = count - 1;
  }
  // The query rows, zeros past this block's heads, 32 bits at a time.
  auto q_word = [&](int i) {
    const int r = i / (D / 2), c = (i % (D / 2)) * 2;
    if (r >= rows) return 0u;
    const uint16_t* qr = p.q + bi * p.qs[0] + (head0 + r) * p.qs[1] + c;
    if (p.q_pairs) return *reinterpret_cast<const uint32_t*>(qr);
    return static_cast<uint32_t>(qr[0]) | (static_cast<uint32_t>(qr[1]) << 16);
  };
  auto store_q = [&](int i, uint32_t word) {
    *reinterpret_cast<uint32_t*>(&q_tile[i / (D / 2)][(i % (D / 2)) * 2]) = word;
  };
  // q goes into registers, all of a thread's words asked for at once (one round trip): where the
  // kernel waits first, before any tile is asked for, so that it does not queue behind them; with
  // rows read before pdl_wait, after the last key's tile.
  constexpr int Q_WORDS = kDecRows * (D / 2);
  constexpr int Q_PER_THREAD = (Q_WORDS + kDecWarps * 32 - 1) / (kDecWarps * 32);
  uint32_t q_words[Q_PER_THREAD];
  auto load_q = [&] {
#pragma unroll
    for (int j = 0; j < Q_PER_THREAD; ++j) {
      const int i = threadIdx.x + j * kDecWarps * 32;
      q_words[j] = i < Q_WORDS ? q_word(i) : 0u;
    }
  };
  if (!rows_before) load_q();
  start_tiles(0, early_stages);
  if (p.launch_next_early) pdl_launch_dependents();
  if (rows_before) {  // q and the last key's row come from the kernel before
    pdl_wait();
    WICK_TL_WAITED();
  }
  start_tiles(early_stages, kDecStages - 1);
  if (rows_before) {
    load_q();
  }

  // The query rows into shared memory, then their B fragments, kept in registers.
#pragma unroll
  for (int j = 0; j < Q_PER_THREAD; ++j) {
    const int i = threadIdx.x + j * kDecWarps * 32;
    if (i < Q_WORDS) store_q(i, q_words[j]);
  }
  __syncthreads();
  // Q^T is the B operand of S^T = K Q^T (8 heads, 16 dims a k-step); the keys are the A's rows.
  uint32_t qf[KSTEPS][2];
#pragma unroll
  for (int kk = 0; kk + 1 < KSTEPS; kk += 2) {
    uint32_t r[4];
    ldmatrix_x4(r, &q_tile[lane & 7][kk * 16 + (lane >> 3) * 8]);
    qf[kk][0] = r[0];
    qf[kk][1] = r[1];
    qf[kk + 1][0] = r[2];
    qf[kk + 1][1] = r[3];
  }
  if constexpr (KSTEPS % 2 == 1) {
    uint32_t r[2];
    ldmatrix_x2(r, &q_tile[lane & 7][(KSTEPS - 1) * 16 + ((lane >> 3) & 1) * 8]);
    qf[KSTEPS - 1][0] = r[0];
    qf[KSTEPS - 1][1] = r[1];
  }
  WICK_TL_MARK(0);

  // O^T, tile n: dims 16n + g (elements 0, 1) and 16n + g + 8 (2, 3) of heads 2tg and 2tg + 1.
  constexpr int NT = D / 16;
  float o[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  // Heads 2tg (j = 0) and 2tg + 1 (j = 1): running max (base 2) and this lane's sum.
  float m[2] = {neg_inf(), neg_inf()}, l[2] = {0.f, 0.f};
  for (int i = 0; i < count; ++i) {
    {
      const int ahead = i + kDecStages - 1, st = ahead % kDecStages;
      live &= ~(1u << st);
      if (ahead < count && visible(tile_of(ahead))) {
        issue(st, tile_of(ahead));
        live |= 1u << st;
      }
      cp_async_commit();
    }
    cp_async_wait<kDecStages - 1>();  // tile i has landed (this lane's copies)
    __syncwarp();                     // ... and every lane's
    const int st = i % kDecStages;
    if (!masked || ((live >> st) & 1u)) {
      const uint16_t* kt = my_ring + st * STAGE;
      const uint16_t* vt = kt + kDecKeys * LD;
      const int k0 = tile_of(i) * kDecKeys;
      const bool no_page = paged && ((absent >> st) & 1u);
      // S^T = K Q^T, 16 keys x 8 heads: lane (g, tg) holds keys g and g + 8 of heads 2tg and
      // 2tg + 1. Even and odd k-steps accumulate apart (shorter chains).
      float sc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
      for (int kk = 0; kk < KSTEPS; ++kk) {
        uint32_t a[4];
        ldmatrix_x4(a, kt + (lane & 15) * LD + kk * 16 + (lane >> 4) * 8);
        mma_16816<T>(sc[kk & 1], a, qf[kk][0], qf[kk][1]);
      }
      // Scale, mask, online softmax per head (j: head 2tg + j).
      float s4[4], mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = (sc[0][e] + sc[1][e]) * p.scale_log2;
        const int key = k0 + g + 8 * (e >> 1);
        const int r = 2 * tg + (e & 1);
        if (key >= keys || key < lo || no_page) {
          x = neg_inf();
        } else if (masked && r < rows) {
          x += bits_to_float<T>(mb[r * p.ms[1] + key * p.ms[3]]) * kLog2e;
        }
        s4[e] = x;
        mx[e & 1] = fmaxf(mx[e & 1], x);
      }
      float corr[2], m_use[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int sh = 4; sh < 32; sh <<= 1) {
          mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], sh));
        }
        const float m_new = fmaxf(m[j], mx[j]);
        m_use[j] = m_new == neg_inf() ? 0.f : m_new;  // no visible key yet: exp2(-inf) = 0
        corr[j] = exp2_approx(m[j] - m_use[j]);
        m[j] = m_new;
        l[j] *= corr[j];
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s4[e] = exp2_approx(s4[e] - m_use[e & 1]);
        l[e & 1] += s4[e];
      }
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        o[n][0] *= corr[0];
        o[n][1] *= corr[1];
        o[n][2] *= corr[0];
        o[n][3] *= corr[1];
      }
      // O^T += V^T P^T: P^T's B fragments are P's (keys 0-7, then 8-15) transposed in
      // registers; V^T's A fragments come by transposed ldmatrix, 16 dims at a time.
      const uint32_t b0 = movmatrix_trans(pack2<T>(s4[0], s4[1]));
      const uint32_t b1 = movmatrix_trans(pack2<T>(s4[2], s4[3]));
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        uint32_t a[4];
        ldmatrix_x4_trans(a, vt + ((mi >> 1) * 8 + ri) * LD + n * 16 + (mi & 1) * 8);
        mma_16816<T>(o[n], a, b0, b1);
      }
    }
    __syncwarp();  // the next iteration refills stage (i + kDecStages) % kDecStages = this one
  }
  cp_async_wait<0>();  // no copy outlives the loop (tiles that were not computed)
  WICK_TL_MARK(1);
  pdl_launch_dependents();

  // Merge the warps: each leaves (max, sum, output) of its rows; the ring becomes the buffer.
  __syncthreads();
  float* s_o = reinterpret_cast<float*>(ring);  // [kDecWarps][kDecRows][OLD]
#pragma unroll
  for (int r2 = 0; r2 < 2; ++r2) {
    float lr = l[r2];  // this lane's keys' part of the head's sum: finish across the warp
    for (int sh = 4; sh < 32; sh <<= 1) lr += __shfl_xor_sync(0xffffffffu, lr, sh);
    const int r = 2 * tg + r2;
    if (r < rows) {
      if (g == 0) {
        s_m[warp][r] = m[r2];
        s_l[warp][r] = lr;
      }
      float* orow = s_o + (warp * kDecRows + r) * OLD;
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        orow[n * 16 + g] = o[n][r2];
        orow[n * 16 + g + 8] = o[n][2 + r2];
      }
    }
  }
  __syncthreads();
  const int64_t out_row0 = static_cast<int64_t>(bi) * p.h + head0;
  for (int idx = threadIdx.x; idx < rows * (D / 2); idx += blockDim.x) {
    const int r = idx / (D / 2), c = (idx % (D / 2)) * 2;
    // Unrolled over the block's warps, so that the shared-memory loads go out together.
    float mw[kDecWarps];
    float mx = neg_inf();
#pragma unroll
    for (int w = 0; w < kDecWarps; ++w) {
      mw[w] = s_m[w][r];
      mx = fmaxf(mx, mw[w]);
    }
    float sum = 0.f, a0 = 0.f, a1 = 0.f;
#pragma unroll
    for (int w = 0; w < kDecWarps; ++w) {
      const float f = mw[w] == neg_inf() ? 0.f : exp2_approx(mw[w] - mx);  // 0: saw no key
      const float2 ov = *reinterpret_cast<const float2*>(s_o + (w * kDecRows + r) * OLD + c);
      sum += f * s_l[w][r];
      a0 += f * ov.x;
      a1 += f * ov.y;
    }
    if (splits == 1) {
      const float inv = sum > 0.f ? 1.f / sum : 0.f;
      *reinterpret_cast<uint32_t*>(p.out + (out_row0 + r) * D + c) = pack2<T>(a0 * inv, a1 * inv);
    } else {
      const int64_t part = (out_row0 + r) * p.splits + split;
      *reinterpret_cast<float2*>(p.part_o + part * D + c) = make_float2(a0, a1);
      if (c == 0) {
        p.part_ml[part * 2] = mx;
        p.part_ml[part * 2 + 1] = sum;
      }
    }
  }
  WICK_TL_MARK(2);
  if (splits == 1) {
    WICK_TL_END(3u << 28 | 1u);
    WICK_TL_END_MARKS(5u << 28);
    return;
  }

  // The last block of this head group merges the splits. One acquire-release count by thread 0
  // after the block's barrier: release is cumulative (it publishes the partials every thread
  // wrote before the barrier) and the barrier after it passes the other blocks' partials on to
  // this block's threads (one fence, not one a thread).
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned done;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;"
                 : "=r"(done)
                 : "l"(&g_decode_done[unit])
                 : "memory");
    s_last = done == static_cast<unsigned>(splits) - 1;
    if (s_last) g_decode_done[unit] = 0;  // ready for the next call
  }
  __syncthreads();
  if (!s_last) {
    WICK_TL_END(3u << 28 | static_cast<uint32_t>(splits));
    WICK_TL_END_MARKS(5u << 28);
    return;
  }
  // Each thread merges four outputs of a row: the (max, sum) pairs and outputs of kDecMerge
  // splits are loaded at once (one round trip to the L2 per chunk), the running sums rescaled
  // to each chunk's max.
  for (int idx = threadIdx.x; idx < rows * (D / 4); idx += blockDim.x) {
    const int r = idx / (D / 4), c = (idx % (D / 4)) * 4;
    const float* po = p.part_o + (out_row0 + r) * p.splits * D + c;
    const float2* ml = reinterpret_cast<const float2*>(p.part_ml + (out_row0 + r) * p.splits * 2);
    float mx = neg_inf(), sum = 0.f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int i0 = 0; i0 < splits; i0 += kDecMerge) {
      float4 v[kDecMerge];
      float2 mls[kDecMerge];
#pragma unroll
      for (int i = 0; i < kDecMerge; ++i) {
        if (i0 + i < splits) {
          v[i] = __ldcg(reinterpret_cast<const float4*>(po + (i0 + i) * D));
          mls[i] = __ldcg(ml + i0 + i);
        } else {
          v[i] = make_float4(0.f, 0.f, 0.f, 0.f);
          mls[i] = make_float2(neg_inf(), 0.f);
        }
      }
      float cmx = mx;
#pragma unroll
      for (int i = 0; i < kDecMerge; ++i) cmx = fmaxf(cmx, mls[i].x);
      const float f = mx == neg_inf() ? 0.f : exp2_approx(mx - cmx);  // sums so far are 0 then
      mx = cmx;
      sum *= f;
      acc.x *= f;
      acc.y *= f;
      acc.z *= f;
      acc.w *= f;
#pragma unroll
      for (int i = 0; i < kDecMerge; ++i) {
        const float wgt = mls[i].x == neg_inf() ? 0.f : exp2_approx(mls[i].x - mx);
        sum += wgt * mls[i].y;
        acc.x += wgt * v[i].x;
        acc.y += wgt * v[i].y;
        acc.z += wgt * v[i].z;
        acc.w += wgt * v[i].w;
      }
    }
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    *reinterpret_cast<uint2*>(p.out + (out_row0 + r) * D + c) =
        make_uint2(pack2<T>(acc.x * inv, acc.y * inv), pack2<T>(acc.z * inv, acc.w * inv));
  }
  WICK_TL_END(3u << 28 | 1u << 16 | static_cast<uint32_t>(splits));
  WICK_TL_END_MARKS(5u << 28 | 1u << 16);
}

// The head dims the decode kernel is compiled for.
bool compiled_for(int64_t d) {
  return d == 16 || d == 32 || d == 64 || d == 96 || d == 128 || d == 256;
}

// Shared memory of a decode block: the query rows, then each warp's ring of K and V tiles.
size_t decode_smem(int d) {
  return static_cast<size_t>(kDecRows + dec_warps(d) * kDecStages * 2 * kDecKeys) *
         static_cast<size_t>(d + kPad) * 2;
}

// The decode kernel: s = 1, f16/bf16, d 16/32/64/96/128/256, 16-byte aligned k/v rows, an 8-byte
// aligned output (any group, with or without a mask; causal is moot for one end-aligned query).
bool decode_fits(DType dtype, const AttentionArgs& a) {
  if (dtype != DType::BF16 && dtype != DType::F16) return false;
  if (a.s != 1 || a.s_kv == 0) return false;
  if (!compiled_for(a.d)) return false;
  const int64_t chunks = (a.h / a.h_kv + kDecRows - 1) / kDecRows;
  if (static_cast<int64_t>(a.b) * a.h_kv * chunks > 65535) return false;  // grid.y
  auto al = [](const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; };
  if (!al(a.k, 16) || !al(a.v, 16) || !al(a.out, 8)) return false;
  for (int i = 0; i < 3; ++i) {
    if (a.k_strides[i] % 8 != 0 || a.v_strides[i] % 8 != 0) return false;
  }
  // Its shared memory (d = 128, 8 warps: 213 KB) on GPUs that have less.
  return decode_smem(a.d) <= shared_per_block_optin();
}

// The launch of a decode kernel over b query rows (tokens) of h heads, p.splits blocks a row.
template <int D, class Kernel>
void launch_decode(Kernel kernel, DecodeArgs& p, int64_t b, int64_t h, const TempAlloc& temp,
                   cudaStream_t s) {
  const size_t smem = decode_smem(D);
  // Above 48 KB of shared memory only by this attribute (per device: set at every launch).
  WICK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
  if (p.splits > 1) {
    const size_t rows = static_cast<size_t>(b * h * p.splits);
    p.part_ml = static_cast<float*>(temp(rows * 2 * sizeof(float)));
    p.part_o = static_cast<float*>(temp(rows * D * sizeof(float)));
  }
  const unsigned units = static_cast<unsigned>(b * p.h_kv * p.chunks);
  launch_pdl_carveout(kCarveoutMaxShared, kernel, dim3(p.splits, units), dim3(dec_warps(D) * 32),
                      smem, s, p);
}

template <class T, int D>
void run_decode(const AttentionArgs& a, const TempAlloc& temp, cudaStream_t s) {
  DecodeArgs p{};
  p.q = static_cast<const uint16_t*>(a.q);
  p.k = static_cast<const uint16_t*>(a.k);
  p.v = static_cast<const uint16_t*>(a.v);
  p.mask = static_cast<const uint16_t*>(a.mask);
  p.last_key = a.last_key;
  p.out = static_cast<uint16_t*>(a.out);
  for (int i = 0; i < 3; ++i) {
    p.qs[i] = a.q_strides[i];
    p.ks[i] = a.k_strides[i];
    p.vs[i] = a.v_strides[i];
  }
  for (int i = 0; i < 4; ++i) p.ms[i] = a.mask != nullptr ? a.mask_strides[i] : 0;
  p.h = a.h;
  p.h_kv = a.h_kv;
  p.group = a.h / a.h_kv;
  p.chunks = (p.group + kDecRows - 1) / kDecRows;
  p.s_kv = a.s_kv;
  const int64_t tiles = (a.s_kv + kDecKeys - 1) / kDecKeys;
  p.scale_log2 = a.scale * kLog2e;
  p.launch_next_early = a.launch_next_early && a.last_key != nullptr;
  p.q_pairs = reinterpret_cast<uintptr_t>(a.q) % 4 == 0 && a.q_strides[0] % 2 == 0 &&
              a.q_strides[1] % 2 == 0;

  // Splits: a function of the key count alone (never of the batch or the GPU), so that a
  // sequence's result is the same bits alone or inside any batch, on every GPU of one
  // architecture. TuningOverrides::decode_splits forces a count up to kDecMaxSplits and the tiles.
  static const int forced = tuning().decode_splits;
  p.splits = forced > 0 ? static_cast<int>(std::clamp<int64_t>(
                              forced, 1, std::min<int64_t>(kDecMaxSplits, tiles)))
                        : decode_splits(tiles, kDecMaxSplits, D);
  auto kernel = a.mask != nullptr       ? attn_decode_kernel<T, D, DecodeMode::Masked>
                : a.last_key != nullptr ? attn_decode_kernel<T, D, DecodeMode::LastKey>
                                        : attn_decode_kernel<T, D, DecodeMode::Plain>;
  launch_decode<D>(kernel, p, a.b, a.h, temp, s);
}

// Paged: (tokens, h, d) queries and outputs, keys and values through the page tables. The grid's
// split count is the most a token of the table's width (or of the window) can need.
template <class T, int D>
void run_paged(const PagedAttentionArgs& a, const TempAlloc& temp, cudaStream_t s) {
  DecodeArgs p{};
  p.q = static_cast<const uint16_t*>(a.q);
  p.k = static_cast<const uint16_t*>(a.k);
  p.v = static_cast<const uint16_t*>(a.v);
  p.out = static_cast<uint16_t*>(a.out);
  p.qs[0] = a.h * a.d;
  p.qs[1] = a.d;
  p.qs[2] = 1;
  p.ks[2] = p.vs[2] = a.d;
  p.h = static_cast<int>(a.h);
  p.h_kv = static_cast<int>(a.h_kv);
  p.group = p.h / p.h_kv;
  p.chunks = (p.group + kDecRows - 1) / kDecRows;
  p.scale_log2 = a.scale * kLog2e;
  p.launch_next_early = a.launch_next_early;
  p.q_pairs = reinterpret_cast<uintptr_t>(a.q) % 4 == 0;
  p.table = a.table;
  p.seq = a.seq;
  p.pos = a.pos;
  p.n_seqs = static_cast<int>(a.n_seqs);
  p.width = static_cast<int>(a.width);
  p.page_size = static_cast<int>(a.page_size);
  p.pages = static_cast<int>(a.pages);
  p.window = static_cast<int>(a.window);
  p.indices_ready = a.indices_ready;
  const int64_t width_tiles = a.width * a.page_size / kDecKeys;
  const int64_t most_tiles =
      a.window > 0 ? std::min(width_tiles, a.window / kDecKeys + 2) : width_tiles;
  p.splits = decode_splits(most_tiles, kDecMaxSplits, D);
  launch_decode<D>(attn_decode_kernel<T, D, DecodeMode::Paged>, p, a.tokens, a.h, temp, s);
}

// run.template operator()<T, D>() for f16/bf16 (dtype) and a head dim the decode kernel is compiled
// for (d; 128 for any other).
template <class Run>
void for_dtype_and_dim(DType dtype, int64_t d, const Run& run) {
  auto by_dim = [&]<class T>() {
    switch (d) {
      case 16:
        return run.template operator()<T, 16>();
      case 32:
        return run.template operator()<T, 32>();
      case 64:
        return run.template operator()<T, 64>();
      case 96:
        return run.template operator()<T, 96>();
      case 256:
        return run.template operator()<T, 256>();
      default:
        return run.template operator()<T, 128>();
    }
  };
  if (dtype == DType::BF16) return by_dim.template operator()<__nv_bfloat16>();
  return by_dim.template operator()<__half>();
}

}  // namespace

bool paged_decode_fits(DType dtype, const PagedAttentionArgs& a) {
  if (dtype != DType::BF16 && dtype != DType::F16) return false;
  if (!compiled_for(a.d)) return false;
  if (a.page_size % kDecKeys != 0 || a.softcap > 0.0f || a.h % a.h_kv != 0) return false;
  if (a.width * a.page_size > INT32_MAX || a.pages > INT32_MAX || a.n_seqs > INT32_MAX) {
    return false;
  }
  const int64_t chunks = (a.h / a.h_kv + kDecRows - 1) / kDecRows;
  if (a.tokens * a.h_kv * chunks > 65535) return false;  // grid.y
  auto al = [](const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; };
  if (!al(a.k, 16) || !al(a.v, 16) || !al(a.out, 8)) return false;
  return decode_smem(static_cast<int>(a.d)) <= shared_per_block_optin();
}

void launch_paged_decode_attention(DType dtype, const PagedAttentionArgs& a, const TempAlloc& temp,
                                   cudaStream_t s) {
  for_dtype_and_dim(dtype, a.d, [&]<class T, int D>() { run_paged<T, D>(a, temp, s); });
}

bool decode_attention_fits(DType dtype, const AttentionArgs& a) {
  return decode_fits(dtype, a);
}

void launch_decode_attention(DType dtype, const AttentionArgs& a, const TempAlloc& temp,
                             cudaStream_t s) {
  for_dtype_and_dim(dtype, a.d, [&]<class T, int D>() { run_decode<T, D>(a, temp, s); });
}

}  // namespace wick::cuda
