// RackExchange: one lane's links to the other racks' hubs and the chunk flow
// across racks (hierarchical mode). A tenant spans R racks with W workers
// each; chunk g (tenant-wide index) has its home at rack (g / lanes) % R and
// lives on lane g % lanes of every hub. Each hub sums its own rack's pushes
// (WorkerProtocol), a non-home hub sends that fp32 rack sum (RACK_SUM) to
// the home hub on this lane's link, the home adds the rack sums in rack
// order, applies the optimizer and sends the parameters back (RACK_PARAMS);
// every hub answers its own workers. In flat mode one hub serves every rack
// and both stages run locally, so both modes give the same bits.
//
// Links go through the LaneHost's net::Connector (TCP or RDMA); accepted
// links arrive from the acceptors through Lane::AdoptHubLink. A link this
// lane opens authenticates first (hub_handshake.h: HUB_HELLO, HUB_CHALLENGE,
// HUB_PROOF, HUB_ACCEPT, within data.hello_timeout_ms); frames for it wait in
// its queue until the other hub has proven the secret. Before a key's
// first frame on a link, a KEY_BIND names it (tenant and key by name, with
// the layout, checked by the receiver). A `from_client` chunk's initial
// values travel as INIT frames: from rack 0's hub to the home, from the home
// to every other rack. Frames naming a key this hub's
// workers have not declared yet are parked and retried; the link's later
// frames of that key wait behind them, so a key's frames are handled in the
// order they were sent. Bounded and async tenants have no rack sum: their
// workers' frames of a chunk homed elsewhere are relayed to the home
// (RACK_RELAY / RACK_RELAY_REPLY, rack_relay.cc), where the lane's worker
// protocol serves them through a RelayConnection per (link, member).
//
// Ownership: the Lane owns it; borrows the lane's ChunkTable and gate.
// Threading: lane thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "chunk_table.h"
#include "config.h"
#include "hub_handshake.h"
#include "lane_gate.h"
#include "lane_host.h"
#include "log_limiter.h"
#include "rackhub/common/status.h"
#include "rackhub/net/transport.h"
#include "registry.h"

namespace rackhub::data::v1 {
class KeyBind;
}

namespace rackhub::server {

class WorkerProtocol;

class RackExchange final : public net::FrameHandler {
 public:
  RackExchange(const TopologyConfig& topology, const DataConfig& data, ChunkTable* table,
               Registry* registry, LaneHost* host, LaneGate* gate, boost::asio::io_context* io);

  // Starts this lane's links to the other racks' hubs (lane i to lane i),
  // reconnecting while they are down.
  void Start();
  // Takes over an authenticated link from another rack's hub (built with
  // this handler): sends HUB_ACCEPT (payload `accept`, from the acceptor's
  // HubAcceptor) as its first frame.
  void AdoptLink(std::shared_ptr<net::Connection> conn, std::string accept);
  // Closes every link (shutdown).
  void CloseAll(const std::string& why);

  // A rack's local sum of chunk `c` for `iteration` is complete (called by
  // the worker protocol).
  void OnRackSum(LaneTenant& t, LaneKey& key, Chunk& c, uint32_t rack, uint64_t iteration);

  // A table spanning racks (rack_rows.cc): rack `rack`'s row contributions
  // to chunk `c` are complete. Their per-row sums go to the rows' home; the
  // home adds the racks' sums in rack order, applies the optimizer to the
  // touched rows and sends those rows back (RACK_SUM / RACK_PARAMS with row
  // payloads); every hub answers its own workers.
  void OnRackRows(LaneTenant& t, LaneKey& key, Chunk& c, uint32_t rack);

  // A `from_client` chunk got its initial values here (from a worker of
  // `from_rack`, or another hub's INIT frame from `from_rack`). Not the home:
  // they go to the home; the home: to every rack but itself and `from_rack`.
  // Each hub link carries a chunk's INIT before any RACK_SUM of it, and a rack
  // gets values only from the home, so the home has them before any sum.
  void OnInitialized(LaneTenant& t, LaneKey& key, Chunk& c, uint32_t from_rack);
  // ChunkTable::GetChunk made chunk `c` of a key spanning racks (a home
  // chunk below its key's floor joins it).
  void OnNewChunk(LaneTenant& t, LaneKey& key, Chunk& c);

