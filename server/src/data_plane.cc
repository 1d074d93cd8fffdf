#include "data_plane.h"

#include <netinet/in.h>
#include <netinet/tcp.h>

#include <fstream>
#include <future>

#include <spdlog/spdlog.h>

#include "hello_check.h"
#include "rackhub/data/v1/control.pb.h"

namespace rackhub::server {

namespace asio = boost::asio;
using asio::ip::tcp;
using net::FrameHeader;
using net::Opcode;
using net::WireError;

// Keepalive so a worker whose host vanished is noticed even without traffic:
// idle 10 s, then 5 probes 2 s apart (tcp(7)).
constexpr int kKeepAliveIdleS = 10;
constexpr int kKeepAliveIntervalS = 2;
constexpr int kKeepAliveProbes = 5;

// "ip:port" of the remote end, for logs.
static std::string PeerName(const tcp::socket& socket) {
  boost::system::error_code ec;
  const auto remote = socket.remote_endpoint(ec);
  return ec ? "?" : remote.address().to_string() + ":" + std::to_string(remote.port());
}

// Reads and checks one HELLO on the acceptor thread, then hands the socket
// over (or answers a fatal ERROR and closes).
class DataPlane::HelloSession : public std::enable_shared_from_this<HelloSession> {
 public:
  HelloSession(DataPlane* plane, tcp::socket socket)
      : plane_(plane), socket_(std::move(socket)), timer_(socket_.get_executor()) {}

  void Start() {
    peer_ = PeerName(socket_);
    timer_.expires_after(std::chrono::milliseconds(plane_->config_.data.hello_timeout_ms));
    timer_.async_wait([self = shared_from_this()](const boost::system::error_code& e) {
      if (!e && !self->done_) {
        spdlog::warn("data: {} sent no HELLO within {} ms; closing", self->peer_,
                     self->plane_->config_.data.hello_timeout_ms);
        self->Fail(WireError::kMalformed, "hello: no HELLO within data.hello_timeout_ms");
      }
    });
    asio::async_read(socket_, asio::buffer(header_buf_),
                     [self = shared_from_this()](const boost::system::error_code& e, size_t) {
                       self->OnHeader(e);
                     });
  }

 private:
  void OnHeader(const boost::system::error_code& ec) {
    if (ec || done_) return Finish();
    header_ = net::DecodeHeader(header_buf_);
    if (auto error = CheckHelloHeader(header_); !error.empty()) {
      return Fail(WireError::kMalformed, error);
    }
    payload_.resize(header_.payload_bytes);
    asio::async_read(socket_, asio::buffer(payload_),
                     [self = shared_from_this()](const boost::system::error_code& e, size_t) {
                       self->OnPayload(e);
                     });
  }

  void OnPayload(const boost::system::error_code& ec) {
    if (ec || done_) return Finish();
    auto checked = CheckHello(payload_, *plane_->registry_, plane_->config_.topology,
                              static_cast<uint32_t>(plane_->services_.size()));
    if (!checked.ok) return Fail(checked.code, checked.text);
    const auto& hello = checked.hello;
    const TenantInfo& tenant = checked.tenant;
    done_ = true;
    timer_.cancel();
    net::ConnectionIdentity id{tenant.handle, tenant.name, hello.rank(), hello.lane(), peer_,
                               hello.rack(), false};
    plane_->HandOver(std::move(socket_), std::move(id));
  }

  void Fail(WireError code, const std::string& text) {
    if (done_) return;
    done_ = true;
    timer_.cancel();
    spdlog::warn("data: refused connection from {}: {}: {}", peer_, net::WireErrorName(code),
                 text);
    FrameHeader h;
    h.opcode = Opcode::kError;
    h.flags = net::kFlagFatal;
    h.request_id = header_.request_id;
    error_body_ = net::EncodeErrorBody(code, text);
    h.payload_bytes = static_cast<uint32_t>(error_body_.size());
    net::EncodeHeader(h, error_header_);
    std::array<asio::const_buffer, 2> buffers = {asio::buffer(error_header_),
                                                 asio::buffer(error_body_)};
    asio::async_write(socket_, buffers,
                      [self = shared_from_this()](const boost::system::error_code&, size_t) {
                        self->Finish();
                      });
  }

  void Finish() {
    done_ = true;
    timer_.cancel();
    boost::system::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }

