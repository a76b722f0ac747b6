// The configuration in documents: analyze's per-run config, the sweep model, check's compared keys
// and the CSV header, all from config_fields() and the placements' options.
#include <doctest/doctest.h>

#include <sstream>

#include "gradflow/app/placements.hpp"
#include "gradflow/app/report.hpp"
#include "gradflow/app/runner.hpp"

using namespace gradflow;

namespace {
std::vector<std::string> keys(const nlohmann::ordered_json& object) {
  std::vector<std::string> out;
  for (const auto& [key, value] : object.items()) out.push_back(key);
  return out;
}

ArchResult tiny_result(std::string_view arch) {
  ModelConfig config;
  config.blocks = 2, config.width = 16, config.heads = 2, config.seq = 4;
  std::vector<ArchResult> results = plan_analysis(config, {&find_architecture(arch)}, {0});
  run_analysis(results, {1, 1, {}});
  return results.front();
}
}  // namespace

TEST_CASE("a run's config lists the fields in document order, keel_variant for keel only") {
  const std::vector<std::string> common = {
      "arch",     "update_rule", "final_norm",    "citation", "provisional", "blocks",     "sublayers",
      "block",    "width",       "heads",         "head_dim", "ffn_hidden",  "seq",        "norm",
      "norm_eps", "init",        "precision",     "branch",   "probes",      "input_corr", "ffn",
      "kv_heads", "rope_theta",  "rope_fraction", "bias",     "angles",      "spectrum",   "exact_jacobian",
      "seeds",    "streams",     "constants"};
  ArchResult pre_ln;
  pre_ln.arch = &find_architecture("pre-ln");
  CHECK(keys(config_to_json(pre_ln)) == common);
  ArchResult keel;
  keel.arch = &find_architecture("keel");
  keel.config.options["keel_variant"] = std::string("v1");
  keel.config.norm = NormKind::dyt;
  std::vector<std::string> with_options = common;
  with_options.push_back("keel_variant");
  with_options.push_back("dyt_alpha");
  const nlohmann::ordered_json config = config_to_json(keel);
  CHECK(keys(config) == with_options);
  CHECK(config.at("keel_variant") == "v1");
}

TEST_CASE("the sweep model holds the fields every cell shares and the options recorded there") {
  ModelConfig model;
  const nlohmann::ordered_json json = sweep_model_to_json(model);
  CHECK(keys(json) == std::vector<std::string>{"block",
                                               "heads",
                                               "seq",
                                               "norm",
                                               "norm_eps",
                                               "init",
                                               "precision",
                                               "branch",
                                               "probes",
                                               "input_corr",
                                               "ffn",
                                               "kv_heads",
                                               "rope_theta",
                                               "rope_fraction",
                                               "bias",
                                               "alpha",
                                               "keel_variant",
                                               "mix_ratio",
                                               "rezero_alpha",
                                               "attnres_blocks",
                                               "attnres_query",
                                               "completep_alpha",
                                               "completep_base_depth",
                                               "dwa_init",
                                               "frac_init",
                                               "num_fracs"});
  CHECK(json.at("alpha") == "paper's constant");  // unset: the placement's own constant
  CHECK(json.at("keel_variant") == "v2");
  CHECK(json.at("mix_ratio") == 0.25);
  CHECK(json.at("rezero_alpha") == 0.0);
  model.options["alpha"] = 3.0;
  CHECK(sweep_model_to_json(model).at("alpha") == 3.0);
}

