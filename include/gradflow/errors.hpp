// Typed errors of the gradflow library; main maps them to exit codes once.
#pragma once
#include <stdexcept>
#include <string>

namespace gradflow {

// Bad input or usage: the message names the value and the fix. Exit code 2.
class InputError : public std::runtime_error {
 public:
  explicit InputError(const std::string& message) : std::runtime_error(message) {}
};

// A check or regression failed. Exit code 1.
class CheckFailed : public std::runtime_error {
 public:
  explicit CheckFailed(const std::string& message) : std::runtime_error(message) {}
};

enum class ExitCode : int { success = 0, check_failed = 1, bad_input = 2 };

}  // namespace gradflow
