// RackExchange, part 2: frames arriving on hub links (KEY_BIND, INIT,
// RACK_SUM, RACK_PARAMS, ERROR), late key binding and parked frames.
#include <algorithm>
#include <cstring>
#include <set>
#include <tuple>

#include <spdlog/spdlog.h>

#include "declare_check.h"
#include "params_reply.h"
#include "proto_convert.h"
#include "rack_exchange.h"
#include "rackhub/common/log_safe.h"
#include "rackhub/common/number.h"
#include "rackhub/data/v1/control.pb.h"
#include "wire_names.h"

namespace rackhub::server {

namespace dpb = rackhub::data::v1;
namespace pb = rackhub::admin::v1;

Verdict RackExchange::Reject(net::Connection& conn, WireError code, const std::string& text,
                             uint64_t request_id) {
  spdlog::warn("rack link: rack {} lane {} ({}): {}: {}; closing", conn.id().rack,
               conn.id().lane, conn.id().peer, net::WireErrorName(code), text);
  conn.SendError(code, text, request_id, true);
  refused_.insert(&conn);
  return Verdict::kReject;
}

Verdict RackExchange::AcceptHeader(net::Connection& conn, const FrameHeader& h) {
  if (Authenticating(conn)) {
    // A link this lane opened, before the other hub proved the secret: only
    // its handshake frames (or its refusal).
    const bool handshake = h.opcode == Opcode::kHubChallenge || h.opcode == Opcode::kHubAccept;
    if (h.opcode == Opcode::kError ||
        (handshake && h.payload_bytes <= kMaxHubAuthBytes)) {
      return Verdict::kAccept;
    }
    return Reject(conn, WireError::kMalformed,
                  std::string(net::OpcodeName(h.opcode)) + " (" + Num(h.payload_bytes) +
                      " bytes) before the hub-link handshake finished",
                  h.request_id);
  }
  switch (h.opcode) {
    case Opcode::kError:  // an answer on a link we opened
    case Opcode::kKeyBind:
      return Verdict::kAccept;
    case Opcode::kRackVersions:
    case Opcode::kRackCheckpoint:
      if (h.payload_bytes > net::kMaxControlPayload) {
        return Reject(conn, WireError::kMalformed,
                      std::string(net::OpcodeName(h.opcode)) + " of " + Num(h.payload_bytes) +
                          " bytes (at most " + Num(net::kMaxControlPayload) + ")",
                      h.request_id);
      }
      return Verdict::kAccept;
    case Opcode::kRackRelayReply:  // relay id checked with its payload (OnRelayReply)
      return Verdict::kAccept;
    case Opcode::kRackRelay:
      if (h.request_id == 0) return Verdict::kAccept;  // a member notice (HandleFrame)
      [[fallthrough]];
    case Opcode::kInit:
    case Opcode::kRackSum:
    case Opcode::kRackParams:
    case Opcode::kRackAlign: {
      LaneTenant* t = nullptr;
      // Not bound yet, behind parked frames of its key on this link, or
      // waiting for a recovery: accept, HandleFrame parks it (checked when
      // it is its turn).
      if (HasParked(conn, h) || !PeerKey(conn.id().rack, h, &t) || HeldByRecovery(*t, h)) {
        unchecked_.insert(&conn);
        return Verdict::kAccept;
      }
      return CheckData(conn, h);
    }
    default:
      return Reject(conn, WireError::kMalformed,
                    "opcode: " + Num(static_cast<int>(h.opcode)) + " is not valid on a hub link",
                    h.request_id);
  }
}

LaneKey* RackExchange::PeerKey(uint32_t peer, const FrameHeader& h, LaneTenant** tenant) {
  const auto bound = peer_tenants_.find({peer, h.tenant});
  LaneTenant* t = bound == peer_tenants_.end() ? nullptr : table_->FindTenant(bound->second);
  // Not bound yet, its tenant deleted here since (perhaps created again
  // with other settings), or its bind refused (the settings may have been
  // fixed since, as the refusal asks): the KEY_BIND is tried again.
  if (!t || (!bind_refusals_.empty() && bind_refusals_.count({peer, h.tenant, h.key}))) {
    if (!Rebind(peer, h.tenant, h.key)) return nullptr;
    t = table_->FindTenant(peer_tenants_.at({peer, h.tenant}));
  }
  *tenant = t;
  return t ? table_->FindKey(*t, h.key) : nullptr;
}

bool RackExchange::Rebind(uint32_t peer, uint32_t peer_tenant, uint32_t key) {
  const auto bytes = binds_.find({peer, peer_tenant, key});
  if (bytes == binds_.end()) return false;
  const Result<bool> bound = TryBind(peer, peer_tenant, bytes->second);
  if (!bound.ok()) bind_refusals_[{peer, peer_tenant, key}] = bound.status().message();
  return bound.ok() && *bound;
}

Verdict RackExchange::CheckData(net::Connection& conn, const FrameHeader& h) {
  const uint64_t rid = h.request_id;
  const uint32_t peer = conn.id().rack;
  LaneTenant* t = nullptr;
  LaneKey* key = PeerKey(peer, h, &t);
  if (!key) {
    SendPeerError(conn, h.tenant, "key: id " + Num(h.key) + " is not bound");
    return Verdict::kDiscard;
  }
  // A relayed worker frame or member notice: the worker protocol checks
  // it at the home (OnRelay).
  if (h.opcode == Opcode::kRackRelay) return Verdict::kAccept;
  if (Stale(*t, h)) return Verdict::kDiscard;  // of an update a recovery round ended
  if (h.chunk >= key->info.placement.chunk_count ||
      table_->OwnerLane(key->info, h.chunk) != table_->lane()) {
    return Reject(conn, WireError::kBadChunk, "chunk: not one of this lane's", rid);
  }
  Chunk& c = table_->GetChunk(*t, *key, h.chunk);
  if (h.opcode == Opcode::kInit) return CheckInit(conn, *key, c, h);
  if (h.opcode == Opcode::kRackAlign) return CheckAlign(conn, *key, c, h);
  if (c.table()) return CheckRowData(conn, *key, c, h);
  if (!c.state.initialized()) {
    // Cannot happen between well-behaved hubs (OnInitialized's ordering).
    SendPeerError(conn, h.tenant,
                  "chunk: " + Num(h.chunk) + " of key '" + key->info.name +
                      "' has no initial values on rack " + Num(topology_.rack) + "'s hub yet");
    return Verdict::kDiscard;
  }
  const bool sum = h.opcode == Opcode::kRackSum;
  size_t want = size_t{c.state.elements()} * (sum ? 4u : WireDTypeBytes(key->info.dtype));
  // An elastic tenant's RACK_SUM carries its update's membership.
  if (sum && c.elastic) want += net::kMembershipSuffixBytes;
  if (sum && c.elastic != ((h.flags & net::kFlagMembership) != 0)) {
    return Reject(conn, WireError::kInvalidArgument,
                  std::string("flags: a RACK_SUM of ") + (c.elastic ? "an " : "a non-") +
                      "elastic tenant " + (c.elastic ? "needs" : "must not carry") +
                      " the membership flag",
                  rid);
  }
  if (h.payload_bytes != want) {
    return Reject(conn, WireError::kBadChunk,
                  "payload_bytes: " + Num(h.payload_bytes) + ", expected " + Num(want), rid);
  }
  if (sum != (c.home == topology_.rack)) {
    return Reject(conn, WireError::kInvalidArgument,
                  std::string(sum ? "RACK_SUM to" : "RACK_PARAMS from") +
                      " a hub that is not the chunk's home",
                  rid);
  }
  const uint64_t expected = sum ? c.state.version() : c.version + 1;
  // A recovery round's agreed version (the key's floor) is past every update
  // before it: their RACK_PARAMS are stale even before the home's RACK_ALIGN
  // brought this copy there.
  const uint64_t agreed = key->runtime->floor.load(std::memory_order_acquire);
  if (h.iteration < expected || (!sum && h.iteration < agreed)) {
    // Sent before a recovery round moved the chunk past it (the round
    // aborted that update everywhere): nothing to do.
    spdlog::debug("rack link: a stale {} of chunk {} (iteration {}, expected {}) dropped",
                  net::OpcodeName(h.opcode), h.chunk, h.iteration, expected);
    return Verdict::kDiscard;
  }
  if (h.iteration != expected || (sum && c.state.has_contributed(peer))) {
    SendPeerError(conn, h.tenant,
                  "iteration: " + Num(h.iteration) + " of chunk " + Num(h.chunk) + ", expected " +
                      Num(expected));
    return Verdict::kDiscard;
  }
  return Verdict::kAccept;
}

Verdict RackExchange::CheckInit(net::Connection& conn, const LaneKey& key, const Chunk& c,
                                const FrameHeader& h) {
  const uint32_t peer = conn.id().rack;
  if (key.info.init != InitMode::kFromClient) {
    return Reject(conn, WireError::kInvalidArgument,
                  "INIT of key '" + key.info.name + "', which starts at zeros", h.request_id);
  }
  const size_t want = size_t{c.state.elements()} * WireDTypeBytes(key.info.dtype);
  if (h.payload_bytes != want || h.iteration != 0) {
    return Reject(conn, WireError::kBadChunk,
                  "INIT: payload_bytes " + Num(h.payload_bytes) + " (expected " + Num(want) +
                      "), iteration " + Num(h.iteration) + " (expected 0)",
                  h.request_id);
  }
  if (c.home != topology_.rack && peer != c.home) {
    return Reject(conn, WireError::kInvalidArgument,
                  "INIT from a hub that is not the chunk's home", h.request_id);
  }
  // Already here (a resend after a reconnect): nothing to do.
  return c.state.initialized() ? Verdict::kDiscard : Verdict::kAccept;
}

void RackExchange::SendPeerError(net::Connection& conn, uint32_t peer_tenant,
                                 const std::string& text) {
  net::ErrorFrame e = net::MakeErrorFrame(WireError::kInvalidArgument, text, peer_tenant, 0, false);
  conn.SendOwned(e.header, std::move(e.body));
}

Result<bool> RackExchange::TryBind(uint32_t peer, uint32_t peer_tenant,
                                   const std::string& bind_bytes) {
  dpb::KeyBind bind;
  TenantInfo tenant;
  KeyInfo key;
  if (!bind.ParseFromString(bind_bytes)) return InvalidArgument("payload: not a KeyBind");
  if (!registry_->GetTenant(bind.tenant(), &tenant).ok()) return false;  // not here yet
  // (Unset: sync, as on create.)
  const auto theirs = bind.consistency() == pb::BOUNDED ? Consistency::kBounded
                      : bind.consistency() == pb::ASYNC ? Consistency::kAsync
                                                        : Consistency::kSync;
  if (tenant.consistency != theirs || tenant.staleness != bind.staleness()) {
    return FailedPrecondition(
        "tenant " + QuoteForLog(bind.tenant()) + " is " +
        ConsistencyName(tenant.consistency, tenant.staleness) + " on rack " +
        Num(topology_.rack) + "'s hub but " + ConsistencyName(theirs, bind.staleness()) +
        " on rack " + Num(peer) + "'s (create the tenant with the same consistency and " +
        "staleness on every hub)");
  }
  const auto differs = [&] {
    return FailedPrecondition("key " + QuoteForLog(bind.key()) + " of tenant " +
                              QuoteForLog(bind.tenant()) +
                              " is laid out or initialized differently on the two racks "
                              "(create the tenant with the same settings and its keys with the "
                              "same init (a table: rows, dim, seed and scale) and in the same "
                              "order on every hub)");
  };
  if (tenant.workers_per_rack != bind.workers_per_rack()) return differs();
  if (!registry_->GetKey(bind.tenant(), bind.key(), &key).ok()) {
    const Result<bool> adopted = AdoptKey(peer, peer_tenant, tenant, bind, &key);
    if (!adopted.ok() || !*adopted) return adopted;  // refused, or not yet
  }
  if (key.id != bind.key_id() || key.elements != bind.elements() ||
      key.placement.first_chunk != bind.first_chunk() ||
      static_cast<int>(key.dtype) != static_cast<int>(bind.dtype()) ||
      key.chunk_elements != bind.chunk_elements() ||
      InitModeToProto(key.init) != bind.init() || key.rows != bind.rows() ||
      key.dim != bind.dim() || key.init_seed != bind.init_seed() ||
      key.init_scale != bind.init_scale()) {
    return differs();
  }
  peer_tenants_[{peer, peer_tenant}] = tenant.handle;
  bind_refusals_.erase({peer, peer_tenant, bind.key_id()});
  table_->EnsureTenant(tenant);
  return true;
}

Result<bool> RackExchange::AdoptKey(uint32_t peer, uint32_t peer_tenant, const TenantInfo& tenant,
                                    const dpb::KeyBind& bind, KeyInfo* key) {
  // With a shared registry (etcd) the key comes through it; without a
  // declaration (a hub of an older version) it waits for a worker or an
  // admin to create it here. Only elastic tenants, whose racks may have no
  // worker to declare a key: the others' hubs get their keys from their
  // own workers or the admin, as before (an admin's `key create` after the
  // tenant's is not preempted).
  if (registry_->shared() || !bind.has_declaration() || !tenant.elastic) return false;
  // The peer's keys of lower ids first (the binds kept from it came before,
  // in id order: SendKeyBind), so keys are declared here in id order also
  // when their binds waited (the tenant was created here after they came).
  for (auto it = binds_.lower_bound({peer, peer_tenant, 0});
       it != binds_.end() && std::get<0>(it->first) == peer &&
       std::get<1>(it->first) == peer_tenant && std::get<2>(it->first) < bind.key_id();
       ++it) {
    dpb::KeyBind lower;
    KeyInfo known;
    if (lower.ParseFromString(it->second) && lower.tenant() == bind.tenant() &&
        !registry_->GetKey(lower.tenant(), lower.key(), &known).ok()) {
      (void)DeclareFromBind(peer, tenant.handle, lower, &known);  // a refusal shows at that key's frames
    }
  }
  return DeclareFromBind(peer, tenant.handle, bind, key);
}

Result<bool> RackExchange::DeclareFromBind(uint32_t peer, uint32_t handle,
                                           const dpb::KeyBind& bind, KeyInfo* key) {
  if (!bind.has_declaration()) return false;
  if (bind.key_id() == 0 || bind.key_id() > kMaxAdoptedKeyId ||
      bind.first_chunk() > kMaxAdoptedChunk) {
    return InvalidArgument("KEY_BIND of key " + QuoteForLog(bind.key()) + " from rack " +
                           Num(peer) + "'s hub: key id " + Num(bind.key_id()) +
                           " or first chunk " + Num(bind.first_chunk()) + " out of range");
  }
  const std::string bytes = bind.declaration().SerializeAsString();
  const DeclareCheck checked =
      CheckDeclare({reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()}, bind.tenant());
  if (!checked.ok) {
    return InvalidArgument("KEY_BIND of key " + QuoteForLog(bind.key()) + " from rack " +
                           Num(peer) + "'s hub: its declaration: " + checked.text);
  }
  const KeySpec& spec = checked.spec;
  if (spec.name != bind.key() || static_cast<int>(spec.dtype) != static_cast<int>(bind.dtype()) ||
      InitModeToProto(spec.init) != bind.init() || spec.rows != bind.rows() ||
      spec.dim != bind.dim() || spec.init_seed != bind.init_seed() ||
      spec.init_scale != bind.init_scale() ||
      (spec.rows == 0 && spec.elements != bind.elements())) {
    return InvalidArgument("KEY_BIND of key " + QuoteForLog(bind.key()) + " from rack " +
                           Num(peer) + "'s hub: its declaration does not match the bind");
  }
  // Refused only where this hub gave the id or chunks to another key.
  const Status s = registry_->AdoptKey(checked.spec, bind.key_id(), bind.first_chunk(), key);
  if (s.code() == StatusCode::kAlreadyExists) {
    // Another lane declared it from its own link's KEY_BIND meanwhile.
    return registry_->GetKey(bind.tenant(), bind.key(), key).ok();
  }
  if (!s.ok()) {
    return FailedPrecondition("key " + QuoteForLog(bind.key()) + " of tenant " +
                              QuoteForLog(bind.tenant()) + " is not declared on rack " +
                              Num(topology_.rack) + "'s hub and cannot be declared there from "
                              "rack " + Num(peer) + "'s KEY_BIND: " + s.message() +
                              " (create the tenant's keys in the same order on every hub)");
  }
  spdlog::info("rack link: lane {} declared key '{}' of tenant '{}' ({} elements, id {}) from "
               "rack {}'s KEY_BIND (no worker of this rack declared it)",
               table_->lane(), SafeForLog(bind.key(), 128), SafeForLog(bind.tenant(), 128),
               key->elements, key->id, peer);
  host_->KeyAdopted(handle, key->id);
  return true;
}

void RackExchange::HandleFrame(net::Connection& conn, const FrameHeader& h,
                               std::span<const std::byte> payload) {
  const uint32_t peer = conn.id().rack;
  host_->CountRackBytes(peer, 0, net::kHeaderBytes + payload.size());
  if (PeerLink* link = Authenticating(conn)) return OnHandshakeFrame(*link, conn, h, payload);
  switch (h.opcode) {
    case Opcode::kError: return OnPeerError(conn, h, payload);
    case Opcode::kKeyBind: return OnKeyBind(conn, h, payload);
    case Opcode::kRackRelayReply: return OnRelayReply(conn, h, payload);
    default: break;
  }
  if (h.opcode == Opcode::kRackCheckpoint) return host_->OnRackCheckpoint(peer, payload);
  if (h.opcode == Opcode::kRackVersions) {
    if (const Status s = host_->OnRackVersions(peer, payload); !s.ok()) {
      refusals_.Warn("rack link: lane " + Num(table_->lane()) + ": rack " + Num(peer) +
                     "'s hub: " + s.message());
    }
    return;
  }
  // Let through unchecked by AcceptHeader (parked or unbound then)?
  const bool unchecked = unchecked_.erase(&conn) > 0;
  // A member notice waits for its tenant only, never behind a key, and
  // behind the link's notices of the tenant that wait (in order: a member's
  // gone notice never overtakes its back notice).
  if (IsMemberNotice(h)) {
    if (HasParkedNotice(conn, h.tenant) || !OnMemberNotice(conn, h, payload)) {
      Park(conn, h, payload, true);
    }
    return;
  }
  LaneTenant* t = nullptr;
  if (!PeerKey(peer, h, &t)) {
    // A relayed frame of a key whose bind was refused: its worker hears why.
    const auto refused = bind_refusals_.find({peer, h.tenant, h.key});
    if (h.opcode == Opcode::kRackRelay && refused != bind_refusals_.end()) {
      return RefuseRelay(conn, h, WireError::kInvalidArgument, "key bind: " + refused->second);
    }
    return Park(conn, h, payload, true);  // a key not here yet
  }
  // Frames of a known key that wait for a recovery to end (or behind one of
  // its frames that does) are not counted against the link's backlog:
  // reading on must go on, as the round's RACK_VERSIONS may come behind
  // them; they are bounded anyway (the other hub's own frames: one per chunk
  // and update, and one RACK_ALIGN per chunk and round).
  if (HasParked(conn, h) || HeldByRecovery(*t, h)) return Park(conn, h, payload, false);
  if (Stale(*t, h)) return;  // a round ended since AcceptHeader checked it
  if (unchecked && CheckData(conn, h) != Verdict::kAccept) return;
  OnData(conn, h, payload);
}

bool RackExchange::HasParked(const net::Connection& conn, const FrameHeader& h) const {
  return std::any_of(parked_.begin(), parked_.end(), [&](const Parked& p) {
    return p.header.tenant == h.tenant && p.header.key == h.key && p.conn.lock().get() == &conn;
  });
}

bool RackExchange::HasParkedNotice(const net::Connection& conn, uint32_t peer_tenant) const {
  return std::any_of(parked_.begin(), parked_.end(), [&](const Parked& p) {
    return IsMemberNotice(p.header) && p.header.tenant == peer_tenant &&
           p.conn.lock().get() == &conn;
  });
}

void RackExchange::OnPeerError(net::Connection& conn, const FrameHeader& h,
                               std::span<const std::byte> payload) {
  const uint32_t peer = conn.id().rack;
  const Result<net::ErrorBody> body = net::DecodeErrorBody(payload);
  const WireError code = body.ok() ? body->code : WireError{};
  const std::string text = SafeForLog(body.ok() ? body->text : body.status().message(), 512);  // another hub's words: escaped before logs and replies
  spdlog::error("rack link: rack {}'s hub refused: {}: {}", peer, net::WireErrorName(code), text);
  if (LaneTenant* t = table_->FindTenant(h.tenant); t && !Unsynced(*t)) {
    // What it refused was part of an update in flight: that update is lost,
    // the tenant's hubs realign (a recovery round). (With nothing pending,
    // e.g. a refused KEY_BIND, a round would only be refused again.)
    if (!t->pending.empty()) {
      host_->AbortIteration(t->info.handle, "rack " + Num(peer) + "'s hub refused: " + text,
                            false);
    }
    // Initial values it may have dropped (parked too long for a key it did
    // not have yet) go again; it ignores those it has.
    OfferInitialValues(peer, t->info.handle);
  }
}

void RackExchange::OnKeyBind(net::Connection& conn, const FrameHeader& h,
                             std::span<const std::byte> payload) {
  const uint32_t peer = conn.id().rack;
  const std::string bytes(reinterpret_cast<const char*>(payload.data()), payload.size());
  binds_[{peer, h.tenant, h.key}] = bytes;  // (kept: PeerKey binds again after changes)
  const Result<bool> bound = TryBind(peer, h.tenant, bytes);
  if (!bound.ok()) {
    SendPeerError(conn, h.tenant, bound.status().message());
    bind_refusals_[{peer, h.tenant, h.key}] = bound.status().message();
  }
}

// The key is not declared here yet, or its tenant recovers: keep the frame
// and retry shortly.
void RackExchange::Park(net::Connection& conn, const FrameHeader& h,
                        std::span<const std::byte> payload, bool reserve) {
  const size_t bytes = reserve ? net::kHeaderBytes + payload.size() : 0;
  if (reserve && !conn.Reserve(bytes)) return;  // the link is failing
  parked_.push_back({conn.weak_from_this(), h, {payload.begin(), payload.end()},
                     std::chrono::steady_clock::now(), bytes});
  if (!parked_timer_armed_) {
    parked_timer_armed_ = true;
    gate_->After(kParkedRetryPeriod, [this] { RetryParked(); });
  }
}

void RackExchange::RetryParked() {
  parked_timer_armed_ = false;
  auto parked = std::move(parked_);
  parked_.clear();
  // A key's frames on a link are handled in the order they came (a chunk's
  // INIT before its RACK_SUM): once one stays parked, the later ones of that
  // key on that link wait behind it. Other keys and tenants do not wait.
  // Member notices wait only for their tenant, in the order they came: once
  // one of a (link, tenant) stays parked, that tenant's later ones wait.
  std::set<std::tuple<const net::Connection*, uint32_t, uint32_t>> blocked;
  std::set<std::pair<const net::Connection*, uint32_t>> notices_blocked;
  for (auto& p : parked) {
    auto conn = p.conn.lock();
    if (!conn || !conn->open()) continue;
    const auto id = std::make_tuple(conn.get(), p.header.tenant, p.header.key);
    const bool notice = IsMemberNotice(p.header);
    if (notice ? notices_blocked.count({conn.get(), p.header.tenant}) > 0 : blocked.count(id) > 0) {
      parked_.push_back(std::move(p));
      continue;
    }
    if (notice) {
      if (OnMemberNotice(*conn, p.header, p.payload)) {
        conn->Unreserve(p.reserved);
        continue;
      }
      notices_blocked.insert({conn.get(), p.header.tenant});
    }
    LaneTenant* t = nullptr;
    if (PeerKey(conn->id().rack, p.header, &t) && HeldByRecovery(*t, p.header)) {
      blocked.insert(id);  // until the recovery ends (rack_recovery.h)
      parked_.push_back(std::move(p));
      continue;
    }
    if (!PeerKey(conn->id().rack, p.header, &t)) {
      if (std::chrono::steady_clock::now() - p.since > kPeerWaitLimit) {
        conn->Unreserve(p.reserved);
        const std::string text = "key: id " + Num(p.header.key) +
                                 " was never declared on rack " + Num(topology_.rack) + "'s hub";
        if (p.header.opcode == Opcode::kRackRelay) {
          RefuseRelay(*conn, p.header, WireError::kUnknownKey, text);  // its worker is answered
        } else {
          SendPeerError(*conn, p.header.tenant, text);
        }
      } else {
        if (!notice) blocked.insert(id);  // (frames never wait behind a notice)
        parked_.push_back(std::move(p));
      }
      continue;
    }
    conn->Unreserve(p.reserved);
    if (CheckData(*conn, p.header) == Verdict::kAccept) {
      OnData(*conn, p.header, p.payload);
    }
  }
  if (!parked_.empty() && !parked_timer_armed_) {
    parked_timer_armed_ = true;
    gate_->After(kParkedRetryPeriod, [this] { RetryParked(); });
  }
}

bool RackExchange::ElasticSumFits(LaneTenant& t, Chunk& c, uint32_t peer, const FrameHeader& h,
                                  std::span<const std::byte>* payload) {
  const auto [generation, total] = MembershipSuffixOf(*payload);
  *payload = payload->first(payload->size() - net::kMembershipSuffixBytes);
  const Status applied = table_->ApplyMembership(t, c);
  const ElasticForming& f = t.forming[ChunkTable::ChunkId(c.key_id, c.index_in_key)];
  std::string why;
  if (!applied.ok()) {
    why = applied.message();
  } else if (generation != f.generation || total != f.total) {
    why = "it sums membership generation " + Num(generation) + " (" + Num(total) +
          " members), this hub's update generation " + Num(f.generation) + " (" + Num(f.total) +
          " members)";
  } else if (!c.state.is_member(peer)) {
    why = "rack " + Num(peer) + " has no member in generation " + Num(f.generation);
  }
  if (why.empty()) return true;
  // Cannot happen between hubs that committed the round's membership (a
  // frame of an older round is stale, one of a newer round held): never
  // mixed into an update; the round that follows (the workers' retries)
  // aligns the chunk.
  sum_refusals_.Warn("rack link: elastic tenant '" + t.info.name + "': the RACK_SUM of chunk " +
                     Num(h.chunk) + " of key id " + Num(h.key) + " (iteration " +
                     Num(h.iteration) + ") from rack " + Num(peer) + " was dropped: " + why);
  return false;
}

void RackExchange::OnData(net::Connection& conn, const FrameHeader& h,
                          std::span<const std::byte> payload) {
  const uint32_t peer = conn.id().rack;
  LaneTenant* tp = nullptr;
  LaneKey& key = *PeerKey(peer, h, &tp);
  LaneTenant& t = *tp;
  if (h.opcode == Opcode::kRackRelay) return OnRelay(conn, t, &key, h, payload);
  Chunk& c = table_->GetChunk(t, key, h.chunk);
  if (h.opcode == Opcode::kRackAlign) return OnAlign(conn, t, key, c, h, payload);
  if (c.table()) return OnRowData(conn, t, key, c, h, payload);
  if (h.opcode == Opcode::kInit) {
    if (!table_->SetInitialMultiRack(key, c, payload)) return;  // a duplicate
    host_->ChunkInitialized(t.info.handle, key.info.id, key.info.placement.chunk_count);
    if (c.home == topology_.rack) OnInitialized(t, key, c, peer);  // pass them on
    if (!c.AwaitsAlign(topology_.rack, key.runtime->floor.load(std::memory_order_acquire))) {
      AnswerPulls(c, c.current_version());
    }
    return;
  }
  if (h.opcode == Opcode::kRackSum) {
    if (c.elastic && !ElasticSumFits(t, c, peer, h, &payload)) return;
    if (c.state.contributions() == 0) table_->MarkPending(t, c);
    if (c.state.Contribute(peer, payload) == aggregation::ChunkState::AddResult::kComplete) {
      FinishCrossRack(t, key, c);
    }
    return;
  }
  // RACK_PARAMS from the home hub. Replies of v - 2 still queued keep their
  // bytes (fresh memory for this version then).
  c.version = h.iteration;
  c.replies[c.version & 1].PrepareOverwrite();
  std::memcpy(c.replies[c.version & 1].data(), payload.data(), payload.size());
  // A rack without members pushed nothing: the update's membership is
  // applied here for its replies' suffix (a no-op once a push did).
  if (c.elastic) (void)table_->ApplyMembership(t, c);
  table_->Completed(t, key, c, c.version);
  AnswerPushes(c, c.version);
}

}  // namespace rackhub::server
