#include "rdma_listener.h"

#include <fcntl.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include <spdlog/spdlog.h>

#include "hello_check.h"

#include "data_plane.h"
#include "lane.h"
#include "rackhub/data/v1/control.pb.h"
#include "rackhub/net/rdma/connection.h"
#include "rackhub/net/rdma/connector.h"
#include "rackhub/net/rdma/device.h"

namespace rackhub::server {

namespace asio = boost::asio;
namespace rdma = net::rdma;
using net::FrameHeader;
using net::Opcode;
using net::WireError;

namespace {

// rdma_listen(3) backlog of connect requests not yet handled.
constexpr int kListenBacklog = 128;
// HELLO is small: tenant, token and a few integers (as over TCP).

std::string Errno(const char* call) { return std::string(call) + ": " + std::strerror(errno); }

}  // namespace

struct RdmaListener::Pending {
  std::shared_ptr<rdma::Channel> channel;
  std::unique_ptr<asio::steady_timer> timer;
  std::string peer;
  uint32_t lane = 0;  // from the connect request's private data
  // A hub link between its HUB_HELLO and HUB_PROOF: the checked hello and
  // the handshake.
  std::optional<data::v1::HubHello> hub_hello;
  std::unique_ptr<HubAcceptor> hub;
};

RdmaListener::RdmaListener(const Config& config, Registry* registry, LaneSet* lanes)
    : config_(config),
      registry_(registry),
      lanes_(lanes),
      registered_(std::make_shared<std::atomic<uint64_t>>(0)) {
  options_.ring_bytes = config.data.rdma_ring_bytes;
  options_.poll = config.data.rdma_poll == "busy" ? rdma::PollMode::kBusy : rdma::PollMode::kEvents;
  options_.device = config.data.rdma_device;
  options_.port = static_cast<uint8_t>(config.data.rdma_port);
  per_connection_bytes_ = rdma::Channel::RegisteredBytes(options_);
}

RdmaListener::~RdmaListener() {
  Stop();
  if (hub_listen_id_) rdma_destroy_id(hub_listen_id_);
  if (listen_id_) rdma_destroy_id(listen_id_);
  if (channel_) rdma_destroy_event_channel(channel_);
}

Status RdmaListener::Listen() {
  net::Endpoint ep = config_.data.rdma_listen;
  if (ep.host.empty()) {
    ep.host = config_.data.listen.host;
    if (ep.port == 0) ep.port = rdma::kDefaultRdmaPort;
  }
  const auto& topo = config_.topology;
  // Hub links of a hierarchical topology: one incoming and one outgoing per
  // lane and peer rack.
  const uint64_t hub_links =
      topo.multi_rack_exchange() ? uint64_t{lanes_->size()} * (topo.rack_count() - 1) : 0;
  // Locked memory first: the clearest failure when it is too low.
  const rdma::MemlockStatus memlock = rdma::CurrentMemlock();
  memlock_limit_ = memlock.cap_ipc_lock ? UINT64_MAX : memlock.limit;
  const uint64_t planned = per_connection_bytes_ * (lanes_->size() + 2 * hub_links);
  if (Status s = rdma::CheckMemlock(
          planned, memlock,
          "data.transport: RDMA with one worker on each of " + std::to_string(lanes_->size()) +
              " lanes" +
              (hub_links ? " and " + std::to_string(2 * hub_links) + " hub links" : std::string()) +
              " (" + std::to_string(per_connection_bytes_ >> 10) +
              " KiB per connection, data.rdma_ring_bytes x 2)");
      !s.ok()) {
    return s;
  }
  if (!(channel_ = rdma_create_event_channel())) {
    return Unavailable("data.rdma_listen " + ep.ToString() + ": " +
                       Errno("rdma_create_event_channel"));
  }
  const int flags = fcntl(channel_->fd, F_GETFL);
  fcntl(channel_->fd, F_SETFL, flags | O_NONBLOCK);
  if (rdma_create_id(channel_, &listen_id_, this, RDMA_PS_TCP) != 0) {
    return Unavailable("data.rdma_listen " + ep.ToString() + ": " + Errno("rdma_create_id"));
  }
  if (Status s = BindAndListen(listen_id_, ep, "data.rdma_listen"); !s.ok()) return s;
  device_ = rdma::DescribeCmId(listen_id_);
  net::Endpoint bound = ep;
  bound.port = ntohs(rdma_get_src_port(listen_id_));
  address_ = bound.ToString();
  bound_ = bound;
  return Status::Ok();
}

Status RdmaListener::ListenForHubs() {
  const auto& topo = config_.topology;
  if (!topo.multi_rack_exchange()) return Status::Ok();
  // This rack's interhub address, on the same event channel (so the same
  // thread and code accept hub links), unless it is the workers' address.
  const net::Endpoint& interhub = topo.racks[topo.rack].interhub;
  if (interhub.host != bound_.host || interhub.port != bound_.port) {
    if (rdma_create_id(channel_, &hub_listen_id_, this, RDMA_PS_TCP) != 0) {
      return Unavailable("topology.racks: " + Errno("rdma_create_id"));
    }
    if (Status s = BindAndListen(hub_listen_id_, interhub,
                                 "topology.racks[" + std::to_string(topo.rack) + "].interhub");
        !s.ok()) {
      rdma_destroy_id(hub_listen_id_);
      hub_listen_id_ = nullptr;
      return s;
    }
  }
  hub_links_ = true;
  // The outgoing hub links' channels (HubConnector, one per lane and peer
  // rack) are not accepted here: count them up front.
  registered_->fetch_add(per_connection_bytes_ * lanes_->size() * (topo.rack_count() - 1));
  return Status::Ok();
}

Status RdmaListener::BindAndListen(rdma_cm_id* id, const net::Endpoint& ep,
                                   const std::string& field) {
  const std::string where = field + " " + ep.ToString();
  rdma_addrinfo hints{};
  rdma_addrinfo* ai = nullptr;
  hints.ai_flags = RAI_PASSIVE;
  hints.ai_port_space = RDMA_PS_TCP;
  const std::string port = std::to_string(ep.port);
  if (rdma_getaddrinfo(ep.host.c_str(), port.c_str(), &hints, &ai) != 0 || !ai) {
    return InvalidArgument(where + ": cannot resolve '" + ep.host + "'");
  }
  // rdma_bind_addr(3): binding to a local IP also binds the id to the verbs
  // device that owns it; a wildcard address leaves it unbound.
  const int rc = rdma_bind_addr(id, ai->ai_src_addr);
  rdma_freeaddrinfo(ai);
  if (rc != 0) {
    return Unavailable(where + ": " + Errno("rdma_bind_addr") +
                       " (no RDMA device on that address?)");
  }
  int gid_index = -1;
  const std::string device = rdma::DescribeCmId(id, &gid_index);
  if (id->verbs) {
    const std::string name = ibv_get_device_name(id->verbs->device);
    if (!config_.data.rdma_device.empty() && name != config_.data.rdma_device) {
      return InvalidArgument("data.rdma_device: " + ep.host + " belongs to device " + name +
                             ", not " + config_.data.rdma_device +
                             "; pick the IP of that device in " + field);
    }
    if (config_.data.rdma_port != 0 && id->port_num != config_.data.rdma_port) {
      return InvalidArgument("data.rdma_port: " + ep.host + " (" + field + ") is on port " +
                             std::to_string(id->port_num) + " of " + name + ", not port " +
                             std::to_string(config_.data.rdma_port));
    }
    if (config_.data.rdma_gid_index != UINT32_MAX &&
        gid_index != static_cast<int>(config_.data.rdma_gid_index)) {
      return InvalidArgument("data.rdma_gid_index: rdma_cm uses GID index " +
                             std::to_string(gid_index) + " for " + ep.host + " (" + device +
                             "), not " + std::to_string(config_.data.rdma_gid_index));
    }
  }
  if (rdma_listen(id, kListenBacklog) != 0) return Unavailable(where + ": " + Errno("rdma_listen"));
  return Status::Ok();
}

std::unique_ptr<net::Connector> RdmaListener::HubConnector() const {
  return net::MakeRdmaConnector(options_);
}

std::unique_ptr<RdmaListener> RdmaListener::ListenConfigured(const Config& config,
                                                            Registry* registry, LaneSet* lanes,
                                                            bool* fatal) {
  *fatal = false;
  const std::string& transport = config.data.transport;
  if (transport == "tcp") {
    spdlog::info("data.transport = tcp: TCP data plane only");
    return nullptr;
  }
  const bool required = transport == "rdma";
  if (!rdma::DevicePresent(config.data.rdma_device)) {
    const std::string what =
        config.data.rdma_device.empty()
            ? std::string("no RDMA verbs device with an active port (ibv_devices lists none)")
            : "no active RDMA device named '" + config.data.rdma_device + "' (data.rdma_device)";
    if (required) {
      spdlog::critical("data.transport = rdma: {}", what);
      *fatal = true;
    } else {
      spdlog::info("data.transport = auto: {}; TCP data plane only", what);
    }
    return nullptr;
  }
  auto listener = std::make_unique<RdmaListener>(config, registry, lanes);
  if (Status s = listener->Listen(); !s.ok()) {
    if (required) {
      spdlog::critical("data.transport = rdma: {}", s.message());
      *fatal = true;
    } else {
      spdlog::warn("data.transport = auto: RDMA not started: {}; TCP data plane only", s.message());
    }
    return nullptr;
  }
  spdlog::info("RDMA data plane on {} ({}; {} KiB registered per connection, {} polling)",
               listener->address(), listener->device(), listener->per_connection_bytes_ >> 10,
               rdma::PollModeName(listener->options_.poll));
  const auto& topo = config.topology;
  if (!topo.multi_rack_exchange()) return listener;
  const std::string& interhub = topo.racks[topo.rack].interhub.ToString();
  if (topo.hub_tls()) {
    // TLS runs over TCP only: the hub links stay on TCP, workers may use RDMA.
    spdlog::info("rack exchange: hub links over TCP with TLS (topology.tls_cert_file), not RDMA");
    return listener;
  }
  if (Status s = listener->ListenForHubs(); !s.ok()) {
    if (required) {
      spdlog::critical("data.transport = rdma: hub links: {} (with data.transport = rdma the "
                       "hubs link over RDMA at their interhub addresses; put them on the RDMA "
                       "interface, or use data.transport = auto on every hub)",
                       s.message());
      *fatal = true;
      return nullptr;
    }
    spdlog::warn("data.transport = auto: hub links over TCP: no rdma_cm listener on {}: {}",
                 interhub, s.message());
    return listener;
  }
  spdlog::info("rack exchange: hub links over RDMA (rdma_cm on {}; the other racks' hubs are "
               "dialed at their interhub addresses)",
               interhub);
  return listener;
}

void RdmaListener::Start(DataPlane* plane) {
  plane_ = plane;
  events_fd_ = std::make_unique<asio::posix::stream_descriptor>(thread_.io(), channel_->fd);
  WatchEvents();
  thread_.Start("rackhub-rdma");
}

void RdmaListener::Stop() {
  thread_.Stop([this] {
    pending_.clear();  // their channels close; handlers still queued hold them
    if (events_fd_) events_fd_->release();
  });
}

void RdmaListener::WatchEvents() {
  events_fd_->async_wait(asio::posix::stream_descriptor::wait_read,
                         [this](boost::system::error_code ec) {
                           if (ec || thread_.stopping()) return;
                           OnEvents();
                           WatchEvents();
                         });
}

void RdmaListener::OnEvents() {
  rdma_cm_event* ev = nullptr;
  while (rdma_get_cm_event(channel_, &ev) == 0) {
    if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
      rdma_cm_id* id = ev->id;
      const std::string data(static_cast<const char*>(ev->param.conn.private_data),
                             ev->param.conn.private_data ? ev->param.conn.private_data_len : 0);
      rdma_ack_cm_event(ev);  // the new id is ours now (rdma_get_cm_event(3))
      OnConnectRequest(id, data.data(), data.size());
      continue;
    }
    warnings_.Warn(std::string("data: rdma listener: ") + rdma_event_str(ev->event));
    rdma_ack_cm_event(ev);
  }
}

