// The emulated CUDA runtime: events, stream capture (CUDA's modes, forks and joins, the errors
// of illegal calls) and graphs.
#include <algorithm>
#include <cstdio>
#include <set>

#include "emulator.h"

namespace cuda_emulator {
namespace {

std::vector<Capture*>& captures() {  // under the lock; those under way
  static auto* v = new std::vector<Capture*>();
  return *v;
}
// Every capture ever begun (events recorded in one may name it after it ended).
std::vector<std::unique_ptr<Capture>>& all_captures() {  // under the lock
  static auto* v = new std::vector<std::unique_ptr<Capture>>();
  return *v;
}
unsigned long long g_next_capture = 1;

// The nodes `from` depends on, directly or not, and `from` themselves.
std::set<std::size_t> ancestors(const GraphData& g, const std::vector<std::size_t>& from) {
  std::set<std::size_t> seen;
  std::vector<std::size_t> todo(from);
  while (!todo.empty()) {
    const std::size_t n = todo.back();
    todo.pop_back();
    if (!seen.insert(n).second) continue;
    for (std::size_t d : g.nodes[n].deps) todo.push_back(d);
  }
  return seen;
}

void end_capture(Capture* c) {  // under the lock
  c->ended = true;
  c->graph.reset();
  c->origin->capture = nullptr;
  c->origin->deps.clear();
  for (CUstream_st* s : c->joined) {
    s->capture = nullptr;
    s->deps.clear();
  }
  auto& v = captures();
  v.erase(std::remove(v.begin(), v.end(), c), v.end());
}

// cudaEventQuery (block false) and cudaEventSynchronize (block true) on the event's latest
// eager record; refused for a captured record or a potentially unsafe call during capture.
cudaError_t query_or_wait(CUevent_st* e, bool block) {
  if (e->ipc != nullptr) return ipc_event_query_or_wait(e, block);
  std::shared_ptr<Progress> progress;
  uint64_t seq = 0;
  {
    std::lock_guard<std::mutex> lock(global_mutex());
    if (e->capture != nullptr) return cudaErrorCapturedEvent;
    if (!e->recorded) return cudaSuccess;  // nothing recorded: complete
    progress = e->progress;
    seq = e->seq;
  }
  if (const cudaError_t err = unsafe_call(); err != cudaSuccess) return err;
  if (!block) return progress->reached(seq) ? cudaSuccess : cudaErrorNotReady;
  progress->wait(seq, "cudaEventSynchronize");
  return cudaSuccess;
}

}  // namespace

cudaError_t capture_node(CUstream_st* s, std::function<void()> op, const char* label) {
  Capture* c = s->capture;
  if (c->invalidated) return cudaErrorStreamCaptureInvalidated;
  c->graph->nodes.push_back(Node{std::move(op), s->deps, label});
  s->deps = {c->graph->nodes.size() - 1};
  return cudaSuccess;
}

void invalidate(Capture* c) {
  c->invalidated = true;
}

cudaError_t unsafe_call() {
  const cudaStreamCaptureMode mode = thread_state().mode;
  if (mode == cudaStreamCaptureModeRelaxed) return cudaSuccess;
  std::lock_guard<std::mutex> lock(global_mutex());
  bool refused = false;
  for (Capture* c : captures()) {
    if (c->invalidated || c->mode == cudaStreamCaptureModeRelaxed) continue;
    const bool mine = c->thread == std::this_thread::get_id();
    if (mine || (c->mode == cudaStreamCaptureModeGlobal && mode == cudaStreamCaptureModeGlobal)) {
      invalidate(c);
      refused = true;
    }
  }
  return refused ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}

void run_graph(const GraphData& g) {
  const std::size_t n = g.nodes.size();
  std::vector<std::vector<std::size_t>> dependents(n);
  std::vector<std::size_t> waiting(n);
  std::size_t width = 0;
  for (std::size_t i = 0; i < n; ++i) {
    waiting[i] = g.nodes[i].deps.size();
    if (waiting[i] == 0) ++width;
    for (std::size_t d : g.nodes[i].deps) dependents[d].push_back(i);
  }
  for (const auto& out : dependents) width += out.size() > 1 ? out.size() - 1 : 0;
  if (width <= 1) {  // a chain: in order on this thread
    for (const Node& node : g.nodes) node.run();
    return;
  }
  std::mutex m;
  std::condition_variable cv;
  std::deque<std::size_t> ready;
  std::size_t done = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (waiting[i] == 0) ready.push_back(i);
  }
  auto work = [&] {
    std::unique_lock<std::mutex> lock(m);
    for (;;) {
      cv.wait(lock, [&] { return !ready.empty() || done == n; });
      if (ready.empty()) return;
      const std::size_t i = ready.front();
      ready.pop_front();
      lock.unlock();
      g.nodes[i].run();
      lock.lock();
      ++done;
      for (std::size_t d : dependents[i]) {
        if (--waiting[d] == 0) ready.push_back(d);
      }
      cv.notify_all();
    }
  };
  std::vector<std::thread> threads;
  for (std::size_t t = 1; t < std::min<std::size_t>(width, 16); ++t) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();
}

}  // namespace cuda_emulator