  // Rack `rack`'s hub restarted: it gets this lane's copies of the
  // `from_client` chunks it is home to as INIT (it takes them if it has no
  // values: a restart without checkpoint).
  void OfferCopies(uint32_t rack);
  // Cross-rack recovery (rack_recovery.h; rack_realign.cc) and cluster
  // checkpoints. Sends a RACK_VERSIONS or RACK_CHECKPOINT on this lane's
  // link to `rack` (lane 0 only; dropped while the link is down: a round
  // sends its report again when it is up, a checkpoint's coordinator times
  // out).
  void SendControl(uint32_t rack, net::Opcode opcode, const std::string& payload);
  // A round agreed on `agreed` (key id -> version): every chunk of those keys
  // on this lane skips to its version; a chunk's home sends its parameters at
  // that version to every other hub (RACK_ALIGN), where PULLs of the chunk
  // are held until they arrive. REQUIRES: nothing pending (a recovery).
  void Realign(LaneTenant& t, const std::map<uint32_t, uint64_t>& agreed);

  // Bounded/async tenants spanning racks (rack_relay.cc, docs/consistency.md
  // "Across racks", docs/wire-protocol.md 7d). A chunk lives at its home
  // only; the other hubs relay their workers' PUSH / INIT / PULL of it there
  // (RACK_RELAY, after a member notice naming the worker) and forward the
  // home's answer (RACK_RELAY_REPLY). At the home each (link, member) is a
  // RelayConnection adopted by the lane's worker protocol, which serves it
  // like a local worker. `workers` is that protocol (set once, by the Lane).
  void SetWorkers(WorkerProtocol* workers) { workers_ = workers; }
  // Not the home: relays a worker's frame (AcceptHeader of the worker
  // protocol vetted its header and payload size).
  void Relay(net::Connection& worker, LaneTenant& t, LaneKey& key, const net::FrameHeader& h,
             std::span<const std::byte> payload);
  // A worker connection of a bounded/async tenant was adopted here: every
  // other rack's hub hears it is live (a member notice on this lane's link).
  void RelayMemberBack(LaneTenant& t, const net::Connection& worker);
  // A worker connection of `member` closed here: the homes it was announced
  // to hear it is gone; its relays in flight are forgotten.
  void RelayMemberGone(LaneTenant& t, uint32_t member, const net::Connection& worker);
  // Rack `rack`'s hub left the cluster (its etcd lease is gone; it may have
  // died silently, its links half-open): at this home its relayed members
  // are gone (their held replies of others released), and this hub's
  // relays to it fail with a non-fatal WORKER_LOST saying `why`. (A hub
  // that is in fact alive goes on: its next relayed frame brings its
  // member back.)
  void RackLost(uint32_t rack, const std::string& why);
  // Tenant `handle` was deleted here (after the lane erased it): its relays
  // in flight, relay counts and member announcements, and at the home its
  // relayed members' connections, are forgotten.
  void ForgetTenant(uint32_t handle);
  // A relay with no answer this long fails at its hub (the straggler
  // timeout + 2 x kPeerWaitLimit; the answer is then dropped there).
  std::chrono::milliseconds relay_deadline() const { return relay_deadline_; }

  // net::FrameHandler for hub links.
  Verdict AcceptHeader(net::Connection& conn, const net::FrameHeader& h) override;
  void HandleFrame(net::Connection& conn, const net::FrameHeader& h,
                   std::span<const std::byte> payload) override;
  void OnConnectionClosed(net::Connection& conn, const std::string& why) override;
  void OnBytesSent(net::Connection& conn, size_t bytes) override;

