// The data-plane state of one lane: its connections (one per worker of each
// tenant), the chunks it owns (tenant-wide index g with g % lanes == lane),
// and the synchronous push/update/reply protocol (DESIGN.md §2).
//
// Thread safety: shared-nothing. Every member runs on the lane's own thread;
// other threads reach it only through LaneSet::Post. No locks on the
// per-chunk path: the registry's lock is taken only the first time a lane
// sees a key, and for control frames (DECLARE, SET_OPTIMIZER).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "config.h"
#include "rackhub/aggregation/chunk_state.h"
#include "rackhub/net/asio.h"
#include "rackhub/net/frame.h"
#include "rackhub/net/transport.h"
#include "registry.h"

namespace rackhub::server {

class DataPlane;
struct KeyRuntime;

class LaneService final : public net::FrameHandler {
 public:
  LaneService(uint32_t lane, uint32_t lanes, const Config& config, Registry* registry,
              DataPlane* plane, boost::asio::io_context* io);
  ~LaneService();

  uint32_t lane() const { return lane_; }

  // Called on the lane thread (posted by the acceptor): takes over an
  // authenticated TCP socket, sends WELCOME and starts reading.
  void AdoptTcp(boost::asio::ip::tcp::socket socket, net::ConnectionIdentity id, uint64_t seq);
  // Transport-independent part of the above. A rank still connected on this
  // lane is waited for (its close may be in flight) `retries_left` times.
  void Adopt(std::shared_ptr<net::Connection> conn, uint64_t seq, int retries_left);

  // net::FrameHandler.
  Verdict AcceptHeader(net::Connection& conn, const net::FrameHeader& h) override;
  void HandleFrame(net::Connection& conn, const net::FrameHeader& h,
                   std::span<const std::byte> payload) override;
  void OnConnectionClosed(net::Connection& conn, const std::string& why) override;
  void OnBytesSent(net::Connection& conn, size_t bytes) override;

  // Posted by the DataPlane.
  // A connection of (tenant, rank) adopted with sequence < `before_seq` was
  // lost: close this lane's older connections of that rank and fail the
  // tenant's pending updates.
  void OnWorkerLost(uint32_t handle, uint32_t rank, uint64_t before_seq, const std::string& why);
  void OnTenantDeleted(uint32_t handle);
  void OnKeyDeleted(uint32_t handle, uint32_t key_id);
  void OnOptimizerChanged(uint32_t handle, uint32_t key_id,
                          const aggregation::OptimizerConfig& optimizer, uint64_t from_update);
  // Closes every connection with a fatal SHUTTING_DOWN error.
  void Shutdown();

  // Rack exchange (lane_exchange.cc). Starts this lane's links to the other
  // racks' hubs (lane i to lane i), reconnecting while they are down.
  void StartPeerLinks();
  // Takes over an authenticated link from another rack's hub.
  void AdoptPeer(boost::asio::ip::tcp::socket socket, net::ConnectionIdentity id);
  size_t connection_count() const;

 private:
  struct Waiter {
    std::weak_ptr<net::Connection> conn;
    uint64_t request_id = 0;
  };
  struct Chunk {
    // One rack: the whole update. Several racks, at the chunk's home hub:
    // the cross-rack stage, one fp32 rack sum per rack, then the optimizer.
    aggregation::ChunkState state;
    uint32_t key_id;
    uint32_t index_in_key;
    std::vector<Waiter> pushes;  // waiting for this update
    std::vector<Waiter> pulls;   // waiting for initial values
    std::chrono::steady_clock::time_point first_contribution;
    // Several racks only: the local sum of each rack served here (by rack;
    // null for racks served elsewhere), the home rack, and the reply bytes
    // (key dtype) of version v in replies[v & 1] with `version` updates done.
    std::vector<std::unique_ptr<aggregation::ChunkState>> stages;
    uint32_t home = 0;
    uint64_t version = 0;
    std::array<std::vector<std::byte>, 2> replies;
  };
  struct Key {
    KeyInfo info;
    std::shared_ptr<KeyRuntime> runtime;
  };
  struct Tenant {
    TenantInfo info;
    std::map<uint32_t, std::shared_ptr<net::Connection>> conns;  // by rank
    std::map<uint32_t, uint64_t> conn_seq;                      // by rank
    std::unordered_map<uint32_t, Key> keys;                     // by id
    std::unordered_map<uint64_t, std::unique_ptr<Chunk>> chunks;  // by (key id << 32 | chunk)
    std::unordered_set<uint64_t> pending;  // chunks with some contributions
    // Ranks that were connected and went away, with the reason; pushes fail
    // fast (WORKER_LOST) until they reconnect.
    std::map<uint32_t, std::string> lost;
  };
  // A link to another rack's hub (this lane to its lane).
  struct PeerLink {
    std::shared_ptr<net::Connection> out;  // we send RACK_SUM / RACK_PARAMS here
    std::unordered_set<uint64_t> bound;    // (tenant << 32 | key) announced on `out`
    bool connecting = false;
    bool warned = false;
    // Frames waiting for the link to come up (for at most kPeerWaitLimit).
    struct Queued {
      uint32_t tenant;
      uint32_t key;
      net::FrameHeader header;
      std::span<const std::byte> payload;  // borrowed, see SendToPeer
    };
    std::vector<Queued> queued;
    uint64_t queue_generation = 0;
  };
  // What KEY_BIND told us: (peer rack, peer's tenant handle) -> our handle.
  std::map<std::pair<uint32_t, uint32_t>, uint32_t> peer_tenants_;
  // KEY_BINDs naming a tenant or key this hub does not have yet (its own
  // workers declare keys a little later): (peer rack, peer tenant, key id).
  std::map<std::tuple<uint32_t, uint32_t, uint32_t>, std::string> pending_binds_;
  // Frames from peers for such keys, retried until the key exists.
  struct Parked {
    std::weak_ptr<net::Connection> conn;
    net::FrameHeader header;
    std::vector<std::byte> payload;
    std::chrono::steady_clock::time_point since;
  };
  std::vector<Parked> parked_;
  bool parked_timer_armed_ = false;

