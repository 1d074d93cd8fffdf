// SnapshotJob: one consistent in-memory copy of a tenant's chunks being
// taken for a checkpoint (docs/durability.md, Checkpoints). The Checkpointer
// fixes a target version per key; each lane copies its chunks of that key
// once they are at exactly that version (at once, or when the updates in
// progress take them there, or a skipped step does) and adds them here.
//
// Ownership: shared by the Checkpointer (which waits on it) and the lanes
// that hold it armed on their chunks.
// Threading: Add/Fail from lane threads; Wait/Take/Cancel from the thread
// that requested the checkpoint. Internally locked (not on the per-chunk
// path: a lane calls Add once per chunk per checkpoint).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "checkpoint_file.h"
#include "rackhub/common/status.h"

namespace rackhub::server {

class SnapshotJob {
 public:
  SnapshotJob(uint32_t handle, std::map<uint32_t, uint64_t> targets, size_t expected_chunks)
      : handle_(handle), targets_(std::move(targets)), expected_(expected_chunks) {}

  uint32_t handle() const { return handle_; }
  // Key id -> the version every chunk of that key is captured at.
  const std::map<uint32_t, uint64_t>& targets() const { return targets_; }

  // A lane's copy of one chunk at its key's target version.
  void Add(CheckpointChunk chunk) {
    std::lock_guard lock(mu_);
    if (cancelled_ || !error_.empty()) return;
    chunks_.push_back(std::move(chunk));
    if (chunks_.size() == expected_) cv_.notify_all();
  }
  // The snapshot cannot be completed: a key was deleted (ABORTED), or a
  // chunk went past its target before it was copied (`moved_on`: training
  // outran the checkpoint; UNAVAILABLE, the caller retries with a later
  // target). The first reason wins.
  void Fail(const std::string& why, bool moved_on = false) {
    std::lock_guard lock(mu_);
    if (error_.empty()) {
      error_ = why;
      moved_on_ = moved_on;
    }
    chunks_.clear();
    cv_.notify_all();
  }
  bool cancelled() const {
    std::lock_guard lock(mu_);
    return cancelled_ || !error_.empty();
  }

  // Waits until every chunk arrived (OK), a lane failed (ABORTED or
  // UNAVAILABLE with its reason) or `deadline` passed (DEADLINE_EXCEEDED;
  // the job is cancelled, lanes drop it when they next look).
  Status Wait(std::chrono::steady_clock::time_point deadline) {
    std::unique_lock lock(mu_);
    cv_.wait_until(lock, deadline, [this] { return chunks_.size() == expected_ || !error_.empty(); });
    if (!error_.empty()) {
      return Status(moved_on_ ? StatusCode::kUnavailable : StatusCode::kAborted, error_);
    }
    if (chunks_.size() == expected_) return {};
    cancelled_ = true;
    const size_t have = chunks_.size();
    chunks_.clear();
    return Status(StatusCode::kDeadlineExceeded,
                  std::to_string(have) + " of " + std::to_string(expected_) +
                      " chunks reached the checkpoint's iteration in time");
  }
  // After Wait returned OK.
  std::vector<CheckpointChunk> Take() {
    std::lock_guard lock(mu_);
    return std::move(chunks_);
  }

 private:
  const uint32_t handle_;
  const std::map<uint32_t, uint64_t> targets_;
  const size_t expected_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<CheckpointChunk> chunks_;  // GUARDED_BY(mu_)
  std::string error_;                    // GUARDED_BY(mu_)
  bool moved_on_ = false;                // GUARDED_BY(mu_)
  bool cancelled_ = false;               // GUARDED_BY(mu_)
};

}  // namespace rackhub::server
