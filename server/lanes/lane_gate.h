// LaneGate: the lane's count of its own asynchronous work (timers, posted
// closures, connect completions), so shutdown is deterministic: after
// Close() no counted work runs its body any more, and WaitIdle() returns
// once every counted handler has run or been destroyed. Nothing a lane
// scheduled can then touch the lane after it is gone.
//
// Ownership: the lane owns its gate; counted handlers hold only a shared
// state block, never the gate or the lane.
// Threading: After/Wrap/Close on the lane's thread; Post, closed(),
// pending() and WaitIdle from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>

#include "rackhub/net/asio.h"

namespace rackhub::server {

class LaneGate {
 public:
  explicit LaneGate(boost::asio::io_context& io)
      : io_(io), state_(std::make_shared<State>()) {}
  LaneGate(const LaneGate&) = delete;
  LaneGate& operator=(const LaneGate&) = delete;

  // Counts a completion handler: while it exists the gate is not idle; once
  // the gate closed, calling it does nothing.
  template <class F>
  auto Wrap(F fn) {
    return [ticket = Ticket(state_), fn = std::move(fn)](auto&&... args) mutable {
      if (!ticket.state->closed.load(std::memory_order_acquire)) {
        fn(std::forward<decltype(args)>(args)...);
      }
    };
  }

  // Runs `fn` on the lane's thread after `delay`, unless the gate closed.
  void After(std::chrono::steady_clock::duration delay, std::function<void()> fn) {
    const uint64_t id = ++next_timer_;
    auto timer = std::make_shared<boost::asio::steady_timer>(io_, delay);
    timers_[id] = timer;
    timer->async_wait(Wrap([this, id, fn = std::move(fn)](const boost::system::error_code&) {
      timers_.erase(id);
      fn();
    }));
  }
  // Runs `fn` on the lane's thread unless the gate closed first.
  void Post(std::function<void()> fn) { boost::asio::post(io_, Wrap(std::move(fn))); }

  // Stops every later body from running and cancels the timers.
  void Close() {
    state_->closed.store(true, std::memory_order_release);
    auto timers = std::move(timers_);
    timers_.clear();
    for (auto& [id, t] : timers) t->cancel();
  }
  bool closed() const { return state_->closed.load(std::memory_order_acquire); }
  size_t pending() const {
    std::lock_guard lock(state_->mu);
    return state_->count;
  }
  // True once no counted handler is left (false at the deadline).
  bool WaitIdle(std::chrono::steady_clock::time_point deadline) const {
    std::unique_lock lock(state_->mu);
    return state_->idle.wait_until(lock, deadline, [this] { return state_->count == 0; });
  }

 private:
  struct State {
    std::atomic<bool> closed{false};
    mutable std::mutex mu;
    std::condition_variable idle;
    size_t count = 0;  // GUARDED_BY(mu)
  };
  // Counts while alive; copies count too (Asio may copy handlers).
  struct Ticket {
    std::shared_ptr<State> state;
    explicit Ticket(std::shared_ptr<State> s) : state(std::move(s)) { Add(); }
    Ticket(const Ticket& o) : state(o.state) { Add(); }
    Ticket(Ticket&& o) noexcept : state(o.state) { Add(); }
    Ticket& operator=(const Ticket&) = delete;
    ~Ticket() {
      std::lock_guard lock(state->mu);
      if (--state->count == 0) state->idle.notify_all();
    }
    void Add() {
      std::lock_guard lock(state->mu);
      ++state->count;
    }
  };

  boost::asio::io_context& io_;
  std::shared_ptr<State> state_;
  uint64_t next_timer_ = 0;
  std::map<uint64_t, std::shared_ptr<boost::asio::steady_timer>> timers_;  // lane thread
};

}  // namespace rackhub::server