TEST_CASE("check compares the configuration fields that change what a run measures") {
  CHECK(compared_config_keys() == std::vector<std::string>{"blocks",
                                                           "sublayers",
                                                           "block",
                                                           "width",
                                                           "heads",
                                                           "ffn_hidden",
                                                           "seq",
                                                           "norm",
                                                           "norm_eps",
                                                           "init",
                                                           "precision",
                                                           "branch",
                                                           "probes",
                                                           "input_corr",
                                                           "ffn",
                                                           "kv_heads",
                                                           "rope_theta",
                                                           "rope_fraction",
                                                           "bias",
                                                           "update_step",
                                                           "learning_rates",
                                                           "update_params",
                                                           "experts",
                                                           "experts_active",
                                                           "shared_expert_hidden",
                                                           "router_gates",
                                                           "shared_expert_gate",
                                                           "keel_variant",
                                                           "attnres_query",
                                                           "completep_alpha",
                                                           "completep_base_depth",
                                                           "dwa_init",
                                                           "frac_init",
                                                           "num_fracs"});
  CHECK(config_flag("experts_active") == "--experts-active");
  CHECK(config_flag("blocks") == "--depth");
  CHECK(config_flag("keel_variant") == "--keel-variant");
  CHECK(config_flag("norm_eps") == "--norm-eps");
  CHECK(config_flag("head_dim") == "--width/--heads");
}

TEST_CASE("an FFN op's options are in the run's config and the sweep model while the op is in use") {
  ModelConfig model;
  const nlohmann::ordered_json dense = run_config_fields(model);
  CHECK(!dense.contains("experts"));
  model.ffn = "moe";
  model.op_options["experts_active"] = 4.0;
  const nlohmann::ordered_json moe = run_config_fields(model);
  CHECK(moe.at("ffn") == "moe");
  CHECK(moe.at("experts") == 8.0);  // the row's default
  CHECK(moe.at("experts_active") == 4.0);
  CHECK(moe.at("router_gates") == "renormalized");
  CHECK(sweep_model_to_json(model).at("experts_active") == 4.0);
  // A document of another FFN lacks them: absent on both sides compares equal.
  CHECK(recorded_config_value(dense, "experts").is_null());
}

TEST_CASE("a config written before issue 19 reads as the default block, and its own values win") {
  ModelConfig model;
  model.heads = 8;
  nlohmann::ordered_json config = run_config_fields(model);
  for (const char* key : {"ffn", "kv_heads", "rope_theta", "rope_fraction", "bias"}) config.erase(key);
  CHECK(recorded_config_value(config, "ffn") == "gelu");
  CHECK(recorded_config_value(config, "rope_theta") == 0.0);
  CHECK(recorded_config_value(config, "bias") == false);
  CHECK(recorded_config_value(config, "kv_heads") == 8);  // absent: the document's own heads
  CHECK(recorded_config_value(config, "blocks") == 64);
  config.erase("heads");  // an older field absent: not a document gradflow wrote
  CHECK(recorded_config_value(config, "heads").is_null());
  model.ffn = "swiglu";
  model.init = InitKind::normal;
  model.init_std = 0.006;
  const nlohmann::ordered_json swiglu = run_config_fields(model);
  CHECK(recorded_config_value(swiglu, "ffn") == "swiglu");
  CHECK(swiglu.at("init") == "normal:0.006");
}

TEST_CASE("reporters on a small result: JSON sections and the CSV header") {
  AnalysisReport report;
  report.results.push_back(tiny_result("pre-ln"));
  report.timing = false;
  const nlohmann::ordered_json document = report_to_json(report);
  CHECK(keys(document) == std::vector<std::string>{"schema_version", "tool", "command", "runs"});
  const nlohmann::ordered_json& run = document.at("runs").at(0);
  CHECK(keys(run) == std::vector<std::string>{"arch", "config", "seeds", "aggregate"});
  CHECK(keys(run.at("seeds").at(0)) == std::vector<std::string>{"seed", "states", "sublayers", "summary"});
  CHECK(run.at("seeds").at(0).at("states").at("rms").size() == 5);  // S + 1 states, S = 4
  std::ostringstream csv;
  write_csv(report, csv);
  const std::string header = csv.str().substr(0, csv.str().find("\r\n"));
  CHECK(header.starts_with(
      "arch,blocks,sublayers,width,heads,seq,norm,init,precision,seed,index,kind,block,rms,"));
  CHECK(header.find(",gain,") != std::string::npos);
}
