// WorkPool (work_pool.hpp): every piece runs exactly once on whichever thread is free, in the
// caller's floating-point mode; the calling thread takes what the workers do not, the
// lowest-numbered failure reaches the caller once every piece is done, and weights drawn a chunk
// at a time by any threads equal the weights drawn in one go.
#include "gradflow/work_pool.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <new>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>

#include "gradflow/analysis.hpp"
#include "gradflow/app/placements.hpp"
#include "gradflow/initialization.hpp"
#include "gradflow/kernels.hpp"
#include "gradflow/rng.hpp"
#include "support/finite_difference.hpp"

using namespace gradflow;
using namespace gradflow::testing;

namespace {
bool same_bits(const Mat<float>& a, const Mat<float>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::equal(a.data(), a.data() + a.size(), b.data(),
                    [](float x, float y) { return std::memcmp(&x, &y, sizeof(float)) == 0; });
}

// One run of `pieces` pieces that records how often each piece ran and on which threads. With
// `wait_for_another_thread`, the first piece to start holds its thread (yielding) until some other
// thread has run a piece: a pool with more than one thread must then use a second one, however
// late the scheduler gives it a core, so the test does not depend on timing. The wait gives up
// after a minute so that a broken pool fails the check instead of hanging.
struct RecordedRun {
  std::vector<std::atomic<int>> runs;
  std::mutex mutex;
  std::set<std::thread::id> threads;
  std::atomic<bool> first_started{false};
  std::atomic<int> threads_seen{0};
  RecordedRun(WorkPool& pool, int pieces, bool wait_for_another_thread = false) : runs(pieces) {
    pool.run(pieces, [&](int piece) {
      runs[piece].fetch_add(1);
      {
        const std::lock_guard<std::mutex> lock(mutex);
        threads.insert(std::this_thread::get_id());
        threads_seen.store(static_cast<int>(threads.size()));
      }
      if (wait_for_another_thread && !first_started.exchange(true)) {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        while (threads_seen.load() < 2 && std::chrono::steady_clock::now() < deadline)
          std::this_thread::yield();
      }
    });
  }
  bool each_once() const {
    return std::all_of(runs.begin(), runs.end(), [](const std::atomic<int>& n) { return n.load() == 1; });
  }
};

// Idle work whose one step blocks until released: keeps a worker busy (as if another process had
// its core) while the caller runs pieces.
struct BlockingStep final : IdleWork {
  std::atomic<bool> entered{false}, released{false}, stepped{false};
  bool step() noexcept override {
    if (stepped.exchange(true)) return false;
    entered.store(true);
    while (!released.load()) std::this_thread::yield();
    return true;
  }
};
}  // namespace

TEST_CASE("WorkPool runs each piece exactly once, on several threads when it has them") {
  for (const int threads : {1, 2, 3, 7}) {
    for (const bool openmp : {false, true}) {
      CAPTURE(threads);
      CAPTURE(openmp);
      WorkPool pool(threads, openmp);
      CHECK(pool.threads() == threads);
      for (int round = 0; round < 50; ++round) {
        for (const int pieces : {0, 1, 5, 64}) {
          RecordedRun run(pool, pieces);
          REQUIRE(run.each_once());
          if (threads == 1) CHECK(run.threads.size() <= 1);
        }
      }
      // The first piece holds its thread until another has run one: only a pool that really
      // hands pieces to a second thread passes, and no deadline decides it.
      for (const int pieces : {2, 64}) {
        CAPTURE(pieces);
        RecordedRun run(pool, pieces, /*wait_for_another_thread=*/threads > 1);
        REQUIRE(run.each_once());
        if (threads == 1) CHECK(run.threads.size() == 1);
        if (threads > 1) CHECK(run.threads.size() > 1);
      }
    }
  }
}

TEST_CASE("WorkPool runs every piece in the calling thread's floating-point mode, on every thread") {
  // SubnormalsFlushed around an op (the backward pass) must hold on the workers too, or a figure
  // could depend on which thread ran a piece. Each piece records its thread's mode; the first
  // piece holds its thread until another thread has run one, so at least two threads take part.
  for (const bool openmp : {false, true}) {
    CAPTURE(openmp);
    WorkPool pool(3, openmp);
    for (const bool flushed : {true, false, true}) {
      CAPTURE(flushed);
      std::optional<SubnormalsFlushed> flush;
      if (flushed) flush.emplace();
      const unsigned caller = float_mode();
      std::vector<unsigned> modes(64);
      std::set<std::thread::id> threads;
      std::mutex mutex;
      std::atomic<bool> first_started{false};
      std::atomic<int> threads_seen{0};
      pool.run(64, [&](int piece) {
        modes[piece] = float_mode();
        {
          const std::lock_guard<std::mutex> lock(mutex);
          threads.insert(std::this_thread::get_id());
          threads_seen.store(static_cast<int>(threads.size()));
        }
        if (!first_started.exchange(true)) {
          const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
          while (threads_seen.load() < 2 && std::chrono::steady_clock::now() < deadline)
            std::this_thread::yield();
        }
      });
      CHECK(std::all_of(modes.begin(), modes.end(), [&](unsigned mode) { return mode == caller; }));
      CHECK(threads.size() > 1);
    }
  }
}

