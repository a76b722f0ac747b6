// Shared by the parts of `check` (check_documents.cpp, check_compare.cpp, check_expect.cpp).
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace gradflow::check_detail {

using json = nlohmann::ordered_json;

// A sweep document (command "sweep" with cells), as opposed to an analyze or cell document.
bool is_sweep(const json& doc);
// Throws InputError naming `which` ("result", "baseline") and the first field that is missing,
// of the wrong type or of another schema_version.
void require_document(const json& doc, const std::string& which);

}  // namespace gradflow::check_detail