void RdmaListener::OnConnectRequest(rdma_cm_id* id, const void* private_data, size_t bytes) {
  const auto refuse = [&](const std::string& why) {
    warnings_.Warn("data: refused RDMA connection: " + why);
    rdma_reject(id, nullptr, 0);
    rdma_destroy_id(id);
  };
  const Result<rdma::RingDescriptor> decoded = rdma::DecodeDescriptor(private_data, bytes);
  if (!decoded.ok()) return refuse(decoded.status().message());
  const rdma::RingDescriptor& peer = *decoded;
  if (peer.lane >= lanes_->size()) {
    return refuse("lane " + std::to_string(peer.lane) + " is out of range; the hub has " +
                  std::to_string(lanes_->size()) + " lanes");
  }
  if (!config_.data.rdma_device.empty() &&
      config_.data.rdma_device != ibv_get_device_name(id->verbs->device)) {
    return refuse(std::string("the request came in on device ") +
                  ibv_get_device_name(id->verbs->device) + ", data.rdma_device is " +
                  config_.data.rdma_device);
  }
  if (registered_->load() + per_connection_bytes_ > memlock_limit_) {
    return refuse(rdma::CheckMemlock(registered_->load() + per_connection_bytes_,
                                     rdma::CurrentMemlock(), "another RDMA connection")
                      .message());
  }
  Result<std::shared_ptr<rdma::Channel>> accepted = rdma::Channel::Accept(id, peer, options_);
  if (!accepted.ok()) {
    warnings_.Warn("data: cannot accept an RDMA connection: " + accepted.status().message());
    return;
  }
  std::shared_ptr<rdma::Channel> ch = *std::move(accepted);
  registered_->fetch_add(per_connection_bytes_);
  ch->SetReleaseHook([reg = registered_, n = per_connection_bytes_] { reg->fetch_sub(n); });
  const uint64_t key = next_key_++;
  auto p = std::make_unique<Pending>();
  p->channel = ch;
  p->peer = ch->peer_address();
  p->lane = peer.lane;
  p->timer = std::make_unique<asio::steady_timer>(
      thread_.io(), std::chrono::milliseconds(config_.data.hello_timeout_ms));
  p->timer->async_wait([this, key](boost::system::error_code ec) {
    if (ec) return;
    const auto it = pending_.find(key);
    const bool hub = it != pending_.end() && it->second->hub;
    Refuse(key, WireError::kMalformed,
           hub ? "hub link: the handshake did not finish within data.hello_timeout_ms"
               : "hello: no HELLO within data.hello_timeout_ms");
  });
  pending_[key] = std::move(p);
  rdma::Channel::Callbacks cb;
  cb.on_frame = [this, key](const FrameHeader& h, std::span<const std::byte> payload) {
    OnFirstFrame(key, h, payload);
  };
  cb.on_violation = [this, key](const std::string& text) {
    Refuse(key, WireError::kMalformed, text);
  };
  cb.on_closed = [this, key](const std::string&) { Drop(key); };
  ch->Attach(thread_.io(), std::move(cb));
}

