// Client::Impl: running operations on the I/O thread: starting one (its
// deadline), sending its chunks, the replies arriving, holding the caller's
// buffers while a transfer runs, and failing or finishing its ticket.
// Issuing: operations.cc; connection loss and Close: close.cc.
#include <algorithm>
#include <cstring>
#include <utility>

#include "client_impl.h"
#include "compress.h"
#include "convert.h"
#include "lane.h"
#include "rackhub/data/v1/control.pb.h"
#include "wire.h"

namespace rackhub::client {

namespace {

// After a ticket failed while a transfer still reads or writes the caller's
// buffer, the transfer gets this long to end before the connection is torn
// down (so the ticket can complete without the buffer being touched later).
constexpr auto kTransferGrace = std::chrono::seconds(2);

}  // namespace

void Client::Impl::Start(const OperationPtr& op) {
  if (op->finished || op->failed) return;  // failed by Close or a broken connection
  op->started = true;
  if (options_.op_timeout.count() > 0) AddDeadline(op);
  if (reconnecting_) return;  // sent once the lanes are back (AdoptReconnect)
  if (Error e = KeyAllowsSend(*op); !e.ok()) {
    FailOp(op, std::move(e));
    return;
  }
  Send(op);
}

void Client::Impl::AddDeadline(const OperationPtr& op) {
  deadlines_.push_back({std::chrono::steady_clock::now() + options_.op_timeout, op});
  ++deadlines_open_;
  if (!deadline_armed_) ArmDeadline();
}

void Client::Impl::DropFinishedDeadlines() {
  auto finished = [](const Deadline& d) {
    const OperationPtr op = d.op.lock();
    return !op || op->finished;
  };
  while (!deadlines_.empty() && finished(deadlines_.front())) deadlines_.pop_front();
  // An operation that stays pending holds the entries behind it: compact
  // once most of the queue is finished, so it stays in proportion to the
  // pending operations (amortized constant per operation).
  if (deadlines_.size() > 64 && deadlines_.size() > 2 * deadlines_open_) {
    std::erase_if(deadlines_, finished);
  }
}

void Client::Impl::ArmDeadline() {
  if (deadlines_.empty() || closing_io_) return;
  if (!deadline_timer_) deadline_timer_ = std::make_unique<asio::steady_timer>(io_);
  deadline_armed_ = true;
  deadline_timer_->expires_at(deadlines_.front().at);
  deadline_timer_->async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    deadline_armed_ = false;
    OnDeadline();
  });
}

void Client::Impl::OnDeadline() {
  const auto now = std::chrono::steady_clock::now();
  while (!deadlines_.empty() && deadlines_.front().at <= now) {
    const OperationPtr op = deadlines_.front().op.lock();
    deadlines_.pop_front();
    if (op && !op->finished) Expire(op);  // its Finish counts it out of deadlines_open_
  }
  DropFinishedDeadlines();
  ArmDeadline();
}

void Client::Impl::Expire(const OperationPtr& op) {
  if (op->finished || op->failed) return;
  if (reconnecting_) {
    // The oldest pending ticket's op_timeout bounds the reconnect.
    GiveUpReconnect("the op_timeout (" + std::to_string(options_.op_timeout.count()) +
                    " ms) of a pending " + internal::OpKindName(op->kind) + " ran out");
    return;
  }
  FailOp(op, MakeError(ErrorCode::kTimeout,
                       std::string(internal::OpKindName(op->kind)) + " of key " +
                           std::to_string(op->key) + " timed out after " +
                           std::to_string(options_.op_timeout.count()) + " ms (" +
                           std::to_string(op->remaining) + " replies missing)"));
}

void Client::Impl::Send(const OperationPtr& op) {
  op->remaining = 0;
  op->min_reply_iteration = UINT64_MAX;
  op->min_updates = op->min_slowest = UINT64_MAX;
  op->membership_generation = UINT64_MAX;
  op->members = 0;
  op->membership_mixed = false;
  op->declared.reset();
  switch (op->kind) {
    case OpKind::kPushPull: StartChunks(op, net::Opcode::kPush); return;
    case OpKind::kInit: StartChunks(op, net::Opcode::kInit); return;
    case OpKind::kPull: StartChunks(op, net::Opcode::kPull); return;
    case OpKind::kPushPullRows: StartRows(op, net::Opcode::kPushRows); return;
    case OpKind::kPullRows: StartRows(op, net::Opcode::kPullRows); return;
    case OpKind::kSetOptimizer:
    case OpKind::kCommit:
    case OpKind::kRollback:
    case OpKind::kDeclare: {
      const bool every_lane = op->kind != OpKind::kDeclare;
      const size_t lanes = every_lane ? lanes_.size() : 1;
      op->remaining = lanes;
      for (size_t l = 0; l < lanes; ++l) {
        net::FrameHeader h;
        h.opcode = op->kind == OpKind::kCommit     ? net::Opcode::kCommit
                   : op->kind == OpKind::kRollback ? net::Opcode::kRollback
                   : every_lane                    ? net::Opcode::kSetOptimizer
                                                   : net::Opcode::kDeclare;
        h.tenant = tenant_handle_;
        h.key = op->key;
        h.iteration = op->iteration;
        h.payload_bytes = static_cast<uint32_t>(op->control.size());
        h.request_id = next_request_id_++;
        lanes_[l]->Expect(h.request_id,
                          PendingRequest{op, every_lane ? net::Opcode::kAck : net::Opcode::kKeyInfo,
                                         0, 0, 0});
        OutFrame f;
        f.header = h;
        f.payload = op->control.data();
        f.bytes = op->control.size();
        f.op = op;
        lanes_[l]->Send(std::move(f));
      }
      return;
    }
  }
}

