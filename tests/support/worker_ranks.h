// Test support: the ranks of a multi-worker client scenario. A Rank is a
// rackhub-test-worker process (TCP, RDMA: ProcessRank) or, for the in-memory
// transport, a thread of the test process running the same worker
// (RunWorker, test_worker.h) with its own Client over in-memory lanes into
// the in-process hub (ThreadRank). ParseWorker reads a worker's --out file.
//
// Threading: a Rank is driven from the test thread; a ThreadRank runs its
// worker on its own thread and closes its links on the hub's link io.
#pragma once

#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "hub_under_test.h"
#include "process.h"
#include "rackhub/client/client.h"
#include "rackhub/client/testing.h"
#include "rackhub/net/asio.h"
#include "rackhub/net/transport.h"
#include "test_worker.h"

namespace rackhub::testing {

// Parsed --out file of a worker.
struct WorkerOutput {
  std::string text;
  std::map<std::string, uint32_t> key_ids;
  std::map<std::string, std::vector<float>> init;
  std::map<std::pair<uint64_t, std::string>, std::vector<float>> iters;
  std::vector<std::string> errors;  // "error ..." lines
  bool done = false;
};

WorkerOutput ParseWorker(const std::string& path);
// The whitespace-separated words of a worker output line, and the floats
// written as hex bit patterns from word `from` on.
std::vector<std::string> Words(const std::string& line);
std::vector<float> HexFloats(const std::vector<std::string>& words, size_t from);

// One worker of a multi-worker scenario: a rackhub-test-worker process (TCP,
// RDMA), or, in-memory, a thread of this process running the same worker
// (RunWorker, test_worker.h) with its own Client, whose lanes are in-memory
// connections into the in-process hub (client::testing::ConnectThrough).
class Rank {
 public:
  virtual ~Rank() = default;
  // The exit code (128+signal if killed), or -1 if still running after `timeout`.
  virtual int Wait(std::chrono::milliseconds timeout) = 0;
  // SIGKILL; in-memory: see ThreadRank::Kill.
  virtual void Kill() = 0;
};

class ProcessRank final : public Rank {
 public:
  ProcessRank(const std::vector<std::string>& argv, const std::string& log) : p_(argv, log) {}
  int Wait(std::chrono::milliseconds timeout) override { return p_.Wait(timeout); }
  void Kill() override { p_.Kill(SIGKILL); }

 private:
  ChildProcess p_;
};

class ThreadRank final : public Rank {
 public:
  ThreadRank(HubUnderTest& hub, std::vector<std::string> args) : hub_(hub) {
    std::packaged_task<int()> task([this, args = std::move(args)] {
      testing::WorkerHooks hooks;
      hooks.connect = [this](const client::Options& o, client::Error* e) {
        return Connect(o, e);
      };
      hooks.hang = [this] { killed_.get_future().wait(); };
      return testing::RunWorker(args, hooks);
    });
    result_ = task.get_future();
    thread_ = std::thread(std::move(task));
  }
  // A rank still running is killed (its connections closed), then joined.
  ~ThreadRank() override {
    Kill();
    thread_.join();
  }

  int Wait(std::chrono::milliseconds timeout) override {
    if (!code_) {
      if (result_.wait_for(timeout) != std::future_status::ready) return -1;
      code_ = result_.get();
    }
    return *code_;
  }
  // The in-memory stand-in for SIGKILL of a worker process: every connection
  // of the rank is closed abruptly (no BYE), which the hub sees exactly as
  // the kernel closing a killed process's sockets ("peer closed the
  // connection"); then the rank's thread, parked in --hang-at, returns
  // kKilledExitCode (its Client, broken by then, is destroyed and sends
  // nothing more).
  void Kill() override {
    std::vector<std::shared_ptr<net::Connection>> conns;
    {
      std::lock_guard lock(mu_);
      conns = conns_;
    }
    std::promise<void> closed;
    boost::asio::post(*hub_.link_io(), [&] {
      for (const auto& c : conns) c->Close("killed (test)");
      closed.set_value();
    });
    closed.get_future().wait();
    std::call_once(kill_once_, [this] { killed_.set_value(); });
  }

  // Client::Connect for a client of this process over in-memory links.
  static std::unique_ptr<client::Client> ConnectInMemory(HubUnderTest& hub, const client::Options& o,
                                                 client::Error* e) {
    return client::testing::ConnectThrough(o, *hub.link_io(), hub.memory_dialer(), e);
  }

 private:
  std::unique_ptr<client::Client> Connect(const client::Options& o, client::Error* e) {
    const auto dial = hub_.memory_dialer();
    return client::testing::ConnectThrough(
        o, *hub_.link_io(),
        [this, dial](const net::FrameHeader& h, const std::string& payload,
                     boost::asio::io_context& io, net::FrameHandler* handler) {
          auto conn = dial(h, payload, io, handler);
          std::lock_guard lock(mu_);
          if (conn) conns_.push_back(conn);
          return conn;
        },
        e);
  }

  HubUnderTest& hub_;
  std::mutex mu_;
  std::vector<std::shared_ptr<net::Connection>> conns_;  // GUARDED_BY(mu_)
  std::promise<void> killed_;
  std::once_flag kill_once_;
  std::future<int> result_;
  std::optional<int> code_;
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace rackhub::testing
