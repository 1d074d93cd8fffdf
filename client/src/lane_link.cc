// The frame handling every client lane transport shares (lane_link.h):
// ERROR frames, and whole-frame replies for RDMA and the in-memory transport.
#include <cstring>

#include "client_impl.h"
#include "compress.h"
#include "convert.h"
#include "lane_link.h"
#include "rackhub/data/v1/control.pb.h"
#include "wire.h"

namespace rackhub::client::internal {

Status HandleErrorFrame(Client::Impl* owner, uint32_t lane, const net::FrameHeader& h,
                        std::span<const std::byte> payload,
                        std::unordered_map<uint64_t, PendingRequest>* pending) {
  net::WireError code{};
  std::string text;
  if (!net::DecodeErrorBody(payload, &code, &text)) {
    return Unavailable("ERROR frame with a payload shorter than 4 bytes");
  }
  const std::string what = std::string(net::WireErrorName(code)) + ": " + text;
  if (h.flags & net::kFlagFatal) {
    std::string why = "the hub sent a fatal ERROR and closes the connection: " + what;
    switch (code) {
      // Caused by this client itself: reconnecting would not help.
      case net::WireError::kMalformed:
      case net::WireError::kUnauthenticated:
      case net::WireError::kTenantGone:
      case net::WireError::kBadChunk:
      case net::WireError::kBadDType:
      case net::WireError::kDuplicatePush:
      case net::WireError::kNotReady:
      case net::WireError::kInvalidArgument:
        return FailedPrecondition(std::move(why));
      default:
        return Unavailable(std::move(why));
    }
  }
  const auto it = pending->find(h.request_id);
  if (it == pending->end()) return Status::Ok();  // unsolicited, not fatal: nothing waits for it
  const OperationPtr op = std::move(it->second.op);
  const uint32_t chunk = it->second.chunk;
  pending->erase(it);
  if (code == net::WireError::kShuttingDown && owner->reconnect_enabled()) {
    // The hub is stopping (maybe restarting): the fatal SHUTTING_DOWN that
    // follows breaks the lane, the client reconnects and re-sends the
    // operation (or fails it with kRolledBack / kConnectionLost then).
    return Status::Ok();
  }
  Error e;
  e.code = ErrorCode::kServer;
  e.wire = ToClientWireError(code);
  // BAD_ITERATION: the header carries the chunk's current version.
  if (code == net::WireError::kBadIteration) e.iteration = h.iteration;
  e.message = std::string("hub refused ") + OpKindName(op->kind) + " of key " +
              std::to_string(op->key) + " (lane " + std::to_string(lane) + ", chunk " +
              std::to_string(chunk) + "): " + what;
  owner->FailOp(op, std::move(e));
  return Status::Ok();
}

namespace {

// A PARAMS, ACK or KEY_INFO answering `request`: the same checks, in the same
// order and with the same messages, as the TCP lane (lane.cc), which reads
// PARAMS payloads straight into the caller's buffer instead.
Status DeliverReply(Client::Impl* owner, const net::FrameHeader& h,
                    std::span<const std::byte> payload, const PendingRequest& request) {
  const net::Opcode op = h.opcode;
  const OperationPtr& o = request.op;
  const auto what = [&] {
    return std::string(net::OpcodeName(op)) + " for request " + std::to_string(h.request_id) +
           " (" + OpKindName(o->kind) + " of key " + std::to_string(o->key) + ")";
  };
  if (op != request.expect) {
    return Unavailable(what() + ": expected " + net::OpcodeName(request.expect));
  }
  if (op == net::Opcode::kRows) {
    if (Status s = StoreRows(h, payload, request); !s.ok()) return s;
  } else if (op == net::Opcode::kParams) {
    if (h.key != o->key || h.chunk != request.chunk) {
      return Unavailable(what() + " names key " + std::to_string(h.key) + " chunk " +
                         std::to_string(h.chunk) + ", expected chunk " +
                         std::to_string(request.chunk));
    }
    const size_t want = size_t{request.elements} * net::DTypeBytes(WireDType(o->dtype));
    const bool bare_ack = h.payload_bytes == 0 && o->kind == OpKind::kInit;
    const size_t suffix = (h.flags & net::kFlagVersions) ? net::kVersionsSuffixBytes : 0;
    if (h.flags & net::kFlagSparse) {
      if (Status st = StoreSparseParams(h, payload, request); !st.ok()) return st;
      owner->ReplyArrived(o, h.iteration);
      return Status::Ok();
    }
    if (!bare_ack && (h.dtype != WireDType(o->dtype) || h.payload_bytes != want + suffix)) {
      return Unavailable(what() + ": " + std::to_string(h.payload_bytes) + " bytes of " +
                         net::DTypeName(h.dtype) + ", expected " + std::to_string(want) +
                         " bytes of " + net::DTypeName(WireDType(o->dtype)));
    }
    if (o->failed || o->finished) return Status::Ok();  // late reply of a failed ticket: dropped
    if (suffix) owner->VersionsArrived(o, ReadVersions(payload.subspan(want)));
    const bool store = !bare_ack && (o->kind == OpKind::kPushPull || o->kind == OpKind::kPull);
    if (store) {
      float* dest = o->out.data() + request.offset;
      if (o->dtype == DType::kFp32) {
        std::memcpy(dest, payload.data(), want);
      } else {
        WidenToFloats(o->dtype, payload.data(), dest, request.elements);
      }
    }
  } else if (h.key != o->key && o->kind != OpKind::kDeclare) {
    return Unavailable(what() + " names key " + std::to_string(h.key));
  }
  if (o->failed || o->finished) return Status::Ok();
  if (op == net::Opcode::kKeyInfo) {
    data::v1::KeyEntry entry;
    if (!entry.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
      return Unavailable("KEY_INFO payload is not a KeyEntry");
    }
    Result<KeyInfo> info = ToKeyInfo(entry, owner->chunk_elements());
    if (!info.ok()) return Unavailable("KEY_INFO: " + info.status().message());
    o->declared = *std::move(info);
  }
  owner->ReplyArrived(o, h.iteration);
  return Status::Ok();
}

}  // namespace

Status RouteFrame(Client::Impl* owner, uint32_t lane, const net::FrameHeader& h,
                  std::span<const std::byte> payload,
                  std::unordered_map<uint64_t, PendingRequest>* pending) {
  const net::Opcode op = h.opcode;
  if (op == net::Opcode::kError) return HandleErrorFrame(owner, lane, h, payload, pending);
  if (op == net::Opcode::kHeartbeat) return Status::Ok();
  if (op != net::Opcode::kParams && op != net::Opcode::kAck && op != net::Opcode::kKeyInfo &&
      op != net::Opcode::kRows) {
    return Unavailable(std::string("unexpected ") + net::OpcodeName(op) + " frame from the hub");
  }
  const auto it = pending->find(h.request_id);
  if (it == pending->end()) {
    return Unavailable(std::string(net::OpcodeName(op)) + " answers unknown request id " +
                       std::to_string(h.request_id));
  }
  PendingRequest request = std::move(it->second);
  pending->erase(it);
  return DeliverReply(owner, h, payload, request);
}

}  // namespace rackhub::client::internal
