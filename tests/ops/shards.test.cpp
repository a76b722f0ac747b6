// The two-shard split (shards.hpp): the ops give the same bits on two cores as on one, and
// weights drawn a chunk at a time by two threads equal the weights drawn in one go.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <new>
#include <thread>

#include "gradflow/analysis.hpp"
#include "gradflow/initialization.hpp"
#include "gradflow/rng.hpp"
#include "support/finite_difference.hpp"

using namespace gradflow;
using namespace gradflow::testing;

namespace {
Mat<float> random_float(Eigen::Index rows, Eigen::Index cols, unsigned seed, double scale = 1.0) {
  return random_matrix(rows, cols, seed, scale).cast<float>();
}

bool same_bits(const Mat<float>& a, const Mat<float>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::equal(a.data(), a.data() + a.size(), b.data(),
                    [](float x, float y) { return std::memcmp(&x, &y, sizeof(float)) == 0; });
}
}  // namespace

namespace {
// One ShardPair::run that records how often and on which thread each shard ran. With
// wait_for_shard_1, shard 0 waits (up to a second) for shard 1 to start, so that a second core
// that is running at all takes shard 1 rather than the calling thread after shard 0.
struct RecordedRun {
  std::atomic<int> runs[2] = {0, 0};
  std::thread::id ids[2];
  RecordedRun(ShardPair& shards, bool wait_for_shard_1) {
    shards.run([&](int shard) {
      runs[shard].fetch_add(1);
      ids[shard] = std::this_thread::get_id();
      const auto start = std::chrono::steady_clock::now();
      while (shard == 0 && wait_for_shard_1 && runs[1].load() == 0 &&
             std::chrono::steady_clock::now() - start < std::chrono::seconds(1)) {
      }
    });
  }
};

// Idle work whose one step blocks until released: keeps the second core busy (as if another
// process had it) while the caller runs shards.
struct BlockingStep final : IdleWork {
  std::atomic<bool> entered{false}, released{false}, stepped{false};
  bool step(int) override {
    if (stepped.exchange(true)) return false;
    entered.store(true);
    while (!released.load()) std::this_thread::yield();
    return true;
  }
};
}  // namespace

TEST_CASE("ShardPair runs each shard exactly once, and the second core takes shard 1 when it can") {
  for (const bool second_core : {false, true}) {
    ShardPair shards(second_core);
    int on_other_thread = 0;
    for (int round = 0; round < 100; ++round) {
      const RecordedRun run(shards, second_core);
      REQUIRE(run.runs[0].load() == 1);
      REQUIRE(run.runs[1].load() == 1);
      CHECK(run.ids[0] == std::this_thread::get_id());
      on_other_thread += run.ids[1] != run.ids[0];
    }
    CHECK(on_other_thread == (second_core ? 100 : 0));
  }
}

TEST_CASE("ShardPair runs shard 1 on the calling thread when the second core does not take it") {
  ShardPair shards(true);
  BlockingStep blocker;
  shards.set_idle_work(&blocker);
  while (!blocker.entered.load()) std::this_thread::yield();  // the second core is now stuck
  for (int round = 0; round < 10; ++round) {
    const RecordedRun run(shards, false);
    REQUIRE(run.runs[0].load() == 1);
    REQUIRE(run.runs[1].load() == 1);
    CHECK(run.ids[1] == std::this_thread::get_id());
  }
  blocker.released.store(true);
  shards.clear_idle_work();
  // Once free, the second core skips the epochs the caller ran and takes the next one.
  const RecordedRun run(shards, true);
  CHECK(run.runs[0].load() == 1);
  CHECK(run.runs[1].load() == 1);
  CHECK(run.ids[1] != std::this_thread::get_id());
}

