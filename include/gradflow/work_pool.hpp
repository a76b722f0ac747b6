// The speed layer's one interface for running an op's pieces of work on several cores.
//
// An op splits its work into pieces that its mathematics offers (attention heads, blocks of hidden
// units, blocks of output columns, states) and whose number depends on the problem's shape only,
// never on the thread count. Each piece writes its own outputs, and any partial sums are added by
// the op afterwards in piece order. Which thread runs a piece therefore changes no bit: `--threads
// 1` and `--threads 16` give the same figures. This is the tensor-parallel split of Megatron-LM
// (Shoeybi et al. 2019, arXiv 1909.08053, Sec. 3) applied to the cores of one CPU.
#pragma once
#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace gradflow {

// Work that a thread does a piece at a time while it would otherwise wait, e.g. the next
// sublayer's weights (WeightDraw). step() does one piece and returns false when none is left; any
// thread may call it, concurrently.
class IdleWork {
 public:
  virtual bool step() noexcept = 0;

 protected:
  ~IdleWork() = default;
};

class WorkPool {
 public:
  // threads >= 1: threads - 1 workers besides the thread that calls run(). on_openmp runs each
  // run() as an OpenMP parallel loop instead (the library path, kernels.hpp; no idle work then).
  // By default as kernel_choice().
  explicit WorkPool(int threads);
  WorkPool(int threads, bool on_openmp);
  ~WorkPool();
  WorkPool(const WorkPool&) = delete;
  WorkPool& operator=(const WorkPool&) = delete;

  int threads() const { return threads_; }

  // Work every thread picks up while it waits. Call from the thread that calls run();
  // clear_idle_work() returns once no worker uses the previous idle work any more.
  void set_idle_work(IdleWork* work);
  void clear_idle_work();

  // One thread calls run() at a time, never from inside a piece; pieces < 2^20.
  // Runs piece(i) for every i in [0, pieces), each exactly once, on the calling thread and the
  // workers (whichever is free takes the next piece), and returns when all are done. If pieces
  // throw (std::bad_alloc, most likely), run() returns only once no piece is running, and rethrows
  // the exception of the lowest-numbered failed piece (on one thread, the pieces run in order and
  // stop at the first failure). Every piece runs in the calling thread's floating-point mode
  // (float_mode(), kernels.hpp), whichever thread runs it.
  template <typename Piece>
  void run(int pieces, Piece&& piece) {
    using Callable = std::remove_reference_t<Piece>;
    if (pieces <= 0) return;
    if (openmp_)
      return run_on_openmp(
          pieces, [](void* c, int i) { (*static_cast<Callable*>(c))(i); },
          const_cast<void*>(static_cast<const void*>(&piece)));
    dispatch(
        pieces, [](void* c, int i) { (*static_cast<Callable*>(c))(i); },
        const_cast<void*>(static_cast<const void*>(&piece)));
  }

 private:
  using Task = void (*)(void*, int);
  void dispatch(int pieces, Task task, void* context);
  void run_on_openmp(int pieces, Task task, void* context);
  // Claims and runs pieces of the run published as `word`'s epoch until none is left.
  void run_pieces(std::uint64_t epoch);
  bool idle_step();
  void record_failure(int piece);
  void worker_loop();

  const int threads_;
  const bool openmp_;
  // One word per run: epoch (high 24 bits), piece count (next 20), next unclaimed piece (low 20).
  // A piece is claimed by a compare-and-swap on it, so a thread that saw an older epoch can never
  // claim a piece of a newer run.
  // The atomics that different threads write sit on cache lines of their own, so that a worker
  // polling for the next run does not take away the line a piece is being claimed on.
  alignas(64) std::atomic<std::uint64_t> word_{0};
  Task task_ = nullptr;  // the current run's piece function, set before word_
  void* context_ = nullptr;
  unsigned float_mode_ = 0;  // the current run's floating-point mode, the caller's; set before word_
  alignas(64) std::atomic<int> remaining_{0};        // pieces of the current run not yet finished
  alignas(64) std::atomic<std::uint32_t> epoch_{0};  // the published epoch, what sleeping workers wait on
  std::atomic<bool> stop_{false};
  alignas(64) std::atomic<int> sleepers_{0};  // workers asleep (or about to be) on epoch_
  alignas(64) std::atomic<IdleWork*> idle_{nullptr};
  alignas(64) std::atomic<int> idle_users_{0};  // workers inside idle_->step()
  std::mutex failure_mutex_;
  std::exception_ptr failure_;  // the lowest-numbered failed piece's exception
  int failed_piece_ = -1;
  std::vector<std::thread> workers_;
};

// Runs piece(i) for i in [0, pieces) on `pool`, or in order on this thread when pool is null:
// the same pieces and the same results either way.
template <typename Piece>
void for_each_piece(WorkPool* pool, int pieces, Piece&& piece) {
  if (pool) return pool->run(pieces, piece);
  for (int i = 0; i < pieces; ++i) piece(i);
}

}  // namespace gradflow
