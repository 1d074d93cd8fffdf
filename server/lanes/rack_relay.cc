// RackExchange, part 3: bounded/async tenants spanning racks
// (docs/consistency.md, "Across racks"; docs/wire-protocol.md 7d). Such a
// tenant behaves as one hub holding every rack's workers: each chunk lives
// at its home hub only. Another rack's hub relays its workers' PUSH, INIT
// and PULL of the chunk to the home (RACK_RELAY, after a member notice) and
// forwards the home's answer (RACK_RELAY_REPLY) with the worker's request
// id. At the home each (link, member) is a RelayConnection, adopted by the
// lane's worker protocol and served like a local worker: the same checks,
// the same clocks and held replies, the same straggler timeout.
#include <algorithm>
#include <cstring>
#include <deque>
#include <functional>
#include <random>

#include <boost/asio/post.hpp>
#include <spdlog/spdlog.h>

#include "rack_exchange.h"
#include "rackhub/common/number.h"
#include "wire_names.h"
#include "worker_protocol.h"

namespace rackhub::server {

namespace {

std::span<const std::byte> AsBytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

// A RACK_RELAY_REPLY's payload: the frame (`h`, `payload`) whole.
std::shared_ptr<std::string> ReplyBody(FrameHeader h, std::span<const std::byte> payload) {
  h.payload_bytes = static_cast<uint32_t>(payload.size());
  auto body = std::make_shared<std::string>(net::kHeaderBytes + payload.size(), '\0');
  net::EncodeHeader(h, std::span<std::byte, net::kHeaderBytes>(
                           reinterpret_cast<std::byte*>(body->data()), net::kHeaderBytes));
  if (!payload.empty()) std::memcpy(body->data() + net::kHeaderBytes, payload.data(), payload.size());
  return body;
}

// At the home: one worker of another rack, as its hub relays it on one
// link. What the worker protocol sends it goes back to its rack in a
// RACK_RELAY_REPLY (the frame whole; its request id is the relay id), on
// this hub's outgoing link there (`reply`).
class RelayConnection final : public net::Connection {
 public:
  using Reply = std::function<void(const FrameHeader&, std::span<const std::byte>)>;
  RelayConnection(net::ConnectionIdentity id, std::weak_ptr<net::Connection> link, Reply reply,
                  net::FrameHandler* handler, LaneGate* gate, boost::asio::io_context* io)
      : id_(std::move(id)),
        link_(std::move(link)),
        reply_(std::move(reply)),
        handler_(handler),
        gate_(gate),
        io_(io) {}

  const net::ConnectionIdentity& id() const override { return id_; }
  bool open() const override {
    const auto link = link_.lock();
    return open_ && link && link->open();
  }
  void Start() override {}
  void SendShared(const FrameHeader& header, std::span<const std::byte> payload,
                  std::shared_ptr<const void> owner) override {
    (void)owner;  // copied into the reply frame
    Forward(header, payload);
  }
  void SendOwned(const FrameHeader& header, std::string payload) override {
    Forward(header, AsBytes(payload));
  }
  void SendError(WireError code, const std::string& text, uint64_t request_id,
                 bool fatal) override {
    const net::ErrorFrame e = net::MakeErrorFrame(code, text, id_.tenant_handle, request_id, fatal);
    Forward(e.header, AsBytes(e.body));
    if (fatal) Close(std::string("sent a fatal ") + net::WireErrorName(code));
  }
  // From inside the worker protocol: its close callback comes later, as a
  // transport's does.
  void Close(const std::string& why) override {
    if (!open_) return;
    open_ = false;
    auto closed = [self = shared_from_this(), handler = handler_, why] {
      handler->OnConnectionClosed(*self, why);
    };
    // Through the lane's gate (counted by its WaitIdle) while it is open.
    // Once it closed (the lane shuts down: WorkerProtocol::CloseAll closes
    // every connection) its handlers no longer run, but this one must: the
    // lane is drained only when its last connection's close was handled.
    if (!gate_->closed()) {
      gate_->Post(std::move(closed));
    } else {
      boost::asio::post(*io_, std::move(closed));
    }
  }
  // From the exchange (a member notice, a lost link): at once.
  void CloseNow(const std::string& why) {
    if (!open_) return;
    open_ = false;
    handler_->OnConnectionClosed(*this, why);
  }

