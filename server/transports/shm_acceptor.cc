#include "shm_acceptor.h"

#include <sys/socket.h>

#include <spdlog/spdlog.h>

#include "rackhub/net/channel_connection.h"
#include "rackhub/net/shm/channel.h"

namespace rackhub::server {

namespace asio = boost::asio;
using local = asio::local::stream_protocol;

namespace {

// "shm:pid 1234" from the peer's credentials (unix(7), SO_PEERCRED).
std::string PeerName(local::socket& socket) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (getsockopt(socket.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return "shm:?";
  return "shm:pid " + std::to_string(cred.pid);
}

}  // namespace

ShmAcceptor::ShmAcceptor(DataPlane* plane) : plane_(plane) {
  hooks_.plane = plane;
  hooks_.waiting = &unauthenticated_;
  hooks_.warn = [this](const std::string& line) { warnings_.Warn(line); };
  hooks_.accepted = [this](HelloResult checked, Socket socket, const std::string& peer) {
    Adopt(std::move(checked), std::move(socket), peer);
  };
}

ShmAcceptor::~ShmAcceptor() { Stop(); }

Status ShmAcceptor::Listen() {
  name_ = net::shm::NewSocketName();
  try {
    acceptor_.open(local());
    acceptor_.bind(local::endpoint(std::string(1, '\0') + name_));
    acceptor_.listen();
  } catch (const std::exception& e) {
    return Unavailable("data.shm: cannot listen on the abstract socket @" + name_ + ": " +
                       e.what());
  }
  return {};
}

void ShmAcceptor::Start() {
  Accept();
  thread_.Start("rackhub-shm");
}

void ShmAcceptor::Stop() {
  thread_.Stop([this] {
    boost::system::error_code ignored;
    acceptor_.close(ignored);
  });
}

void ShmAcceptor::Accept() {
  acceptor_.async_accept([this](const boost::system::error_code& ec, Socket socket) {
    if (thread_.stopping() || ec == asio::error::operation_aborted) return;
    if (ec) {
      warnings_.Warn("data (shm): accept failed: " + ec.message() + "; retrying in 100 ms");
      retry_.expires_after(kAcceptRetryDelay);
      retry_.async_wait([this](const boost::system::error_code& e) {
        if (!e && !thread_.stopping()) Accept();
      });
      return;
    }
    const uint32_t limit = plane_->config().data.max_unauthenticated_connections;
    if (unauthenticated_ >= limit) {
      warnings_.Warn("data (shm): " + std::to_string(unauthenticated_) +
                  " connections are waiting for their first frame "
                  "(data.max_unauthenticated_connections); closed one");
    } else {
      const std::string peer = PeerName(socket);
      std::make_shared<HelloSession<Socket>>(std::move(socket), peer, &hooks_)->Start();
    }
    Accept();
  });
}

void ShmAcceptor::Adopt(HelloResult checked, Socket socket, const std::string& peer) {
  const Config& config = plane_->config();
  // Four of the tenant's chunk frames fit a ring whatever is configured.
  const uint32_t ring = net::shm::RingBytesFor(config.data.shm_ring_bytes,
                                               checked.tenant.chunk_bytes);
  // One publish arena per (tenant, lane), shared by the tenant's local
  // workers there: a reply chunk is published once for all of them.
  std::erase_if(arenas_, [](const auto& entry) { return entry.second.expired(); });
  std::weak_ptr<net::shm::PublishArena>& weak =
      arenas_[{checked.tenant.handle, checked.hello.lane()}];
  std::shared_ptr<net::shm::PublishArena> arena = weak.lock();
  if (!arena) {
    Result<std::shared_ptr<net::shm::PublishArena>> made =
        net::shm::PublishArena::Create(2 * size_t{ring});
    if (made.ok()) {
      arena = *std::move(made);
      weak = arena;
    } else {
      warnings_.Warn("data (shm): no publish arena (replies are copied per worker): " +
                  made.status().message());
    }
  }
  boost::system::error_code ec;
  const int fd = socket.release(ec);
  if (ec) return;
  Result<std::shared_ptr<net::shm::Channel>> channel = net::shm::Channel::Accept(
      fd, ring, std::move(arena), peer,
      config.data.shm_poll == "busy" ? net::shm::PollMode::kBusy : net::shm::PollMode::kEvents);
  if (!channel.ok()) {
    warnings_.Warn("data (shm): cannot set up shared memory for " + peer + ": " +
                channel.status().message());
    return;
  }
  net::ConnectionIdentity id{checked.tenant.handle, checked.tenant.name, checked.hello.rank(),
                             checked.hello.lane(), peer, checked.hello.rack(), false,
                             checked.hello.session()};
  const uint64_t seq = plane_->NextSeq();
  plane_->OnLane(id.lane, [ch = *std::move(channel), id = std::move(id), seq](Lane& lane) mutable {
    auto conn = std::make_shared<net::ChannelConnection<net::shm::Channel>>(
        lane.worker_handler(), std::move(ch), std::move(id), &lane.io());
    lane.AdoptWorker(std::move(conn), seq);
  });
}

}  // namespace rackhub::server
