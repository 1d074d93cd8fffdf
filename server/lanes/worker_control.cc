// WorkerProtocol, part 2: the control frames of a worker connection:
// WELCOME, client DECLARE and SET_OPTIMIZER. None of it is per chunk.
#include <spdlog/spdlog.h>

#include "declare_check.h"
#include "proto_convert.h"
#include "rackhub/data/v1/control.pb.h"
#include "wire_names.h"
#include "worker_protocol.h"

namespace rackhub::server {

namespace pb = rackhub::admin::v1;
namespace dpb = rackhub::data::v1;

namespace {

WireError WireErrorOf(const Status& s) {
  switch (s.code()) {
    case StatusCode::kResourceExhausted: return WireError::kQuotaExceeded;
    case StatusCode::kNotFound: return WireError::kUnknownKey;
    case StatusCode::kUnauthenticated: return WireError::kUnauthenticated;
    default: return WireError::kInvalidArgument;
  }
}

void FillKeyEntry(const KeyInfo& k, uint64_t version, dpb::KeyEntry* e) {
  e->set_id(k.id);
  e->set_name(k.name);
  e->set_elements(k.elements);
  e->set_dtype(static_cast<pb::DType>(k.dtype));
  e->set_first_chunk(k.placement.first_chunk);
  e->set_chunk_count(k.placement.chunk_count);
  e->set_init(InitModeToProto(k.init));
  OptimizerToProto(k.optimizer, e->mutable_optimizer());
  e->set_version(version);
  e->set_rows(k.rows);
  e->set_dim(k.dim);
  e->set_rows_per_chunk(k.rows_per_chunk());
  e->set_topk_ratio(static_cast<float>(k.topk_ratio));
  e->set_topk_ratio_exact(k.topk_ratio);
  for (uint32_t rank : k.participants) e->add_participants(rank);
}

}  // namespace

std::string WorkerProtocol::WelcomePayload(const LaneTenant& t, uint64_t generation) {
  dpb::Welcome w;
  w.set_generation(generation);
  w.set_tenant_handle(t.info.handle);
  w.set_chunk_elements(t.info.chunk_bytes / aggregation::kMasterElementBytes);
  w.set_lanes(table_->lanes());
  w.set_workers(t.info.workers_per_rack);
  w.set_epoch(1);
  w.set_server_version(RACKHUB_VERSION);
  w.set_straggler_timeout_ms(config_.straggler_timeout_ms);
  w.set_consistency(ConsistencyToProto(t.info.consistency));
  w.set_staleness(t.info.staleness);
  w.set_incarnation(host_->WelcomeIncarnation(t.info));
  std::vector<KeyInfo> keys;
  if (registry_->ListKeys(t.info.name, &keys).ok()) {
    for (const auto& k : keys) {
      const auto rt = host_->KeyRuntimeFor(t.info.handle, k.id);
      FillKeyEntry(k, rt->version.load(std::memory_order_relaxed), w.add_keys());
    }
  }
  return w.SerializeAsString();
}

void WorkerProtocol::OnDeclare(net::Connection& conn, LaneTenant& t, const FrameHeader& h,
                               std::span<const std::byte> payload) {
  const DeclareCheck checked = CheckDeclare(payload, t.info.name);
  if (!checked.ok) {
    if (checked.fatal) {
      Reject(conn, checked.code, checked.text, h.request_id);
    } else {
      conn.SendError(checked.code, checked.text, h.request_id, false);
    }
    return;
  }
  const KeySpec& spec = checked.spec;
  KeyInfo known;
  if (registry_->shared() && !registry_->GetKey(spec.tenant, spec.name, &known).ok()) {
    // A new key in a registry shared through etcd: a transaction and its
    // watch, milliseconds to seconds; never on the lane (its other tenants
    // would wait). The answer comes back through the gate.
    auto done = gate_->Wrap([this, conn = conn.shared_from_this(), handle = t.info.handle,
                             request_id = h.request_id](const Status& s, const KeyInfo& info,
                                                        bool created) {
      if (conn->open()) AnswerDeclare(*conn, handle, request_id, s, info, created);
    });
    LaneGate* gate = gate_;
    Registry* registry = registry_;
    host_->RunBlocking([gate, registry, spec, done]() mutable {
      KeyInfo info;
      bool created = false;
      const Status s = registry->DeclareKey(spec, &info, &created);
      gate->Post([done, s, info, created]() mutable { done(s, info, created); });
    });
    return;
  }
  KeyInfo info;
  bool created = false;
  const Status s = registry_->DeclareKey(spec, &info, &created);
  AnswerDeclare(conn, t.info.handle, h.request_id, s, info, created);
}

void WorkerProtocol::AnswerDeclare(net::Connection& conn, uint32_t handle, uint64_t request_id,
                                   const Status& s, const KeyInfo& info, bool created) {
  if (!s.ok()) {
    conn.SendError(WireErrorOf(s), s.message(), request_id, false);
    return;
  }
  if (created) {
    spdlog::info("data: tenant '{}' rank {} declared key '{}' ({} elements)", info.tenant,
                 conn.id().rank, info.name, info.elements);
  }
  dpb::KeyEntry entry;
  const auto rt = host_->KeyRuntimeFor(handle, info.id);
  FillKeyEntry(info, rt->version.load(std::memory_order_relaxed), &entry);
  FrameHeader r;
  r.opcode = Opcode::kKeyInfo;
  r.tenant = handle;
  r.key = info.id;
  r.request_id = request_id;
  conn.SendOwned(r, entry.SerializeAsString());
}

void WorkerProtocol::OnSetOptimizer(net::Connection& conn, LaneTenant& t, const FrameHeader& h,
                                    std::span<const std::byte> payload) {
  dpb::OptimizerUpdate update;
  if (!update.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    Reject(conn, WireError::kMalformed, "payload: SET_OPTIMIZER is not an OptimizerUpdate",
           h.request_id);
    return;
  }
  KeyInfo info;
  Status s = registry_->GetKeyById(t.info.handle, h.key, &info);
  Result<ProtoOptimizer> opt = OptimizerFromProto(update.optimizer());
  if (s.ok() && !opt.ok()) s = InvalidArgument("optimizer." + opt.status().message());
  if (!s.ok()) {
    conn.SendError(WireErrorOf(s), s.message(), h.request_id, false);
    return;
  }
  const uint32_t handle = t.info.handle;
  const std::string tenant = t.info.name;
  const FrameHeader request = h;
  // The registry tells every lane (this one included) through the observer;
  // with a shared registry (etcd) the write leaves the lane (OnDeclare).
  auto set = [registry = registry_, tenant, name = info.name, config = opt->config,
              keep_type = opt->unspecified_type, from = h.iteration + 1](KeyInfo* out) {
    return registry->SetOptimizer(tenant, name, config, keep_type, out, from);
  };
  auto answer = [this, handle, request](net::Connection& c, const Status& st,
                                         const KeyInfo& key) {
    if (!st.ok()) {
      c.SendError(WireErrorOf(st), st.message(), request.request_id, false);
      return;
    }
    // Apply here at once too, so the ACK means "this lane has it".
    table_->ApplyOptimizer(handle, key.id, key.optimizer, request.iteration + 1);
    FrameHeader r;
    r.opcode = Opcode::kAck;
    r.tenant = handle;
    r.key = key.id;
    r.iteration = request.iteration;
    r.request_id = request.request_id;
    c.SendOwned(r, {});
  };
  if (registry_->shared()) {
    auto done = gate_->Wrap([answer, conn = conn.shared_from_this()](const Status& st,
                                                                     const KeyInfo& key) {
      if (conn->open()) answer(*conn, st, key);
    });
    LaneGate* gate = gate_;
    host_->RunBlocking([gate, set, done]() mutable {
      KeyInfo key;
      const Status st = set(&key);
      gate->Post([done, st, key]() mutable { done(st, key); });
    });
    return;
  }
  s = set(&info);
  answer(conn, s, info);
}

}  // namespace rackhub::server
