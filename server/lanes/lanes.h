// Lanes: one thread per lane, each pinned to one core and running its own
// Boost.Asio io_context (docs/threading.md). Everything a lane owns is touched only
// by its thread; other threads hand it work with Post().
//
// Each lane ticks a heartbeat every kHeartbeatPeriod from its own thread, so
// the systemd watchdog can be fed only while every lane really makes progress.
//
// Start/Stop are called from the main thread; Post and AllLanesAlive from any.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <time.h>

#include "rackhub/net/asio.h"

namespace rackhub::server {

class LaneSet {
 public:
  static constexpr std::chrono::milliseconds kHeartbeatPeriod{100};

  LaneSet() = default;
  ~LaneSet();
  LaneSet(const LaneSet&) = delete;
  LaneSet& operator=(const LaneSet&) = delete;

  // Starts `count` lane threads; with `pin`, lane i is pinned to the i-th CPU
  // of the process's affinity mask (wrapping around). Pinning failures are
  // logged, not fatal (containers may forbid it).
  void Start(uint32_t count, bool pin);
  // Stops every io_context and joins the threads. Idempotent.
  void Stop();

  uint32_t size() const { return static_cast<uint32_t>(lanes_.size()); }
  boost::asio::io_context& context(uint32_t lane) { return lanes_[lane]->io; }
  // Runs `fn` on lane `lane`'s thread.
  void Post(uint32_t lane, std::function<void()> fn);
  // True when every lane ticked within `max_age`.
  bool AllLanesAlive(std::chrono::steady_clock::duration max_age) const;
  // CPU each lane is pinned to (-1: not pinned).
  std::vector<int> PinnedCpus() const;
  // CPU time each lane's thread has used (seconds; its busy time: an idle
  // lane sleeps in epoll). 0 for a lane whose thread has not started or ended.
  std::vector<double> BusySeconds() const;

 private:
  struct Lane {
    boost::asio::io_context io{1};  // concurrency hint 1: one thread, no locking in Asio
    std::unique_ptr<boost::asio::steady_timer> heartbeat;
    std::atomic<int64_t> last_tick_ns{0};
    std::atomic<int> cpu{-1};
    std::atomic<bool> has_clock{false};
    clockid_t clock{};  // the thread's CPU clock, written before has_clock
    std::thread thread;
  };
  void Tick(Lane* lane);

  std::vector<std::unique_ptr<Lane>> lanes_;
};

}  // namespace rackhub::server