 private:
  // A link to another rack's hub (this lane to its lane).
  struct PeerLink {
    std::shared_ptr<net::Connection> out;  // we send RACK_SUM / RACK_PARAMS here
    // While `out` authenticates: its handshake; `ready` once HUB_ACCEPT checked.
    std::unique_ptr<HubOpener> auth;
    bool ready = false;
    uint64_t attempt = 0;  // numbers `out`'s connections (handshake deadline)
    std::string refusal;   // why the last handshake failed (until one succeeds)
    std::unordered_set<uint64_t> bound;    // (tenant << 32 | key) announced on `out`
    // By tenant handle: every key id below it was announced on `out` (or
    // is not here): binds go out in key id order (SendKeyBind).
    std::unordered_map<uint32_t, uint32_t> bound_below;
    bool connecting = false;
    bool warned = false;
    // Frames waiting for the link to come up (for at most kPeerWaitLimit).
    struct Queued {
      uint32_t tenant;
      uint32_t key;
      net::FrameHeader header;
      std::span<const std::byte> payload;
      std::shared_ptr<const void> owner;  // keeps `payload` alive and unchanged
    };
    std::vector<Queued> queued;
    uint64_t queue_generation = 0;
    // Relayed members announced on `out` (tenant handle, member) and the
    // key their notice was bound with (rack_relay.cc).
    std::map<std::pair<uint32_t, uint32_t>, uint32_t> announced;
  };
  // A relayed frame waiting for its home's answer (not the home).
  struct PendingRelay {
    std::weak_ptr<net::Connection> worker;
    const net::Connection* worker_ptr = nullptr;
    uint64_t request_id = 0;  // the worker's
    uint32_t home = 0;
    uint32_t key = 0;    // the answer's PARAMS must name these
    uint32_t chunk = 0;
    std::string key_name;
    uint32_t tenant = 0;  // this hub's handle
    size_t reserved = 0;  // on the worker's connection (Reserve)
    std::chrono::steady_clock::time_point sent{};
  };
  // Relays in flight per worker connection, at most (refused beyond).
  static constexpr size_t kMaxRelaysPerWorker = 4096;
  // A link to another hub that is down is retried this often.
  static constexpr auto kPeerRetryPeriod = std::chrono::milliseconds(200);
  // Frames for a hub that is not connected (yet) wait this long for the link
  // before the updates waiting on them fail with WORKER_LOST; frames for a key
  // not declared here yet are kept as long.
  static constexpr auto kPeerWaitLimit = std::chrono::seconds(5);
  // How often relays in flight are checked against relay_deadline_.
  static constexpr auto kRelaySweepPeriod = std::chrono::seconds(1);
  // Parked frames are retried this often.
  static constexpr auto kParkedRetryPeriod = std::chrono::milliseconds(10);
  // Lane 0: recovery rounds still waiting send their reports again this often
  // (LaneHost::ResendRackReports).
  static constexpr auto kRoundResendPeriod = std::chrono::seconds(1);
  void ArmRoundResend();

  // Frames from peers for keys not declared here yet, retried until they are.
  // Each reserves its bytes in its link's backlog (Connection::Reserve), so
  // a peer whose frames park pauses like one that does not read.
  struct Parked {
    std::weak_ptr<net::Connection> conn;
    net::FrameHeader header;
    std::vector<std::byte> payload;
    std::chrono::steady_clock::time_point since;
    size_t reserved = 0;
  };