TEST_CASE("ShardPair hands an exception of either shard to the caller once both shards are done") {
  for (const bool second_core : {false, true}) {
    for (const int thrower : {0, 1}) {
      ShardPair shards(second_core);
      for (int round = 0; round < 50; ++round) {
        std::atomic<int> finished{0};
        const auto work = [&](int shard) {
          if (shard == thrower) throw std::bad_alloc();
          std::this_thread::sleep_for(std::chrono::microseconds(shard == 1 ? 200 : 0));
          finished.fetch_add(1);
        };
        int at_throw = -1;
        try {
          shards.run(work);
        } catch (const std::bad_alloc&) {
          at_throw = finished.load();
          // No shard is still running once run() has unwound (the lambda's captures die here).
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
          CHECK(finished.load() == at_throw);
        }
        REQUIRE(at_throw >= 0);                  // the exception reached the caller
        if (thrower == 1) CHECK(at_throw == 1);  // shard 0 ran to its end first
      }
      // And the pair still works afterwards.
      const RecordedRun run(shards, second_core);
      CHECK(run.runs[0].load() == 1);
      CHECK(run.runs[1].load() == 1);
    }
  }
}

TEST_CASE("shard_range splits at a granule boundary and covers every item once") {
  CHECK(shard_range(1024, 0, 16).begin == 0);
  CHECK(shard_range(1024, 0, 16).end == 512);
  CHECK(shard_range(1024, 1, 16).end == 1024);
  CHECK(shard_range(40, 0, 16).end == 16);  // 20 rounded down to the granule
  CHECK(shard_range(1, 0).size() == 0);     // one head: shard 0 is empty
  CHECK(shard_range(1, 1).size() == 1);
}

