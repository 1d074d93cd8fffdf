#include "rack_exchange.h"

#include <cstring>
#include <set>

#include <spdlog/spdlog.h>

#include "declare_check.h"
#include "params_reply.h"
#include "proto_convert.h"
#include "rackhub/aggregation/kernels.h"
#include "rackhub/common/log_safe.h"
#include "rackhub/common/number.h"
#include "rackhub/data/v1/control.pb.h"
#include "wire_names.h"

namespace rackhub::server {

namespace pb = rackhub::admin::v1;
namespace dpb = rackhub::data::v1;

namespace {

std::span<const std::byte> Bytes(std::span<const float> f) {
  return {reinterpret_cast<const std::byte*>(f.data()), f.size() * sizeof(float)};
}

// What a hub link may hold (docs/architecture.md, Bounded send queues). A
// peer hub makes this hub queue only small ERRORs (answers to its frames,
// throttled by the pause) and parked frames (reserved, throttled likewise).
// The RACK_SUM / RACK_PARAMS frames queued on a link are this hub's own: at
// most one per chunk and iteration (a chunk's next sum needs the home's
// answer to this one), shared with the chunk's buffers, so bounded by the
// tenants' parameters and not failed by a byte limit, which a slow link
// would otherwise trip for a large model and fail every tenant on the lane.
net::SendLimits LinkLimits(const DataConfig& data) {
  net::SendLimits l;
  l.pause_bytes = static_cast<size_t>(data.max_queued_bytes_per_connection / 2);
  l.max_bytes = 0;
  l.setting = "data.max_queued_bytes_per_connection";
  return l;
}

}  // namespace

RackExchange::RackExchange(const TopologyConfig& topology, const DataConfig& data,
                           ChunkTable* table, Registry* registry, LaneHost* host, LaneGate* gate,
                           boost::asio::io_context* io)
    : topology_(topology),
      link_limits_(LinkLimits(data)),
      handshake_limit_(data.hello_timeout_ms),
      relay_deadline_(std::chrono::milliseconds(data.straggler_timeout_ms) + 2 * kPeerWaitLimit),
      table_(table),
      registry_(registry),
      host_(host),
      gate_(gate),
      io_(io),
      links_(topology.rack_count()) {}

void RackExchange::OnRackSum(LaneTenant& t, LaneKey& key, Chunk& c, uint32_t rack,
                             uint64_t iteration) {
  aggregation::ChunkState& stage = *c.stages[rack];
  const auto sum = Bytes(stage.params(stage.version()));
  auto sum_owner = stage.params_ref(stage.version());
  if (c.home == topology_.rack || !table_->exchange()) {
    if (c.state.contributions() == 0) table_->MarkPending(t, c);
    if (c.state.Contribute(rack, sum) == aggregation::ChunkState::AddResult::kComplete) {
      FinishCrossRack(t, key, c);
    }
    return;
  }
  // To the home hub. The sum stays valid until this stage's version + 2,
  // which needs our workers' next pushes, which need the home's answer.
  FrameHeader h = c.Header(Opcode::kRackSum, t.info.handle, iteration);
  h.dtype = net::DType::kFp32;  // a rack sum is fp32 whatever the key's dtype
  if (c.elastic) {
    // The update's cluster membership follows the sum (ElasticSumFits).
    const ElasticForming& f = t.forming[ChunkTable::ChunkId(c.key_id, c.index_in_key)];
    auto tagged = std::make_shared<const std::string>(WithMembershipSuffix(sum, f.generation, f.total));
    h.flags |= net::kFlagMembership;
    const auto bytes = std::as_bytes(std::span<const char>(*tagged));
    SendToPeer(c.home, t, key, h, bytes, std::move(tagged));
    return;
  }
  SendToPeer(c.home, t, key, h, sum, std::move(sum_owner));
}

void RackExchange::PublishHomeParams(const LaneKey& key, Chunk& c) {
  const uint64_t v = c.state.version();
  auto& out = c.replies[v & 1];
  out.PrepareOverwrite();  // a reply of v - 2 still queued keeps its bytes
  aggregation::CopyOut(out.data(), c.state.params(v).data(), c.state.elements(),
                       static_cast<aggregation::ElementType>(static_cast<uint8_t>(key.info.dtype)));
  c.version = v;
}

void RackExchange::FinishCrossRack(LaneTenant& t, LaneKey& key, Chunk& c) {
  c.state.Update();
  PublishHomeParams(key, c);
  const uint64_t v = c.version;
  table_->Completed(t, key, c, v);
  if (table_->exchange()) {
    const FrameHeader h = c.Header(Opcode::kRackParams, t.info.handle, v);
    for (uint32_t r = 0; r < table_->racks(); ++r) {
      if (r != topology_.rack) SendToPeer(r, t, key, h, c.reply_bytes(v), c.reply_owner(v));
    }
  }
  AnswerPushes(c, v);
}

void RackExchange::OnInitialized(LaneTenant& t, LaneKey& key, Chunk& c, uint32_t from_rack) {
  if (!table_->exchange()) return;  // flat: one hub has every rack's stages
  if (c.home != topology_.rack) {
    SendInit(c.home, t, key, c);
    return;
  }
  for (uint32_t r = 0; r < table_->racks(); ++r) {
    if (r != topology_.rack && r != from_rack) SendInit(r, t, key, c);
  }
  // Past a recovery round (values that came after it, e.g. another hub's
  // copy offered to this restarted hub): the chunk joins the agreed version
  // and the others get its values there.
  JoinFloor(t, key, c);
}

void RackExchange::OnNewChunk(LaneTenant& t, LaneKey& key, Chunk& c) {
  // A chunk this hub is home to, made after a recovery round agreed on its
  // key (the key was declared here only later: TryBind, a worker's DECLARE):
  // it starts at the agreed version, and the other racks' copies, which
  // wait for it, get its values there. (A from_client chunk does once its
  // values came: OnInitialized.)
  if (table_->exchange() && c.home == topology_.rack && c.state.initialized()) {
    JoinFloor(t, key, c);
  }
}

void RackExchange::JoinFloor(LaneTenant& t, LaneKey& key, Chunk& c) {
  const uint64_t floor = key.runtime->floor.load(std::memory_order_acquire);
  if (floor <= c.state.version()) return;
  for (auto& stage : c.stages) {
    if (stage && stage->version() < floor) stage->SkipTo(floor);
  }
  c.state.SkipTo(floor);
  PublishHomeParams(key, c);
  SendAlign(t, key, c, floor);
}

void RackExchange::OfferCopies(uint32_t rack) {
  for (auto& [handle, t] : table_->tenants()) {
    size_t offered = 0;
    for (auto& [id, c] : t.chunks) {
      if (!c->multi_rack() || c->home != rack || !c->state.initialized()) continue;
      LaneKey* key = table_->FindKey(t, c->key_id);
      if (!key || key->info.init != InitMode::kFromClient) continue;
      // As its initial values: the home takes them only if it has none.
      SendToPeer(rack, t, *key, c->Header(Opcode::kInit, t.info.handle, 0),
                 c->reply_bytes(c->version), c->reply_owner(c->version));
      ++offered;
    }
    if (offered > 0) {
      spdlog::warn("rack link: lane {}: rack {}'s hub restarted; offered it this hub's copy of "
                   "{} chunk(s) of tenant '{}' it is home to (from_client keys)",
                   table_->lane(), rack, offered, t.info.name);
    }
  }
}

void RackExchange::SendInit(uint32_t rack, LaneTenant& t, LaneKey& key, Chunk& c) {
  SendToPeer(rack, t, key, c.Header(Opcode::kInit, t.info.handle, 0), c.reply_bytes(0),
             c.reply_owner(0));
}

void RackExchange::OfferInitialValues(uint32_t rack, std::optional<uint32_t> tenant) {
  for (auto& [handle, t] : table_->tenants()) {
    if (tenant && handle != *tenant) continue;
    size_t offered = 0;
    for (auto& [id, c] : t.chunks) {
      if (!c->multi_rack() || !c->state.initialized() || c->version != 0) continue;
      if (c->home != topology_.rack && c->home != rack) continue;
      LaneKey* key = table_->FindKey(t, c->key_id);
      if (key && key->info.init == InitMode::kFromClient) {
        SendInit(rack, t, *key, *c);
        ++offered;
      }
    }
    if (offered > 0) {
      spdlog::info("rack link: lane {} offered rack {} the initial values of {} chunk(s) of "
                   "tenant '{}' again",
                   table_->lane(), rack, offered, t.info.name);
    }
  }
}

void RackExchange::SendToPeer(uint32_t rack, LaneTenant& t, LaneKey& key, const FrameHeader& h,
                              std::span<const std::byte> payload,
                              std::shared_ptr<const void> owner) {
  PeerLink& link = links_[rack];
  FrameHeader tagged = h;
  if (EpochTagged(h.opcode)) tagged.request_id = t.rack_epoch;  // stale after a newer round
  if (!LinkUp(rack)) return Hold(rack, t.info.handle, key.info.id, tagged, payload, std::move(owner));
  SendKeyBind(link, t, key);
  FrameHeader f = tagged;
  f.payload_bytes = static_cast<uint32_t>(payload.size());
  link.out->SendShared(f, payload, std::move(owner));
  host_->CountRackChunkBytes(rack, net::kHeaderBytes + payload.size());
}

bool RackExchange::LinkUp(uint32_t rack) const {
  const PeerLink& link = links_[rack];
  return link.out && link.out->open() && link.ready;
}

void RackExchange::Hold(uint32_t rack, uint32_t tenant, uint32_t key, const FrameHeader& h,
                        std::span<const std::byte> payload, std::shared_ptr<const void> owner) {
  // Not connected or not authenticated (yet): hold the frame for a while
  // (with its payload's owner, so a deleted key's bytes stay valid).
  PeerLink& link = links_[rack];
  if (link.queued.empty()) {
    const uint64_t generation = ++link.queue_generation;
    gate_->After(kPeerWaitLimit, [this, rack, generation] { GiveUp(rack, generation); });
  }
  link.queued.push_back({tenant, key, h, payload, std::move(owner)});
  Connect(rack);
}

void RackExchange::SendKeyBind(PeerLink& link, LaneTenant& t, LaneKey& key) {
  const uint64_t bind_id = (uint64_t{t.info.handle} << 32) | key.info.id;
  if (link.bound.count(bind_id)) return;
  // The tenant's keys of lower ids first: a hub that has none of them (no
  // worker of its rack declared them) declares each from its KEY_BIND, and
  // key ids are given in order (TryBind). (From the registry: no LaneKey is
  // made here, the caller may be iterating the tenant's keys.)
  uint32_t& below = link.bound_below[t.info.handle];
  for (below = std::max<uint32_t>(below, 1); below < key.info.id; ++below) {
    KeyInfo lower;
    if (registry_->GetKeyById(t.info.handle, below, &lower).ok()) SendOneKeyBind(link, t, lower);
  }
  SendOneKeyBind(link, t, key.info);
}

void RackExchange::SendOneKeyBind(PeerLink& link, const LaneTenant& t, const KeyInfo& key) {
  const uint64_t bind_id = (uint64_t{t.info.handle} << 32) | key.id;
  if (!link.bound.insert(bind_id).second) return;
  dpb::KeyBind bind;
  bind.set_tenant(t.info.name);
  bind.set_key(key.name);
  bind.set_key_id(key.id);
  bind.set_elements(key.elements);
  bind.set_dtype(static_cast<pb::DType>(key.dtype));
  bind.set_first_chunk(key.placement.first_chunk);
  bind.set_chunk_elements(key.chunk_elements);
  bind.set_workers_per_rack(t.info.workers_per_rack);
  bind.set_init(InitModeToProto(key.init));
  bind.set_rows(key.rows);
  bind.set_dim(key.dim);
  bind.set_init_seed(key.init_seed);
  bind.set_init_scale(key.init_scale);
  bind.set_consistency(ConsistencyToProto(t.info.consistency));
  bind.set_staleness(t.info.staleness);
  KeyDeclarationOf(key, bind.mutable_declaration());
  FrameHeader b;
  b.opcode = Opcode::kKeyBind;
  b.tenant = t.info.handle;
  b.key = key.id;
  link.out->SendOwned(b, bind.SerializeAsString());
}

void RackExchange::Start() {
  if (!table_->exchange()) return;
  for (uint32_t r = 0; r < table_->racks(); ++r) {
    if (r != topology_.rack) Connect(r);
  }
  if (table_->lane() == 0) ArmRoundResend();
}

void RackExchange::ArmRoundResend() {
  gate_->After(kRoundResendPeriod, [this] {
    host_->ResendRackReports();
    ArmRoundResend();
  });
}

void RackExchange::Connect(uint32_t rack) {
  PeerLink& link = links_[rack];
  if (gate_->closed() || link.connecting || (link.out && link.out->open())) return;
  link.connecting = true;
  net::ConnectionIdentity id;
  id.hub = true;
  id.rack = rack;
  id.lane = table_->lane();
  id.peer = topology_.racks[rack].interhub.ToString();
  host_->hub_connector().Connect(
      *io_, topology_.racks[rack].interhub, this, id,
      gate_->Wrap([this, rack](Result<std::shared_ptr<net::Connection>> conn) {
        if (!conn.ok()) return RetryConnect(rack, conn.status().message());
        OnConnected(rack, *std::move(conn));
      }));
}

void RackExchange::RetryConnect(uint32_t rack, const std::string& why) {
  PeerLink& link = links_[rack];
  link.connecting = false;
  if (!link.warned) {
    spdlog::warn("rack link: lane {} cannot reach rack {}'s hub ({}); retrying", table_->lane(),
                 rack, why);
    link.warned = true;
  }
  gate_->After(kPeerRetryPeriod, [this, rack] { Connect(rack); });
}

void RackExchange::OnConnected(uint32_t rack, std::shared_ptr<net::Connection> conn) {
  PeerLink& link = links_[rack];
  link.connecting = false;
  link.out = conn;
  link.ready = false;
  link.bound.clear();
  link.bound_below.clear();
  link.auth = std::make_unique<HubOpener>(
      host_->hub_secret(),
      HubLinkFacts{topology_.rack, rack, table_->lane(), table_->racks(), table_->lanes()});
  conn->SetSendLimits(link_limits_);
  Result<std::string> hello = link.auth->Hello();
  if (hello.ok()) {
    FrameHeader h;
    h.opcode = Opcode::kHubHello;
    conn->SendOwned(h, *std::move(hello));
  }
  conn->Start();
  if (!hello.ok()) return conn->Close(hello.status().message());
  // A hub that stalls mid-handshake is cut (and dialed again).
  const uint64_t attempt = ++link.attempt;
  gate_->After(handshake_limit_, [this, rack, attempt] {
    PeerLink& l = links_[rack];
    if (l.attempt != attempt || !l.out || l.ready) return;
    l.refusal = "rack " + Num(rack) + "'s hub did not finish the hub-link handshake within " +
                "data.hello_timeout_ms (" + Num(handshake_limit_.count()) + " ms)";
    l.out->Close(l.refusal);
  });
}

RackExchange::PeerLink* RackExchange::Authenticating(const net::Connection& conn) {
  const uint32_t rack = conn.id().rack;
  if (rack >= links_.size()) return nullptr;
  PeerLink& link = links_[rack];
  return link.out.get() == &conn && !link.ready ? &link : nullptr;
}

void RackExchange::OnHandshakeFrame(PeerLink& link, net::Connection& conn, const FrameHeader& h,
                                    std::span<const std::byte> payload) {
  const uint32_t rack = conn.id().rack;
  const std::string who = "rack " + Num(rack) + "'s hub at " + conn.id().peer;
  if (h.opcode == Opcode::kError) {
    const Result<net::ErrorBody> body = net::DecodeErrorBody(payload);
    link.refusal =
        who + " refused the link: " +
        (body.ok() ? std::string(net::WireErrorName(body->code)) + ": " +
                         SafeForLog(body->text, 512)  // another hub's words
                   : "an ERROR that does not decode (" + body.status().message() + ")");
    return conn.Close(link.refusal);
  }
  if (!link.auth) return conn.Close("hub-link handshake: no handshake in progress");
  Status failed;
  if (h.opcode == Opcode::kHubChallenge) {
    Result<std::string> proof = link.auth->OnChallenge(payload);
    if (proof.ok()) {
      FrameHeader p;
      p.opcode = Opcode::kHubProof;
      conn.SendOwned(p, *std::move(proof));
      return;
    }
    failed = proof.status();
  } else {
    failed = link.auth->OnAccept(payload);
    if (failed.ok()) return OnAuthenticated(rack, conn);
  }
  link.refusal = who + ": " + failed.message();
  // This side found the problem: say so to the other end too.
  conn.SendError(failed.code() == StatusCode::kUnauthenticated ? WireError::kUnauthenticated
                                                               : WireError::kInvalidArgument,
                 "hub link: " + link.refusal, 0, true);
}

void RackExchange::OnAuthenticated(uint32_t rack, net::Connection& conn) {
  PeerLink& link = links_[rack];
  link.ready = true;
  link.auth.reset();
  link.refusal.clear();
  link.warned = false;
  spdlog::info("rack link: lane {} connected to rack {}'s hub at {} ({}), mutually authenticated",
               table_->lane(), rack, conn.id().peer, host_->hub_connector().name());
  // Initial values first: frames queued meanwhile may be sums needing them.
  OfferInitialValues(rack);
  FlushQueue(rack);
  // A recovery round's reports this hub may not have got through.
  if (table_->lane() == 0) host_->RackLinkUp(rack);
}

void RackExchange::FlushQueue(uint32_t rack) {
  auto queued = std::move(links_[rack].queued);
  links_[rack].queued.clear();
  ++links_[rack].queue_generation;  // cancels the pending give-up
  for (const auto& q : queued) {
    if (q.header.opcode == Opcode::kRackRelayReply) {
      SendRelayReply(rack, q.header, q.payload, q.owner);
      continue;
    }
    LaneTenant* t = table_->FindTenant(q.tenant);
    LaneKey* key = t ? table_->FindKey(*t, q.key) : nullptr;
    if (key) SendToPeer(rack, *t, *key, q.header, q.payload, q.owner);
  }
}

void RackExchange::GiveUp(uint32_t rack, uint64_t generation) {
  PeerLink& link = links_[rack];
  if (link.queue_generation != generation || link.queued.empty()) return;
  std::set<uint32_t> tenants;
  for (const auto& q : link.queued) {
    // (A relay reply's worker is on that rack: its hub fails the relay.)
    if (q.header.opcode != Opcode::kRackRelayReply) tenants.insert(q.tenant);
  }
  link.queued.clear();
  const std::string unreachable =
      "the hub of rack " + Num(rack) + " (" + topology_.racks[rack].interhub.ToString() +
      ") is unreachable" + (link.refusal.empty() ? std::string() : ": " + link.refusal);
  FailRelays(rack, unreachable);
  for (uint32_t handle : tenants) {
    if (LaneTenant* t = table_->FindTenant(handle); t && !Unsynced(*t)) {
      // Its frames are lost: the tenant's hubs realign (a recovery round,
      // which waits for that hub).
      host_->AbortIteration(handle, "rack link: " + unreachable, false, /*own_round=*/true);
    }
  }
}

void RackExchange::AdoptLink(std::shared_ptr<net::Connection> conn, std::string accept) {
  if (gate_->closed()) {
    conn->Close("the hub is shutting down");
    return;
  }
  std::erase_if(peer_in_, [](const auto& c) { return !c->open(); });
  // A newer authenticated link from the same rack's hub (lane i to lane i)
  // supersedes an older one: that hub dialed again, so the old one is
  // half-open (a partition it saw, not yet this end). Its relayed members
  // go with it now, not at TCP keepalive. Like a link closed refusing a
  // frame, its close starts no recovery round here: the other hub saw its
  // link lost and starts it, this hub joins.
  const uint32_t rack = conn->id().rack;
  const auto older = peer_in_;
  for (const auto& old : older) {
    if (old->id().rack != rack || old->id().lane != conn->id().lane) continue;
    const std::string why = "superseded by a newer link of rack " + Num(rack) + "'s hub from " +
                            conn->id().peer;
    CloseRelays(old.get(), "lost the link of rack " + Num(rack) + "'s hub (" + why + ")");
    refused_.insert(old.get());
    old->Close(why);
  }
  std::erase_if(peer_in_, [&](const auto& c) {
    return c->id().rack == rack && c->id().lane == conn->id().lane;
  });
  conn->SetSendLimits(link_limits_);
  FrameHeader a;
  a.opcode = Opcode::kHubAccept;
  conn->SendOwned(a, std::move(accept));  // the opener's proof matched: ours
  peer_in_.push_back(conn);
  spdlog::info("rack link: lane {} accepted rack {}'s hub from {}", table_->lane(),
               conn->id().rack, conn->id().peer);
  conn->Start();
}

void RackExchange::CloseAll(const std::string& why) {
  for (auto& link : links_) {
    if (auto out = link.out) out->Close(why);
  }
  const auto in = peer_in_;
  for (const auto& c : in) c->Close(why);
  peer_in_.clear();
}

void RackExchange::OnConnectionClosed(net::Connection& conn, const std::string& why) {
  unchecked_.erase(&conn);
  const bool refused = refused_.erase(&conn) > 0;
  const uint32_t peer = conn.id().rack;
  PeerLink& link = links_[peer];
  const bool outgoing = link.out.get() == &conn;
  const bool was_ready = link.ready;
  if (outgoing) {
    link.out.reset();
    link.auth.reset();
    link.ready = false;
    link.bound.clear();
    link.bound_below.clear();
  }
  if (gate_->closed()) return;
  // The home: the other rack's workers relayed on this link are gone.
  CloseRelays(&conn, "lost the link of rack " + Num(peer) + "'s hub (" + why + ")");
  if (outgoing && !was_ready) {
    // The handshake failed: nothing of ours went out on it (the queue waits,
    // GiveUp bounds that); log why (rate-limited) and dial again shortly.
    if (link.refusal.empty()) {
      link.refusal = "rack " + Num(peer) + "'s hub at " + conn.id().peer +
                     " closed the link during the hub-link handshake (" + why +
                     "; a hub that refuses sends an ERROR naming why first, so this one may "
                     "run an older rackhubd of hub-link version 1, or have stopped)";
    }
    refusals_.Warn("rack link: lane " + Num(table_->lane()) + ": " + link.refusal +
                   "; retrying every " + Num(kPeerRetryPeriod.count()) + " ms");
    link.connecting = true;  // Connect waits for the retry
    gate_->After(kPeerRetryPeriod, [this, peer] {
      links_[peer].connecting = false;
      Connect(peer);
    });
    return;
  }
  spdlog::warn("rack link: lane {} lost its {} link with rack {}'s hub: {}", table_->lane(),
               outgoing ? "outgoing" : "incoming", peer, why);
  // Frames in flight on it are lost: every tenant here is recovered across
  // racks (its updates in flight fail, its hubs agree on the versions again).
  // Not for a link this hub closed refusing a frame of it: the other hub
  // sees its link lost and starts the round, which this hub joins.
  if (!refused) {
    AbortAll("rack link: lost the hub of rack " + Num(peer) + " (" + why + ")");
  }
  // Relayed requests on it are lost: they fail (WORKER_LOST naming the
  // rack); so are the answers on an incoming link (the home sends them on
  // its own link here), but the members announced there stay live.
  if (outgoing) {
    FailRelays(peer, "lost the link to the hub of rack " + Num(peer) + " (" + why + ")");
    Connect(peer);
  } else {
    FailRelays(peer,
               "lost the link from the hub of rack " + Num(peer) + ", which carries its " +
                   "answers (" + why + ")",
               false);
  }
}

void RackExchange::AbortAll(const std::string& why) {
  std::vector<uint32_t> handles;
  for (auto& [handle, t] : table_->tenants()) {
    // (Bounded/async tenants have no cross-rack update to realign.)
    if (!t.chunks.empty() && !Unsynced(t)) handles.push_back(handle);
  }
  // A round of its own: the peer may not have seen the link break (its frames
  // to this hub are lost too), and a round that ends now may predate that.
  for (uint32_t handle : handles) host_->AbortIteration(handle, why, false, /*own_round=*/true);
}

void RackExchange::OnBytesSent(net::Connection& conn, size_t bytes) {
  host_->CountRackBytes(conn.id().rack, bytes, 0);
}

}  // namespace rackhub::server
