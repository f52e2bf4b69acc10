#include "cuda/graph.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuda/check.h"
#include "cuda/trace.h"
#include "cuda_config.h"
#include "util.h"

namespace wick::cuda {

namespace {

// Graph mode by default: replaying a captured batch costs a fraction of launching its ops one by
// one.
constexpr bool kGraphsByDefault = true;
constexpr double kDefaultWorkLimit = 1e8;  // below it the launch costs more than the work
constexpr size_t kMaxCached = 128;
constexpr size_t kLostOpsShown = 12;
constexpr uint64_t kKeySeed = 0xcbf29ce484222325ull;

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h * 0x100000001b3ull;
}

uint64_t dims(const dim3& d) {
  return (uint64_t{d.x} << 32) ^ (uint64_t{d.y} << 16) ^ d.z;
}

// Mixes into `key` what a captured batch must share with another for cudaGraphExecUpdate to turn
// the other's executable into it: the node types; each kernel's function, grid, block, dynamic
// shared memory and cluster shape; each copy's and memset's extent; the edges with their types
// and ports. Updates given more than new addresses are not always carried out in full: between
// batches of the same ops and the same kernels launched with other shapes or copying other sizes
// (a bf16 decode step of 8 rows after steps of other sizes, on an H100), cudaGraphExecUpdate
// succeeded and the executable then computed other numbers. Edge types are kept apart too: the
// update's documentation does not say that it carries a changed type over, and a programmatic
// edge lets a kernel start before the one it follows ends. A kernel whose parameters the runtime
// cannot read (a driver-API launch, should it fail) counts by its type and cluster shape.
cudaError_t structure_key(cudaGraph_t graph, uint64_t& key, size_t& nodes, size_t& programmatic) {
  cudaError_t st = cudaGraphGetNodes(graph, nullptr, &nodes);
  if (st != cudaSuccess || nodes == 0) return st;
  std::vector<cudaGraphNode_t> list(nodes);
  st = cudaGraphGetNodes(graph, list.data(), &nodes);
  if (st != cudaSuccess) return st;
  key = mix(key, nodes);
  for (cudaGraphNode_t n : list) {
    cudaGraphNodeType type{};
    st = cudaGraphNodeGetType(n, &type);
    if (st != cudaSuccess) return st;
    key = mix(key, static_cast<uint64_t>(type));
    if (type == cudaGraphNodeTypeKernel) {
      cudaKernelNodeParams p{};
      if (cudaGraphKernelNodeGetParams(n, &p) == cudaSuccess) {
        key = mix(key, reinterpret_cast<uintptr_t>(p.func));
        key = mix(key, dims(p.gridDim));
        key = mix(key, dims(p.blockDim));
        key = mix(key, p.sharedMemBytes);
      } else {
        (void)cudaGetLastError();
      }
      cudaLaunchAttributeValue cluster{};
      if (cudaGraphKernelNodeGetAttribute(n, cudaLaunchAttributeClusterDimension, &cluster) ==
          cudaSuccess) {
        key =
            mix(key, dims(dim3(cluster.clusterDim.x, cluster.clusterDim.y, cluster.clusterDim.z)));
      } else {
        (void)cudaGetLastError();
      }
    } else if (type == cudaGraphNodeTypeMemcpy) {
      cudaMemcpy3DParms p{};
      if (cudaGraphMemcpyNodeGetParams(n, &p) == cudaSuccess) {
        key = mix(key, p.extent.width * 1000003 + p.extent.height * 1009 + p.extent.depth);
        key = mix(key, static_cast<uint64_t>(p.kind));
      } else {
        (void)cudaGetLastError();
      }
    } else if (type == cudaGraphNodeTypeMemset) {
      cudaMemsetParams p{};
      if (cudaGraphMemsetNodeGetParams(n, &p) == cudaSuccess) {
        key = mix(key, p.width * 1000003 + p.height * 1009 + p.elementSize);
      } else {
        (void)cudaGetLastError();
      }
    }
  }
  size_t edges = 0;
  st = cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &edges);
  if (st != cudaSuccess) return st;
  std::vector<cudaGraphNode_t> from(edges), to(edges);
  std::vector<cudaGraphEdgeData> data(edges);
  st = cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &edges);
  if (st != cudaSuccess) return st;
  key = mix(key, edges);
  programmatic = 0;
  for (const cudaGraphEdgeData& e : data) {
    programmatic += e.type == cudaGraphDependencyTypeProgrammatic;
    key = mix(key, (uint64_t{e.type} << 16) | (uint64_t{e.from_port} << 8) | e.to_port);
  }
  return cudaSuccess;
}

}  // namespace

bool graphs_enabled_by_default() {
  return config().graphs < 0 ? kGraphsByDefault : config().graphs == 1;
}

double batch_work_limit() {
  return config().batch_work > 0 ? config().batch_work : kDefaultWorkLimit;
}

GraphQueue::GraphQueue(int ordinal, cudaStream_t stream, bool trace)
    : ordinal_(ordinal),
      stream_(stream),
      trace_(trace),
      enabled_(graphs_enabled_by_default()),
      work_limit_(batch_work_limit()) {}

GraphQueue::~GraphQueue() {
  // Devices live until the process ends, when the driver may already be gone: the executables
  // are left to it.
}

