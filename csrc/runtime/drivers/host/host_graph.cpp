#include "runtime/drivers/host/host_graph.h"

#include <pthread.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <fstream>
#include <functional>
#include <queue>
#include <stdexcept>
#include <string>
#include <thread>

namespace accel::rt::host {
namespace {

// The nodes of one replay whose dependencies have all completed, and who runs them: the
// replaying worker and any helper that took the replay's offer.
struct Job {
  std::vector<Node>* nodes = nullptr;
  std::size_t total = 0;  // nodes->size(), readable after the graph is gone
  const std::vector<std::vector<uint32_t>>* successors = nullptr;
  HostStream* stream = nullptr;  // the replay stream (tasks see it as their worker's)

  std::mutex m;
  std::condition_variable cv;
  std::vector<uint32_t> remaining;  // per node: dependencies not yet completed
  // Ready nodes, lowest (earliest captured) first.
  std::priority_queue<uint32_t, std::vector<uint32_t>, std::greater<>> ready;
  std::size_t finished = 0;
  int running = 0;
  // The first failure's message. Kept as text, not as the exception: the stream worker reads
  // it after helpers may have dropped the job, and an exception object shared across threads
  // is freed through libstdc++'s own (uninstrumented) reference counts, which ThreadSanitizer
  // reports as a race.
  bool failed = false;
  std::string error;

  bool done() const { return finished == total || (failed && running == 0); }

  void participate() {
    std::unique_lock<std::mutex> lock(m);
    for (;;) {
      if (done()) return;
      if (ready.empty() || failed) {
        cv.wait(lock);
        continue;
      }
      const uint32_t id = ready.top();
      ready.pop();
      ++running;
      lock.unlock();
      bool node_failed = false;
      std::string message;
      try {
        (*nodes)[id].task();
      } catch (const std::exception& e) {
        node_failed = true;
        message = e.what();
      } catch (...) {
        node_failed = true;
        message = "unknown exception";
      }
      lock.lock();
      --running;
      ++finished;
      if (node_failed) {
        if (!failed) {  // nodes that depend on it never become ready
          failed = true;
          error = std::move(message);
        }
      } else {
        for (uint32_t s : (*successors)[id]) {
          if (--remaining[s] == 0) ready.push(s);
        }
      }
      if (done() || !ready.empty()) cv.notify_all();
    }
  }
};

// Threads that help replays run independent branches; started on first use, for the process.
class BranchHelpers {
 public:
  static BranchHelpers& get() {
    static auto* helpers = new BranchHelpers();  // used by stream workers up to process exit
    return *helpers;
  }

  int size() const { return size_; }

  // Offers `job` to `n` helpers; each that takes an offer works on the job until it is done.
  void offer(const std::shared_ptr<Job>& job, int n) {
    {
      std::lock_guard<std::mutex> lock(m_);
      while (static_cast<int>(threads_.size()) < size_) {
        threads_.emplace_back([this, i = threads_.size()] { loop(static_cast<int>(i)); });
        threads_.back().detach();
      }
      for (int i = 0; i < n; ++i) offers_.push_back(job);
    }
    cv_.notify_all();
  }

  // Takes back the offers of `job` that no helper has taken yet.
  void withdraw(const Job* job) {
    std::lock_guard<std::mutex> lock(m_);
    offers_.erase(std::remove_if(offers_.begin(), offers_.end(),
                                 [&](const std::shared_ptr<Job>& j) { return j.get() == job; }),
                  offers_.end());
  }

 private:
  BranchHelpers()
      : size_(static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 2u, 9u) - 1)) {}

  void loop(int index) {
    const std::string name = "accel-graph-" + std::to_string(index);
    ::pthread_setname_np(::pthread_self(), name.substr(0, 15).c_str());
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(m_);
        cv_.wait(lock, [&] { return !offers_.empty(); });
        job = std::move(offers_.front());
        offers_.pop_front();
      }
      tls_worker_stream = job->stream;
      job->participate();
      tls_worker_stream = nullptr;
    }
  }

  const int size_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> offers_;
  std::vector<std::thread> threads_;
};

std::string dot_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c == '\n' ? ' ' : c);
  }
  return out;
}

}  // namespace