  DataPlane* plane_;
  tcp::socket socket_;
  asio::steady_timer timer_;
  std::string peer_;
  bool done_ = false;
  std::array<std::byte, net::kHeaderBytes> header_buf_{};
  FrameHeader header_{};
  std::vector<std::byte> payload_;
  std::array<std::byte, net::kHeaderBytes> error_header_{};
  std::string error_body_;
};

DataPlane::DataPlane(const Config& config, Registry* registry, LaneSet* lanes)
    : config_(config), registry_(registry), lanes_(lanes) {
  for (uint32_t i = 0; i < lanes->size(); ++i) {
    services_.push_back(std::make_unique<LaneService>(i, lanes->size(), config, registry, this,
                                                      &lanes->context(i)));
  }
  for (uint32_t r = 0; r < config.topology.rack_count(); ++r) {
    link_counters_.push_back(std::make_unique<LinkCounters>());
  }
  if (!config.topology.secret_file.empty()) {
    std::ifstream f(config.topology.secret_file);
    std::getline(f, hub_secret_);
  }
  registry_->SetObserver(this);
}

void DataPlane::CountRackBytes(uint32_t rack, uint64_t out, uint64_t in) {
  if (rack >= link_counters_.size()) return;
  link_counters_[rack]->bytes_out.fetch_add(out, std::memory_order_relaxed);
  link_counters_[rack]->bytes_in.fetch_add(in, std::memory_order_relaxed);
}

void DataPlane::CountRackChunkBytes(uint32_t rack, uint64_t out) {
  if (rack < link_counters_.size()) {
    link_counters_[rack]->chunk_bytes_out.fetch_add(out, std::memory_order_relaxed);
  }
}

std::vector<DataPlane::RackLinkStats> DataPlane::RackLinks() const {
  std::vector<RackLinkStats> out;
  if (!config_.topology.multi_rack_exchange()) return out;
  for (uint32_t r = 0; r < link_counters_.size(); ++r) {
    if (r == config_.topology.rack) continue;
    out.push_back({r, link_counters_[r]->bytes_out.load(), link_counters_[r]->bytes_in.load(),
                   link_counters_[r]->chunk_bytes_out.load()});
  }
  return out;
}

// Reads and checks a HUB_HELLO on the acceptor thread, then hands the link
// to the lane it names.
class DataPlane::HubHelloSession : public std::enable_shared_from_this<HubHelloSession> {
 public:
  HubHelloSession(DataPlane* plane, tcp::socket socket)
      : plane_(plane), socket_(std::move(socket)), timer_(socket_.get_executor()) {}

  void Start() {
    peer_ = PeerName(socket_);
    timer_.expires_after(std::chrono::milliseconds(plane_->config_.data.hello_timeout_ms));
    timer_.async_wait([self = shared_from_this()](const boost::system::error_code& e) {
      if (!e) self->Close("no HUB_HELLO in time");
    });
    asio::async_read(socket_, asio::buffer(header_),
                     [self = shared_from_this()](const boost::system::error_code& e, size_t) {
                       self->OnHeader(e);
                     });
  }

 private:
  void OnHeader(const boost::system::error_code& ec) {
    if (ec) return Close(ec.message());
    const FrameHeader h = net::DecodeHeader(header_);
    if (!net::ValidateHeader(h).empty() || h.opcode != Opcode::kHubHello ||
        h.payload_bytes == 0 || h.payload_bytes > kMaxHelloBytes) {
      return Close("the first frame is not a HUB_HELLO");
    }
    payload_.resize(h.payload_bytes);
    asio::async_read(socket_, asio::buffer(payload_),
                     [self = shared_from_this()](const boost::system::error_code& e, size_t) {
                       self->OnPayload(e);
                     });
  }

  void OnPayload(const boost::system::error_code& ec) {
    if (ec) return Close(ec.message());
    data::v1::HubHello hello;
    const auto& topo = plane_->config_.topology;
    if (!hello.ParseFromArray(payload_.data(), static_cast<int>(payload_.size()))) {
      return Close("HUB_HELLO is not a HubHello");
    }
    if (hello.secret() != plane_->hub_secret_) return Close("wrong hub secret");
    if (hello.racks() != topo.rack_count() || hello.rack() >= topo.rack_count() ||
        hello.rack() == topo.rack) {
      return Close("rack " + std::to_string(hello.rack()) + " of " +
                   std::to_string(hello.racks()) + " does not fit this hub's topology");
    }
    if (hello.lanes() != plane_->services_.size() || hello.lane() >= plane_->services_.size()) {
      return Close("the hubs must run the same number of lanes (peer " +
                   std::to_string(hello.lanes()) + ", here " +
                   std::to_string(plane_->services_.size()) + ")");
    }
    timer_.cancel();
    net::ConnectionIdentity id;
    id.hub = true;
    id.rack = hello.rack();
    id.lane = hello.lane();
    id.peer = peer_;
    LaneService* service = plane_->services_[id.lane].get();
    plane_->MoveToLane(std::move(socket_), id.lane,
                       [service, id](tcp::socket s) { service->AdoptPeer(std::move(s), id); });
  }

