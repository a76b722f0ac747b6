// The library runner: the same results on any number of threads, progress that reaches its total,
// and the resume check of a sweep's cell files.
#include "gradflow/app/runner.hpp"

#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <stdexcept>

#include "gradflow/app/placements.hpp"
#include "gradflow/app/report.hpp"
#include "support/small_model.hpp"

using namespace gradflow;

namespace {
// float32, the CLI's default precision: the runner's results are compared bit for bit.
ModelConfig tiny_config() {
  return testing::small_model(3, 16, 2, 4, Precision::f32);
}

nlohmann::ordered_json without_timing(const std::vector<ArchResult>& results) {
  AnalysisReport report;
  report.results = results;
  report.timing = false;
  return report_to_json(report);
}
}  // namespace

TEST_CASE("run_analysis gives the same results with 1 and 2 runs at once, each in its own slot") {
  const std::vector<const Architecture*> archs = parse_architecture_list("keel,pre-ln");
  const std::vector<std::uint64_t> seeds = {3, 7};
  std::vector<ArchResult> one = plan_analysis(tiny_config(), archs, seeds);
  std::vector<ArchResult> two = one;
  run_analysis(one, {1, 1, {}});
  run_analysis(two, {2, 1, {}});
  REQUIRE(one.size() == 2);
  for (std::size_t a = 0; a < one.size(); ++a) {
    REQUIRE(one[a].seeds.size() == seeds.size());
    for (std::size_t s = 0; s < seeds.size(); ++s) {
      CHECK(one[a].seeds[s].seed == seeds[s]);
      CHECK(one[a].seeds[s].states.values.size() > 0);
    }
    CHECK(one[a].seeds[0].states.values != one[a].seeds[1].states.values);  // the seeds differ
  }
  CHECK(without_timing(one) == without_timing(two));
}

TEST_CASE("run_all reports progress up to the total work of every run and hands each result over once") {
  const ModelConfig config = tiny_config();
  const Architecture& arch = find_architecture("post-ln");
  const Constants constants = resolve_constants(arch, config);
  const std::vector<RunRequest> runs = {
      {&config, &arch, &constants, 0}, {&config, &arch, &constants, 1}, {&config, &arch, &constants, 2}};
  for (const int at_once : {1, 2}) {
    long long last_done = -1, last_total = -1;
    std::vector<int> handed(runs.size(), 0);
    std::mutex mutex;
    run_all(runs,
            {at_once, 1, [&](long long done, long long total) { last_done = done, last_total = total; }},
            [&](std::size_t run, SeedResult&& result, double seconds) {
              std::lock_guard lock(mutex);
              ++handed[run];
              CHECK(result.seed == runs[run].seed);
              CHECK(seconds >= 0);
            });
    CHECK(last_total == 3 * analysis_work_units(config));
    CHECK(last_done == last_total);
    CHECK(handed == std::vector<int>{1, 1, 1});
  }
}

TEST_CASE("run_all rethrows a run's exception once every run has ended") {
  const ModelConfig config = tiny_config();
  const Architecture& arch = find_architecture("pre-ln");
  const Constants constants = resolve_constants(arch, config);
  const std::vector<RunRequest> runs = {{&config, &arch, &constants, 0}, {&config, &arch, &constants, 1}};
  std::atomic<int> finished = 0;  // run_all calls back from both runs' threads at once
  CHECK_THROWS_AS(run_all(runs, {2, 1, {}},
                          [&](std::size_t run, SeedResult&&, double) {
                            ++finished;
                            if (run == 0) throw std::runtime_error("disk full");
                          }),
                  std::runtime_error);
  CHECK(finished == 2);
}

TEST_CASE("plan_sweep_cells keeps a complete cell file and names why another cannot be reused") {
  const std::filesystem::path directory =
      std::filesystem::temp_directory_path() / ("gradflow_runner_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(directory);
  const ModelConfig model = tiny_config();
  const std::vector<SweepCell> cells = {{"keel", 2, 16, 0}, {"keel", 3, 16, 0}};
  std::vector<CellPlan> plans = plan_sweep_cells(model, cells, directory);
  REQUIRE(plans.size() == 2);
  CHECK_FALSE(plans[0].exists);
  CHECK_FALSE(plans[0].complete());
  // Compute the first cell and write its file, as the sweep does.
  run_all({{&plans[0].run.config, plans[0].run.arch, &plans[0].run.constants, 0}}, {1, 1, {}},
          [&](std::size_t, SeedResult&& seed, double) { plans[0].run.seeds[0] = std::move(seed); });
  std::ofstream(plans[0].path) << cell_document(plans[0].run).dump() << "\n";
  std::ofstream(plans[1].path) << "{\"schema_version\": 1}\n";  // not a cell document
  const std::vector<CellPlan> again = plan_sweep_cells(model, cells, directory);
  CHECK(again[0].complete());
  CHECK(again[1].exists);
  CHECK_FALSE(again[1].complete());
  CHECK(again[1].stale_reason.find("not a cell document") != std::string::npos);
  // Another model (a different --probes) makes the first file stale too, naming the field.
  ModelConfig other = model;
  other.probes = 2;
  const std::vector<CellPlan> changed = plan_sweep_cells(other, cells, directory);
  CHECK_FALSE(changed[0].complete());
  CHECK(changed[0].stale_reason.find("config.probes") != std::string::npos);
  std::filesystem::remove_all(directory);
}