  // A row payload on a hub link: the PUSH_ROWS layout with want = 0 and
  // fp32 rows (`rows`: ids.size() x dim floats); and its parse, checked
  // against the shard (ids in its range, strictly ascending).
  static std::shared_ptr<std::string> EncodeRackRowsPayload(std::span<const uint64_t> ids,
                                                            const float* rows, uint32_t dim);
  static std::span<const std::byte> RackRowsSpan(const std::string& s);
  static Status ParseRackRows(const aggregation::RowShard& r, std::span<const std::byte> payload,
                              net::RowsPayload* out);
  // A table's rack row sums (`ids` ascending, fp32 rows) at the rows' home.
  void AddRackRows(LaneTenant& t, LaneKey& key, Chunk& c, uint32_t rack,
                   std::span<const uint64_t> ids, const float* rows);
  // A table chunk's RACK_SUM / RACK_PARAMS header (rack_rows.cc).
  Verdict CheckRowData(net::Connection& conn, const LaneKey& key, const Chunk& c,
                       const net::FrameHeader& h);
  // Its payload: a malformed one closes the link (the updates waiting on it fail).
  void OnRowData(net::Connection& conn, LaneTenant& t, LaneKey& key, Chunk& c,
                 const net::FrameHeader& h, std::span<const std::byte> payload);
  // At the home, an elastic tenant's RACK_SUM (docs/elastic.md, "Across
  // racks"): the membership applied to the chunk, the sum's suffix (taken
  // off *payload) names its generation and a rack with members; else the
  // frame is dropped with a warning naming both generations.
  bool ElasticSumFits(LaneTenant& t, Chunk& c, uint32_t peer, const net::FrameHeader& h,
                      std::span<const std::byte>* payload);
  // The home hub's cross-rack stage is complete: update and answer everyone.
  void FinishCrossRack(LaneTenant& t, LaneKey& key, Chunk& c);
  // At the home: the reply bytes of version c.state.version() from the fp32
  // parameters (c.version follows).
  void PublishHomeParams(const LaneKey& key, Chunk& c);
  // RACK_ALIGN of the home's chunk at `v` to every other hub: a dense
  // chunk's reply bytes, a table's rows (all of them, fp32).
  void SendAlign(LaneTenant& t, LaneKey& key, Chunk& c, uint64_t v);
  // RACK_ALIGN at a hub that is not the chunk's home (rack_realign.cc).
  void OnAlign(net::Connection& conn, LaneTenant& t, LaneKey& key, Chunk& c,
               const net::FrameHeader& h, std::span<const std::byte> payload);
  // Frames of a recovering tenant's update (RACK_SUM, RACK_PARAMS) wait
  // until its recovery ends (parked): the realignment decides what they are.
  // Also frames of a round that has not ended here yet: each RACK_SUM,
  // RACK_PARAMS and RACK_ALIGN carries the sender's LaneTenant::rack_epoch
  // in request_id.
  static bool HeldByRecovery(const LaneTenant& t, const net::FrameHeader& h);
  static bool EpochTagged(net::Opcode op);
  // A frame sent before the last round that ended here: its update was
  // aborted (or rolled back) by that round; dropped without a word.
  static bool Stale(const LaneTenant& t, const net::FrameHeader& h);
  // Every tenant with chunks on this lane is recovered across racks
  // (LaneHost::AbortIteration), e.g. after a hub link broke.
  void AbortAll(const std::string& why);
  void SendToPeer(uint32_t rack, LaneTenant& t, LaneKey& key, const net::FrameHeader& h,
                  std::span<const std::byte> payload, std::shared_ptr<const void> owner);
  // Whether the outgoing link to `rack` is authenticated and open.
  bool LinkUp(uint32_t rack) const;
  // Queues a frame for `rack` until its link is up (GiveUp after
  // kPeerWaitLimit).
  void Hold(uint32_t rack, uint32_t tenant, uint32_t key, const net::FrameHeader& h,
            std::span<const std::byte> payload, std::shared_ptr<const void> owner);
  void SendKeyBind(PeerLink& link, LaneTenant& t, LaneKey& key);
  void SendOneKeyBind(PeerLink& link, const LaneTenant& t, const KeyInfo& key);
  // Realign: `key`'s chunks wait for the RACK_ALIGN of rack `home`'s hub,
  // which must have the key (its KEY_BIND on this lane's link).
  void BindAtHome(LaneTenant& t, LaneKey& key, uint32_t home);
  // A home chunk below its key's floor (a recovery round's agreed version)
  // skips there and sends its RACK_ALIGN.
  void JoinFloor(LaneTenant& t, LaneKey& key, Chunk& c);
  void Connect(uint32_t rack);
  void OnConnected(uint32_t rack, std::shared_ptr<net::Connection> conn);
  void RetryConnect(uint32_t rack, const std::string& why);
  // The outgoing link `conn` is, if it is one and not authenticated yet.
  PeerLink* Authenticating(const net::Connection& conn);
  // HUB_CHALLENGE, HUB_ACCEPT or ERROR on an outgoing link that authenticates.
  void OnHandshakeFrame(PeerLink& link, net::Connection& conn, const net::FrameHeader& h,
                        std::span<const std::byte> payload);
  // The link is up: what waited for it goes.
  void OnAuthenticated(uint32_t rack, net::Connection& conn);
  // Sends what queued up while the link to `rack` was down.
  void FlushQueue(uint32_t rack);
  // After (re)connecting to `rack`, or an ERROR from it: INIT frames a
  // broken link may have lost or it may have dropped (chunks of `tenant`, or
  // of every tenant, still at version 0 that `rack` should have values from
  // this hub; duplicates are ignored by the receiver).
  void OfferInitialValues(uint32_t rack, std::optional<uint32_t> tenant = std::nullopt);
  void SendInit(uint32_t rack, LaneTenant& t, LaneKey& key, Chunk& c);
  // Called kPeerWaitLimit after frames were queued for a link that is down.
  void GiveUp(uint32_t rack, uint64_t generation);
  // Resolves a KEY_BIND: true when bound; false when the tenant or key does
  // not exist here yet; INVALID_ARGUMENT for a payload that is not a KeyBind,
  // FAILED_PRECONDITION when the key is laid out differently here.
  Result<bool> TryBind(uint32_t peer, uint32_t peer_tenant, const std::string& bind_bytes);
  // The tenant and key a peer's frame names, binding late if needed.
  LaneKey* PeerKey(uint32_t peer, const net::FrameHeader& h, LaneTenant** tenant);
  // Tries the KEY_BIND received for (peer, peer tenant, key) again: true if
  // bound now (a refusal is recorded in bind_refusals_).
  bool Rebind(uint32_t peer, uint32_t peer_tenant, uint32_t key);
  Verdict CheckData(net::Connection& conn, const net::FrameHeader& h);
  Verdict CheckInit(net::Connection& conn, const LaneKey& key, const Chunk& c,
                    const net::FrameHeader& h);
  Verdict CheckAlign(net::Connection& conn, const LaneKey& key, const Chunk& c,
                     const net::FrameHeader& h);
  // TryBind of a key this hub does not have: declares it from the bind's
  // declaration at the peer's key id and chunks (Registry::AdoptKey). False:
  // not here yet (a shared registry, a bind without a declaration).
  Result<bool> AdoptKey(uint32_t peer, uint32_t peer_tenant, const TenantInfo& tenant,
                        const data::v1::KeyBind& bind, KeyInfo* key);
  // AdoptKey of one key (the lower ids' done first).
  Result<bool> DeclareFromBind(uint32_t peer, uint32_t handle, const data::v1::KeyBind& bind,
                               KeyInfo* key);
  // Bounds on what a peer's KEY_BIND may declare here (no wrap of the
  // tenant's key ids or chunk indices).
  static constexpr uint32_t kMaxAdoptedKeyId = uint32_t{1} << 20;
  static constexpr uint64_t kMaxAdoptedChunk = uint64_t{1} << 48;
  void OnKeyBind(net::Connection& conn, const net::FrameHeader& h,
                 std::span<const std::byte> payload);
  void OnPeerError(net::Connection& conn, const net::FrameHeader& h,
                   std::span<const std::byte> payload);
  void OnData(net::Connection& conn, const net::FrameHeader& h,
              std::span<const std::byte> payload);
  // `reserve`: counted in the link's backlog (Connection::Reserve).
  void Park(net::Connection& conn, const net::FrameHeader& h, std::span<const std::byte> payload,
            bool reserve);
  // Whether frames of `h`'s tenant and key from `conn` are parked (its
  // later ones then park behind them).
  bool HasParked(const net::Connection& conn, const net::FrameHeader& h) const;
  // Whether member notices of `peer_tenant` from `conn` are parked (its
  // later ones then park behind them).
  bool HasParkedNotice(const net::Connection& conn, uint32_t peer_tenant) const;
  static bool IsMemberNotice(const net::FrameHeader& h) {
    return h.opcode == net::Opcode::kRackRelay && h.request_id == 0;
  }
  void RetryParked();
  // ERROR to a peer about its tenant `peer_tenant` (so it can fail the
  // updates waiting on it).
  void SendPeerError(net::Connection& conn, uint32_t peer_tenant, const std::string& text);
  Verdict Reject(net::Connection& conn, net::WireError code, const std::string& text,
                 uint64_t request_id);

