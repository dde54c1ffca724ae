// Several threads allocating, freeing, submitting, recording and capturing at once. Data is
// shared between tasks without atomics on purpose: under ThreadSanitizer these tests check
// that stream order and events give the happens-before edges the runtime promises.
#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "test_util.h"

namespace accel::rt {
namespace {

constexpr int kThreads = 8;

struct Live {
  void* ptr;
  std::size_t size;
  uint64_t tag;
  Stream stream;
};

// Stamps and checks go through copies (not host access), so the test runs on every driver.
void stamp(const Live& b) {
  memcpy(b.ptr, &b.tag, sizeof(uint64_t), CopyKind::HostToDevice);
  memcpy(static_cast<char*>(b.ptr) + b.size - sizeof(uint64_t), &b.tag, sizeof(uint64_t),
         CopyKind::HostToDevice);
}

bool intact(const Live& b) {
  uint64_t head = 0, tail = 0;
  memcpy(&head, b.ptr, sizeof(uint64_t), CopyKind::DeviceToHost);
  memcpy(&tail, static_cast<char*>(b.ptr) + b.size - sizeof(uint64_t), sizeof(uint64_t),
         CopyKind::DeviceToHost);
  return head == b.tag && tail == b.tag;
}

// One thread's share of the allocation churn: random sizes on its own and shared streams,
// record_stream, stamps checked before every free.
void churn(int device, const std::vector<Stream>& shared, int t, int iterations,
           std::atomic<int>& corrupted) {
  std::mt19937_64 rng(1234 + t);
  // At least 16 bytes: the head and tail stamps must not overlap.
  const std::size_t sizes[] = {16, 100, 512, 4000, 65536, 1 << 20, (1 << 20) + 8, 3 << 20};
  std::vector<Live> live;
  Stream own = stream_create(device);
  for (int i = 0; i < iterations; ++i) {
    if (live.size() < 16 && (live.empty() || rng() % 3 != 0)) {
      const std::size_t size = sizes[rng() % std::size(sizes)] + rng() % 64;
      const Stream s = rng() % 2 ? own : shared[rng() % shared.size()];
      Live b{malloc(size, s), size, (uint64_t(t) << 32) | uint64_t(i), s};
      stamp(b);
      if (rng() % 4 == 0) record_stream(b.ptr, shared[rng() % shared.size()]);
      live.push_back(b);
    } else {
      const std::size_t k = rng() % live.size();
      if (!intact(live[k])) corrupted.fetch_add(1);
      free(live[k].ptr);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
    }
  }
  for (const Live& b : live) {
    if (!intact(b)) corrupted.fetch_add(1);
    free(b.ptr);
  }
  stream_destroy(own);
}

void expect_balanced(int device, const DeviceStats& before) {
  device_synchronize(device);
  empty_cache(device);
  const DeviceStats after = memory_stats(device);
  EXPECT_EQ(after.allocation[kAggregate].current, before.allocation[kAggregate].current);
  EXPECT_EQ(after.allocated_bytes[kAggregate].current, before.allocated_bytes[kAggregate].current);
  EXPECT_EQ(after.active[kAggregate].current, before.active[kAggregate].current);
  EXPECT_EQ(after.requested_bytes[kAggregate].current, before.requested_bytes[kAggregate].current);
}

TEST(Stress, ConcurrentAllocationNeverHandsOutOverlappingBlocks) {
  const int device = 1;
  device_synchronize(device);
  const DeviceStats before = memory_stats(device);
  std::vector<Stream> shared;
  for (int i = 0; i < 3; ++i) shared.push_back(stream_create(device));
  std::atomic<int> corrupted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] { churn(device, shared, t, 1500, corrupted); });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(corrupted.load(), 0);
  for (Stream s : shared) stream_destroy(s);
  expect_balanced(device, before);
}

