// hub_lane_fuzz's side of the in-memory links: LinkIo (the client ends'
// io thread), Link (one worker connection: the client end and what it saw)
// and Session (one input's tenant: its links per (rank, lane), its keys, and
// Play for each decoded Op).
//
// Ownership: the Session owns its Links; each Link owns its client end. The
// hub (its DataPlane and Registry) and the LinkIo outlive every Session.
// Threading: a Session is used from the fuzzing thread only. A Link's
// FrameHandler callbacks run on the LinkIo thread; its state is guarded by
// its mutex. Client ends are only touched on the LinkIo thread (posts).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "data_plane.h"
#include "hub_ops.h"
#include "rackhub/net/asio.h"
#include "rackhub/net/transport.h"
#include "registry.h"

namespace rackhub::fuzz {

// Aborts with `what` when !ok (a broken contract or a broken harness).
void Require(bool ok, const char* what);

class LinkIo {
 public:
  LinkIo();
  ~LinkIo();
  boost::asio::io_context& io() { return io_; }
  // Runs fn on the io thread and waits for it.
  void Run(std::function<void()> fn);

 private:
  boost::asio::io_context io_{1};
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> guard_;
  std::thread thread_;
};

class Link final : public net::FrameHandler {
 public:
  explicit Link(uint32_t tenant_handle) : handle_(tenant_handle) {}
  std::shared_ptr<net::Connection> conn;  // the client end; set once, used on the io thread

  bool closed() const;
  // Waits until a HEARTBEAT answering `request_id` arrived or the link
  // closed; false after `timeout`.
  bool WaitHeartbeat(uint64_t request_id, std::chrono::milliseconds timeout);
  bool WaitClosed(std::chrono::milliseconds timeout);
  // The id of the key the last KEY_INFO named (0 if none).
  uint32_t last_declared() const;

  // net::FrameHandler (io thread).
  Verdict AcceptHeader(net::Connection&, const net::FrameHeader& h) override;
  void HandleFrame(net::Connection& conn, const net::FrameHeader& h,
                   std::span<const std::byte> payload) override;
  void OnConnectionClosed(net::Connection& conn, const std::string& why) override;
  void OnBytesSent(net::Connection&, size_t) override {}

 private:
  const uint32_t handle_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ = false;                 // GUARDED_BY(mu_)
  std::vector<uint64_t> heartbeats_;    // GUARDED_BY(mu_)
  uint32_t last_declared_ = 0;          // GUARDED_BY(mu_)
};

class Session {
 public:
  Session(server::DataPlane& plane, LinkIo& io, const server::TenantInfo& tenant,
          std::string token, uint32_t victim_handle);
  ~Session();

  // Creates a key through the registry (as an admin would).
  void AddKey(const std::string& name, uint64_t elements, server::WireDType dtype,
              server::InitMode init);
  void Play(const Op& op);
  // A HEARTBEAT round trip on every open link (10 s each at most).
  void ExpectLive();
  // Every link closes within 10 s (after the tenant was deleted).
  void ExpectAllClosed();

 private:
  // The open link of (rank, lane), connecting (HELLO) if there is none.
  Link& LinkFor(uint32_t rank, uint32_t lane);
  void Send(Link& link, const net::FrameHeader& h, std::string payload);
  std::string Payload(const Op& op, const server::KeyInfo* key, const net::FrameHeader& h);

  server::DataPlane& plane_;
  LinkIo& io_;
  const server::TenantInfo tenant_;
  const std::string token_;
  const uint32_t victim_handle_;
  std::vector<server::KeyInfo> keys_;
  std::map<std::pair<uint32_t, uint32_t>, std::shared_ptr<Link>> links_;  // (rank, lane)
  std::vector<std::shared_ptr<Link>> old_links_;  // closed, kept until the end
  // The next iteration each (rank, key id, chunk) pushes.
  std::map<std::tuple<uint32_t, uint32_t, uint32_t>, uint64_t> next_iteration_;
  uint32_t declared_ = 0;  // the key id the last KEY_INFO named
  uint64_t request_ = 0;
};

}  // namespace rackhub::fuzz