void RdmaListener::Drop(uint64_t key) { pending_.erase(key); }

void RdmaListener::Refuse(uint64_t key, WireError code, const std::string& text) {
  const auto it = pending_.find(key);
  if (it == pending_.end()) return;
  Pending& p = *it->second;
  warnings_.Warn("data: refused RDMA connection from " + p.peer + ": " +
                 std::string(net::WireErrorName(code)) + ": " + text);
  p.timer->cancel();
  FrameHeader h;
  h.opcode = Opcode::kError;
  h.flags = net::kFlagFatal;
  rdma::OutgoingFrame f;
  f.owned = net::EncodeErrorBody(code, text);
  h.payload_bytes = static_cast<uint32_t>(f.owned.size());
  net::EncodeHeader(h, f.header);
  f.close_after = true;
  auto ch = p.channel;  // Send may close it, which erases the entry
  ch->Send(std::move(f));
}

void RdmaListener::OnFirstFrame(uint64_t key, const FrameHeader& h,
                                std::span<const std::byte> payload) {
  const auto it = pending_.find(key);
  if (it == pending_.end()) return;
  if (it->second->hub) return OnHubProof(key, h, payload);
  if (h.opcode == Opcode::kHubHello) return OnHubHello(key, h, payload);
  OnHello(key, h, payload);
}

