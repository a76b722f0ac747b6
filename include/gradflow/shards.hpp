// Two fixed shards of one op's work, run on two cores or one after the other on one.
//
// Every op that uses them splits its work into the same two halves whatever the thread count
// (attention by heads, the FFN by hidden units, weight generation by element range) and combines
// partial sums in the fixed order shard 0 + shard 1, so `--threads 1` and `--threads 2` produce
// the same bits. This is the tensor-parallel split of Megatron-LM (Shoeybi et al. 2019, arXiv
// 1909.08053, Sec. 3) applied to two cores of one CPU.
#pragma once
#include <atomic>
#include <cstdint>
#include <exception>
#include <thread>
#include <type_traits>
#include <utility>

namespace gradflow {

// Work that either thread does a piece at a time while it would otherwise wait for the other
// (ShardPair::set_idle_work). step(thread) does one piece and returns false when none is left;
// thread is 0 on the thread that calls ShardPair::run and 1 on the second core, so that the work
// can hand each thread the pieces that thread will read next (they then stay in its cache).
class IdleWork {
 public:
  virtual bool step(int thread) = 0;

 protected:
  ~IdleWork() = default;
};

class ShardPair {
 public:
  static constexpr int kShards = 2;

  // second_core = false runs both shards on the calling thread. With a second core, the shards
  // run on ShardPair's own second thread, or with on_openmp in an OpenMP region of two threads per
  // op (the library path, kernels.hpp; no idle work is done then). By default as kernel_choice().
  explicit ShardPair(bool second_core);
  ShardPair(bool second_core, bool on_openmp);
  ~ShardPair();
  ShardPair(const ShardPair&) = delete;
  ShardPair& operator=(const ShardPair&) = delete;

  // Work both threads pick up while they wait, e.g. the next sublayer's weights. Call from the
  // thread that calls run(); clear_idle_work() returns once the second core no longer uses the
  // previous idle work, so the caller may then reuse it.
  void set_idle_work(IdleWork* work);
  void clear_idle_work();

  // Runs work(0) on the calling thread and work(1) on the second core, and returns when both are
  // done. If the second core has not taken work(1) by the time work(0) is done (it is descheduled:
  // another process has the core), the calling thread runs it too. Either way each shard runs
  // exactly once, with the same results. Without a second core, work(1) runs after work(0).
  // If either shard throws (std::bad_alloc, most likely), run() still waits for the other and
  // then rethrows the first exception on the calling thread.
  template <typename Work>
  void run(Work&& work) {
    using Callable = std::remove_reference_t<Work>;
    task_ = [](void* context, int shard) { (*static_cast<Callable*>(context))(shard); };
    context_ = const_cast<void*>(static_cast<const void*>(&work));
    if (openmp_) return run_on_openmp();
    if (!worker_.joinable()) {
      work(0);
      work(1);
      return;
    }
    dispatch_and_wait([&] { work(0); });
  }

 private:
  // The library path (kernels.hpp, shard_pair = false): an OpenMP parallel region of two threads
  // per op, no idle work.
  void run_on_openmp();
  template <typename Own>
  void dispatch_and_wait(Own&& own) {
    const std::uint32_t epoch = posted_.load(std::memory_order_relaxed) + 1;
    posted_.store(epoch, std::memory_order_release);
    posted_.notify_one();
    std::exception_ptr own_failure;
    try {
      own();
    } catch (...) {  // shard 1 may be running on the second core: wait for it before unwinding
      own_failure = std::current_exception();
    }
    std::uint32_t unclaimed = epoch - 1;
    if (claimed_.compare_exchange_strong(unclaimed, epoch, std::memory_order_acq_rel)) {
      if (own_failure) std::rethrow_exception(own_failure);
      task_(context_, 1);  // the second core never took it: run it here
      return;
    }
    wait_until_finished(epoch);
    if (own_failure) std::rethrow_exception(own_failure);
    if (worker_failure_) std::rethrow_exception(std::exchange(worker_failure_, nullptr));
  }
  void wait_until_finished(std::uint32_t epoch);
  void wait_until_posted(std::uint32_t seen);
  bool worker_idle_step();
  void worker_loop();

  void (*task_)(void*, int) = nullptr;
  void* context_ = nullptr;
  std::atomic<std::uint32_t> posted_{0};    // epochs handed to the worker
  std::atomic<std::uint32_t> claimed_{0};   // the last epoch whose shard 1 a thread has taken
  std::atomic<std::uint32_t> finished_{0};  // the last epoch whose shard 1 the worker has completed
  std::atomic<bool> stop_{false};
  std::atomic<IdleWork*> idle_{nullptr};
  std::atomic<int> idle_users_{0};  // 1 while the second core is inside idle_->step(1)
  // What shard 1 threw on the second core; written before finished_ is released, read after.
  std::exception_ptr worker_failure_;
  std::thread worker_;
  bool openmp_ = false;
};

// Runs work(0) and work(1) on `shards`, or one after the other when shards is null: callers
// that have no second core pass null and get the same split and the same results.
template <typename Work>
void run_shards(ShardPair* shards, Work&& work) {
  if (shards) return shards->run(work);
  work(0);
  work(1);
}

// The half-open range [begin, end) of shard `shard` when `count` items are split in two, the
// first shard taking floor(count / 2) rounded down to a multiple of `granule`.
struct ShardRange {
  long long begin, end;
  long long size() const { return end - begin; }
};
inline ShardRange shard_range(long long count, int shard, long long granule = 1) {
  const long long middle = (count / 2) / granule * granule;
  return shard == 0 ? ShardRange{0, middle} : ShardRange{middle, count};
}

}  // namespace gradflow