  static uint64_t ChunkId(uint32_t key, uint32_t chunk) {
    return (static_cast<uint64_t>(key) << 32) | chunk;
  }
  Tenant* FindTenant(uint32_t handle);
  // The key (cached, else from the registry); nullptr if unknown.
  Key* FindKey(Tenant& t, uint32_t key_id);
  // The chunk's state, created on first use.
  Chunk& GetChunk(Tenant& t, Key& key, uint32_t chunk);
  // Non-fatal refusal: ERROR without closing; the payload is dropped.
  Verdict Refuse(net::Connection& conn, net::WireError code, const std::string& text,
                 uint64_t request_id);
  // Fatal refusal: ERROR, then the connection closes.
  Verdict Reject(net::Connection& conn, net::WireError code, const std::string& text,
                 uint64_t request_id);

  void HandlePush(net::Connection& conn, Tenant& t, const net::FrameHeader& h,
                  std::span<const std::byte> payload);
  void HandleInit(net::Connection& conn, Tenant& t, const net::FrameHeader& h,
                  std::span<const std::byte> payload);
  void HandlePull(net::Connection& conn, Tenant& t, const net::FrameHeader& h);
  void HandleDeclare(net::Connection& conn, Tenant& t, const net::FrameHeader& h,
                     std::span<const std::byte> payload);
  void HandleSetOptimizer(net::Connection& conn, Tenant& t, const net::FrameHeader& h,
                          std::span<const std::byte> payload);
  void SendParams(net::Connection& conn, const Chunk& c, uint64_t version, uint64_t request_id,
                  bool copy);
  // Multi-rack chunk flow (lane_exchange.cc).
  bool MultiRack(const Tenant&) const { return racks_ > 1; }
  // Workers of a tenant are indexed rack * workers_per_rack + rank.
  static uint32_t Member(const Tenant& t, const net::ConnectionIdentity& id) {
    return id.rack * t.info.workers_per_rack + id.rank;
  }
  aggregation::ChunkState& Stage(Chunk& c, uint32_t rack) {
    return c.stages.empty() ? c.state : *c.stages[rack];
  }
  void InitMultiRackChunk(Tenant& t, Key& key, Chunk& c, uint64_t global_index);
  // A rack's local sum of chunk `c` for `iteration` is complete.
  void OnRackSum(Tenant& t, Key& key, Chunk& c, uint32_t rack, uint64_t iteration);
  // The home hub's cross-rack stage is complete: update and answer everyone.
  void FinishCrossRack(Tenant& t, Key& key, Chunk& c);
  // Replies of version c.version to the chunk's waiting pushes.
  void AnswerMultiRack(Chunk& c, const Key& key);
  void SendToPeer(uint32_t rack, Tenant& t, Key& key, const net::FrameHeader& h,
                  std::span<const std::byte> payload);
  void ConnectPeer(uint32_t rack);
  // Sends what queued up while the link to `rack` was down.
  void FlushPeerQueue(uint32_t rack);
  // Called kPeerWaitLimit after frames were queued for a link that is down.
  void GiveUpOnPeer(uint32_t rack, uint64_t generation);
  net::FrameHandler::Verdict AcceptPeerHeader(net::Connection& conn, const net::FrameHeader& h);
  void HandlePeerFrame(net::Connection& conn, const net::FrameHeader& h,
                       std::span<const std::byte> payload);
  void OnPeerClosed(net::Connection& conn, const std::string& why);
  // Resolves a KEY_BIND: true when bound; false with *problem empty when the
  // tenant or key does not exist here yet; false with *problem on mismatch.
  bool TryBind(uint32_t peer, uint32_t peer_tenant, const std::string& bind_bytes,
               std::string* problem);
  // The tenant and key a peer's frame names, binding late if needed.
  Key* PeerKey(uint32_t peer, const net::FrameHeader& h, Tenant** tenant);
  net::FrameHandler::Verdict CheckPeerFrame(net::Connection& conn, const net::FrameHeader& h);
  void ProcessPeerData(uint32_t peer, const net::FrameHeader& h,
                       std::span<const std::byte> payload);
  void RetryParked();
  // ERROR to a peer about its tenant `peer_tenant` (so it can fail the
  // updates waiting on it).
  void SendPeerError(net::Connection& conn, uint32_t peer_tenant, const std::string& text);
  // Fails every waiting push of the tenant (some contributions in) with
  // `code` and discards their partial sums.
  void FailPending(Tenant& t, net::WireError code, const std::string& why);
  void ArmStragglerTimer();
  void CheckStragglers();
  std::string WelcomePayload(const Tenant& t);

  const uint32_t lane_;
  const uint32_t lanes_;
  const DataConfig config_;
  const TopologyConfig topology_;
  const uint32_t racks_;      // racks a tenant spans (1: single rack)
  const bool exchange_;       // hierarchical: other racks' hubs hold some homes
  std::string hub_secret_;
  std::vector<PeerLink> links_;                                 // by rack
  std::vector<std::shared_ptr<net::Connection>> peer_in_;       // accepted hub links
  Registry* registry_;
  DataPlane* plane_;
  boost::asio::io_context* io_;
  boost::asio::steady_timer straggler_timer_;
  std::unordered_map<uint32_t, Tenant> tenants_;  // by handle
  bool shut_down_ = false;
};

}  // namespace rackhub::server
