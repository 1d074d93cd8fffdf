// net::Connector over RDMA: Channel::Connect on a helper thread, the
// RdmaConnection built on the caller's io_context (see rdma/connector.h).
#include "rackhub/net/rdma/connector.h"

#include <pthread.h>

#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>

#include "rackhub/net/rdma/connection.h"

namespace rackhub::net {

namespace {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

// Channel::Connect keeps its deadline for resolution and connection, but not
// for name lookup (rdma_getaddrinfo(3) may ask a resolver); the destructor
// waits this much longer for the helper threads before giving up on them.
constexpr auto kHelperGrace = std::chrono::seconds(2);

// What the connector and its helper threads share; outlives both.
struct Shared {
  std::mutex mu;
  std::condition_variable idle;
  size_t helpers = 0;      // GUARDED_BY(mu): helper threads not finished
  bool abandoned = false;  // GUARDED_BY(mu): the connector was destroyed
};

class RdmaConnector final : public Connector {
 public:
  RdmaConnector(const rdma::ChannelOptions& options, std::chrono::milliseconds timeout)
      : options_(options), timeout_(timeout), shared_(std::make_shared<Shared>()) {}

  ~RdmaConnector() override {
    // After this no helper posts to a caller's io_context, and completions
    // already posted do nothing (they check `abandoned`).
    std::unique_lock lock(shared_->mu);
    shared_->abandoned = true;
    shared_->idle.wait_for(lock, timeout_ + kHelperGrace, [this] { return shared_->helpers == 0; });
  }

  const char* name() const override { return "rdma"; }

  void Connect(asio::io_context& io, const Endpoint& to, FrameHandler* handler,
               ConnectionIdentity id, Done done) override {
    auto job = std::make_shared<Job>(Job{shared_, options_, Clock::now() + timeout_, &io, to,
                                         handler, std::move(id), std::move(done), nullptr, ""});
    {
      std::lock_guard lock(shared_->mu);
      ++shared_->helpers;
    }
    try {
      std::thread([job] { Run(job); }).detach();
    } catch (const std::system_error& e) {
      // No thread (out of threads or memory): `done` is still ours.
      {
        std::lock_guard lock(shared_->mu);
        --shared_->helpers;
      }
      asio::post(io, [job, why = std::string(e.what())] {
        job->done(Unavailable("rdma " + job->to.ToString() + ": cannot start a connect thread: " +
                              why));
      });
    }
  }

 private:
  // One connect; the helper thread holds it until it is posted back.
  struct Job {
    std::shared_ptr<Shared> shared;
    rdma::ChannelOptions options;
    Clock::time_point deadline;
    asio::io_context* io;
    Endpoint to;
    FrameHandler* handler;
    ConnectionIdentity id;
    Done done;
    std::shared_ptr<rdma::Channel> channel;  // set by the helper on success
    std::string error;                       // set by the helper on failure
  };

  // On the helper thread.
  static void Run(const std::shared_ptr<Job>& job) {
    pthread_setname_np(pthread_self(), "rackhub-rdmacon");  // 15 characters at most
    Result<std::shared_ptr<rdma::Channel>> connected =
        rdma::Channel::Connect(job->to, job->id.lane, job->options, job->deadline);
    if (connected.ok()) {
      job->channel = *std::move(connected);
    } else {
      job->error = connected.status().message();
    }
    const std::shared_ptr<Shared> shared = job->shared;
    std::unique_lock lock(shared->mu);
    if (shared->abandoned) {
      // Nobody wants the result: release it here, before this thread counts
      // as finished (after that nothing of it may run).
      lock.unlock();
      Abandon(*job);
      lock.lock();
    } else {
      // Posted under the lock: the destructor cannot return (and the caller
      // cannot destroy `io`) in between. This thread touches the job no more.
      asio::post(*job->io, [job] { Finish(*job); });
    }
    --shared->helpers;
    shared->idle.notify_all();
  }

  // On the caller's io_context thread.
  static void Finish(Job& job) {
    bool abandoned;
    {
      std::lock_guard lock(job.shared->mu);
      abandoned = job.shared->abandoned;
    }
    if (abandoned) return Abandon(job);
    Done done = std::move(job.done);
    if (!job.channel) return done(Unavailable(job.error));
    // The channel is connected and not attached yet: RdmaConnection::Start
    // attaches it to this thread.
    done(std::shared_ptr<Connection>(std::make_shared<rdma::RdmaConnection>(
        job.handler, std::move(job.channel), std::move(job.id), job.io)));
  }

  static void Abandon(Job& job) {
    if (job.channel) job.channel->Close("the connector was destroyed while connecting");
    job.channel.reset();
    job.done = nullptr;
  }

  const rdma::ChannelOptions options_;
  const std::chrono::milliseconds timeout_;
  std::shared_ptr<Shared> shared_;
};

}  // namespace

std::unique_ptr<Connector> MakeRdmaConnector(const rdma::ChannelOptions& options,
                                             std::chrono::milliseconds timeout) {
  return std::make_unique<RdmaConnector>(options, timeout);
}

}  // namespace rackhub::net