bool GraphQueue::admit(double work, size_t batch_ops) {
  if (work >= work_limit_) return false;
  if (!capturing_) {
    // Relaxed: the allocator may cudaMalloc mid-capture and other threads may add ops.
    WICK_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
    capturing_ = true;
    first_op_ = batch_ops;
    key_ = kKeySeed;
    work_ = 0;
  }
  work_ += work;
  if (work_ >= work_limit_) close_requested_ = true;
  return true;
}

void GraphQueue::note(const char* name, DType dtype) {
  if (!capturing_) return;  // the capture was ended mid-op (a big allocation)
  key_ = mix(key_, reinterpret_cast<uintptr_t>(name));
  key_ = mix(key_, static_cast<uint64_t>(dtype));
}

void GraphQueue::reset_batch() {
  close_requested_ = false;
  work_ = 0;
}

void GraphQueue::commit(const std::vector<const char*>& ops) {
  if (!capturing_) return;
  double t0 = trace_ ? now_ms() : 0;
  capturing_ = false;
  cudaGraph_t graph = nullptr;
  cudaError_t st = cudaStreamEndCapture(stream_, &graph);
  if (st != cudaSuccess || graph == nullptr) {
    (void)cudaGetLastError();
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    lose(ops, nullptr, str("cudaStreamEndCapture: ", cudaGetErrorName(st)));
    return;
  }
  size_t nodes = 0, programmatic = 0;
  uint64_t key = key_;
  st = structure_key(graph, key, nodes, programmatic);
  if (st != cudaSuccess || nodes == 0) {
    (void)cudaGetLastError();
    (void)cudaGraphDestroy(graph);
    if (st != cudaSuccess)
      lose(ops, nullptr, str("reading the captured graph: ", cudaGetErrorName(st)));
    return;
  }
  const char* how = "miss";
  cudaGraphExec_t exec = nullptr;
  auto it = cache_.find(key);
  if (it != cache_.end()) {
    cudaGraphExecUpdateResultInfo info{};
    st = cudaGraphExecUpdate(it->second.exec, graph, &info);
    if (st == cudaSuccess) {
      exec = it->second.exec;
      it->second.last_use = ++clock_;
      ++stats_.updates;
      how = "hit";
    } else {
      // Refused (a different topology behind the same key): build it anew.
      (void)cudaGetLastError();
      (void)cudaGraphExecDestroy(it->second.exec);  // freed once its launches in flight ended
      cache_.erase(it);
      ++stats_.refused;
      how = "refused";
    }
  }
  if (exec == nullptr) {
    st = cudaGraphInstantiate(&exec, graph, 0);
    if (st != cudaSuccess) {
      (void)cudaGetLastError();
      (void)cudaGraphDestroy(graph);
      lose(ops, nullptr, str("cudaGraphInstantiate: ", cudaGetErrorName(st)));
      return;
    }
    if (cache_.size() >= kMaxCached) evict_one();
    cache_[key] = Entry{exec, ++clock_};
    ++stats_.instantiations;
  }
  st = cudaGraphLaunch(exec, stream_);
  (void)cudaGraphDestroy(graph);
  if (st != cudaSuccess) {
    (void)cudaGetLastError();
    lose(ops, nullptr, str("cudaGraphLaunch: ", cudaGetErrorName(st)));
    return;
  }
  ++stats_.commits;
  if (trace_) {
    trace_line("GRAPH",
               str("commit ", ops.size(), " ops, ", nodes, " nodes (", programmatic,
                   " programmatic edges), ", how),
               now_ms() - t0);
  }
}

void GraphQueue::abort(const std::vector<const char*>& ops, const char* failed) {
  if (!capturing_) return;
  capturing_ = false;
  cudaGraph_t graph = nullptr;
  (void)cudaStreamEndCapture(stream_, &graph);
  if (graph != nullptr) (void)cudaGraphDestroy(graph);
  (void)cudaGetLastError();
  lose(ops, failed, str("the launch of ", failed, " failed during capture"));
}

void GraphQueue::lose(const std::vector<const char*>& ops, const char* extra,
                      const std::string& why) {
  ++stats_.lost;
  if (trace_) std::fprintf(stderr, "[wick] GRAPH lost %zu ops: %s\n", ops.size(), why.c_str());
  if (!lost_.empty()) return;  // the first loss explains the rest
  // Ops of the batch before the capture began were launched directly and did run.
  std::vector<const char*> all(
      ops.begin() + static_cast<std::ptrdiff_t>(std::min(first_op_, ops.size())), ops.end());
  if (extra != nullptr) all.push_back(extra);
  std::string list = "[";
  for (size_t i = 0; i < all.size() && i < kLostOpsShown; ++i) {
    if (i) list += ", ";
    list += all[i];
  }
  if (all.size() > kLostOpsShown) list += str(", ... (", all.size(), " ops)");
  list += "]";
  lost_ = str("a CUDA graph batch on cuda:", ordinal_, " was lost (", why,
              "); these ops never ran: ", list);
}

void GraphQueue::rethrow_lost(const char* what) {
  if (lost_.empty()) return;
  std::string msg = str(what, ": ", lost_);
  lost_.clear();
  throw BackendError(msg);
}

void GraphQueue::evict_one() {
  auto oldest = cache_.begin();
  for (auto it = cache_.begin(); it != cache_.end(); ++it) {
    if (it->second.last_use < oldest->second.last_use) oldest = it;
  }
  (void)cudaGraphExecDestroy(oldest->second.exec);
  cache_.erase(oldest);
}

GraphStats GraphQueue::stats() const {
  GraphStats s = stats_;
  s.cached = cache_.size();
  return s;
}

}  // namespace wick::cuda
