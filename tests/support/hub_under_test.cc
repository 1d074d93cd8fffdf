#include "hub_under_test.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <thread>

#include "connection_link.h"
#include "in_process_hub.h"
#include "memory_links.h"
#include "process.h"
#include "rackhub/net/endpoint.h"
#include "rackhub/net/rdma/channel.h"
#include "rackhub/net/rdma/connection.h"
#include "rackhub/net/shm/channel.h"
#include "rackhub/net/testing/memory_connection.h"
#include "raw_client.h"
#include "rdma_env.h"

namespace rackhub::testing {

namespace rdma = net::rdma;

std::string TransportName(Transport t) {
  switch (t) {
    case Transport::kMemory: return "Memory";
    case Transport::kTcp: return "Tcp";
    case Transport::kShm: return "Shm";
    case Transport::kRdma: return "Rdma";
  }
  return "?";
}

std::vector<Transport> AllTransports() {
  return {Transport::kMemory, Transport::kTcp, Transport::kShm, Transport::kRdma};
}

std::string TransportParamName(const ::testing::TestParamInfo<Transport>& info) {
  return TransportName(info.param);
}

namespace {

// Hubs under test keep no state on disk unless the test gives a --state-dir.
bool HasStateDir(const std::vector<std::string>& args) {
  for (const auto& a : args) {
    if (a == "--state-dir" || a.rfind("--state-dir=", 0) == 0) return true;
  }
  return false;
}

// The in-process hub (in_process_hub.h) without metrics, its state in memory
// unless the test gives a --state-dir.
class MemoryHub final : public HubUnderTest {
 public:
  static std::unique_ptr<MemoryHub> Start(std::vector<std::string> args, std::string* why) {
    std::vector<std::string> argv = {"--no-metrics"};
    if (!HasStateDir(args)) argv.push_back("--in-memory");
    argv.insert(argv.end(), args.begin(), args.end());
    std::unique_ptr<InProcessHub> hub = InProcessHub::Start(argv, why);
    if (!hub) return nullptr;
    return std::unique_ptr<MemoryHub>(new MemoryHub(std::move(hub)));
  }
  ~MemoryHub() override {
    if (stopper_.joinable()) stopper_.join();
  }

  Transport transport() const override { return Transport::kMemory; }
  const std::string& admin_address() const override { return hub_->admin_address(); }
  std::string data_address() const override { return hub_->data_address(); }
  ConnectionLink::Dialer memory_dialer() override { return hub_->dialer(); }
  boost::asio::io_context* link_io() override { return &hub_->link_io(); }
  std::unique_ptr<DataLink> Connect() override {
    return std::make_unique<ConnectionLink>(hub_->link_io(), hub_->dialer());
  }
  void BeginShutdown() override {
    stopper_ = std::thread([this] { hub_->Stop(); });
  }
  int FinishShutdown() override {
    if (stopper_.joinable()) stopper_.join();
    return 0;
  }

 private:
  explicit MemoryHub(std::unique_ptr<InProcessHub> hub) : hub_(std::move(hub)) {}

  std::unique_ptr<InProcessHub> hub_;
  std::thread stopper_;
};

// A real rackhubd; TCP links, shared-memory links (`shm`), or RDMA links
// when `rdma_ip` is set.
class ProcessHub final : public HubUnderTest {
 public:
  ProcessHub(std::vector<std::string> args, std::string rdma_ip, bool shm) : shm_(shm) {
    args.insert(args.begin(), "--no-pin-lanes");
    if (!HasStateDir(args)) args.insert(args.begin(), "--in-memory");
    if (!rdma_ip.empty()) {
      // rdma_cm ports are not in the ready file: a fixed port per daemon.
      static int instance = 0;
      rdma_address_ = rdma_ip + ":" + std::to_string(21000 + (getpid() % 2000) * 8 + instance++ % 8);
      args.insert(args.end(), {"--transport", "rdma", "--rdma-listen", rdma_address_});
    }
    daemon_ = std::make_unique<DaemonProcess>(args);
  }
  bool started() const { return daemon_->started(); }

  Transport transport() const override {
    return shm_ ? Transport::kShm : rdma_address_.empty() ? Transport::kTcp : Transport::kRdma;
  }
  const std::string& admin_address() const override { return daemon_->admin_address(); }
  std::string data_address() const override { return daemon_->data_address(); }
  std::string rdma_address() const override { return rdma_address_; }
  DaemonProcess* daemon() override { return daemon_.get(); }
  std::unique_ptr<DataLink> Connect() override {
    if (shm_) {
      return std::make_unique<ConnectionLink>(
          client_.io(), [this](const FrameHeader& h, const std::string& payload,
                               boost::asio::io_context& io,
                               net::FrameHandler* handler) { return DialShm(h, payload, io, handler); });
    }
    if (rdma_address_.empty()) return std::make_unique<RawClient>(daemon_->data_address());
    return std::make_unique<ConnectionLink>(
        client_.io(),
        [this](const FrameHeader& h, const std::string& payload, boost::asio::io_context& io,
               net::FrameHandler* handler) { return DialRdma(h, payload, io, handler); },
        time_scale());
  }
  void BeginShutdown() override { kill(daemon_->pid(), SIGTERM); }
  int FinishShutdown() override { return daemon_->Stop(SIGTERM); }

