#include "lane.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "compress.h"
#include "convert.h"
#include "rackhub/data/v1/control.pb.h"
#include "wire.h"

namespace rackhub::client::internal {

Lane::Lane(Client::Impl* owner, uint32_t index) : owner_(owner), index_(index) {}

Lane::~Lane() {
  // The connection calls nothing of ours after Close (it is closed already
  // unless the client is being destroyed with the lane open).
  if (conn_ && conn_->open()) {
    open_ = false;
    conn_->Close("client lane destroyed");
  }
}

void Lane::Start(std::shared_ptr<net::Connection> conn, bool in_step) {
  in_step_ = in_step;
  conn_ = std::move(conn);
  conn_->Start();
  Pump();
}

void Lane::Expect(uint64_t request_id, PendingRequest request) {
  pending_.emplace(request_id, std::move(request));
}

void Lane::Release(OutFrame& frame) {
  if (frame.holds_io && frame.op) owner_->ReleaseIo(frame.op);
  frame.holds_io = false;
  frame.op.reset();
}

void Lane::Send(OutFrame frame) {
  if (!open_ || closing_ || (frame.op && frame.op->failed)) return;
  if (frame.op && frame.bytes > 0) {
    ++frame.op->io_refs;
    frame.holds_io = true;
  }
  if (frame.pos != kUnpaced) queued_pushes_.push_back(frame.pos);
  queue_.push_back(std::move(frame));
  Pump();
}

uint64_t Lane::OldestUnwritten() const {
  if (!open_ || !in_step_) return UINT64_MAX;
  if (!handed_pushes_.empty()) return handed_pushes_.front().first;
  return queued_pushes_.empty() ? UINT64_MAX : queued_pushes_.front();
}

void Lane::SendByeAndClose() {
  if (!open_ || closing_) return;
  OutFrame bye;
  bye.header.opcode = net::Opcode::kBye;
  bye.header.tenant = owner_->tenant_handle();
  queue_.push_back(std::move(bye));
  closing_ = true;
  Pump();
}

void Lane::Pump() {
  if (!conn_) return;  // Start hands over what was queued before it
  // (The connection may report bytes the lane did not hand over, e.g. a
  // fatal ERROR of its own: never more than handed.)
  bool dropped_push = false;
  // The frontier only moves forward (a push handed over is still
  // unwritten): a value read earlier is a safe bound, read again before a
  // push waits on it (a nested pump may have moved it meanwhile).
  uint64_t frontier = kUnpaced;
  while (open_ && !queue_.empty() &&
         handed_bytes_ - std::min(sent_bytes_, handed_bytes_) < kSendWindowBytes) {
    const OutFrame& next = queue_.front();
    // Frames of operations that already failed are not sent (their caller
    // may reuse the buffers as soon as the ticket completes).
    const bool drop = next.op && next.op->failed;
    // A push waits while it is too far ahead of the other lanes' (lane.h).
    if (!drop && in_step_ && next.pos != kUnpaced) {
      if (frontier == kUnpaced) frontier = owner_->PaceFrontier();
      const uint64_t lookahead =
          std::max<uint64_t>(kLookaheadBytes, uint64_t{owner_->lanes()} * (net::kHeaderBytes + next.bytes));
      if (next.pos >= frontier + lookahead) {
        frontier = owner_->PaceFrontier();
        if (next.pos >= frontier + lookahead) break;
      }
    }
    OutFrame f = std::move(queue_.front());
    queue_.pop_front();
    if (f.pos != kUnpaced) queued_pushes_.pop_front();
    if (drop) {
      dropped_push = dropped_push || f.pos != kUnpaced;
      Release(f);
      continue;
    }
    const bool bye = f.header.opcode == net::Opcode::kBye;
    net::FrameHeader h = f.header;
    h.payload_bytes = static_cast<uint32_t>(f.bytes);
    handed_bytes_ += net::kHeaderBytes + f.bytes;
    if (f.pos != kUnpaced) handed_pushes_.emplace_back(f.pos, handed_bytes_);
    if (f.bytes == 0) {
      Release(f);
      conn_->SendOwned(h, std::string());
    } else {
      // The payload is held until the connection is done with it; then
      // (written, copied into a ring, or dropped by a close) the io_ref goes.
      std::shared_ptr<const void> hold = owner_->HoldIo(f.op, f.holds_io);
      f.holds_io = false;
      conn_->SendShared(h, std::span(static_cast<const std::byte*>(f.payload), f.bytes),
                        std::move(hold));
    }
    if (bye) {
      bye_handed_ = true;
      break;
    }
  }
  // The frontier may have moved: the other lanes may hand more.
  if (dropped_push) owner_->PumpLanes();
}

void Lane::OnBytesSent(net::Connection& conn, size_t bytes) {
  sent_bytes_ += bytes;
  bool wrote_push = false;
  while (!handed_pushes_.empty() && handed_pushes_.front().second <= sent_bytes_) {
    handed_pushes_.pop_front();
    wrote_push = true;
  }
  if (bye_handed_ && sent_bytes_ >= handed_bytes_ && conn.open()) {
    conn.Close("the client closed the lane after BYE");
    if (wrote_push) owner_->PumpLanes();
    return;
  }
  if (wrote_push) {
    owner_->PumpLanes();
  } else {
    Pump();
  }
}

void Lane::Abort() {
  if (!open_) return;
  open_ = false;
  Shut();
  if (conn_) conn_->Close("the client aborted the lane");
  owner_->LaneClosed();
}

void Lane::Shut() {
  while (!queue_.empty()) {
    Release(queue_.front());
    queue_.pop_front();
  }
  queued_pushes_.clear();
  handed_pushes_.clear();
  DropCurrent();
  pending_.clear();  // their operations are failed by the owner
}

void Lane::DropCurrent() {
  if (!dest_.empty()) {
    dest_ = {};
    owner_->ReleaseIo(current_.op);
  }
  current_ = PendingRequest{};
}

void Lane::OnConnectionClosed(net::Connection&, const std::string& why) {
  if (!open_) return;  // we closed it
  if (closing_ || owner_->closing()) {
    open_ = false;
    Shut();
    owner_->LaneClosed();
    return;
  }
  Broken(why == "peer closed the connection" ? "the hub closed the connection" : why);
}

void Lane::Broken(const std::string& reason, bool reconnectable) {
  owner_->ConnectionLost("lane " + std::to_string(index_) + ": " + reason, reconnectable);
  Abort();  // if the client did not abort every lane already
}

net::FrameHandler::Verdict Lane::AcceptHeader(net::Connection&, const net::FrameHeader& h) {
  if (!open_) return Verdict::kReject;
  const net::Opcode op = h.opcode;
  if (op == net::Opcode::kError || op == net::Opcode::kHeartbeat) return Verdict::kAccept;
  const auto reject = [&](const std::string& why) {
    Broken(why);
    return Verdict::kReject;
  };
  if (op != net::Opcode::kParams && op != net::Opcode::kAck && op != net::Opcode::kKeyInfo &&
      op != net::Opcode::kRows) {
    return reject(std::string("unexpected ") + net::OpcodeName(op) + " frame from the hub");
  }
  const auto it = pending_.find(h.request_id);
  if (it == pending_.end()) {
    return reject(std::string(net::OpcodeName(op)) + " answers unknown request id " +
                  std::to_string(h.request_id));
  }
  current_ = std::move(it->second);
  pending_.erase(it);
  const Operation& o = *current_.op;
  const auto what = [&] {
    return std::string(net::OpcodeName(op)) + " for request " + std::to_string(h.request_id) +
           " (" + OpKindName(o.kind) + " of key " + std::to_string(o.key) + ")";
  };
  if (op != current_.expect)
    return reject(what() + ": expected " + net::OpcodeName(current_.expect));
  if (op == net::Opcode::kRows) return Verdict::kAccept;  // checked whole by StoreRows
  if (op != net::Opcode::kParams) {
    if (h.key != o.key && o.kind != OpKind::kDeclare) {
      return reject(what() + " names key " + std::to_string(h.key));
    }
    return Verdict::kAccept;
  }
  if (h.key != o.key || h.chunk != current_.chunk) {
    return reject(what() + " names key " + std::to_string(h.key) + " chunk " +
                  std::to_string(h.chunk) + ", expected chunk " + std::to_string(current_.chunk));
  }
  const size_t want = size_t{current_.elements} * net::DTypeBytes(WireDType(o.dtype));
  if (h.payload_bytes == 0 && o.kind == OpKind::kInit) return Verdict::kAccept;  // bare ack
  const size_t suffix = ((h.flags & net::kFlagVersions) ? net::kVersionsSuffixBytes : 0) +
                        ((h.flags & net::kFlagMembership) ? net::kMembershipSuffixBytes : 0);
  const bool sparse = (h.flags & net::kFlagSparse) != 0;
  if (sparse && h.payload_bytes <= want) return Verdict::kAccept;  // StoreSparseParams checks
  if (sparse || h.dtype != WireDType(o.dtype) || h.payload_bytes != want + suffix) {
    return reject(what() + ": " + std::to_string(h.payload_bytes) + " bytes of " +
                  net::DTypeName(h.dtype) + ", expected " + std::to_string(want) + " bytes of " +
                  net::DTypeName(WireDType(o.dtype)));
  }
  const bool store =
      !o.failed && !o.finished && (o.kind == OpKind::kPushPull || o.kind == OpKind::kPull);
  if (store && o.dtype == DType::kFp32 && suffix == 0 && want > 0) {
    // fp32: straight into the caller's buffer at the chunk's offset.
    dest_ = std::as_writable_bytes(current_.op->out.subspan(current_.offset, current_.elements));
    ++current_.op->io_refs;
  }
  return Verdict::kAccept;
}

std::span<std::byte> Lane::PayloadDestination(net::Connection&, const net::FrameHeader&) {
  return dest_;
}

void Lane::HandleFrame(net::Connection&, const net::FrameHeader& h,
                       std::span<const std::byte> payload) {
  if (!open_) return;
  if (h.opcode == net::Opcode::kHeartbeat) return;
  if (h.opcode == net::Opcode::kError) {
    if (const Status s = HandleErrorFrame(owner_, index_, h, payload, &pending_); !s.ok()) {
      Broken(s.message(), s.code() != StatusCode::kFailedPrecondition);
    }
    return;
  }
  const PendingRequest request = std::exchange(current_, PendingRequest{});
  const bool held = !std::exchange(dest_, {}).empty();
  const Status s = StoreReply(h, payload, request);
  if (held) owner_->ReleaseIo(request.op);
  if (!s.ok()) Broken(s.message());
}

Status Lane::StoreReply(const net::FrameHeader& h, std::span<const std::byte> payload,
                        const PendingRequest& request) {
  const OperationPtr& op = request.op;
  if (op->failed || op->finished) return Status::Ok();  // late reply of a failed ticket: dropped
  if (h.opcode == net::Opcode::kParams) {
    const size_t want = size_t{request.elements} * net::DTypeBytes(WireDType(op->dtype));
    const bool data = op->kind == OpKind::kPushPull || op->kind == OpKind::kPull;
    if (h.flags & net::kFlagSparse) {
      if (Status st = StoreSparseParams(h, payload, request); !st.ok()) return st;
    } else if (h.payload_bytes > 0 && data) {
      float* dest = op->out.data() + request.offset;
      if (op->dtype != DType::kFp32) {
        WidenToFloats(op->dtype, payload.data(), dest, request.elements);
      } else if (payload.data() != reinterpret_cast<const std::byte*>(dest)) {
        std::memcpy(dest, payload.data(), want);  // from a ring, or before a suffix
      }
    }
    if ((h.flags & net::kFlagVersions) && !(h.flags & net::kFlagSparse) &&
        payload.size() >= want + net::kVersionsSuffixBytes) {
      owner_->VersionsArrived(op, ReadVersions(payload.subspan(want)));
    }
    if ((h.flags & net::kFlagMembership) && !(h.flags & net::kFlagSparse) &&
        payload.size() >= want + net::kMembershipSuffixBytes) {
      owner_->MembershipArrived(op, ReadMembership(payload.subspan(want)));
    }
  } else if (h.opcode == net::Opcode::kRows) {
    if (Status s = StoreRows(h, payload, request); !s.ok()) return s;
  } else if (h.opcode == net::Opcode::kKeyInfo) {
    data::v1::KeyEntry entry;
    if (!entry.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
      return Unavailable("KEY_INFO payload is not a KeyEntry");
    }
    Result<KeyInfo> info = ToKeyInfo(entry, owner_->chunk_elements());
    if (!info.ok()) return Unavailable("KEY_INFO: " + info.status().message());
    op->declared = *std::move(info);
  }
  owner_->ReplyArrived(op, h.iteration);
  return Status::Ok();
}

Status HandleErrorFrame(Client::Impl* owner, uint32_t lane, const net::FrameHeader& h,
                        std::span<const std::byte> payload,
                        std::unordered_map<uint64_t, PendingRequest>* pending) {
  const Result<net::ErrorBody> error = net::DecodeErrorBody(payload);
  if (!error.ok()) return Unavailable("ERROR frame with a payload shorter than 4 bytes");
  const net::WireError code = error->code;
  const std::string& text = error->text;
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

}  // namespace rackhub::client::internal
