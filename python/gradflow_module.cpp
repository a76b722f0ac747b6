// gradflow._gradflow: the Python module's native part. It runs one gradflow command line in this
// process (cli::run_cli, the code the binary runs), so that options, defaults, validation and
// messages are the CLI's own; python/gradflow/__init__.py turns keyword arguments into that
// command line and the results into Python objects (docs/python.md).
//
// While a command runs the GIL is released and the work runs on its own thread; the calling
// thread wakes every 20 ms to run Python's signal handlers (Ctrl-C) and the progress callback, so
// both happen on the interpreter's main thread. An exception from either stops the run at the
// next sublayer (the progress hook throws cli::Cancelled there) and is raised once the run ended.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <iostream>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "commands.hpp"
#include "gradflow/app/report.hpp"
#include "gradflow/kernels.hpp"

namespace py = pybind11;

namespace {

// An analyze report kept on the C++ side: rendered to the CLI's JSON or CSV text on request.
class Report {
 public:
  explicit Report(gradflow::AnalysisReport report) : report_(std::move(report)) {}
  std::string json() const {
    std::ostringstream out;
    gradflow::write_json(report_, out);
    return out.str();
  }
  std::string csv() const {
    std::ostringstream out;
    gradflow::write_csv(report_, out);
    return out.str();
  }

 private:
  gradflow::AnalysisReport report_;
};

struct Outcome {
  int code = 0;
  std::string stdout_text, message;
  std::shared_ptr<Report> report;
};

// One command line at a time: the CLI's hooks and std::cout are process-wide. The owner is
// remembered so that a call from inside a running command (its progress callback, a signal
// handler) is refused instead of waiting for itself.
std::mutex g_one_command;
std::atomic<std::thread::id> g_owner{};

// std::cout redirected into a string for the duration of a command.
class CaptureStdout {
 public:
  CaptureStdout() : previous_(std::cout.rdbuf(buffer_.rdbuf())) {}
  ~CaptureStdout() { std::cout.rdbuf(previous_); }
  CaptureStdout(const CaptureStdout&) = delete;
  CaptureStdout& operator=(const CaptureStdout&) = delete;
  std::string text() const { return buffer_.str(); }