 private:
  std::shared_ptr<net::Connection> DialRdma(const FrameHeader& h, const std::string& payload,
                                            boost::asio::io_context& io,
                                            net::FrameHandler* handler) {
    data::v1::Hello hello;
    hello.ParseFromString(payload);
    const Result<net::Endpoint> ep = net::ParseEndpoint(rdma_address_);
    if (!ep.ok()) {
      ADD_FAILURE() << ep.status().message();
      return nullptr;
    }
    rdma::ChannelOptions options;
    options.ring_bytes = 1u << 20;
    Result<std::shared_ptr<rdma::Channel>> connected = rdma::Channel::Connect(
        *ep, hello.lane(), options, std::chrono::steady_clock::now() + std::chrono::seconds(60));
    if (!connected.ok()) {
      ADD_FAILURE() << "RDMA connect to " << rdma_address_ << ": "
                    << connected.status().message();
      return nullptr;
    }
    std::shared_ptr<rdma::Channel> channel = *std::move(connected);
    net::ConnectionIdentity id;
    id.peer = "rdma:" + rdma_address_;
    std::promise<std::shared_ptr<net::Connection>> made;
    boost::asio::post(io, [&] {
      auto conn = std::make_shared<rdma::RdmaConnection>(handler, channel, id, &io);
      FrameHeader hello_header = h;
      conn->SendOwned(hello_header, payload);
      conn->Start();
      made.set_value(conn);
    });
    return made.get_future().get();
  }

  // Shared memory: the hub's offer comes from its TCP port (a HELLO with
  // shm_probe, with the test's credentials), then HELLO goes to the offered
  // socket. A refusal at either step reaches the test as the ERROR frame it
  // is, through an in-memory pair (as MemoryHub refuses).
  std::shared_ptr<net::Connection> DialShm(const FrameHeader& h, const std::string& payload,
                                           boost::asio::io_context& io,
                                           net::FrameHandler* handler) {
    data::v1::Hello probe;
    probe.ParseFromString(payload);
    probe.set_shm_probe(true);
    std::optional<Frame> offer;
    {
      RawClient tcp(daemon_->data_address());
      FrameHeader ph = h;
      tcp.Send(ph, probe.SerializeAsString());
      offer = tcp.Receive();
    }
    if (!offer) {
      ADD_FAILURE() << "no answer to the shared-memory probe";
      return nullptr;
    }
    if (offer->h.opcode == Opcode::kError) return Refused(*offer, io, handler);
    data::v1::Welcome w;
    if (!w.ParseFromString(offer->payload) || w.shm_socket().empty()) {
      ADD_FAILURE() << "the hub offers no shared memory";
      return nullptr;
    }
    Result<net::shm::ConnectReply> reply =
        net::shm::Channel::Connect(w.shm_socket(), payload, net::shm::PollMode::kEvents,
                                   std::chrono::steady_clock::now() + std::chrono::seconds(10));
    if (!reply.ok()) {
      ADD_FAILURE() << "shared-memory connect: " << reply.status().message();
      return nullptr;
    }
    if (!reply->channel) return Refused({reply->refusal, reply->refusal_body}, io, handler);
    net::ConnectionIdentity id;
    id.peer = "shm:@" + w.shm_socket();
    std::promise<std::shared_ptr<net::Connection>> made;
    boost::asio::post(io, [&] {
      auto conn = std::make_shared<net::ChannelConnection<net::shm::Channel>>(
          handler, reply->channel, id, &io);
      conn->Start();
      made.set_value(conn);
    });
    return made.get_future().get();
  }

  std::shared_ptr<net::Connection> Refused(const Frame& error, boost::asio::io_context& io,
                                           net::FrameHandler* handler) {
    const net::ErrorBody body =
        net::DecodeErrorBody(std::as_bytes(std::span(error.payload.data(), error.payload.size())))
            .value_or(net::ErrorBody{WireError::kInternal, "the hub refused HELLO"});
    const WireError code = body.code;
    const std::string& text = body.text;
    net::ConnectionIdentity client_id;
    client_id.peer = "hub (refused)";
    auto pair = net::testing::MakeMemoryPair(refuser_io_.io(), &refuser_, {}, io, handler,
                                             client_id);
    boost::asio::post(refuser_io_.io(), [refusing = pair.a, code, text, rid = error.h.request_id] {
      refusing->SendError(code, text, rid, true);
      refusing->Start();
    });
    std::lock_guard lock(refused_mu_);
    refused_.push_back(pair.a);
    boost::asio::post(io, [client = pair.b] { client->Start(); });
    return pair.b;
  }

  IoThread client_;
  IoThread refuser_io_;
  Refuser refuser_;
  std::mutex refused_mu_;
  std::vector<std::shared_ptr<net::Connection>> refused_;  // GUARDED_BY(refused_mu_)
  std::string rdma_address_;
  bool shm_ = false;
  std::unique_ptr<DaemonProcess> daemon_;
};

}  // namespace

std::unique_ptr<HubUnderTest> HubUnderTest::Start(Transport transport,
                                                  std::vector<std::string> args,
                                                  std::string* why) {
  if (transport == Transport::kMemory) return MemoryHub::Start(std::move(args), why);
  std::string ip;
  if (transport == Transport::kRdma && !HaveRdma(&ip, why)) return nullptr;
  auto hub = std::make_unique<ProcessHub>(std::move(args), ip, transport == Transport::kShm);
  if (!hub->started()) {
    *why = "rackhubd did not start";
    return nullptr;
  }
  return hub;
}

}  // namespace rackhub::testing
