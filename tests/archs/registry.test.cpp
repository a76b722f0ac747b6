// PlacementRegistry (issue 33): a value built from the built-ins plus the placements handed to it,
// with no table of the process behind it; and the app layer's registry read from directories.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "gradflow/app/placements.hpp"
#include "gradflow/errors.hpp"
#include "gradflow/placement_file.hpp"
#include "gradflow/placement_registry.hpp"

using namespace gradflow;

namespace {
const std::string kFile =
    "id = \"registry-test\"\ncitation = \"c\"\nexpected_growth = \"sqrt\"\noutput = \"N(x)\"\n"
    "[options.registry_gain]\nhelp = \"h\"\ndefault = 1.0\nrange = \"(0, inf)\"\n"
    "[constants]\ng = { value = \"1\", option = \"registry_gain\" }\n"
    "[[sublayer]]\nrule = \"x <- x + g*F(N(x))\"\n";

std::vector<std::string_view> ids(const PlacementRegistry& registry) {
  std::vector<std::string_view> out;
  for (const Architecture* arch : registry.all()) out.push_back(arch->id);
  return out;
}
}  // namespace

TEST_CASE("a PlacementRegistry holds the built-ins, and what is added to one registry is in no other") {
  PlacementRegistry first;
  const PlacementRegistry second;
  REQUIRE(ids(first) == ids(second));
  CHECK(first.find("pre-ln").id == "pre-ln");
  CHECK_THROWS_WITH_AS(first.find("PreNorm"), doctest::Contains("did you mean \"pre-ln\"?"), InputError);
  const std::size_t built_ins = first.all().size();

  const Architecture& added = first.add(load_placement_text("registry-test.toml", kFile));
  CHECK(first.all().size() == built_ins + 1);
  CHECK(&first.find("registry-test") == &added);
  CHECK(first.declaring("registry_gain") == std::vector<std::string_view>{"registry-test"});
  CHECK(second.all().size() == built_ins);
  CHECK_THROWS_AS(second.find("registry-test"), InputError);
  CHECK(second.declaring("registry_gain").empty());
  // The option is validated by the registry that declares it; the other knows no such key.
  ModelConfig config;
  config.options["registry_gain"] = -1.0;
  CHECK_THROWS_AS(first.validate_options(config), InputError);
  CHECK_THROWS_AS(second.validate_options(config), std::logic_error);
  // A taken id is refused, naming the first definition.
  CHECK_THROWS_WITH_AS(first.add(load_placement_text("again.toml", kFile)),
                       doctest::Contains("already defined by registry-test.toml"), InputError);
}

TEST_CASE("a PlacementRegistry's named files are found by path and forgotten together") {
  PlacementRegistry registry;
  const Architecture file = load_placement_text("dir/registry-test.toml", kFile);
  registry.add_named_file("dir/registry-test.toml", file);
  CHECK(&registry.find("dir/registry-test.toml") == &file);
  CHECK(&registry.find("registry-test") == &file);
  CHECK(registry.parse_list("pre-ln,registry-test").size() == 2);
  registry.forget_named_files();
  CHECK(registry.named_file("dir/registry-test.toml") == nullptr);
  CHECK_THROWS_AS(registry.find("registry-test"), InputError);
}

TEST_CASE("an Architecture from a placement file outlives the registry and the text it came from") {
  Architecture kept;
  {
    PlacementRegistry registry;
    kept = registry.add(load_placement_text("registry-test.toml", std::string(kFile)));
  }
  CHECK(kept.id == "registry-test");
  CHECK(kept.options.at(0).flag == "--registry-gain");
  CHECK(kept.definition != nullptr);
}

TEST_CASE("the app layer reads a directory's placement files into a registry") {
  const auto directory = std::filesystem::temp_directory_path() / "gradflow-test-registry-dir";
  std::filesystem::create_directories(directory);
  std::ofstream(directory / "registry-test.toml") << kFile;
  std::ofstream(directory / "ignored.txt") << "not a placement";
  const PlacementRegistry registry = read_placement_registry({directory.string()});
  CHECK(registry.all().size() == PlacementRegistry().all().size() + 1);
  CHECK(registry.find("registry-test").source == (directory / "registry-test.toml").string());
  CHECK(read_placement_registry({(directory / "missing").string()}).all().size() ==
        PlacementRegistry().all().size());
  std::filesystem::remove_all(directory);
}
