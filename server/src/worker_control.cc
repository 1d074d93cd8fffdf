// WorkerProtocol, part 2: the control frames of a worker connection:
// WELCOME, client DECLARE and SET_OPTIMIZER. None of it is per chunk.
#include <spdlog/spdlog.h>

#include "declare_check.h"
#include "proto_convert.h"
#include "rackhub/data/v1/control.pb.h"
#include "worker_protocol.h"

namespace rackhub::server {

namespace pb = rackhub::admin::v1;
namespace dpb = rackhub::data::v1;
using net::FrameHeader;
using net::Opcode;
using net::WireError;

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
}

}  // namespace

std::string WorkerProtocol::WelcomePayload(const LaneTenant& t) {
  dpb::Welcome w;
  w.set_tenant_handle(t.info.handle);
  w.set_chunk_elements(t.info.chunk_bytes / aggregation::kMasterElementBytes);
  w.set_lanes(table_->lanes());
  w.set_workers(t.info.workers_per_rack);
  w.set_epoch(1);
  w.set_server_version(RACKHUB_VERSION);
  w.set_straggler_timeout_ms(config_.straggler_timeout_ms);
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
  KeyInfo info;
  bool created = false;
  const Status s = registry_->DeclareKey(spec, &info, &created);
  if (!s.ok()) {
    conn.SendError(WireErrorOf(s), s.message(), h.request_id, false);
    return;
  }
  if (created) {
    spdlog::info("data: tenant '{}' rank {} declared key '{}' ({} elements)", t.info.name,
                 conn.id().rank, info.name, info.elements);
  }
  dpb::KeyEntry entry;
  const auto rt = host_->KeyRuntimeFor(t.info.handle, info.id);
  FillKeyEntry(info, rt->version.load(std::memory_order_relaxed), &entry);
  FrameHeader r;
  r.opcode = Opcode::kKeyInfo;
  r.tenant = t.info.handle;
  r.key = info.id;
  r.request_id = h.request_id;
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
  if (s.ok()) {
    Result<ProtoOptimizer> opt = OptimizerFromProto(update.optimizer());
    if (!opt.ok()) {
      s = InvalidArgument("optimizer." + opt.status().message());
    } else {
      // The registry tells every lane (this one included) through the observer.
      s = registry_->SetOptimizer(t.info.name, info.name, opt->config, opt->unspecified_type,
                                  &info, h.iteration + 1);
    }
  }
  if (!s.ok()) {
    conn.SendError(WireErrorOf(s), s.message(), h.request_id, false);
    return;
  }
  // Apply here at once too, so the ACK means "this lane has it".
  table_->ApplyOptimizer(t.info.handle, info.id, info.optimizer, h.iteration + 1);
  FrameHeader r;
  r.opcode = Opcode::kAck;
  r.tenant = t.info.handle;
  r.key = info.id;
  r.iteration = h.iteration;
  r.request_id = h.request_id;
  conn.SendOwned(r, {});
}

}  // namespace rackhub::server