void RdmaListener::OnHello(uint64_t key, const FrameHeader& h, std::span<const std::byte> payload) {
  const auto it = pending_.find(key);
  if (it == pending_.end()) return;
  const auto fail = [&](WireError code, const std::string& text) { Refuse(key, code, text); };
  if (Status s = CheckHelloHeader(h); !s.ok()) return fail(WireError::kMalformed, s.message());
  // The same checks as the TCP acceptor.
  auto checked = CheckHello(payload, *registry_, config_.topology, lanes_->size());
  if (!checked.ok) return fail(checked.code, checked.text);
  const auto& hello = checked.hello;
  const TenantInfo& tenant = checked.tenant;
  Pending& p = *it->second;
  if (hello.lane() >= lanes_->size() || hello.lane() != p.lane) {
    return fail(WireError::kInvalidArgument,
                "lane: HELLO names lane " + std::to_string(hello.lane()) +
                    ", the RDMA connection was set up for lane " + std::to_string(p.lane));
  }
  net::ConnectionIdentity id;
  id.tenant_handle = tenant.handle;
  id.tenant = tenant.name;
  id.rank = hello.rank();
  id.lane = hello.lane();
  id.session = hello.session();
  id.peer = "rdma:" + p.peer;
  id.rack = hello.rack();
  const uint64_t seq = plane_->NextSeq();
  const uint32_t lane = id.lane;  // read before the capture below moves id
  HandOver(key, lane,
           [id = std::move(id), seq](Lane& target, std::shared_ptr<rdma::Channel> ch) mutable {
             target.AdoptWorker(std::make_shared<rdma::RdmaConnection>(
                                    target.worker_handler(), std::move(ch), std::move(id),
                                    &target.io()),
                                seq);
           });
}

