// How fast the machine's two cores hand data to each other right now: one thread writes a 1 MB
// buffer, the other reads it, in turns (what an op's pieces on two threads do with weights and
// activations, op after op). bench.py runs it at each round's start and end: on this shared
// machine the host sometimes places the two vCPUs far apart (another CCD), and then a hand-off
// costs three times as long and --threads 2 runs 1.5x slower, while either core alone and a
// 2-thread GEMM that shares nothing run at full speed.
//
// Prints {"handoff_us": round trip per 1 MB hand-off, "read_gb_s": the reading thread's rate}.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

int main() {
  constexpr std::size_t kFloats = std::size_t{1} << 18;  // 1 MB
  constexpr std::size_t kLine = 16;                      // floats per 64-byte cache line
  constexpr int kRounds = 2000;                          // about 0.2-0.6 s
  std::vector<float> buffer(kFloats, 1.0f);
  std::atomic<int> turn{0};
  double read_seconds = 0;
  float sink = 0;
  const auto start = std::chrono::steady_clock::now();
  std::thread reader([&] {
    for (int round = 0; round < kRounds; ++round) {
      while (turn.load(std::memory_order_acquire) != 2 * round + 1) {
      }
      const auto read_start = std::chrono::steady_clock::now();
      float sum = 0;
      for (std::size_t i = 0; i < kFloats; i += kLine) sum += buffer[i];  // one read per line
      sink += sum;
      read_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - read_start).count();
      turn.store(2 * round + 2, std::memory_order_release);
    }
  });
  for (int round = 0; round < kRounds; ++round) {
    while (turn.load(std::memory_order_acquire) != 2 * round) {
    }
    for (std::size_t i = 0; i < kFloats; i += kLine)
      buffer[i] = static_cast<float>(round);  // one write per line
    turn.store(2 * round + 1, std::memory_order_release);
  }
  reader.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("{\"handoff_us\": %.1f, \"read_gb_s\": %.1f, \"checksum\": %.0f}\n", seconds / kRounds * 1e6,
              kRounds * sizeof(float) * kFloats / read_seconds / 1e9, sink);
}