 private:
  std::ostringstream buffer_;
  std::streambuf* previous_;
};

// Takes the one-command lock without holding the GIL (the running command needs it every 20 ms),
// answering Ctrl-C while it waits.
std::unique_lock<std::mutex> take_command_lock() {
  if (g_owner.load() == std::this_thread::get_id())
    throw std::runtime_error(
        "gradflow cannot be called while it runs a command on this thread (from a progress "
        "callback or a signal handler)");
  std::unique_lock lock(g_one_command, std::defer_lock);
  while (true) {
    {
      py::gil_scoped_release release;
      if (lock.try_lock()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
  g_owner.store(std::this_thread::get_id());
  return lock;
}

Outcome run(const std::vector<std::string>& args, const py::object& progress, bool want_report) {
  std::unique_lock one_at_a_time = take_command_lock();
  struct ReleaseOwner {
    ~ReleaseOwner() { g_owner.store(std::thread::id{}); }
  } release_owner;
  Outcome outcome;
  std::atomic<bool> cancel{false}, finished{false};
  std::atomic<long long> done{0}, total{0};
  gradflow::cli::CliHooks hooks;
  if (want_report)
    hooks.report = [&](const gradflow::AnalysisReport& report) {
      outcome.report = std::make_shared<Report>(report);
    };
  hooks.progress = [&](long long now, long long of) {
    done.store(now), total.store(of);
    if (cancel.load()) throw gradflow::cli::Cancelled();
  };
  hooks.stdout_captured = true;
  std::mutex mutex;
  std::condition_variable wake;
  py::object raised_type, raised_value, raised_trace;  // a Python exception to raise after the run
  std::exception_ptr failure;                          // a C++ one (should not happen: run_cli catches all)
  {
    CaptureStdout captured;
    gradflow::cli::CliOutcome result;
    py::gil_scoped_release release;
    std::thread worker([&] {
      try {
        result = gradflow::cli::run_cli("gradflow", args, &hooks);  // catches everything itself
      } catch (...) {
        failure = std::current_exception();
      }
      std::lock_guard lock(mutex);
      finished.store(true);
      wake.notify_all();
    });
    long long reported = -1;
    for (bool last = false; !last;) {
      {
        std::unique_lock lock(mutex);
        wake.wait_for(lock, std::chrono::milliseconds(20), [&] { return finished.load(); });
      }
      last = finished.load();  // one more pass after the end: the callback sees the final count
      py::gil_scoped_acquire acquire;
      try {
        if (!raised_type && PyErr_CheckSignals() != 0) throw py::error_already_set();  // Ctrl-C
        if (!raised_type && !progress.is_none() && total.load() > 0 && done.load() != reported) {
          reported = done.load();
          progress(reported, total.load());
        }
      } catch (py::error_already_set& error) {
        raised_type = error.type(), raised_value = error.value(), raised_trace = error.trace();
        cancel.store(true);
      } catch (...) {
        if (!failure) failure = std::current_exception();
        cancel.store(true);
      }
    }
    worker.join();
    outcome.code = result.code;
    outcome.message = result.message;
    outcome.stdout_text = captured.text();
  }
  if (raised_type) {
    PyErr_Restore(raised_type.release().ptr(), raised_value.release().ptr(), raised_trace.release().ptr());
    throw py::error_already_set();
  }
  if (failure) std::rethrow_exception(failure);
  return outcome;
}

// Text as str; bytes that are not UTF-8 (a message may quote a malformed file) become U+FFFD.
py::str text(const std::string& bytes) {
  return py::reinterpret_steal<py::str>(
      PyUnicode_DecodeUTF8(bytes.data(), static_cast<Py_ssize_t>(bytes.size()), "replace"));
}

// (exit code, message, rows): a subcommand's options as the CLI declares them (cli::option_table),
// each row a dict of names, flag, kind and several; code 2 and the line when the app cannot be
// built (a broken placement file) or the subcommand is unknown.
py::tuple options(const std::string& subcommand) {
  std::unique_lock one_at_a_time = take_command_lock();  // the registry is process-wide, as for run
  struct ReleaseOwner {
    ~ReleaseOwner() { g_owner.store(std::thread::id{}); }
  } release_owner;
  const gradflow::cli::OptionTable table = gradflow::cli::option_table(subcommand);
  py::list rows;
  for (const gradflow::cli::OptionRow& row : table.rows) {
    py::dict entry;
    entry["names"] = row.names;
    entry["flag"] = row.flag;
    entry["kind"] = row.kind;
    entry["several"] = row.several;
    rows.append(entry);
  }
  return py::make_tuple(table.outcome.code, text(table.outcome.message), rows);
}

}  // namespace

PYBIND11_MODULE(_gradflow, module) {
  module.doc() = "gradflow's native part: one command line run in this process (see the gradflow package)";
  gradflow::use_single_threaded_blas();  // as the binary's main: the library leaves OpenBLAS's threads alone
  py::class_<Report, std::shared_ptr<Report>>(module, "Report")
      .def("json", &Report::json, "The analyze JSON document, as the CLI writes it")
      .def("csv", &Report::csv, "The analyze CSV, as the CLI writes it");
  py::class_<Outcome>(module, "Outcome")
      .def_readonly("code", &Outcome::code)
      .def_property_readonly("stdout", [](const Outcome& o) { return text(o.stdout_text); })
      .def_property_readonly("message", [](const Outcome& o) { return text(o.message); })
      .def_readonly("report", &Outcome::report);
  module.def("run", &run, py::arg("args"), py::arg("progress") = py::none(), py::arg("want_report") = false,
             "Runs one gradflow command line (without the program name) in this process; returns its exit "
             "code, its stdout, its one-line message and, with want_report, analyze's report (which is then "
             "not written to stdout)");
  module.def("options", &options, py::arg("subcommand"),
             "(exit code, message, rows): the options of one subcommand as the command line declares them, "
             "each a dict: names (long names without --), flag (takes no value), kind (whole, real or text: "
             "of each item for a list) and several (repeat: one occurrence per value; join: comma-separated "
             "in one value; '': one value)");
  module.attr("version") = GRADFLOW_VERSION;
}