  void Close(const std::string& why) {
    timer_.cancel();
    if (!socket_.is_open()) return;
    spdlog::warn("rack link: refused a hub link from {}: {}", peer_, why);
    boost::system::error_code ignored;
    socket_.close(ignored);
  }

  DataPlane* plane_;
  tcp::socket socket_;
  asio::steady_timer timer_;
  std::string peer_;
  std::array<std::byte, net::kHeaderBytes> header_{};
  std::vector<std::byte> payload_;
};

bool DataPlane::ListenForHubs() {
  const auto& topo = config_.topology;
  if (!topo.multi_rack_exchange()) return true;
  const net::Endpoint& ep = topo.racks[topo.rack].interhub;
  try {
    tcp::resolver resolver(*acceptor_io_);
    const auto endpoint = resolver.resolve(ep.host, std::to_string(ep.port)).begin()->endpoint();
    hub_acceptor_ = std::make_unique<tcp::acceptor>(*acceptor_io_);
    hub_acceptor_->open(endpoint.protocol());
    hub_acceptor_->set_option(asio::socket_base::reuse_address(true));
    hub_acceptor_->bind(endpoint);
    hub_acceptor_->listen();
  } catch (const std::exception& e) {
    spdlog::critical("topology.racks: cannot listen for hubs on {}: {}", ep.ToString(), e.what());
    return false;
  }
  spdlog::info("rack exchange: rack {} of {}, hub links on {}", topo.rack, topo.rack_count(),
               ep.ToString());
  AcceptHubNext();
  for (auto& s : services_) {
    LaneService* service = s.get();
    lanes_->Post(service->lane(), [service] { service->StartPeerLinks(); });
  }
  return true;
}

void DataPlane::AcceptHubNext() {
  hub_acceptor_->async_accept([this](const boost::system::error_code& ec, tcp::socket socket) {
    if (ec) {
      if (ec == asio::error::operation_aborted || stopping_) return;
      spdlog::warn("rack link: accept failed: {}", ec.message());
    } else {
      boost::system::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      std::make_shared<HubHelloSession>(this, std::move(socket))->Start();
    }
    if (!stopping_) AcceptHubNext();
  });
}

DataPlane::~DataPlane() {
  registry_->SetObserver(nullptr);
  if (acceptor_thread_.joinable()) {
    acceptor_io_->stop();
    acceptor_thread_.join();
  }
}

void DataPlane::Start(asio::io_context* acceptor_io, tcp::acceptor* acceptor) {
  acceptor_io_ = acceptor_io;
  acceptor_ = acceptor;
  AcceptNext();
  hubs_ok_ = ListenForHubs();
  acceptor_thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "rackhub-accept");
    auto guard = asio::make_work_guard(*acceptor_io_);
    acceptor_io_->run();
  });
}

void DataPlane::AcceptNext() {
  acceptor_->async_accept([this](const boost::system::error_code& ec, tcp::socket socket) {
    if (ec) {
      if (ec == asio::error::operation_aborted || stopping_) return;
      spdlog::warn("data: accept failed: {}", ec.message());
    } else {
      boost::system::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      socket.set_option(asio::socket_base::keep_alive(true), ignored);
      const int fd = socket.native_handle();
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &kKeepAliveIdleS, sizeof(int));
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &kKeepAliveIntervalS, sizeof(int));
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &kKeepAliveProbes, sizeof(int));
      std::make_shared<HelloSession>(this, std::move(socket))->Start();
    }
    if (!stopping_) AcceptNext();
  });
}