  const TopologyConfig topology_;
  // Hub links: reading pauses as on worker connections; no fatal limit (see
  // the .cc: their data frames are this hub's own, one per chunk and iteration).
  const net::SendLimits link_limits_;
  // A handshake this lane opens must finish within this (data.hello_timeout_ms).
  const std::chrono::milliseconds handshake_limit_;
  // Not the home: a relay unanswered this long fails (ExpireRelays): the
  // home answers within its straggler timeout, each way held at most
  // kPeerWaitLimit while a link is down.
  const std::chrono::milliseconds relay_deadline_;
  // Failed handshakes (a wrong secret retried every 200 ms) are logged at
  // most this often.
  LogLimiter refusals_{5, std::chrono::seconds(10)};
  LogLimiter sum_refusals_{5, std::chrono::seconds(10)};  // ElasticSumFits
  // Relays (rack_relay.cc). Not the home: frames in flight by relay id.
  void OnRelayReply(net::Connection& conn, const net::FrameHeader& h,
                    std::span<const std::byte> payload);
  void SendMemberNotice(uint32_t home, LaneTenant& t, LaneKey& key, uint32_t rank,
                        uint64_t session, net::RelayKind kind);
  // The link to `home` is lost (or gave up), or the one from it that
  // carries its answers: every relay to it fails with a non-fatal
  // WORKER_LOST naming the rack. `members_gone`: the home lost the members
  // announced to it (they are announced again).
  void FailRelays(uint32_t home, const std::string& why, bool members_gone = true);
  // Every relay in flight longer than relay_deadline_ fails with a
  // non-fatal WORKER_LOST naming its home's rack (the link up but the
  // answer lost, or it never came); runs every second while relays wait.
  void ExpireRelays();
  // Relay `r` (taken out of relays_) fails: its worker, if still there,
  // gets a non-fatal WORKER_LOST saying `why` about the home's rack.
  bool FailRelay(const PendingRelay& r, const std::string& why);
  // A relay answered or failed: its worker has one fewer in flight, and
  // its reservation is released.
  void Uncount(const PendingRelay& r);
  // The home: a RACK_RELAY from `conn` (a member notice, or a frame served
  // by the worker protocol through the member's RelayConnection).
  // `frame_key`: the frame's key (null for a member notice, which is about a
  // worker of the tenant, not of a key).
  void OnRelay(net::Connection& conn, LaneTenant& t, const LaneKey* frame_key,
               const net::FrameHeader& h, std::span<const std::byte> payload);
  // A member notice (a RACK_RELAY of relay id 0) is handled as soon as its
  // tenant is bound on `conn`'s rack, never parked behind its key's frames:
  // true if handled (else it waits for the tenant's bind).
  bool OnMemberNotice(net::Connection& conn, const net::FrameHeader& h,
                      std::span<const std::byte> payload);
  // The home: a RACK_RELAY_REPLY (`h`: its header; `body`: the answer frame
  // whole) goes to the worker's rack on this hub's OUTGOING link there, so
  // each link carries bulk one way only (LinkLimits); held while it is down.
  void SendRelayReply(uint32_t rack, const net::FrameHeader& h, std::span<const std::byte> body,
                      std::shared_ptr<const void> owner);
  // The home: answers a relayed frame (`h`, from `conn`) with a non-fatal
  // ERROR naming the problem (a member notice: an ERROR on the link).
  void RefuseRelay(net::Connection& conn, const net::FrameHeader& h, net::WireError code,
                   const std::string& text);
  // The home: every RelayConnection of link `link` closes (link lost).
  void CloseRelays(const net::Connection* link, const std::string& why);
  using RelaySlot = std::tuple<const net::Connection*, uint32_t, uint32_t>;
  // The home: the RelayConnections whose (link, tenant handle, member)
  // `which` picks close.
  void CloseRelaysIf(const std::function<bool(const RelaySlot&)>& which, const std::string& why);
  // Whether `t` is a bounded/async tenant (no cross-rack sync state: link
  // losses and peer errors abort nothing of it).
  static bool Unsynced(const LaneTenant& t) { return t.info.consistency != Consistency::kSync; }