namespace {

WireError HubLinkCode(const Status& s) {
  return s.code() == StatusCode::kUnauthenticated ? WireError::kUnauthenticated
                                                  : WireError::kInvalidArgument;
}

}  // namespace

void RdmaListener::OnHubHello(uint64_t key, const FrameHeader& h,
                              std::span<const std::byte> payload) {
  const auto it = pending_.find(key);
  if (it == pending_.end()) return;
  const auto fail = [&](const Status& s) { Refuse(key, HubLinkCode(s), "hub link: " + s.message()); };
  const auto& topo = config_.topology;
  if (!topo.multi_rack_exchange()) {
    return fail(InvalidArgument("this hub does not exchange with other racks"));
  }
  if (Status s = CheckHubHelloHeader(h); !s.ok()) {
    return Refuse(key, WireError::kMalformed, "hub link: " + s.message());
  }
  // The same checks and handshake as the TCP acceptor.
  Result<data::v1::HubHello> hello = CheckHubHello(payload, topo, lanes_->size());
  if (!hello.ok()) return fail(hello.status());
  Pending& p = *it->second;
  if (hello->lane() != p.lane) {
    return fail(InvalidArgument("HUB_HELLO names lane " + std::to_string(hello->lane()) +
                                ", the RDMA connection was set up for lane " +
                                std::to_string(p.lane)));
  }
  p.hub = std::make_unique<HubAcceptor>(plane_->hub_secret(), topo.rack);
  Result<std::string> challenge = p.hub->OnHello(*hello);
  if (!challenge.ok()) return fail(challenge.status());
  p.hub_hello = *std::move(hello);
  FrameHeader c;
  c.opcode = Opcode::kHubChallenge;
  rdma::OutgoingFrame f;
  f.owned = *std::move(challenge);
  c.payload_bytes = static_cast<uint32_t>(f.owned.size());
  net::EncodeHeader(c, f.header);
  p.channel->Send(std::move(f));
}

void RdmaListener::OnHubProof(uint64_t key, const FrameHeader& h,
                              std::span<const std::byte> payload) {
  const auto it = pending_.find(key);
  if (it == pending_.end()) return;
  const auto fail = [&](const Status& s) { Refuse(key, HubLinkCode(s), "hub link: " + s.message()); };
  if (Status s = CheckHubProofHeader(h); !s.ok()) {
    return Refuse(key, WireError::kMalformed, "hub link: " + s.message());
  }
  Pending& p = *it->second;
  Result<std::string> accept = p.hub->OnProof(payload);
  if (!accept.ok()) return fail(accept.status());
  net::ConnectionIdentity id;
  id.hub = true;
  id.rack = p.hub_hello->rack();
  id.lane = p.hub_hello->lane();
  id.peer = "rdma:" + p.peer;
  const uint32_t lane = id.lane;  // read before the capture below moves id
  HandOver(key, lane,
           [id = std::move(id), accept = *std::move(accept)](
               Lane& target, std::shared_ptr<rdma::Channel> ch) mutable {
             target.AdoptHubLink(std::make_shared<rdma::RdmaConnection>(
                                     target.hub_handler(), std::move(ch), std::move(id),
                                     &target.io()),
                                 std::move(accept));
           });
}

void RdmaListener::HandOver(uint64_t key, uint32_t lane,
                            std::function<void(Lane&, std::shared_ptr<rdma::Channel>)> adopt) {
  const auto it = pending_.find(key);
  Pending& p = *it->second;
  p.timer->cancel();
  std::shared_ptr<rdma::Channel> ch = std::move(p.channel);
  pending_.erase(it);
  ch->Detach();
  asio::post(thread_.io(), [this, ch, lane, adopt = std::move(adopt)]() mutable {
    plane_->OnLane(lane, [ch, adopt = std::move(adopt)](Lane& target) mutable {
      adopt(target, std::move(ch));
    });
  });
}

}  // namespace rackhub::server