 private:
  void Forward(FrameHeader h, std::span<const std::byte> payload) {
    // WELCOME (adoption) is the worker's own hub's business; a frame about
    // no request (request id 0) has no relay to answer.
    if (h.opcode == Opcode::kWelcome || h.request_id == 0) return;
    if (open()) reply_(h, payload);
  }

  const net::ConnectionIdentity id_;
  const std::weak_ptr<net::Connection> link_;  // the incoming link it came on
  const Reply reply_;
  net::FrameHandler* const handler_;
  LaneGate* const gate_;
  boost::asio::io_context* const io_;
  bool open_ = true;
};

}  // namespace

void RackExchange::Relay(net::Connection& worker, LaneTenant& t, LaneKey& key,
                         const FrameHeader& h, std::span<const std::byte> payload) {
  const uint32_t home = table_->HomeRack(key.info, h.chunk);
  size_t& inflight = relays_per_worker_[&worker];
  if (inflight >= kMaxRelaysPerWorker) {
    t.CountError(WireError::kQuotaExceeded);
    worker.SendError(WireError::kQuotaExceeded,
                     "relay: " + Num(inflight) + " requests of this worker are in flight to " +
                         "rack " + Num(home) + "'s hub (home of chunk " + Num(h.chunk) +
                         " of key '" + key.info.name + "'), at most " +
                         Num(kMaxRelaysPerWorker) + "; wait for their answers",
                     h.request_id, false);
    return;
  }
  const uint32_t member = ChunkTable::Member(t, worker.id());
  PeerLink& link = links_[home];
  if (!link.announced.count({t.info.handle, member})) {
    SendMemberNotice(home, t, key, worker.id().rank, worker.id().session,
                     net::RelayKind::kMemberBack);
    link.announced[{t.info.handle, member}] = key.info.id;
  }
  // The relay's payload and its answer count on the worker's connection
  // until answered (as a held PULL's reply does): a worker that does not
  // read its answers pauses its own reading, not the hub link (a refused
  // reservation: the connection is failing, QUOTA_EXCEEDED).
  const size_t reserved = payload.size() + 2 * net::kHeaderBytes + net::kVersionsSuffixBytes +
                          size_t{ChunkTable::ChunkElements(key.info, h.chunk)} *
                              WireDTypeBytes(key.info.dtype);
  if (!worker.Reserve(reserved)) return;
  const uint64_t id = ++next_relay_;
  ++inflight;
  relays_[id] = PendingRelay{worker.weak_from_this(), &worker, h.request_id, home, h.key,
                             h.chunk, key.info.name, t.info.handle, reserved,
                             std::chrono::steady_clock::now()};
  if (!relay_sweep_armed_) {
    relay_sweep_armed_ = true;
    gate_->After(kRelaySweepPeriod, [this] { ExpireRelays(); });
  }
  auto body = std::make_shared<std::string>(net::EncodeRelayPrefix(
      {net::RelayKind::kFrame, h.opcode, worker.id().rank, worker.id().session}));
  body->append(reinterpret_cast<const char*>(payload.data()), payload.size());
  FrameHeader r = h;
  r.opcode = Opcode::kRackRelay;
  r.tenant = t.info.handle;
  r.request_id = id;
  SendToPeer(home, t, key, r, AsBytes(*body), body);
}

uint64_t RackExchange::RandomRelayBase() {
  std::random_device rd;
  const uint64_t r = (uint64_t{rd()} << 32) | rd();
  // Below 2^63: 2^63 ids issue before a wrap (relay id 0 is a notice).
  return r >> 1;
}

void RackExchange::SendMemberNotice(uint32_t home, LaneTenant& t, LaneKey& key, uint32_t rank,
                                    uint64_t session, net::RelayKind kind) {
  auto body = std::make_shared<std::string>(
      net::EncodeRelayPrefix({kind, Opcode::kHeartbeat, rank, session}));
  FrameHeader n;
  n.opcode = Opcode::kRackRelay;
  n.tenant = t.info.handle;
  n.key = key.info.id;
  SendToPeer(home, t, key, n, AsBytes(*body), body);
}

void RackExchange::RelayMemberBack(LaneTenant& t, const net::Connection& worker) {
  // A notice binds a key first: any key of the tenant (none yet: the
  // worker's first relayed frame announces it).
  LaneKey* key = t.keys.empty() ? nullptr : &t.keys.begin()->second;
  if (!key) {
    std::vector<KeyInfo> keys;
    if (registry_->ListKeys(t.info.name, &keys).ok() && !keys.empty()) {
      key = table_->FindKey(t, keys.front().id);
    }
  }
  if (!key) return;
  const uint32_t member = ChunkTable::Member(t, worker.id());
  for (uint32_t rack = 0; rack < links_.size(); ++rack) {
    if (rack == topology_.rack || links_[rack].announced.count({t.info.handle, member})) continue;
    SendMemberNotice(rack, t, *key, worker.id().rank, worker.id().session,
                     net::RelayKind::kMemberBack);
    links_[rack].announced[{t.info.handle, member}] = key->info.id;
  }
}

void RackExchange::RelayMemberGone(LaneTenant& t, uint32_t member,
                                   const net::Connection& worker) {
  for (uint32_t rack = 0; rack < links_.size(); ++rack) {
    PeerLink& link = links_[rack];
    const auto it = link.announced.find({t.info.handle, member});
    if (it == link.announced.end()) continue;
    // (Bound with the key that announced it, or, that one deleted since,
    // any key of the tenant: the home takes notices by tenant.)
    LaneKey* key = table_->FindKey(t, it->second);
    if (!key && !t.keys.empty()) key = &t.keys.begin()->second;
    link.announced.erase(it);
    // (On a link that is down it waits behind the notice that announced
    // the member, if that one waits too; a home that lost the link has
    // marked the member gone already and ignores it.)
    if (key) {
      SendMemberNotice(rack, t, *key, worker.id().rank, worker.id().session,
                       net::RelayKind::kMemberGone);
    }
  }
  if (relays_per_worker_.erase(&worker) > 0) {
    std::erase_if(relays_, [&](const auto& r) { return r.second.worker_ptr == &worker; });
  }
}

void RackExchange::ForgetTenant(uint32_t handle) {
  for (auto it = relays_.begin(); it != relays_.end();) {
    if (it->second.tenant != handle) {
      ++it;
      continue;
    }
    Uncount(it->second);
    it = relays_.erase(it);
  }
  for (auto& link : links_) {
    std::erase_if(link.announced, [&](const auto& a) { return a.first.first == handle; });
  }
  // (Its peers' KEY_BINDs stay: a tenant of that name created again binds them.)
  std::erase_if(peer_tenants_, [&](const auto& p) { return p.second == handle; });
  CloseRelaysIf([&](const auto& slot) { return std::get<1>(slot) == handle; },
                "the tenant was deleted");
}

void RackExchange::RackLost(uint32_t rack, const std::string& why) {
  if (rack >= links_.size() || rack == topology_.rack) return;
  CloseRelaysIf([&](const RelaySlot& slot) { return std::get<0>(slot)->id().rack == rack; },
                why);
  FailRelays(rack, why, false);
}

void RackExchange::Uncount(const PendingRelay& r) {
  if (const auto w = r.worker.lock()) w->Unreserve(r.reserved);
  if (auto n = relays_per_worker_.find(r.worker_ptr);
      n != relays_per_worker_.end() && --n->second == 0) {
    relays_per_worker_.erase(n);
  }
}

bool RackExchange::FailRelay(const PendingRelay& r, const std::string& why) {
  Uncount(r);
  const auto w = r.worker.lock();
  if (!w || !w->open()) return false;
  if (LaneTenant* t = table_->FindTenant(w->id().tenant_handle)) {
    t->CountError(WireError::kWorkerLost);
  }
  w->SendError(WireError::kWorkerLost,
               "rack link: " + why + "; rack " + Num(r.home) + "'s hub is home to chunk " +
                   Num(r.chunk) + " of key '" + r.key_name + "' and this request may or may " +
                   "not have been applied there: Pull the key and push on",
               r.request_id, false);
  return true;
}

void RackExchange::ExpireRelays() {
  relay_sweep_armed_ = false;
  const auto now = std::chrono::steady_clock::now();
  size_t failed = 0;
  for (auto it = relays_.begin(); it != relays_.end();) {
    if (now - it->second.sent < relay_deadline_) {
      ++it;
      continue;
    }
    const PendingRelay r = std::move(it->second);
    it = relays_.erase(it);
    failed += FailRelay(r, "no answer from the hub of rack " + Num(r.home) + " within " +
                               Num(relay_deadline_.count() / 1000) + " s") ? 1 : 0;
  }
  if (failed > 0) {
    spdlog::warn("rack link: lane {}: {} relayed request(s) had no answer in time",
                 table_->lane(), failed);
  }
  if (!relays_.empty()) {
    relay_sweep_armed_ = true;
    gate_->After(kRelaySweepPeriod, [this] { ExpireRelays(); });
  }
}

void RackExchange::FailRelays(uint32_t home, const std::string& why, bool members_gone) {
  if (members_gone) links_[home].announced.clear();
  size_t failed = 0;
  for (auto it = relays_.begin(); it != relays_.end();) {
    if (it->second.home != home) {
      ++it;
      continue;
    }
    const PendingRelay r = std::move(it->second);
    it = relays_.erase(it);
    failed += FailRelay(r, why) ? 1 : 0;
  }
  if (failed > 0) {
    spdlog::warn("rack link: lane {}: {} relayed request(s) to rack {}'s hub failed: {}",
                 table_->lane(), failed, home, why);
  }
}

void RackExchange::OnRelayReply(net::Connection& conn, const FrameHeader& h,
                                std::span<const std::byte> payload) {
  const uint32_t peer = conn.id().rack;
  const auto it = relays_.find(h.request_id);
  if (it == relays_.end()) {
    if (h.request_id <= relay_base_ || h.request_id > next_relay_) {
      SendPeerError(conn, h.tenant,
                    "RACK_RELAY_REPLY: relay id " + Num(h.request_id) + " was never issued by " +
                        "rack " + Num(topology_.rack) + "'s hub on lane " + Num(table_->lane()));
    }
    return;  // else: its worker is gone, or it failed already (a lost link)
  }
  PendingRelay& r = it->second;
  // (The home answers on its own link to this hub: an incoming one.)
  if (peer != r.home || links_[r.home].out.get() == &conn) {
    Reject(conn, WireError::kInvalidArgument,
           "RACK_RELAY_REPLY: relay id " + Num(h.request_id) + " went to rack " + Num(r.home) +
               "'s hub (the chunk's home), not to rack " + Num(peer) + "'s",
           h.request_id);
    return;
  }
  const Result<FrameHeader> decoded = net::DecodeRelayReply(payload);
  if (!decoded.ok()) {
    Reject(conn, WireError::kMalformed, decoded.status().message(), h.request_id);
    return;
  }
  FrameHeader inner = *decoded;
  // A PARAMS names the key and chunk it answers: one that is not this
  // relay's is an answer to another request (e.g. a previous process of
  // this hub that issued the same id); dropped, the relay waits on.
  if (inner.opcode == Opcode::kParams && (inner.key != r.key || inner.chunk != r.chunk)) {
    refusals_.Warn("rack link: lane " + Num(table_->lane()) + ": rack " + Num(peer) +
                   "'s hub answered relay id " + Num(h.request_id) + " with PARAMS of key id " +
                   Num(inner.key) + " chunk " + Num(inner.chunk) + ", but that relay is key '" +
                   r.key_name + "' chunk " + Num(r.chunk) + ": a stale answer, dropped");
    return;
  }
  const PendingRelay done = std::move(r);
  relays_.erase(it);
  Uncount(done);
  const auto w = done.worker.lock();
  if (!w || !w->open()) return;
  const auto body = payload.subspan(net::kHeaderBytes);
  if (inner.opcode == Opcode::kError && (inner.flags & net::kFlagFatal)) {
    const Result<net::ErrorBody> e = net::DecodeErrorBody(body);
    w->SendError(e.ok() ? e->code : WireError::kInternal,
                 e.ok() ? e->text : "rack " + Num(peer) + "'s hub sent an ERROR that does not "
                                    "decode",
                 done.request_id, true);
    return;
  }
  inner.request_id = done.request_id;
  inner.tenant = w->id().tenant_handle;
  w->SendOwned(inner, std::string(reinterpret_cast<const char*>(body.data()), body.size()));
}

bool RackExchange::OnMemberNotice(net::Connection& conn, const FrameHeader& h,
                                  std::span<const std::byte> payload) {
  LaneTenant* t = nullptr;
  PeerKey(conn.id().rack, h, &t);  // (binds the tenant by a pending KEY_BIND too)
  if (!t) return false;
  OnRelay(conn, *t, nullptr, h, payload);
  return true;
}

void RackExchange::OnRelay(net::Connection& conn, LaneTenant& t, const LaneKey* frame_key,
                           const FrameHeader& h, std::span<const std::byte> payload) {
  const uint32_t peer = conn.id().rack;
  const auto refuse = [&](WireError code, const std::string& text) {
    RefuseRelay(conn, h, code, text);
  };
  const Result<net::RelayPrefix> prefix = net::DecodeRelayPrefix(payload);
  if (!prefix.ok()) {
    Reject(conn, WireError::kMalformed, prefix.status().message(), h.request_id);
    return;
  }
  const auto [kind, op, rank, session] = *prefix;
  if (!frame_key && kind == net::RelayKind::kFrame) {
    return refuse(WireError::kInvalidArgument,
                  "RACK_RELAY: a frame (kind 0) needs a relay id; relay id 0 is a member notice");
  }
  if (!Unsynced(t) || !workers_) {
    return refuse(WireError::kInvalidArgument,
                  "RACK_RELAY: tenant '" + t.info.name + "' is sync; only bounded and async " +
                      "tenants relay their workers' frames to a chunk's home");
  }
  if (rank >= t.info.workers_per_rack) {
    return refuse(WireError::kInvalidArgument,
                  "RACK_RELAY: rank " + Num(rank) + " of rack " + Num(peer) + " is not a " +
                      "worker of tenant '" + t.info.name + "' (workers_per_rack " +
                      Num(t.info.workers_per_rack) + ")");
  }
  net::ConnectionIdentity id;
  id.tenant_handle = t.info.handle;
  id.tenant = t.info.name;
  id.rank = rank;
  id.lane = table_->lane();
  id.rack = peer;
  id.session = session;
  id.peer = "rack " + Num(peer) + "'s hub (" + conn.id().peer + ")";
  const auto slot = std::make_tuple(&conn, t.info.handle, ChunkTable::Member(t, id));
  auto found = relay_conns_.find(slot);
  std::deque<uint64_t>& gone = gone_sessions_[slot];
  const auto mark_gone = [&gone](uint64_t s) {
    if (std::find(gone.begin(), gone.end(), s) == gone.end()) gone.push_back(s);
    if (gone.size() > kMaxGoneSessions) gone.pop_front();
  };
  if (found != relay_conns_.end() && !found->second->open()) {
    // Ended by the worker protocol here (a fatal answer; the link is up):
    // its session is over, as if gone. Frames its hub sent behind the
    // fatal one are refused, never applied by a fresh connection.
    mark_gone(found->second->id().session);
    relay_conns_.erase(found);
    found = relay_conns_.end();
  }
  RelayConnection* relay =
      found != relay_conns_.end() && found->second->open()
          ? static_cast<RelayConnection*>(found->second.get())
          : nullptr;
  // The worker's own hub owns its generations (sessions): a notice or
  // frame names the session it is about. A gone notice ends only that
  // session's connection here, and its later frames (parked behind their
  // key, say) are refused, never resurrecting it; a member-back notice of
  // another session replaces the slot's connection (a new process of the
  // rank on its hub: the one before is over there), and a frame of any
  // session but the slot's current one is refused.
  if (kind == net::RelayKind::kMemberGone) {
    mark_gone(session);
    if (found != relay_conns_.end() && found->second->id().session == session) {
      const auto closing = std::move(found->second);
      relay_conns_.erase(found);
      static_cast<RelayConnection*>(closing.get())
          ->CloseNow("rack " + Num(peer) + "'s hub: its connection there closed");
    }
    return;
  }
  if (kind == net::RelayKind::kMemberBack) {
    std::erase(gone, session);
  } else if (std::find(gone.begin(), gone.end(), session) != gone.end()) {
    return refuse(WireError::kWorkerLost,
                  "RACK_RELAY: rank " + Num(rank) + " of rack " + Num(peer) + " (session " +
                      Num(session) + ") is gone from rack " + Num(peer) + "'s hub (or was " +
                      "ended on rack " + Num(topology_.rack) + "'s by a fatal error)");
  }
  if (relay && relay->id().session != session && kind == net::RelayKind::kFrame) {
    return refuse(WireError::kWorkerLost,
                  "RACK_RELAY: rank " + Num(rank) + " of rack " + Num(peer) + " (session " +
                      Num(session) + ") is not its current session on rack " +
                      Num(topology_.rack) + "'s hub (" + Num(relay->id().session) + ")");
  }
  if (relay && relay->id().session != session) {
    const auto replaced = std::move(found->second);
    relay_conns_.erase(found);
    static_cast<RelayConnection*>(replaced.get())
        ->CloseNow("rank " + Num(rank) + " of rack " + Num(peer) + ": session " +
                   Num(replaced->id().session) + " was replaced by session " + Num(session) +
                   " on its hub");
    relay = nullptr;
  }
  if (!relay) {
    // Announced (or a frame before its notice, which may wait parked behind
    // another key): the member joins here as a worker of this lane.
    auto fresh = std::make_shared<RelayConnection>(
        id, conn.weak_from_this(),
        [this, peer](const FrameHeader& f, std::span<const std::byte> payload) {
          const auto body = ReplyBody(f, payload);
          SendRelayReply(peer, f, AsBytes(*body), body);
        },
        workers_, gate_, io_);
    relay = fresh.get();
    relay_conns_[slot] = fresh;
    workers_->Adopt(fresh, ++relay_seq_);
  }
  if (kind == net::RelayKind::kMemberBack) return;
  const LaneKey& key = *frame_key;
  if (op != Opcode::kPush && op != Opcode::kInit && op != Opcode::kPull) {
    return refuse(WireError::kInvalidArgument,
                  "RACK_RELAY: opcode " + Num(static_cast<int>(op)) + " is not PUSH, INIT or " +
                      "PULL");
  }
  if (h.chunk >= key.info.placement.chunk_count ||
      table_->HomeRack(key.info, h.chunk) != topology_.rack) {
    return refuse(WireError::kInvalidArgument,
                  "RACK_RELAY: chunk " + Num(h.chunk) + " of key '" + key.info.name +
                      "' is not homed on rack " + Num(topology_.rack) + "'s hub");
  }
  // (The relaying hub sends each chunk on its owner lane's link, as its
  // worker did: another lane here is a hub's bug, refused without closing
  // the worker's connection there.)
  if (const uint32_t owner = table_->OwnerLane(key.info, h.chunk); owner != table_->lane()) {
    return refuse(WireError::kInvalidArgument,
                  "RACK_RELAY: chunk " + Num(h.chunk) + " of key '" + key.info.name +
                      "' lives on lane " + Num(owner) + ", not lane " + Num(table_->lane()));
  }
  FrameHeader inner = h;
  inner.opcode = op;
  inner.tenant = t.info.handle;
  inner.payload_bytes = static_cast<uint32_t>(payload.size() - net::kRelayPrefixBytes);
  const auto body = payload.subspan(net::kRelayPrefixBytes);
  if (workers_->AcceptHeader(*relay, inner) == Verdict::kAccept) {
    workers_->HandleFrame(*relay, inner, body);
  }
}

void RackExchange::SendRelayReply(uint32_t rack, const FrameHeader& h,
                                  std::span<const std::byte> body,
                                  std::shared_ptr<const void> owner) {
  FrameHeader r;
  r.opcode = Opcode::kRackRelayReply;
  r.tenant = h.tenant;
  r.key = h.key;
  r.chunk = h.chunk;
  r.iteration = h.iteration;
  r.request_id = h.request_id;
  if (!LinkUp(rack)) return Hold(rack, h.tenant, h.key, r, body, std::move(owner));
  r.payload_bytes = static_cast<uint32_t>(body.size());
  links_[rack].out->SendShared(r, body, std::move(owner));
  host_->CountRackChunkBytes(rack, net::kHeaderBytes + body.size());
}

void RackExchange::RefuseRelay(net::Connection& conn, const FrameHeader& h, WireError code,
                               const std::string& text) {
  if (h.request_id == 0) return SendPeerError(conn, h.tenant, text);  // a notice
  const net::ErrorFrame e = net::MakeErrorFrame(code, text, h.tenant, h.request_id, false);
  const auto body = ReplyBody(e.header, AsBytes(e.body));
  SendRelayReply(conn.id().rack, e.header, AsBytes(*body), body);
}

void RackExchange::CloseRelays(const net::Connection* link, const std::string& why) {
  CloseRelaysIf([&](const auto& slot) { return std::get<0>(slot) == link; }, why);
}

void RackExchange::CloseRelaysIf(const std::function<bool(const RelaySlot&)>& which,
                                 const std::string& why) {
  std::erase_if(gone_sessions_, [&](const auto& g) { return which(g.first); });
  for (auto it = relay_conns_.begin(); it != relay_conns_.end();) {
    if (!which(it->first)) {
      ++it;
      continue;
    }
    const auto conn = std::move(it->second);
    it = relay_conns_.erase(it);
    static_cast<RelayConnection*>(conn.get())->CloseNow(why);
  }
}

}  // namespace rackhub::server
