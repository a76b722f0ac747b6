// The real binary: issue 4's flags reach the JSON, and --exact-jacobian refuses large inputs (exit 2).
#include <doctest/doctest.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace {
struct Run {
  int exit_code = -1;
  std::string output;
};
Run run_binary(const std::string& arguments) {
  Run run;
  FILE* pipe = popen((std::string(GRADFLOW_BINARY) + " " + arguments + " 2>/dev/null").c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buffer[4096];
  while (const std::size_t n = std::fread(buffer, 1, sizeof buffer, pipe)) run.output.append(buffer, n);
  const int status = pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}
}  // namespace

TEST_CASE("analyze --angles all --spectrum 2 --exact-jacobian writes the new figures to JSON") {
  const Run run = run_binary(
      "analyze --arch pre-ln --depth 2 --width 8 --heads 2 --seq 4 --precision f64 --probes 4 "
      "--angles all --spectrum 2 --exact-jacobian -q");
  REQUIRE(run.exit_code == 0);
  const auto doc = nlohmann::json::parse(run.output);
  const auto& seed = doc["runs"][0]["seeds"][0];
  CHECK(seed["angles_matrix"].size() == 5);
  for (const char* name : {"token_cos", "erank", "log10_singular_value_2", "log10_jacobian_fro_exact"}) {
    CHECK(seed["states"].contains(name));
  }
  for (const char* name :
       {"output_share", "output_share_se", "stream_decomposition", "angle", "log10_param_grad"}) {
    CHECK(seed["sublayers"].contains(name));
  }
  CHECK(seed["summary"]["effective_depth"].is_number());
  CHECK(seed["summary"]["stream_decomposition_input"].is_number());
}

TEST_CASE("analyze --exact-jacobian above its limit is bad input (exit 2)") {
  CHECK(run_binary("analyze --arch pre-ln --depth 1 --exact-jacobian -q").exit_code == 2);
}