void Client::Impl::StartChunks(const OperationPtr& op, net::Opcode opcode) {
  const uint64_t ce = chunk_elements_;
  const uint64_t chunks = (op->elements + ce - 1) / ce;
  const bool with_payload = opcode != net::Opcode::kPull;
  const bool borrow = op->dtype == DType::kFp32;
  const uint32_t elem_bytes = net::DTypeBytes(internal::WireDType(op->dtype));
  op->remaining = chunks;
  for (uint64_t c = 0; c < chunks; ++c) {
    const uint64_t offset = c * ce;
    const auto n = static_cast<uint32_t>(std::min(ce, op->elements - offset));
    Lane& lane = *lanes_[(op->first_chunk + c) % lanes_.size()];
    net::FrameHeader h;
    h.opcode = opcode;
    h.dtype = with_payload ? internal::WireDType(op->dtype) : net::DType::kNone;
    h.tenant = tenant_handle_;
    h.key = op->key;
    h.chunk = static_cast<uint32_t>(c);
    h.payload_bytes = with_payload ? n * elem_bytes : 0;
    h.iteration = opcode == net::Opcode::kPush ? op->iteration : 0;
    h.request_id = next_request_id_++;
    lane.Expect(h.request_id, PendingRequest{op, net::Opcode::kParams, static_cast<uint32_t>(c),
                                             offset, n});
    OutFrame f;
    f.op = op;
    if (with_payload && !op->packed_chunks.empty()) {
      // Top-k: the payload PackTopK built (the op holds the buffer).
      const Operation::PackedChunk& p = op->packed_chunks[c];
      if (p.sparse) h.flags = net::kFlagSparse;
      h.payload_bytes = static_cast<uint32_t>(p.bytes);
      f.payload = op->packed->data() + p.offset;
      f.bytes = p.bytes;
    } else if (with_payload) {
      f.payload = borrow ? static_cast<const void*>(op->in.data() + offset)
                         : static_cast<const void*>(op->narrowed->data() + offset);
      f.bytes = h.payload_bytes;
    }
    if (with_payload) {
      f.pos = next_pace_pos_;
      next_pace_pos_ += net::kHeaderBytes + f.bytes;
    }
    f.header = h;
    lane.Send(std::move(f));
  }
}

uint64_t Client::Impl::PaceFrontier() const {
  uint64_t frontier = UINT64_MAX;
  for (const auto& lane : lanes_) frontier = std::min(frontier, lane->OldestUnwritten());
  return frontier;
}

void Client::Impl::PumpLanes() {
  // A connection may report bytes written from inside a send (ring
  // transports): then the pass in progress runs once more.
  if (pumping_lanes_) {
    pump_lanes_again_ = true;
    return;
  }
  pumping_lanes_ = true;
  do {
    pump_lanes_again_ = false;
    for (const auto& lane : lanes_) lane->Pump();
  } while (pump_lanes_again_);
  pumping_lanes_ = false;
}

void Client::Impl::VersionsArrived(const OperationPtr& op, const net::VersionsSuffix& v) {
  op->min_updates = std::min(op->min_updates, v.updates);
  op->min_slowest = std::min(op->min_slowest, v.slowest);
}

void Client::Impl::MembershipArrived(const OperationPtr& op, const net::MembershipSuffix& m) {
  if (op->membership_generation != UINT64_MAX && op->membership_generation != m.generation) {
    op->membership_mixed = true;
  }
  if (m.generation < op->membership_generation) {
    op->membership_generation = m.generation;
    op->members = m.members;
  }
}

