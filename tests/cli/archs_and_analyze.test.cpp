// The real binary: `gradflow archs` lists every placement with a citation, and
// `gradflow analyze --arch all --depth 64` gives valid JSON with finite figures, the right
// sublayer counts and the stated constants (issue 3, acceptance 1 and 5).
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "gradflow/app/placements.hpp"
#include "gradflow/architecture.hpp"

using json = nlohmann::json;

namespace {
// stdout of `gradflow ARGS`, and its exit code.
std::pair<std::string, int> run_binary(const std::string& args) {
  const std::string command = std::string(GRADFLOW_BINARY) + " " + args + " 2>/dev/null";
  FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string out;
  char buffer[4096];
  while (const std::size_t n = std::fread(buffer, 1, sizeof buffer, pipe)) out.append(buffer, n);
  const int status = pclose(pipe);
  return {out, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

bool all_numbers(const json& array) {
  for (const json& v : array) {
    if (!v.is_number() || !std::isfinite(v.get<double>())) return false;
  }
  return true;
}
}  // namespace

TEST_CASE(
    "gradflow archs lists at least 19 placements, each with an arXiv citation, and span-norm is "
    "provisional") {
  const auto [out, code] = run_binary("archs --format json --depth 64");
  REQUIRE(code == 0);
  const json doc = json::parse(out);
  const json& list = doc.at("architectures");
  CHECK(list.size() >= 19);
  CHECK(list.size() == gradflow::architectures().size());
  for (const json& arch : list) {
    CAPTURE(arch.at("id").get<std::string>());
    CHECK(arch.at("citation").get<std::string>().find("arXiv") != std::string::npos);
    CHECK(arch.at("provisional").get<bool>() == (arch.at("id") == "span-norm"));
    for (const json& c : arch.at("constants")) CHECK((c.at("unit") != "" && c.at("value").is_number()));
  }
  const auto [table, table_code] = run_binary("archs");
  CHECK(table_code == 0);
  CHECK(table.find("PROVISIONAL") != std::string::npos);
  const auto [keel, keel_code] = run_binary("archs --arch keel --depth 32");
  CHECK(keel_code == 0);
  CHECK(keel.find("alpha = S = 64 (sublayers)") != std::string::npos);
  CHECK(keel.find("skip factor: 0.999878") != std::string::npos);  // 64 / sqrt(64^2 + 1)
  CHECK(keel.find("bounded") != std::string::npos);
}

TEST_CASE(
    "gradflow analyze --arch all --depth 64: every placement, finite figures, 128 sublayers, stated "
    "constants") {
  const auto [out, code] = run_binary("analyze --arch all --depth 64 -q");
  REQUIRE(code == 0);
  const json doc = json::parse(out);  // throws on invalid JSON
  const json& runs = doc.at("runs");
  REQUIRE(runs.size() == gradflow::architectures().size());
  for (const json& run : runs) {
    const std::string id = run.at("arch");
    CAPTURE(id);
    CHECK(run.at("config").at("sublayers") == 128);
    const json& seed = run.at("seeds").at(0);
    CHECK(seed.at("summary").at("diverged").is_null());
    CHECK(seed.at("states").at("index").size() == 129);
    for (const char* name : {"rms", "log10_grad", "log10_grad_rel"})
      CHECK(all_numbers(seed.at("states").at(name)));
    CHECK(seed.at("sublayers").at("index").size() == 128);
    // A placement that reads a history has no per-sublayer skip path: its skip_gain and branch_gain
    // are null (docs/placement-files.md, "Reading a history"); every other figure is a number.
    const bool reads_history = gradflow::find_architecture(id).history_streams > 0;
    for (const char* name : {"gain", "skip_gain", "branch_gain", "branch_rms", "stream_share"}) {
      CAPTURE(name);
      const json& values = seed.at("sublayers").at(name);
      const bool split = std::string_view(name) == "skip_gain" || std::string_view(name) == "branch_gain";
      if (reads_history && split)
        CHECK(std::all_of(values.begin(), values.end(), [](const json& v) { return v.is_null(); }));
      else
        CHECK(all_numbers(values));
    }
    CHECK(std::isfinite(seed.at("summary").at("growth_exponent").get<double>()));
  }
  const auto constant = [&](const std::string& id, const std::string& name) {
    for (const json& run : runs) {
      if (run.at("arch") != id) continue;
      for (const auto& [key, value] : run.at("config").at("constants").items()) {
        if (key == name) return value.at("value").get<double>();
      }
    }
    FAIL("no constant " << name << " for " << id);
    return 0.0;
  };
  CHECK(constant("deepnorm", "alpha") == doctest::Approx(std::pow(128.0, 0.25)));
  CHECK(constant("deepnorm", "beta") == doctest::Approx(std::pow(512.0, -0.25)));
  CHECK(constant("keel", "alpha") == 128.0);
  CHECK(constant("mix-ln", "post_ln_blocks") == 16.0);
  CHECK(constant("layerscale", "lambda") == 1e-6);
  CHECK(constant("deepscalelm", "beta") == doctest::Approx(std::sqrt(2.0 / 128)));
}