HostGraph* end_capture(HostStream& origin) {
  std::shared_ptr<Capture> cap;
  std::vector<uint32_t> origin_frontier;
  {
    std::lock_guard<std::mutex> lock(origin.m);
    cap = origin.capture;
    ACCEL_RT_CHECK(cap && cap->origin == &origin, CaptureError,
                   "the stream is not the origin of a capture");
    origin_frontier = origin.frontier;
  }
  std::vector<std::shared_ptr<HostStream>> joined;
  std::vector<Node> nodes;
  {
    std::lock_guard<std::mutex> lock(cap->m);
    cap->ended = true;
    joined = cap->joined;
    nodes = std::move(cap->nodes);
  }
  // Everything reachable backwards from the origin's last work.
  std::vector<char> reached(nodes.size(), 0);
  std::vector<uint32_t> todo(origin_frontier);
  while (!todo.empty()) {
    const uint32_t n = todo.back();
    todo.pop_back();
    if (reached[n]) continue;
    reached[n] = 1;
    for (uint32_t dep : nodes[n].deps) todo.push_back(dep);
  }
  int unjoined = 0;
  for (auto& s : joined) {
    std::lock_guard<std::mutex> lock(s->m);
    if (s.get() != &origin) {
      for (uint32_t n : s->frontier) {
        if (!reached[n]) {
          ++unjoined;
          break;
        }
      }
    }
    s->capture.reset();
    s->frontier.clear();
  }
  if (unjoined > 0) {
    throw CaptureError(ErrorCode::CaptureUnjoined,
                       detail::concat(unjoined,
                                      " stream(s) joined the capture but their work was not "
                                      "joined back into the origin stream before "
                                      "capture_end; record an event on each of them and "
                                      "make the origin stream wait on it"),
                       __FILE__, __LINE__);
  }
  return new HostGraph{cap->device, std::make_shared<std::vector<Node>>(std::move(nodes))};
}

void write_dot(const HostGraph& graph, const char* path) {
  std::ofstream out(path);
  ACCEL_RT_CHECK(out.good(), InvalidValueError, "graph_debug_dump: cannot write '", path, "'");
  out << "digraph accel_graph {\n  node [shape=box];\n";
  const std::vector<Node>& nodes = *graph.nodes;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    out << "  n" << i << " [label=\"" << i << ": " << dot_escape(nodes[i].label) << "\"];\n";
  }
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    for (uint32_t d : nodes[i].deps) out << "  n" << d << " -> n" << i << ";\n";
  }
  out << "}\n";
  out.close();
  ACCEL_RT_CHECK(!out.fail(), InvalidValueError, "graph_debug_dump: writing '", path, "' failed");
}

Exec::Exec(std::shared_ptr<std::vector<Node>> nodes) : nodes_(std::move(nodes)) {
  const std::vector<Node>& n = *nodes_;
  successors_.resize(n.size());
  dep_counts_.resize(n.size());
  // Nodes are in capture order, a topological order: a node's level is one more than its
  // deepest dependency's, and the most nodes on one level is how many can run at once.
  std::vector<uint32_t> level(n.size(), 0);
  std::vector<int> per_level;
  for (uint32_t i = 0; i < n.size(); ++i) {
    std::vector<uint32_t> deps = n[i].deps;
    std::sort(deps.begin(), deps.end());
    deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
    dep_counts_[i] = static_cast<uint32_t>(deps.size());
    for (uint32_t d : deps) {
      successors_[d].push_back(i);
      level[i] = std::max(level[i], level[d] + 1);
    }
    if (level[i] >= per_level.size()) per_level.resize(level[i] + 1, 0);
    width_ = std::max(width_, ++per_level[level[i]]);
  }
}

void Exec::run() {
  std::lock_guard<std::mutex> lock(run_mutex_);
  if (width_ == 1 || BranchHelpers::get().size() == 0) {
    // A chain (or no helpers): capture order respects every dependency.
    for (Node& n : *nodes_) n.task();
    return;
  }
  run_parallel();
}

void Exec::run_parallel() {
  auto job = std::make_shared<Job>();
  job->nodes = nodes_.get();
  job->total = nodes_->size();
  job->successors = &successors_;
  job->stream = tls_worker_stream;
  job->remaining = dep_counts_;
  for (uint32_t i = 0; i < dep_counts_.size(); ++i) {
    if (dep_counts_[i] == 0) job->ready.push(i);
  }
  BranchHelpers& helpers = BranchHelpers::get();
  helpers.offer(job, std::min(width_ - 1, helpers.size()));
  job->participate();
  helpers.withdraw(job.get());
  // Helpers still inside participate() see the job done and touch neither nodes nor this Exec.
  if (job->failed) {
    std::string message;
    {
      std::lock_guard<std::mutex> lock(job->m);
      message = job->error;
    }
    throw std::runtime_error(message);
  }
}

}  // namespace accel::rt::host
