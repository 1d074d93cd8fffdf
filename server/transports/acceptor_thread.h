// AcceptorThread: the io_context and the thread an acceptor (TcpAcceptor,
// ShmAcceptor, RdmaListener) accepts on and runs its connections' first-frame
// sessions on, until the connections go to their lanes. One start path and
// one stop path for the three of them.
//
// Ownership: a member of its acceptor, which builds its listeners, sockets
// and timers on io() (so declare it before them: they go first). Handlers
// still queued when it is destroyed are destroyed with io() without running.
// Threading: Start and Stop from the main thread; io() and stopping() from
// the acceptor's own thread (stopping() from any thread).
#pragma once

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>
#include <utility>

#include "rackhub/net/asio.h"

namespace rackhub::server {

// A failed accept for lack of descriptors or memory is retried after this
// (TcpAcceptor, ShmAcceptor).
inline constexpr auto kAcceptRetryDelay = std::chrono::milliseconds(100);

class AcceptorThread {
 public:
  AcceptorThread() = default;
  ~AcceptorThread() { Stop([] {}); }
  AcceptorThread(const AcceptorThread&) = delete;
  AcceptorThread& operator=(const AcceptorThread&) = delete;

  boost::asio::io_context& io() { return io_; }
  // True once Stop was called: handlers then start nothing new.
  bool stopping() const { return stopping_.load(); }

  // Runs io() on a new thread named `name` (pthread_setname_np(3): at most
  // 15 characters) until Stop.
  void Start(const char* name) {
    thread_ = std::thread([this, name] {
      pthread_setname_np(pthread_self(), name);
      auto guard = boost::asio::make_work_guard(io_);
      io_.run();
    });
  }

  // Runs `close` on the thread (it closes the listeners and whatever else
  // must go before the thread does), then stops io() and joins the thread.
  // Only the first call does anything; without Start, nothing runs.
  void Stop(std::function<void()> close) {
    if (stopping_.exchange(true) || !thread_.joinable()) return;
    boost::asio::post(io_, std::move(close));
    boost::asio::post(io_, [this] { io_.stop(); });
    thread_.join();
  }

 private:
  boost::asio::io_context io_{1};
  std::thread thread_;
  std::atomic<bool> stopping_{false};
};

}  // namespace rackhub::server