TEST(Stress, AllocatorSettingsCachingAndSensorsChangeWhileThreadsAllocate) {
  // Caching switched off and on, PyTorch's allocator settings changed, sensors and native
  // handles asked for, all while threads allocate: blocks stay intact, statistics balance.
  const int device = 1;
  device_synchronize(device);
  const DeviceStats before = memory_stats(device);
  std::vector<Stream> shared;
  for (int i = 0; i < 3; ++i) shared.push_back(stream_create(device));
  std::atomic<int> corrupted{0};
  std::atomic<bool> done{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads / 2; ++t) {
    threads.emplace_back([&, t] { churn(device, shared, t, 800, corrupted); });
  }
  const bool sensors = testing::sensors_available(device);
  std::thread control([&] {
    AllocatorSettings tuned;
    tuned.max_split_size = std::size_t{21} << 20;  // just above a large segment
    tuned.garbage_collection_threshold = 0.5;
    tuned.roundup_power2_divisions.assign(16, 4);
    tuned.expandable_segments = true;
    for (int i = 0; !done.load(); ++i) {
      set_memory_caching(i % 3 != 0, device);
      set_allocator_settings(i % 2 == 0 ? tuned : AllocatorSettings{});
      if (sensors) {
        EXPECT_GE(device_sensor(Sensor::MemoryUsed, device), 0);
      }
      const Stream s = shared[static_cast<std::size_t>(i) % shared.size()];
      if (driver_capabilities().native_handles) {
        EXPECT_EQ(stream_from_native(stream_native_handle(s), device), s);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    set_memory_caching(true, device);
    set_allocator_settings(AllocatorSettings{});
  });
  for (auto& th : threads) th.join();
  done = true;
  control.join();
  EXPECT_EQ(corrupted.load(), 0);
  for (Stream s : shared) stream_destroy(s);
  expect_balanced(device, before);
  EXPECT_EQ(memory_stats(device).oversize_allocations.current, 0);
}

TEST(Stress, ProducersAndConsumersOrderedByEvents) {
  // Pairs of streams pass a plain (non-atomic) value from a task on one to a task on the
  // other; only the event wait orders them.
  constexpr int kPairs = 4, kRounds = 300;
  struct Pair {
    Stream producer, consumer;
    Event ready, consumed;
    long value = 0;
    long seen_sum = 0;
  };
  std::vector<Pair> pairs(kPairs);
  for (auto& p : pairs) {
    p.producer = stream_create(0);
    p.consumer = stream_create(0);
    p.ready = event_create(0);
    p.consumed = event_create(0);
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < kPairs; ++t) {
    threads.emplace_back([&, t] {
      Pair& p = pairs[t];
      for (int r = 1; r <= kRounds; ++r) {
        stream_wait_event(p.producer, p.consumed);  // do not overwrite before it was read
        launch_host_func(p.producer, [&p, r] { p.value = r; });
        event_record(p.ready, p.producer);
        stream_wait_event(p.consumer, p.ready);
        launch_host_func(p.consumer, [&p] { p.seen_sum += p.value; });
        event_record(p.consumed, p.consumer);
      }
    });
  }
  for (auto& th : threads) th.join();
  for (auto& p : pairs) {
    stream_synchronize(p.consumer);
    stream_synchronize(p.producer);
    EXPECT_EQ(p.seen_sum, long(kRounds) * (kRounds + 1) / 2);
    event_destroy(p.ready);
    event_destroy(p.consumed);
    stream_destroy(p.producer);
    stream_destroy(p.consumer);
  }
}

TEST(Stress, ManyThreadsSubmitToSharedStreams) {
  constexpr int kStreams = 4, kPerThread = 2000;
  std::vector<Stream> streams;
  std::vector<long> counters(kStreams, 0);  // only touched by tasks of their stream
  for (int i = 0; i < kStreams; ++i) streams.push_back(stream_from_pool(0, -(i % 2)));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const int k = (t + i) % kStreams;
        launch_host_func(streams[k], [&counters, k] { ++counters[k]; });
        if (i % 500 == 0) stream_query(streams[k]);
      }
    });
  }
  for (auto& th : threads) th.join();
  long total = 0;
  for (int k = 0; k < kStreams; ++k) {
    stream_synchronize(streams[k]);
    total += counters[k];
  }
  EXPECT_EQ(total, long(kThreads) * kPerThread);
}

TEST(Stress, HandlesAreCreatedAndDestroyedConcurrently) {
  std::vector<std::thread> threads;
  std::atomic<int> ran{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        Stream s = stream_create(t % 2, -(i % 3));
        Event e = event_create(t % 2, i % 2 == 0);
        launch_host_func(s, [&] { ran.fetch_add(1); });
        event_record(e, s);
        event_synchronize(e);
        event_destroy(e);
        stream_destroy(s);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(ran.load(), kThreads * 200);
}

TEST(Stress, ConcurrentCapturesAndReplays) {
  constexpr int kCapturers = 4;
  std::vector<long> counts(kCapturers, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kCapturers; ++t) {
    threads.emplace_back([&, t] {
      Stream s = stream_create(0);
      Graph g = graph_create();
      graph_capture_begin(g, s, {}, CaptureMode::ThreadLocal);
      void* scratch = malloc(1024 * (t + 1), s);
      launch_host_func(s, [&counts, t] { ++counts[t]; });
      free(scratch);
      graph_capture_end(g);
      for (int r = 0; r < 100; ++r) graph_replay(g, s);
      stream_synchronize(s);
      graph_destroy(g);
      stream_destroy(s);
    });
  }
  for (auto& th : threads) th.join();
  for (long c : counts) EXPECT_EQ(c, 100);
}

}  // namespace
}  // namespace accel::rt
