// The second core of ShardPair: between shards it does idle work (the next sublayer's weights)
// or spins briefly (ops arrive every few microseconds in the per-sublayer loop), then sleeps on a
// futex, so that an oversubscribed machine (sweep --jobs, a busy CI runner) loses nothing to
// spinning. Each op's shard 1 goes to whichever thread claims it first: the second core as soon as
// it sees the op, or the calling thread once its shard 0 is done. So when another process holds
// the second core, the caller does not wait out that process's time slice, op after op (at depth
// 1024 with a busy loop on the second core, 2 threads took 6.2 s before, 4.8 s after; 1 thread 4.8 s).
#include "gradflow/shards.hpp"

#include <immintrin.h>
#include <omp.h>

#include "gradflow/kernels.hpp"

namespace gradflow {

namespace {
// About 50 microseconds of spinning with nothing to do before sleeping: longer than the gap
// between two ops of one sublayer, much shorter than a scheduler time slice.
constexpr int kSpinIterations = 2000;
}  // namespace

ShardPair::ShardPair(bool second_core) : ShardPair(second_core, !kernel_choice().shard_pair) {}

ShardPair::ShardPair(bool second_core, bool on_openmp) : openmp_(second_core && on_openmp) {
  if (second_core && !openmp_) worker_ = std::thread([this] { worker_loop(); });
}

void ShardPair::run_on_openmp() {
  std::exception_ptr failures[kShards];
#pragma omp parallel num_threads(kShards)
  {
    const int shard = omp_get_thread_num();
    try {
      if (omp_get_num_threads() == kShards) {
        task_(context_, shard);
      } else if (shard == 0) {
        for (int s = 0; s < kShards; ++s) task_(context_, s);
      }
    } catch (...) {
      failures[shard] = std::current_exception();
    }
  }
  for (const std::exception_ptr& failure : failures) {
    if (failure) std::rethrow_exception(failure);
  }
}

ShardPair::~ShardPair() {
  if (!worker_.joinable()) return;
  stop_.store(true, std::memory_order_release);
  posted_.fetch_add(1, std::memory_order_release);
  posted_.notify_one();
  worker_.join();
}

void ShardPair::set_idle_work(IdleWork* work) {
  idle_.store(work);
}

// Dekker-style handshake (sequentially consistent): once idle_ is null and no step of the second
// core is in flight, no later step can see the old work.
void ShardPair::clear_idle_work() {
  idle_.store(nullptr);
  while (idle_users_.load() != 0) _mm_pause();
}

bool ShardPair::worker_idle_step() {
  idle_users_.fetch_add(1);
  IdleWork* work = idle_.load();
  const bool stepped = work != nullptr && work->step(1);
  idle_users_.fetch_sub(1);
  return stepped;
}

namespace {
// Waits until done(counter) holds: does idle work while there is some, then spins for about
// kSpinIterations pauses, then sleeps on the counter (a futex) until it changes.
template <typename Done, typename IdleStep>
void wait_on(const std::atomic<std::uint32_t>& counter, Done&& done, IdleStep&& idle_step) {
  int idle_spins = 0;
  for (;;) {
    const std::uint32_t seen = counter.load(std::memory_order_acquire);
    if (done(seen)) return;
    if (idle_step()) {
      idle_spins = 0;
      continue;
    }
    if (++idle_spins < kSpinIterations) {
      _mm_pause();
      continue;
    }
    counter.wait(seen, std::memory_order_acquire);
  }
}
}  // namespace

void ShardPair::wait_until_finished(std::uint32_t epoch) {
  wait_on(
      finished_, [epoch](std::uint32_t finished) { return finished == epoch; },
      [this] {
        IdleWork* work = idle_.load(std::memory_order_relaxed);  // this thread owns it
        return work != nullptr && work->step(0);
      });
}

void ShardPair::wait_until_posted(std::uint32_t seen) {
  wait_on(
      posted_, [seen](std::uint32_t posted) { return posted != seen; },
      [this] { return worker_idle_step(); });
}

// Takes the latest posted epoch's shard 1 unless the calling thread took it first (then that
// epoch is simply skipped: the caller has run it and may already have posted the next one).
void ShardPair::worker_loop() {
  std::uint32_t seen = 0;
  for (;;) {
    wait_until_posted(seen);
    // The epoch first, then stop_: the destructor sets stop_ before it posts its last epoch, so an
    // epoch read here is either a real op's or comes with stop_ set (never run as an op).
    seen = posted_.load(std::memory_order_acquire);
    if (stop_.load(std::memory_order_acquire)) return;
    std::uint32_t unclaimed = seen - 1;
    if (!claimed_.compare_exchange_strong(unclaimed, seen, std::memory_order_acq_rel)) continue;
    try {
      task_(context_, 1);
    } catch (...) {  // handed to the calling thread, which rethrows it from run()
      worker_failure_ = std::current_exception();
    }
    finished_.store(seen, std::memory_order_release);
    finished_.notify_one();
  }
}

}  // namespace gradflow
