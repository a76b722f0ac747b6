// The values a stack's history reads take (attend, history_sum, history_mean; docs/placement-files.md,
// "Reading a history"), kept state by state: per stream some read takes, each member state's value
// and key, and the running sum of the member states before each state (the uniform reads' shortcut,
// DepthHistory::prefix). StackRun keeps one for its pass (the values are its stored states); --update
// keeps one per stepped pass (update.cpp: copies, since the stepped state is overwritten).
#pragma once
#include <deque>
#include <vector>

#include "gradflow/depth_attention.hpp"
#include "gradflow/graph.hpp"

namespace gradflow {

template <typename Scalar>
class DepthHistoryStore {
 public:
  // Its views point into the store (and into the states it was given), so it stays where it is made.
  DepthHistoryStore() = default;
  DepthHistoryStore(const DepthHistoryStore&) = delete;
  DepthHistoryStore& operator=(const DepthHistoryStore&) = delete;

  // streams[s]: some read takes stream s's history; members[s][j]: state j of stream s is a source
  // (SublayerGraph::history_member of sublayer j's graph); states: S + 1; running_sums: keep the
  // prefix sums (false under AnalysisHooks::attend_in_full, where every read takes its sources).
  void reset(const std::vector<bool>& streams, const std::vector<std::vector<char>>& members, int states,
             bool running_sums, double eps) {
    members_ = &members;
    eps_ = eps;
    values_.assign(streams.size(), {});
    keys_.assign(streams.size(), {});
    prefix_.assign(streams.size(), {});
    copies_.clear();
    for (std::size_t s = 0; s < streams.size(); ++s) {
      if (!streams[s]) continue;
      values_[s].assign(static_cast<std::size_t>(states), nullptr);
      keys_[s].resize(static_cast<std::size_t>(states));
      if (running_sums) prefix_[s].resize(static_cast<std::size_t>(states));
    }
  }

  // Stores state j (after states 0 .. j-1): each member stream's value (a copy when `copy`, else the
  // caller's, which must stay in place) and key, and the sum of the member states before j.
  void store(int j, const std::vector<Mat<Scalar>>& state, bool copy) {
    const auto at = static_cast<std::size_t>(j);
    for (std::size_t s = 0; s < values_.size(); ++s) {
      if (values_[s].empty()) continue;
      if (!prefix_[s].empty()) {
        if (j == 0) {
          prefix_[s][0].setZero(state[s].rows(), state[s].cols());  // no state before x_0
        } else {
          prefix_[s][at] = prefix_[s][at - 1];
          if (member(s, j - 1)) prefix_[s][at] += *values_[s][at - 1];
        }
      }
      if (!member(s, j)) continue;
      values_[s][at] = copy ? &copies_.emplace_back(state[s]) : &state[s];
      depth_key(*values_[s][at], eps_, keys_[s][at]);
    }
  }

  bool reads(std::size_t s) const { return !values_[s].empty(); }  // some read takes stream s's history
  bool member(std::size_t s, int j) const { return (*members_)[s][static_cast<std::size_t>(j)] != 0; }

  // The view sublayer l's reads take: per stream, its member states among 0 .. l-1 (values and keys)
  // and, with `sums`, their running sum; the cotangents and tangents are the caller's.
  void point(DepthHistory<Scalar>& view, int l, bool sums) const {
    const std::size_t streams = values_.size();
    view.earlier.resize(streams);
    view.prefix.assign(streams, nullptr);
    for (std::size_t s = 0; s < streams; ++s) {
      view.earlier[s].clear();
      if (!reads(s)) continue;
      if (sums && !prefix_[s].empty()) view.prefix[s] = &prefix_[s][static_cast<std::size_t>(l)];
      for (int j = 0; j < l; ++j)
        if (member(s, j)) view.earlier[s].push_back({values_[s][j], &keys_[s][j]});
    }
  }

 private:
  const std::vector<std::vector<char>>* members_ = nullptr;
  double eps_ = 0;
  std::vector<std::vector<const Mat<Scalar>*>> values_;  // per stream, per state: null unless a member
  std::vector<std::vector<DepthKey<Scalar>>> keys_;
  std::vector<std::vector<Mat<Scalar>>> prefix_;  // prefix_[s][j]: the member states 0 .. j-1 summed
  std::deque<Mat<Scalar>> copies_;                // stable addresses for the copied values
};

}  // namespace gradflow