  WorkerProtocol* workers_ = nullptr;
  std::unordered_map<uint64_t, PendingRelay> relays_;
  std::unordered_map<const net::Connection*, size_t> relays_per_worker_;
  // Relay ids: this process issues relay_base_ + 1, + 2, ...; the base is
  // random (RandomRelayBase), so a restarted hub does not issue the ids of
  // its previous process, whose answers may still come (a home that does
  // not know yet that the old process's link is dead).
  static uint64_t RandomRelayBase();
  const uint64_t relay_base_ = RandomRelayBase();
  uint64_t next_relay_ = relay_base_;
  // The home: relay connections by (link, tenant handle here, member).
  std::map<RelaySlot, std::shared_ptr<net::Connection>> relay_conns_;
  // The home: per slot, the sessions its member notices said are gone (a
  // frame of one that comes later, e.g. parked behind its key, is refused;
  // a MEMBER_BACK of the session takes it out). Forgotten with the slot's
  // link or tenant, and bounded: the newest kMaxGoneSessions per slot (a
  // session's straggling frames come within seconds of its gone notice;
  // each restart of a rank's process adds one).
  static constexpr size_t kMaxGoneSessions = 8;
  std::map<RelaySlot, std::deque<uint64_t>> gone_sessions_;
  uint64_t relay_seq_ = 0;
  bool relay_sweep_armed_ = false;

