// WorkPool's workers: between runs they do idle work (the next sublayer's weights) or spin briefly
// (runs arrive every few microseconds in the per-sublayer loop), then sleep on a futex, so that
// an oversubscribed machine (sweep --jobs, a busy CI runner, --threads above the core count) loses
// little to spinning. Pieces go to whichever thread claims them first, the calling thread
// included, so a descheduled worker delays nothing: the others take its share.
#include "gradflow/work_pool.hpp"

#include <immintrin.h>
#include <omp.h>

#include <stdexcept>
#include <utility>

#include "gradflow/kernels.hpp"

namespace gradflow {

namespace {
// About 50 microseconds of spinning with nothing to do before sleeping: longer than the gap
// between two ops of one sublayer, much shorter than a scheduler time slice.
constexpr int kSpinIterations = 2000;

constexpr int kIndexBits = 20;  // pieces per run < 2^20; the epoch takes the top 24 bits
constexpr std::uint64_t kIndexMask = (1ull << kIndexBits) - 1;
constexpr std::uint64_t kEpochMask = (1ull << 24) - 1;

std::uint64_t epoch_of(std::uint64_t word) {
  return word >> (2 * kIndexBits);
}
std::uint64_t count_of(std::uint64_t word) {
  return (word >> kIndexBits) & kIndexMask;
}
std::uint64_t next_of(std::uint64_t word) {
  return word & kIndexMask;
}
}  // namespace

WorkPool::WorkPool(int threads) : WorkPool(threads, !kernel_choice().work_pool) {}

WorkPool::WorkPool(int threads, bool on_openmp)
    : threads_(threads < 1 ? 1 : threads), openmp_(on_openmp && threads_ > 1) {
  if (openmp_) return;
  workers_.reserve(threads_ - 1);
  for (int i = 1; i < threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
}

WorkPool::~WorkPool() {
  stop_.store(true);
  epoch_.fetch_add(1);
  epoch_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

void WorkPool::set_idle_work(IdleWork* work) {
  idle_.store(work);
}

// Dekker-style handshake (sequentially consistent): once idle_ is null and no worker's step is in
// flight, no later step can see the old work.
void WorkPool::clear_idle_work() {
  idle_.store(nullptr);
  while (idle_users_.load() != 0) _mm_pause();
}

bool WorkPool::idle_step() {
  if (idle_.load(std::memory_order_relaxed) == nullptr) return false;  // nothing to use: no handshake
  idle_users_.fetch_add(1);
  IdleWork* work = idle_.load();
  const bool stepped = work != nullptr && work->step();
  idle_users_.fetch_sub(1);
  return stepped;
}

void WorkPool::record_failure(int piece) {
  const std::lock_guard<std::mutex> lock(failure_mutex_);
  if (failed_piece_ < 0 || piece < failed_piece_) {
    failed_piece_ = piece;
    failure_ = std::current_exception();
  }
}

void WorkPool::run_pieces(std::uint64_t epoch) {
  unsigned mode = float_mode();
  std::uint64_t word = word_.load(std::memory_order_acquire);
  for (;;) {
    if (epoch_of(word) != epoch || next_of(word) >= count_of(word)) return;
    if (!word_.compare_exchange_weak(word, word + 1, std::memory_order_acq_rel, std::memory_order_acquire))
      continue;
    // A claimed piece is unfinished, so the run (and task_, context_, float_mode_) is still the
    // current one. A worker takes on the caller's floating-point mode (SubnormalsFlushed).
    const int piece = static_cast<int>(next_of(word));
    if (float_mode_ != mode) set_float_mode(mode = float_mode_);
    try {
      task_(context_, piece);
    } catch (...) {
      record_failure(piece);
    }
    remaining_.fetch_sub(1, std::memory_order_acq_rel);
    word = word_.load(std::memory_order_acquire);
  }
}

void WorkPool::dispatch(int pieces, Task task, void* context) {
  if (static_cast<std::uint64_t>(pieces) > kIndexMask) throw std::length_error("WorkPool: too many pieces");
  if (workers_.empty()) {  // one thread: in order, here
    for (int i = 0; i < pieces; ++i) task(context, i);
    return;
  }
  const std::uint64_t epoch = (epoch_of(word_.load(std::memory_order_relaxed)) + 1) & kEpochMask;
  task_ = task;
  context_ = context;
  float_mode_ = float_mode();
  remaining_.store(pieces, std::memory_order_relaxed);
  word_.store((epoch << (2 * kIndexBits)) | (static_cast<std::uint64_t>(pieces) << kIndexBits),
              std::memory_order_seq_cst);
  epoch_.store(static_cast<std::uint32_t>(epoch), std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) epoch_.notify_all();
  run_pieces(epoch);
  int spins = 0;
  while (remaining_.load(std::memory_order_acquire) != 0) {
    IdleWork* work = idle_.load(std::memory_order_relaxed);  // this thread sets and clears it
    if (work != nullptr && work->step()) continue;
    if (++spins > kSpinIterations) std::this_thread::yield();
    _mm_pause();
  }
  if (failed_piece_ >= 0) {  // every piece is done: no worker writes the failure any more
    failed_piece_ = -1;
    std::rethrow_exception(std::exchange(failure_, nullptr));
  }
}

void WorkPool::worker_loop() {
  const unsigned own_mode = float_mode();  // idle work (weight draws) runs in the thread's own mode
  std::uint32_t seen = 0;
  for (;;) {
    int spins = 0;
    std::uint32_t epoch = epoch_.load(std::memory_order_acquire);
    while (epoch == seen && !stop_.load(std::memory_order_relaxed)) {
      if (idle_step()) {
        spins = 0;
      } else if (++spins < kSpinIterations) {
        _mm_pause();
      } else {
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        if (epoch_.load(std::memory_order_seq_cst) == seen && !stop_.load()) epoch_.wait(seen);
        sleepers_.fetch_sub(1, std::memory_order_seq_cst);
        spins = 0;
      }
      epoch = epoch_.load(std::memory_order_acquire);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = epoch;
    run_pieces(epoch);
    if (float_mode() != own_mode) set_float_mode(own_mode);
  }
}

void WorkPool::run_on_openmp(int pieces, Task task, void* context) {
  std::vector<std::exception_ptr> failures(pieces);
  const unsigned mode = float_mode();  // OpenMP's threads keep the mode they were created in
#pragma omp parallel for num_threads(threads_) schedule(dynamic, 1)
  for (int i = 0; i < pieces; ++i) {
    const unsigned own_mode = float_mode();
    if (own_mode != mode) set_float_mode(mode);
    try {
      task(context, i);
    } catch (...) {
      failures[i] = std::current_exception();
    }
    if (own_mode != mode) set_float_mode(own_mode);
  }
  for (const std::exception_ptr& failure : failures) {
    if (failure) std::rethrow_exception(failure);
  }
}

}  // namespace gradflow