TEST_CASE("ffn and attention give the same bits on two cores as on one") {
  const int d = 64, tokens = 12, probes = 3;
  ShardPair two_cores(true);
  SublayerWeights<float> w;
  w.w_q = random_float(d, d, 1, 0.15);
  w.w_k = random_float(d, d, 2, 0.15);
  w.w_v = random_float(d, d, 3, 0.15);
  w.w_o = random_float(d, d, 4, 0.15);
  w.w_1 = random_float(d, 4 * d, 5, 0.1);
  w.w_2 = random_float(4 * d, d, 6, 0.1);
  const Mat<float> x = random_float(tokens, d, 7);
  const Mat<float> dy = random_float(probes * tokens, d, 8);

  SUBCASE("ffn") {
    for (const double hidden_scale : {1.0, 8.0}) {  // 8 = nGPT's s_uv = sqrt(d)
      CAPTURE(hidden_scale);
      const FfnOptions options{hidden_scale};
      FfnCache<float> one, two;
      Mat<float> out_one, out_two;
      ffn_forward(x, w, options, one, out_one);
      ffn_forward(x, w, options, two, out_two, &two_cores);
      CHECK(same_bits(out_one, out_two));
      Mat<float> dx_one = Mat<float>::Zero(probes * tokens, d), dx_two = dx_one;
      ParamGradSquares squares_one, squares_two;
      ffn_backward(x, w, options, one, dy, &dx_one, &squares_one);
      ffn_backward(x, w, options, two, dy, &dx_two, &squares_two, &two_cores);
      CHECK(same_bits(dx_one, dx_two));
      CHECK(squares_one == squares_two);
    }
  }
  SUBCASE("attention") {
    for (const QkvNorm norm :
         {QkvNorm::none, QkvNorm::per_head_qkv, QkvNorm::full_qk, QkvNorm::per_head_qk_unit}) {
      for (const int heads : {1, 4, 8}) {
        CAPTURE(static_cast<int>(norm));
        CAPTURE(heads);
        AttentionOptions options;
        options.heads = heads;
        options.qkv_norm = norm;
        options.score_scale = 1.0 / std::sqrt(static_cast<double>(d / heads));
        AttentionCache<float> one, two;
        Mat<float> out_one, out_two;
        attention_forward(x, w, options, one, out_one);
        attention_forward(x, w, options, two, out_two, &two_cores);
        CHECK(same_bits(out_one, out_two));
        Mat<float> dx_one = Mat<float>::Zero(probes * tokens, d), dx_two = dx_one;
        ParamGradSquares squares_one, squares_two;
        attention_backward(x, w, options, one, dy, &dx_one, &squares_one);
        attention_backward(x, w, options, two, dy, &dx_two, &squares_two, &two_cores);
        CHECK(same_bits(dx_one, dx_two));
        CHECK(squares_one == squares_two);
      }
    }
  }
  SUBCASE("gated ffn with biases") {
    SublayerWeights<float> gated = w;
    gated.w_3 = random_float(d, 4 * d, 9, 0.1);
    gated.b_1 = random_float(4 * d, 1, 10, 0.1);
    gated.b_3 = random_float(4 * d, 1, 11, 0.1);
    gated.b_2 = random_float(d, 1, 12, 0.1);
    for (const FfnKind kind : {FfnKind::swiglu, FfnKind::geglu}) {
      CAPTURE(to_string(kind));
      const FfnOptions options{1.0, kind};
      FfnCache<float> one, two;
      Mat<float> out_one, out_two;
      ffn_forward(x, gated, options, one, out_one);
      ffn_forward(x, gated, options, two, out_two, &two_cores);
      CHECK(same_bits(out_one, out_two));
      Mat<float> dx_one = Mat<float>::Zero(probes * tokens, d), dx_two = dx_one;
      ParamGradSquares squares_one, squares_two;
      ffn_backward(x, gated, options, one, dy, &dx_one, &squares_one);
      ffn_backward(x, gated, options, two, dy, &dx_two, &squares_two, &two_cores);
      CHECK(same_bits(dx_one, dx_two));
      CHECK(squares_one == squares_two);
    }
  }
  SUBCASE("grouped-query attention with rotary embeddings and biases") {
    for (const int kv_heads : {1, 2, 4}) {  // 8 query heads: groups of 8, 4 and 2, split across shards
      CAPTURE(kv_heads);
      const int head_dim = d / 8;
      SublayerWeights<float> grouped = w;
      grouped.w_k = random_float(d, kv_heads * head_dim, 13, 0.15);
      grouped.w_v = random_float(d, kv_heads * head_dim, 14, 0.15);
      grouped.b_q = random_float(d, 1, 15, 0.1);
      grouped.b_k = random_float(kv_heads * head_dim, 1, 16, 0.1);
      grouped.b_v = random_float(kv_heads * head_dim, 1, 17, 0.1);
      grouped.b_o = random_float(d, 1, 18, 0.1);
      AttentionOptions options;
      options.heads = 8;
      options.kv_heads = kv_heads;
      options.qkv_norm = QkvNorm::per_head_qkv;
      options.score_scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
      options.rope_theta = 10000.0;
      options.rotary_dims = head_dim;
      AttentionCache<float> one, two;
      Mat<float> out_one, out_two;
      attention_forward(x, grouped, options, one, out_one);
      attention_forward(x, grouped, options, two, out_two, &two_cores);
      CHECK(same_bits(out_one, out_two));
      Mat<float> dx_one = Mat<float>::Zero(probes * tokens, d), dx_two = dx_one;
      ParamGradSquares squares_one, squares_two;
      attention_backward(x, grouped, options, one, dy, &dx_one, &squares_one);
      attention_backward(x, grouped, options, two, dy, &dx_two, &squares_two, &two_cores);
      CHECK(same_bits(dx_one, dx_two));
      CHECK(squares_one == squares_two);
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

TEST_CASE("weights drawn by two threads as idle work equal weights drawn in one go") {
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
    ShardPair shards(true);
    WeightDraw<float> draw;
    draw.plan(config, arch, ctx, 5, drawn);
    shards.set_idle_work(&draw);
    shards.run([](int) {});  // the second core draws chunks while it waits
    draw.finish();
    shards.clear_idle_work();
    // One thread alone draws its own chunks, then the other thread's.
    SublayerWeights<float> by_one_thread;
    WeightDraw<float> alone;
    alone.plan(config, arch, ctx, 5, by_one_thread);
    while (alone.step(1)) {
    }
    CHECK_FALSE(alone.step(0));  // nothing left for the other thread
    alone.finish();
    for (const auto member :
         {&SublayerWeights<float>::w_q, &SublayerWeights<float>::w_k, &SublayerWeights<float>::w_v,
          &SublayerWeights<float>::w_o, &SublayerWeights<float>::w_1, &SublayerWeights<float>::w_2}) {
      CHECK(same_bits(expected.*member, drawn.*member));
      CHECK(same_bits(expected.*member, by_one_thread.*member));
    }
  }
}
