#include "lanes.h"

#include <pthread.h>
#include <sched.h>

#include <cstring>
#include <latch>

#include <spdlog/spdlog.h>

#include "config.h"

namespace rackhub::server {
namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

LaneSet::~LaneSet() { Stop(); }

void LaneSet::Start(uint32_t count, bool pin) {
  const std::vector<int> cpus = AllowedCpus();
  lanes_.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    auto lane = std::make_unique<Lane>();
    lane->last_tick_ns = NowNs();
    lane->heartbeat = std::make_unique<boost::asio::steady_timer>(lane->io);
    lanes_.push_back(std::move(lane));
  }
  // Start() returns once every lane is pinned and running.
  std::latch started(count);
  for (uint32_t i = 0; i < count; ++i) {
    Lane* lane = lanes_[i].get();
    const int cpu = (pin && !cpus.empty()) ? cpus[i % cpus.size()] : -1;
    lane->thread = std::thread([this, lane, i, cpu, &started] {
      const std::string name = "rackhub-lane" + std::to_string(i);
      pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
      if (pthread_getcpuclockid(pthread_self(), &lane->clock) == 0) {
        lane->has_clock.store(true, std::memory_order_release);
      }
      if (cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpu, &set);
        const int rc = pthread_setaffinity_np(pthread_self(), sizeof set, &set);
        if (rc == 0) {
          lane->cpu = cpu;
        } else {
          spdlog::warn("lane {}: cannot pin to cpu {}: {}", i, cpu, std::strerror(rc));
        }
      }
      Tick(lane);
      started.count_down();
      auto guard = boost::asio::make_work_guard(lane->io);
      lane->io.run();
    });
  }
  started.wait();
}

void LaneSet::Tick(Lane* lane) {
  lane->last_tick_ns.store(NowNs(), std::memory_order_relaxed);
  lane->heartbeat->expires_after(kHeartbeatPeriod);
  lane->heartbeat->async_wait([this, lane](const boost::system::error_code& ec) {
    if (!ec) Tick(lane);
  });
}

void LaneSet::Stop() {
  for (auto& lane : lanes_) lane->io.stop();
  for (auto& lane : lanes_)
    if (lane->thread.joinable()) lane->thread.join();
}

void LaneSet::Post(uint32_t lane, std::function<void()> fn) {
  boost::asio::post(lanes_.at(lane)->io, std::move(fn));
}

bool LaneSet::AllLanesAlive(std::chrono::steady_clock::duration max_age) const {
  const int64_t now = NowNs();
  const int64_t max_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(max_age).count();
  for (const auto& lane : lanes_) {
    if (now - lane->last_tick_ns.load(std::memory_order_relaxed) > max_ns) return false;
  }
  return true;
}

std::vector<double> LaneSet::BusySeconds() const {
  std::vector<double> out;
  for (const auto& lane : lanes_) {
    timespec ts{};
    // After the thread ended clock_gettime fails (EINVAL): 0.
    const bool ok = lane->has_clock.load(std::memory_order_acquire) &&
                    clock_gettime(lane->clock, &ts) == 0;
    out.push_back(ok ? static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9 : 0.0);
  }
  return out;
}

std::vector<int> LaneSet::PinnedCpus() const {
  std::vector<int> out;
  for (const auto& lane : lanes_) out.push_back(lane->cpu.load());
  return out;
}

}  // namespace rackhub::server