void DataPlane::HandOver(tcp::socket socket, net::ConnectionIdentity id) {
  const uint32_t lane = id.lane;
  const uint64_t seq = NextSeq();
  LaneService* service = services_[lane].get();
  MoveToLane(std::move(socket), lane, [service, id = std::move(id), seq](tcp::socket s) mutable {
    service->AdoptTcp(std::move(s), std::move(id), seq);
  });
}

void DataPlane::MoveToLane(tcp::socket socket, uint32_t lane,
                           std::function<void(tcp::socket)> adopt) {
  // Move the descriptor from the acceptor's io_context to the lane's.
  boost::system::error_code ec;
  const auto protocol = socket.local_endpoint(ec).protocol();
  const int fd = socket.release(ec);
  if (ec) {
    spdlog::error("data: cannot hand a connection to lane {}: {}", lane, ec.message());
    return;
  }
  auto& io = lanes_->context(lane);
  lanes_->Post(lane, [&io, protocol, fd, adopt = std::move(adopt)]() mutable {
    tcp::socket s(io);
    boost::system::error_code assign_ec;
    s.assign(protocol, fd, assign_ec);
    if (assign_ec) {
      ::close(fd);
      return;
    }
    adopt(std::move(s));
  });
}

void DataPlane::Shutdown(std::chrono::milliseconds grace) {
  stopping_ = true;
  if (acceptor_io_) {
    asio::post(*acceptor_io_, [this] {
      boost::system::error_code ignored;
      acceptor_->close(ignored);
      if (hub_acceptor_) hub_acceptor_->close(ignored);
    });
  }
  for (auto& s : services_) {
    LaneService* service = s.get();
    lanes_->Post(service->lane(), [service] { service->Shutdown(); });
  }
  // Wait for the lanes to flush their SHUTTING_DOWN frames and close.
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (std::chrono::steady_clock::now() < deadline) {
    size_t open = 0;
    for (auto& s : services_) {
      LaneService* service = s.get();
      std::promise<size_t> count;
      auto f = count.get_future();
      lanes_->Post(service->lane(), [service, &count] { count.set_value(service->connection_count()); });
      open += f.get();
    }
    if (open == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (acceptor_thread_.joinable()) {
    acceptor_io_->stop();
    acceptor_thread_.join();
  }
}

void DataPlane::WorkerLost(uint32_t handle, uint32_t rank, const std::string& why) {
  const uint64_t before = seq_.load() + 1;
  for (auto& s : services_) {
    LaneService* service = s.get();
    lanes_->Post(service->lane(),
                 [service, handle, rank, before, why] { service->OnWorkerLost(handle, rank, before, why); });
  }
}

std::shared_ptr<KeyRuntime> DataPlane::KeyRuntimeFor(uint32_t handle, uint32_t key_id) {
  std::lock_guard lock(runtime_mu_);
  auto& rt = runtimes_[{handle, key_id}];
  if (!rt) rt = std::make_shared<KeyRuntime>();
  return rt;
}

void DataPlane::ChunkInitialized(uint32_t handle, uint32_t key_id, uint64_t chunk_count) {
  const auto rt = KeyRuntimeFor(handle, key_id);
  if (rt->initialized_chunks.fetch_add(1) + 1 == chunk_count) {
    registry_->MarkKeyReady(handle, key_id);
  }
}

void DataPlane::OnTenantDeleted(uint32_t handle) {
  for (auto& s : services_) {
    LaneService* service = s.get();
    lanes_->Post(service->lane(), [service, handle] { service->OnTenantDeleted(handle); });
  }
  std::lock_guard lock(runtime_mu_);
  std::erase_if(runtimes_, [handle](const auto& kv) { return kv.first.first == handle; });
}

void DataPlane::OnKeyDeleted(uint32_t handle, uint32_t key_id) {
  for (auto& s : services_) {
    LaneService* service = s.get();
    lanes_->Post(service->lane(), [service, handle, key_id] { service->OnKeyDeleted(handle, key_id); });
  }
  std::lock_guard lock(runtime_mu_);
  runtimes_.erase({handle, key_id});
}

void DataPlane::OnOptimizerChanged(uint32_t handle, uint32_t key_id,
                                   const aggregation::OptimizerConfig& optimizer,
                                   uint64_t from_update) {
  for (auto& s : services_) {
    LaneService* service = s.get();
    lanes_->Post(service->lane(), [service, handle, key_id, optimizer, from_update] {
      service->OnOptimizerChanged(handle, key_id, optimizer, from_update);
    });
  }
}

}  // namespace rackhub::server