TEST_CASE("WorkPool runs every piece on the calling thread when its workers are busy") {
  WorkPool pool(2, false);
  BlockingStep blocker;
  pool.set_idle_work(&blocker);
  while (!blocker.entered.load()) std::this_thread::yield();  // the one worker is now stuck
  for (int round = 0; round < 10; ++round) {
    RecordedRun run(pool, 8);
    REQUIRE(run.each_once());
    CHECK(run.threads == std::set<std::thread::id>{std::this_thread::get_id()});
  }
  blocker.released.store(true);
  pool.clear_idle_work();
  // The worker is back: with the first piece holding the caller, it must take the others.
  RecordedRun run(pool, 64, /*wait_for_another_thread=*/true);
  REQUIRE(run.each_once());
  CHECK(run.threads.size() == 2);
}

TEST_CASE("WorkPool hands the lowest-numbered failure to the caller once no piece runs") {
  for (const int threads : {1, 2, 4}) {
    for (const bool openmp : {false, true}) {
      CAPTURE(threads);
      CAPTURE(openmp);
      WorkPool pool(threads, openmp);
      for (int round = 0; round < 30; ++round) {
        std::atomic<int> finished{0};
        const auto work = [&](int piece) {
          if (piece == 3) throw std::bad_alloc();
          if (piece == 6) throw std::runtime_error("six");
          std::this_thread::sleep_for(std::chrono::microseconds(piece == 7 ? 300 : 0));
          finished.fetch_add(1);
        };
        bool caught = false;
        try {
          pool.run(8, work);
        } catch (const std::bad_alloc&) {
          caught = true;
          const int at_throw = finished.load();
          // On one thread the pieces run in order and stop at the first failure (3 finished);
          // with workers, every other piece runs to its end first.
          CHECK(at_throw == (threads == 1 ? 3 : 6));
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
          CHECK(finished.load() == at_throw);  // and none runs after run() unwound
        }
        REQUIRE(caught);
      }
      RecordedRun run(pool, 16);  // the pool still works afterwards
      CHECK(run.each_once());
    }
  }
}

TEST_CASE("the Gram identity: ||X^T dY||_F^2 from lower triangles") {
  const MatD x = random_matrix(9, 7, 21), dy = random_matrix(9, 5, 22);
  MatD x_gram, dy_gram;
  lower_gram<double>(x, x_gram);
  lower_gram<double>(dy, dy_gram);
  CHECK(symmetric_inner(x_gram, dy_gram) ==
        doctest::Approx((x.transpose() * dy).squaredNorm()).epsilon(1e-12));
}

TEST_CASE("fill_normal_range pieces equal one fill_normal") {
  const std::size_t count = 5 * kNormalChunk + 37;
  std::vector<float> whole(count), pieces(count);
  fill_normal(99, 0.5f, whole.data(), count);
  for (std::size_t begin = 0; begin < count; begin += 2 * kNormalChunk) {
    fill_normal_range(99, 0.5f, pieces.data() + begin, begin, std::min(count, begin + 2 * kNormalChunk));
  }
  CHECK(whole == pieces);
  CHECK_THROWS(fill_normal_range(99, 0.5f, pieces.data(), 5, 10));
}

TEST_CASE("weights drawn by several threads as idle work equal weights drawn in one go") {
  ModelConfig config;
  config.width = 64;
  config.blocks = 2;
  const Architecture& arch = find_architecture("keel");
  const Constants constants = resolve_constants(arch, config);
  for (const SublayerKind kind : {SublayerKind::attn, SublayerKind::ffn}) {
    const int sublayer = kind == SublayerKind::attn ? 2 : 3;
    const SublayerContext ctx{config, constants, sublayer, 1, kind};
    SublayerWeights<float> expected, drawn;
    generate_weights(config, arch, ctx, 5, expected);
    WorkPool pool(4, false);
    WeightDraw<float> draw;
    draw.plan(config, arch, ctx, 5, drawn);
    pool.set_idle_work(&draw);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // the workers draw chunks meanwhile
    draw.finish();
    pool.clear_idle_work();
    // One thread alone, a chunk per step.
    SublayerWeights<float> by_one_thread;
    WeightDraw<float> alone;
    alone.plan(config, arch, ctx, 5, by_one_thread);
    int steps = 0;
    while (alone.step()) ++steps;
    CHECK(steps > 1);
    CHECK_FALSE(alone.step());  // nothing left
    alone.finish();
    REQUIRE(expected.matrices.size() == (kind == SublayerKind::attn ? 4u : 2u));
    REQUIRE(drawn.matrices.size() == expected.matrices.size());
    REQUIRE(by_one_thread.matrices.size() == expected.matrices.size());
    for (std::size_t m = 0; m < expected.matrices.size(); ++m) {
      CHECK(same_bits(expected.matrices[m], drawn.matrices[m]));
      CHECK(same_bits(expected.matrices[m], by_one_thread.matrices[m]));
    }
  }
}