  ChunkTable* table_;
  Registry* registry_;
  LaneHost* host_;
  LaneGate* gate_;
  boost::asio::io_context* io_;
  std::vector<PeerLink> links_;                            // by rack
  std::vector<std::shared_ptr<net::Connection>> peer_in_;  // accepted hub links
  // What KEY_BIND told us: (peer rack, peer's tenant handle) -> our handle.
  std::map<std::pair<uint32_t, uint32_t>, uint32_t> peer_tenants_;
  // The KEY_BINDs received: (peer rack, peer tenant, key id) -> its bytes.
  // Kept after binding: one naming a tenant or key this hub does not have
  // yet (its own workers declare keys a little later), one refused, and
  // one whose tenant was deleted here since are tried again (PeerKey).
  std::map<std::tuple<uint32_t, uint32_t, uint32_t>, std::string> binds_;
  // KEY_BINDs refused (a different layout or consistency), by the same
  // triple: why, for the relayed frames of that key (answered at once
  // unless the bind, tried again, fits now).
  std::map<std::tuple<uint32_t, uint32_t, uint32_t>, std::string> bind_refusals_;
  std::vector<Parked> parked_;
  bool parked_timer_armed_ = false;
  // Links whose frame in progress AcceptHeader let through without
  // CheckData (HandleFrame checks it then; one frame at a time per link).
  std::unordered_set<const net::Connection*> unchecked_;
  // Links this lane closes after refusing one of their frames (Reject).
  std::unordered_set<const net::Connection*> refused_;
};

}  // namespace rackhub::server