void Client::Impl::ReplyArrived(const OperationPtr& op, uint64_t iteration) {
  if (op->failed || op->finished) return;
  op->min_reply_iteration = std::min(op->min_reply_iteration, iteration);
  if (op->remaining > 0) --op->remaining;
  MaybeFinish(op);
}

std::shared_ptr<const void> Client::Impl::HoldIo(const OperationPtr& op, bool io_ref) {
  if (!io_ref) return op;
  return std::shared_ptr<const void>(op.get(), [gate = io_gate_, op](const void*) {
    if (gate->impl != nullptr) gate->impl->ReleaseIo(op);
  });
}

void Client::Impl::ReleaseIo(const OperationPtr& op) {
  --op->io_refs;
  MaybeFinish(op);
}

void Client::Impl::FailOp(const OperationPtr& op, Error error) {
  if (op->finished || op->failed) return;
  op->failed = true;
  op->error = std::move(error);
  MaybeFinish(op);
  if (op->finished || closing_io_) return;
  // A transfer still touches the caller's buffer: give it a moment, then tear
  // the connection down so the ticket cannot hang.
  auto timer = std::make_shared<asio::steady_timer>(io_, kTransferGrace);
  timer->async_wait([this, op, timer](const boost::system::error_code& ec) {
    if (ec || op->finished) return;
    ConnectionLost(std::string("a transfer of a failed ") + internal::OpKindName(op->kind) +
                   " of key " + std::to_string(op->key) + " did not end within 2 s");
  });
}

void Client::Impl::MaybeFinish(const OperationPtr& op) {
  if (op->finished || op->io_refs > 0) return;
  if (op->failed || op->remaining == 0) Finish(op);
}

void Client::Impl::Finish(const OperationPtr& op) {
  op->finished = true;
  if (op->started && options_.op_timeout.count() > 0) {
    if (deadlines_open_ > 0) --deadlines_open_;
    DropFinishedDeadlines();
  }
  Error result = op->failed ? op->error : Error{};
  {
    std::lock_guard lock(mu_);
    if (op->kind == OpKind::kDeclare) {
      if (result.ok() && op->declared) ImportKey(*op->declared);
    } else if (op->kind != OpKind::kSetOptimizer && op->kind != OpKind::kCommit &&
               op->kind != OpKind::kRollback) {
      const auto it = keys_.find(op->key);
      if (it != keys_.end()) {
        KeyInfo& k = it->second.info;
        it->second.busy = false;
        if (result.ok() && op->min_updates != UINT64_MAX) {
          k.updates = op->min_updates;
          k.slowest_iteration = op->min_slowest;
        }
        if (result.ok() && op->membership_generation != UINT64_MAX) {
          k.membership_generation = op->membership_generation;
          k.members = op->members;
          k.membership_mixed = op->membership_mixed;
        }
        if (result.ok() && op->min_reply_iteration != UINT64_MAX) {
          k.version = op->min_reply_iteration;
          const bool push = op->kind == OpKind::kPushPull || op->kind == OpKind::kPushPullRows;
          k.next_iteration = push ? op->iteration + 1 : op->min_reply_iteration;
          if (op->kind == OpKind::kPull || op->kind == OpKind::kPullRows) {
            k.resync_needed = false;
          }
        }
        if (!result.ok() &&
            (op->kind == OpKind::kPushPull || op->kind == OpKind::kPushPullRows) &&
            result.code == ErrorCode::kServer &&
            (result.wire == WireError::kWorkerLost ||
             result.wire == WireError::kBadIteration)) {
          // The key's chunks may be at another version than next_iteration:
          // the caller must Pull before pushing again.
          Error mark = MakeError(
              ErrorCode::kRolledBack,
              "key '" + k.name + "' needs a Pull before the next PushPull: its PushPull of " +
                  "iteration " + std::to_string(op->iteration) + " failed with " +
                  WireErrorName(result.wire) + " (" + result.message + ")");
          mark.iteration =
              result.wire == WireError::kBadIteration ? result.iteration : k.next_iteration;
          MarkResync(it->second, std::move(mark));
        }
      }
    }
    if (op->callback) tickets_.erase(op->ticket);
  }
  {
    std::lock_guard lock(op->mu);
    op->done = true;
    op->result = result;
  }
  op->cv.notify_all();
  if (op->callback) op->callback(result);
}

std::vector<internal::OperationPtr> Client::Impl::UnfinishedOps() {
  std::vector<OperationPtr> ops;
  std::lock_guard lock(mu_);
  for (const auto& [ticket, op] : tickets_) {
    if (!op->finished) ops.push_back(op);
  }
  std::sort(ops.begin(), ops.end(),
            [](const OperationPtr& a, const OperationPtr& b) { return a->ticket < b->ticket; });
  return ops;
}

}  // namespace rackhub::client