using namespace cuda_emulator;

extern "C" {

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  EMU_ENTER();
  if ((flags & cudaEventInterprocess) != 0) return fail(ipc_event_create(event, flags));
  auto* e = new CUevent_st;
  e->flags = flags;
  *event = e;
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  EMU_ENTER();
  if (event == nullptr) return fail(cudaErrorInvalidResourceHandle);
  delete event;  // a pending record only touches its progress, which it shares
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  EMU_ENTER();
  if (event == nullptr) return fail(cudaErrorInvalidResourceHandle);
  CUstream_st* s = resolve(stream);
  if (event->ipc != nullptr) return fail(ipc_event_record(event, s));
  std::lock_guard<std::mutex> lock(global_mutex());
  ++event->generation;
  event->recorded = true;
  if (s->capture != nullptr) {
    if (s->capture->invalidated) return fail(cudaErrorStreamCaptureInvalidated);
    event->capture = s->capture;
    event->deps = s->deps;
    event->progress = nullptr;
    return cudaSuccess;
  }
  event->capture = nullptr;
  event->deps.clear();
  std::function<void()> op = [] {};
  if ((event->flags & cudaEventDisableTiming) == 0) {
    op = [stamp = event->stamp, gen = event->generation] {
      std::lock_guard<std::mutex> l(stamp->m);
      if (stamp->generation < gen) {
        stamp->generation = gen;
        stamp->time = Clock::now();
      }
    };
  }
  event->seq = enqueue(s, std::move(op));
  event->progress = s->progress;
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  EMU_ENTER();
  if (event == nullptr) return fail(cudaErrorInvalidResourceHandle);
  CUstream_st* s = resolve(stream);
  if (event->ipc != nullptr) return fail(ipc_event_wait(s, event));
  std::shared_ptr<Progress> progress;
  uint64_t seq = 0;
  {
    std::lock_guard<std::mutex> lock(global_mutex());
    if (!event->recorded) return cudaSuccess;  // nothing to wait for
    if (Capture* c = event->capture) {
      if (c->ended) return fail(cudaErrorCapturedEvent);
      if (c->invalidated) return fail(cudaErrorStreamCaptureInvalidated);
      if (s->capture == nullptr) {  // a fork: s joins the capture
        s->capture = c;
        s->deps = event->deps;
        c->joined.push_back(s);
      } else if (s->capture == c) {  // a join
        for (std::size_t d : event->deps) {
          if (std::find(s->deps.begin(), s->deps.end(), d) == s->deps.end()) s->deps.push_back(d);
        }
      } else {
        invalidate(c);
        invalidate(s->capture);
        return fail(cudaErrorStreamCaptureMerge);
      }
      return cudaSuccess;
    }
    if (s->capture != nullptr) {  // work outside the capture cannot order captured work
      invalidate(s->capture);
      return fail(cudaErrorStreamCaptureIsolation);
    }
    progress = event->progress;
    seq = event->seq;
  }
  return fail(submit(
      s, [progress, seq] { progress->wait(seq, "cudaStreamWaitEvent (on the stream)"); },
      "wait event"));
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  EMU_ENTER();
  return fail(query_or_wait(event, false));
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  EMU_ENTER();
  return fail(query_or_wait(event, true));
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  EMU_ENTER();
  std::lock_guard<std::mutex> lock(global_mutex());
  for (CUevent_st* e : {start, end}) {
    if ((e->flags & cudaEventDisableTiming) != 0 || !e->recorded) {
      return fail(cudaErrorInvalidResourceHandle);
    }
    if (e->capture != nullptr) return fail(cudaErrorCapturedEvent);
    if (!e->progress->reached(e->seq)) return fail(cudaErrorNotReady);
  }
  Clock::time_point from, to;
  {
    std::lock_guard<std::mutex> a(start->stamp->m);
    from = start->stamp->time;
  }
  {
    std::lock_guard<std::mutex> b(end->stamp->m);
    to = end->stamp->time;
  }
  *ms = std::chrono::duration<float, std::milli>(to - from).count();
  return cudaSuccess;
}

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  EMU_ENTER();
  std::swap(thread_state().mode, *mode);
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  EMU_ENTER();
  if (reinterpret_cast<uintptr_t>(stream) <= 2) return fail(cudaErrorStreamCaptureUnsupported);
  std::lock_guard<std::mutex> lock(global_mutex());
  if (stream->capture != nullptr) return fail(cudaErrorIllegalState);
  all_captures().push_back(std::make_unique<Capture>());
  Capture* c = all_captures().back().get();
  c->id = g_next_capture++;
  c->mode = mode;
  c->origin = stream;
  c->thread = std::this_thread::get_id();
  stream->capture = c;
  stream->deps.clear();
  captures().push_back(c);
  return cudaSuccess;
}

cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream, cudaStreamCaptureStatus* status,
                                     unsigned long long* id, cudaGraph_t* graph,
                                     const cudaGraphNode_t** deps, const cudaGraphEdgeData** edges,
                                     std::size_t* num_deps) {
  EMU_ENTER();
  CUstream_st* s = resolve(stream);
  std::lock_guard<std::mutex> lock(global_mutex());
  Capture* c = s->capture;
  *status = c == nullptr     ? cudaStreamCaptureStatusNone
            : c->invalidated ? cudaStreamCaptureStatusInvalidated
                             : cudaStreamCaptureStatusActive;
  if (id != nullptr) *id = c != nullptr ? c->id : 0;
  if (graph != nullptr) *graph = nullptr;  // the graph under construction is not exposed
  if (deps != nullptr) *deps = nullptr;
  if (edges != nullptr) *edges = nullptr;
  if (num_deps != nullptr) *num_deps = c != nullptr ? s->deps.size() : 0;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  EMU_ENTER();
  *graph = nullptr;
  CUstream_st* s = resolve(stream);
  std::lock_guard<std::mutex> lock(global_mutex());
  Capture* c = s->capture;
  if (c == nullptr) return fail(cudaErrorIllegalState);
  if (c->origin != s) {
    invalidate(c);
    return fail(cudaErrorStreamCaptureUnmatched);
  }
  if (c->mode != cudaStreamCaptureModeRelaxed && c->thread != std::this_thread::get_id()) {
    return fail(cudaErrorStreamCaptureWrongThread);
  }
  if (c->invalidated) {
    end_capture(c);
    return fail(cudaErrorStreamCaptureInvalidated);
  }
  const std::set<std::size_t> joined = ancestors(*c->graph, s->deps);
  for (CUstream_st* other : c->joined) {
    for (std::size_t d : other->deps) {
      if (joined.count(d) == 0) {
        end_capture(c);
        return fail(cudaErrorStreamCaptureUnjoined);
      }
    }
  }
  *graph = new CUgraph_st{std::move(c->graph)};
  end_capture(c);
  return cudaSuccess;
}

cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, std::size_t* count) {
  EMU_ENTER();
  if (graph == nullptr || count == nullptr) return fail(cudaErrorInvalidValue);
  const std::size_t n = graph->data->nodes.size();
  if (nodes != nullptr) {
    for (std::size_t i = 0; i < std::min(n, *count); ++i) {
      nodes[i] = reinterpret_cast<cudaGraphNode_t>(i + 1);
    }
  }
  *count = n;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  EMU_ENTER();
  if (graph == nullptr) return fail(cudaErrorInvalidValue);
  *exec = new CUgraphExec_st;
  (*exec)->data = graph->data;  // captured graphs are not edited afterwards
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  EMU_ENTER();
  if (exec == nullptr) return fail(cudaErrorInvalidResourceHandle);
  std::shared_ptr<const GraphData> data = exec->data;
  CUstream_st* s = resolve(stream);
  bool capturing = false;
  {
    std::lock_guard<std::mutex> lock(global_mutex());
    capturing = s->capture != nullptr;
  }
  if (capturing)
    return fail(submit(
        s, [data] { run_graph(*data); }, "graph"));  // a child graph
  auto done = std::make_shared<std::promise<void>>();
  std::shared_future<void> previous;
  {
    std::lock_guard<std::mutex> lock(exec->m);
    previous = exec->last;
    exec->last = done->get_future().share();
  }
  const cudaError_t e = submit(
      s,
      [data, previous, done] {
        if (previous.valid()) previous.wait();
        run_graph(*data);
        done->set_value();
      },
      "graph");
  if (e != cudaSuccess) done->set_value();
  return fail(e);
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  EMU_ENTER();
  delete graph;
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  EMU_ENTER();
  delete exec;  // a pending launch holds the nodes
  return cudaSuccess;
}

cudaError_t cudaGraphDebugDotPrint(cudaGraph_t graph, const char* path, unsigned int) {
  EMU_ENTER();
  if (graph == nullptr) return fail(cudaErrorInvalidValue);
  std::FILE* f = std::fopen(path, "w");
  if (f == nullptr) return fail(cudaErrorOperatingSystem);
  std::fprintf(f, "digraph emulated_cuda_graph {\n");
  const auto& nodes = graph->data->nodes;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    std::fprintf(f, "  n%zu [label=\"%s\"];\n", i, nodes[i].label.c_str());
    for (std::size_t d : nodes[i].deps) std::fprintf(f, "  n%zu -> n%zu;\n", d, i);
  }
  std::fprintf(f, "}\n");
  std::fclose(f);
  return cudaSuccess;
}

}  // extern "C"
