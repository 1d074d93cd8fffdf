// Client::Impl: issuing operations (caller threads), running them on the I/O
// thread, completing tickets, failure propagation and Close.
#include <algorithm>
#include <cstring>
#include <random>
#include <utility>

#include "client_impl.h"
#include "compress.h"
#include "convert.h"
#include "lane.h"
#include "rackhub/data/v1/control.pb.h"
#include "wire.h"

namespace rackhub::client {

using internal::Lane;
using internal::OpKind;
using internal::Operation;
using internal::OperationPtr;
using internal::OutFrame;
using internal::PendingRequest;

namespace {

// After a ticket failed while a transfer still reads or writes the caller's
// buffer, the transfer gets this long to end before the connection is torn
// down (so the ticket can complete without the buffer being touched later).
constexpr auto kTransferGrace = std::chrono::seconds(2);
// Close(): how long BYE frames get to flush.
constexpr auto kCloseFlush = std::chrono::seconds(1);

Error MakeError(ErrorCode code, std::string message) {
  Error e;
  e.code = code;
  e.message = std::move(message);
  return e;
}

}  // namespace

namespace internal {
const char* OpKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kPushPull: return "PushPull";
    case OpKind::kInit: return "Init";
    case OpKind::kPull: return "Pull";
    case OpKind::kSetOptimizer: return "SetOptimizer";
    case OpKind::kDeclare: return "DeclareKey";
    case OpKind::kPushPullRows: return "PushPullRows";
    case OpKind::kPullRows: return "PullRows";
  }
  return "?";
}

}  // namespace internal

namespace {

// A random non-zero session id from the OS's generator: two processes (or
// two clients of one process) never share one in practice (2^-64).
uint64_t NewSession() {
  std::random_device rd;
  uint64_t s = 0;
  while (s == 0) s = (uint64_t{rd()} << 32) ^ rd();
  return s;
}

}  // namespace

Client::Impl::Impl(const Options& options) : options_(options), session_(NewSession()) {
  io_gate_->impl = this;
}

Client::Impl::~Impl() { Close(); }

// ---------------------------------------------------------------------------
// Issuing (caller threads)

Error Client::Impl::UsableLocked() const {
  switch (state_) {
    case State::kOpen: return {};
    case State::kBroken: return broken_;
    case State::kClosed: return MakeError(ErrorCode::kClosed, "the client is closed");
  }
  return {};
}

Ticket Client::Impl::Register(const OperationPtr& op) {
  op->ticket = next_ticket_++;
  tickets_.emplace(op->ticket, op);
  return op->ticket;
}

Ticket Client::Impl::CompleteNow(OperationPtr op, Error error) {
  {
    std::lock_guard lock(mu_);
    op->ticket = next_ticket_++;
    op->finished = true;
    if (!op->callback) tickets_.emplace(op->ticket, op);
  }
  {
    std::lock_guard lock(op->mu);
    op->done = true;
    op->result = error;
  }
  op->cv.notify_all();
  if (op->callback) op->callback(error);  // on the calling thread: nothing was started
  return op->ticket;
}

void Client::Impl::Post(OperationPtr op) {
  if (op->kind == OpKind::kPushPull && op->topk_ratio > 0) {
    internal::PackTopK(*op, chunk_elements_);  // on the calling thread, like narrowing
  } else if ((op->kind == OpKind::kPushPull || op->kind == OpKind::kInit) &&
             op->dtype != DType::kFp32) {
    op->narrowed->resize(op->in.size());
    internal::NarrowFloats(op->dtype, op->in.data(), op->narrowed->data(), op->in.size());
  }
  asio::post(io_, [this, op = std::move(op)] { Start(op); });
}

Error Client::Impl::AcquireKey(KeyId key, uint64_t in_size, uint64_t out_size, bool check_in,
                               bool check_out, Operation* op) {
  const auto it = keys_.find(key);
  if (it == keys_.end()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "unknown key id " + std::to_string(key) + " (declare it first)");
  }
  KeyState& k = it->second;
  const char* kind = internal::OpKindName(op->kind);
  if (check_in && in_size != k.info.elements) {
    return MakeError(ErrorCode::kInvalidArgument,
                     std::string(kind) + " of key '" + k.info.name + "': input has " +
                         std::to_string(in_size) + " elements, the key has " +
                         std::to_string(k.info.elements));
  }
  if (check_out && out_size != k.info.elements) {
    return MakeError(ErrorCode::kInvalidArgument,
                     std::string(kind) + " of key '" + k.info.name + "': output has " +
                         std::to_string(out_size) + " elements, the key has " +
                         std::to_string(k.info.elements));
  }
  if (k.gone) {
    Error e = MakeError(ErrorCode::kServer,
                        std::string(kind) + " of key '" + k.info.name +
                            "': the hub no longer has this key (or has it with another layout) "
                            "since the client reconnected: UNKNOWN_KEY");
    e.wire = WireError::kUnknownKey;
    return e;
  }
  if ((op->kind == OpKind::kPushPull || op->kind == OpKind::kPushPullRows) &&
      k.info.resync_needed && !k.busy) {
    return k.resync_error;
  }
  if (k.busy) {
    return MakeError(ErrorCode::kInvalidArgument,
                     std::string(kind) + " of key '" + k.info.name +
                         "': the key already has a PushPull/Init/Pull pending; wait for it");
  }
  k.busy = true;
  op->narrowed = k.staging;
  op->dtype = k.info.dtype;
  op->elements = k.info.elements;
  op->first_chunk = k.info.first_chunk;
  op->iteration = k.info.next_iteration;
  if (op->kind == OpKind::kPushPull && k.info.topk_ratio > 0) {
    op->topk_ratio = k.info.topk_ratio;
    op->packed = k.packed;
    if (k.error_feedback) {
      if (!k.residual) k.residual = std::make_shared<std::vector<float>>(k.info.elements, 0.0f);
      op->residual = k.residual;
    }
  }
  return {};
}

Ticket Client::Impl::PushPull(KeyId key, std::span<const float> grad, std::span<float> out,
                              Callback done) {
  auto op = std::make_shared<Operation>();
  op->kind = OpKind::kPushPull;
  op->key = key;
  op->in = grad;
  op->out = out;
  op->callback = std::move(done);
  Error e;
  {
    std::lock_guard lock(mu_);
    e = UsableLocked();
    if (e.ok()) e = AcquireKey(key, grad.size(), out.size(), true, true, op.get());
    if (e.ok()) Register(op);
  }
  if (!e.ok()) return CompleteNow(std::move(op), std::move(e));
  const Ticket t = op->ticket;
  Post(std::move(op));
  return t;
}

Ticket Client::Impl::InitKey(KeyId key, std::span<const float> values, Callback done) {
  auto op = std::make_shared<Operation>();
  op->kind = OpKind::kInit;
  op->key = key;
  op->in = values;
  op->callback = std::move(done);
  Error e;
  {
    std::lock_guard lock(mu_);
    e = UsableLocked();
    if (e.ok()) e = AcquireKey(key, values.size(), 0, true, false, op.get());
    if (e.ok()) Register(op);
  }
  if (!e.ok()) return CompleteNow(std::move(op), std::move(e));
  const Ticket t = op->ticket;
  Post(std::move(op));
  return t;
}

Ticket Client::Impl::Pull(KeyId key, std::span<float> out, Callback done) {
  auto op = std::make_shared<Operation>();
  op->kind = OpKind::kPull;
  op->key = key;
  op->out = out;
  op->callback = std::move(done);
  Error e;
  {
    std::lock_guard lock(mu_);
    e = UsableLocked();
    if (e.ok()) e = AcquireKey(key, 0, out.size(), false, true, op.get());
    if (e.ok()) Register(op);
  }
  if (!e.ok()) return CompleteNow(std::move(op), std::move(e));
  const Ticket t = op->ticket;
  Post(std::move(op));
  return t;
}

Ticket Client::Impl::SetOptimizer(KeyId key, const OptimizerSpec& spec, uint64_t from_iteration,
                                  Callback done) {
  auto op = std::make_shared<Operation>();
  op->kind = OpKind::kSetOptimizer;
  op->key = key;
  op->iteration = from_iteration;
  op->callback = std::move(done);
  data::v1::OptimizerUpdate update;
  Error e;
  if (Result<admin::v1::Optimizer> proto = internal::ToProtoOptimizer(spec); proto.ok()) {
    *update.mutable_optimizer() = *std::move(proto);
  } else {
    e = MakeError(ErrorCode::kInvalidArgument, "SetOptimizer: " + proto.status().message());
  }
  update.SerializeToString(&op->control);
  if (e.ok()) {
    std::lock_guard lock(mu_);
    e = UsableLocked();
    if (e.ok() && keys_.find(key) == keys_.end()) {
      e = MakeError(ErrorCode::kInvalidArgument, "unknown key id " + std::to_string(key));
    }
    if (e.ok()) Register(op);
  }
  if (!e.ok()) return CompleteNow(std::move(op), std::move(e));
  const Ticket t = op->ticket;
  Post(std::move(op));
  return t;
}

Error Client::Impl::DeclareKey(const KeyDecl& decl, KeyId* out) {
  auto op = std::make_shared<Operation>();
  op->kind = OpKind::kDeclare;
  data::v1::KeyDeclaration d;
  d.set_name(decl.name);
  d.set_elements(decl.elements);
  d.set_dtype(internal::ProtoDType(decl.dtype));
  d.set_init(decl.init == Init::kFromClient ? admin::v1::FROM_CLIENT
             : decl.init == Init::kRandom   ? admin::v1::RANDOM
                                            : admin::v1::ZEROS);
  d.set_rows(decl.rows);
  d.set_dim(decl.dim);
  d.set_init_scale(decl.init_scale);
  d.set_init_seed(decl.init_seed);
  d.set_topk_ratio(decl.topk_ratio);
  Error e;
  if (decl.name.empty()) e = MakeError(ErrorCode::kInvalidArgument, "DeclareKey: empty name");
  if (e.ok() && !(decl.topk_ratio >= 0.0f && decl.topk_ratio <= 1.0f)) {
    e = MakeError(ErrorCode::kInvalidArgument,
                  "DeclareKey '" + decl.name + "': topk_ratio must be in (0, 1] or 0 (dense), got " +
                      std::to_string(decl.topk_ratio));
  }
  if (e.ok() && decl.rows == 0 && decl.elements == 0) {
    e = MakeError(ErrorCode::kInvalidArgument, "DeclareKey '" + decl.name + "': 0 elements");
  }
  if (e.ok() && decl.optimizer) {
    if (Result<admin::v1::Optimizer> proto = internal::ToProtoOptimizer(*decl.optimizer);
        proto.ok()) {
      *d.mutable_optimizer() = *std::move(proto);
    } else {
      e = MakeError(ErrorCode::kInvalidArgument,
                    "DeclareKey '" + decl.name + "': " + proto.status().message());
    }
  }
  if (!e.ok()) return e;
  d.SerializeToString(&op->control);
  {
    std::lock_guard lock(mu_);
    e = UsableLocked();
    if (!e.ok()) return e;
    Register(op);
  }
  const Ticket t = op->ticket;
  Post(op);
  e = Wait(t, std::nullopt);
  if (e.ok()) {
    if (!op->declared) return MakeError(ErrorCode::kConnectionLost, "DeclareKey: no KEY_INFO");
    if (out) *out = op->declared->id;
    std::lock_guard lock(mu_);
    if (const auto it = keys_.find(op->declared->id); it != keys_.end()) {
      it->second.error_feedback = decl.error_feedback;
    }
  }
  return e;
}

std::optional<KeyId> Client::Impl::FindKey(const std::string& name) const {
  std::lock_guard lock(mu_);
  const auto it = names_.find(name);
  if (it == names_.end()) return std::nullopt;
  return it->second;
}

std::optional<KeyInfo> Client::Impl::GetKeyInfo(KeyId key) const {
  std::lock_guard lock(mu_);
  const auto it = keys_.find(key);
  if (it == keys_.end()) return std::nullopt;
  return it->second.info;
}

void Client::Impl::ImportKey(const KeyInfo& info) {
  auto [it, inserted] = keys_.try_emplace(info.id);
  KeyState& k = it->second;
  const bool resync = !inserted && k.info.resync_needed && !k.gone;
  if (inserted || !k.busy) {
    k.info = info;
    if (resync) {  // a re-declaration does not resynchronize: only Pull does
      k.info.resync_needed = true;
      k.info.next_iteration = k.resync_error.iteration;
    }
  } else {  // keep the iteration a pending operation will set
    const uint64_t next = k.info.next_iteration;
    k.info = info;
    k.info.next_iteration = next;
  }
  k.gone = false;
  names_[info.name] = info.id;
}

void Client::Impl::MarkResync(KeyState& k, Error error) {
  k.info.resync_needed = true;
  k.resync_error = std::move(error);
}

Error Client::Impl::KeyAllowsSend(const Operation& op) {
  if (op.kind == OpKind::kSetOptimizer || op.kind == OpKind::kDeclare) return {};
  std::lock_guard lock(mu_);
  const auto it = keys_.find(op.key);
  if (it == keys_.end()) return {};
  const KeyState& k = it->second;
  if (k.gone) {
    Error e = MakeError(ErrorCode::kServer,
                        std::string(internal::OpKindName(op.kind)) + " of key '" + k.info.name +
                            "': the hub no longer has this key (or has it with another layout) "
                            "since the client reconnected: UNKNOWN_KEY");
    e.wire = WireError::kUnknownKey;
    return e;
  }
  if ((op.kind == OpKind::kPushPull || op.kind == OpKind::kPushPullRows) &&
      k.info.resync_needed) {
    return k.resync_error;
  }
  return {};
}

Error Client::Impl::Wait(Ticket ticket, std::optional<std::chrono::milliseconds> timeout) {
  OperationPtr op;
  {
    std::lock_guard lock(mu_);
    const auto it = tickets_.find(ticket);
    if (it == tickets_.end()) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "unknown ticket " + std::to_string(ticket) +
                           " (never issued, already waited, or completed by its callback)");
    }
    op = it->second;
  }
  Error result;
  {
    std::unique_lock lock(op->mu);
    const auto is_done = [&] { return op->done; };
    if (timeout) {
      if (!op->cv.wait_for(lock, *timeout, is_done)) {
        return MakeError(ErrorCode::kTimeout, "ticket " + std::to_string(ticket) +
                                                  " not done after " +
                                                  std::to_string(timeout->count()) + " ms");
      }
    } else {
      op->cv.wait(lock, is_done);
    }
    result = op->result;
  }
  std::lock_guard lock(mu_);
  tickets_.erase(ticket);
  return result;
}

// ---------------------------------------------------------------------------
// I/O thread

void Client::Impl::Start(const OperationPtr& op) {
  if (op->finished || op->failed) return;  // failed by Close or a broken connection
  op->started = true;
  if (options_.op_timeout.count() > 0) {
    op->timer = std::make_unique<asio::steady_timer>(io_, options_.op_timeout);
    op->timer->async_wait([this, op](const boost::system::error_code& ec) {
      if (ec || op->finished || op->failed) return;
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
    });
  }
  if (reconnecting_) return;  // sent once the lanes are back (AdoptReconnect)
  if (Error e = KeyAllowsSend(*op); !e.ok()) {
    FailOp(op, std::move(e));
    return;
  }
  Send(op);
}

void Client::Impl::Send(const OperationPtr& op) {
  op->remaining = 0;
  op->min_reply_iteration = UINT64_MAX;
  op->min_updates = op->min_slowest = UINT64_MAX;
  op->declared.reset();
  switch (op->kind) {
    case OpKind::kPushPull: StartChunks(op, net::Opcode::kPush); return;
    case OpKind::kInit: StartChunks(op, net::Opcode::kInit); return;
    case OpKind::kPull: StartChunks(op, net::Opcode::kPull); return;
    case OpKind::kPushPullRows: StartRows(op, net::Opcode::kPushRows); return;
    case OpKind::kPullRows: StartRows(op, net::Opcode::kPullRows); return;
    case OpKind::kSetOptimizer:
    case OpKind::kDeclare: {
      const bool every_lane = op->kind == OpKind::kSetOptimizer;
      const size_t lanes = every_lane ? lanes_.size() : 1;
      op->remaining = lanes;
      for (size_t l = 0; l < lanes; ++l) {
        net::FrameHeader h;
        h.opcode = every_lane ? net::Opcode::kSetOptimizer : net::Opcode::kDeclare;
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
    f.header = h;
    lane.Send(std::move(f));
  }
}

void Client::Impl::VersionsArrived(const OperationPtr& op, const net::VersionsSuffix& v) {
  op->min_updates = std::min(op->min_updates, v.updates);
  op->min_slowest = std::min(op->min_slowest, v.slowest);
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
  if (op->timer) op->timer->cancel();
  Error result = op->failed ? op->error : Error{};
  {
    std::lock_guard lock(mu_);
    if (op->kind == OpKind::kDeclare) {
      if (result.ok() && op->declared) ImportKey(*op->declared);
    } else if (op->kind != OpKind::kSetOptimizer) {
      const auto it = keys_.find(op->key);
      if (it != keys_.end()) {
        KeyInfo& k = it->second.info;
        it->second.busy = false;
        if (result.ok() && op->min_updates != UINT64_MAX) {
          k.updates = op->min_updates;
          k.slowest_iteration = op->min_slowest;
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

std::vector<OperationPtr> Client::Impl::UnfinishedOps() {
  std::vector<OperationPtr> ops;
  std::lock_guard lock(mu_);
  for (const auto& [ticket, op] : tickets_) {
    if (!op->finished) ops.push_back(op);
  }
  std::sort(ops.begin(), ops.end(),
            [](const OperationPtr& a, const OperationPtr& b) { return a->ticket < b->ticket; });
  return ops;
}

void Client::Impl::FailAll(ErrorCode code, const std::string& message) {
  for (const auto& op : UnfinishedOps()) FailOp(op, MakeError(code, message));
}

void Client::Impl::ConnectionLost(const std::string& reason, bool reconnectable) {
  if (reconnecting_) return;  // the lanes are already down; a reconnect is under way
  if (reconnectable && options_.reconnect && can_reconnect_ && !closing_io_) {
    {
      std::lock_guard lock(mu_);
      if (state_ != State::kOpen) return;
    }
    reconnecting_ = true;
    ++reconnect_generation_;
    break_reason_ = reason;
    break_time_ = std::chrono::steady_clock::now();
    for (auto& lane : lanes_) lane->Abort();
    if (options_.op_timeout.count() > 0) {
      reconnect_timer_ = std::make_unique<asio::steady_timer>(io_, options_.op_timeout);
      reconnect_timer_->async_wait([this](const boost::system::error_code& ec) {
        if (!ec) GiveUpReconnect("no reconnect within op_timeout");
      });
    }
    StopReconnectThread();  // the previous episode's thread, done already
    {
      std::lock_guard lock(reconnect_mu_);
      reconnect_cancel_ = false;
      reconnect_error_.clear();
    }
    reconnect_abort_ = false;
    const uint64_t generation = reconnect_generation_;
    reconnect_thread_ = std::thread([this, generation] { ReconnectLoop(generation); });
    return;
  }
  Broken("connection to the hub lost: " + reason);
}

void Client::Impl::Broken(const std::string& message) {
  {
    std::lock_guard lock(mu_);
    if (state_ == State::kBroken) return;
    if (state_ == State::kOpen) {
      state_ = State::kBroken;
      broken_ = MakeError(ErrorCode::kConnectionLost, message);
    }
  }
  for (auto& lane : lanes_) lane->Abort();
  if (!closing_io_) FailAll(ErrorCode::kConnectionLost, message);
}

void Client::Impl::LaneClosed() {
  if (!closing_io_) return;
  for (const auto& lane : lanes_) {
    if (lane->open()) return;
  }
  if (close_timer_) close_timer_->cancel();
  io_.stop();
}

void Client::Impl::CloseOnIo() {
  if (closing_io_) return;
  if (reconnecting_) {
    reconnecting_ = false;
    if (reconnect_timer_) reconnect_timer_->cancel();
    reconnect_abort_ = true;
    std::lock_guard lock(reconnect_mu_);
    reconnect_cancel_ = true;
    reconnect_cv_.notify_all();
  }
  FailAll(ErrorCode::kClosed, "the client was closed");
  closing_io_ = true;
  close_timer_ = std::make_unique<asio::steady_timer>(io_, kCloseFlush);
  close_timer_->async_wait([this](const boost::system::error_code& ec) {
    if (!ec) io_.stop();
  });
  for (auto& lane : lanes_) lane->SendByeAndClose();
  LaneClosed();  // stops at once if no lane was open
}

void Client::Impl::Close() {
  std::lock_guard close_lock(close_mu_);
  {
    std::lock_guard lock(mu_);
    state_ = State::kClosed;
  }
  if (thread_.joinable()) {
    if (std::this_thread::get_id() == thread_.get_id()) {
      CloseOnIo();  // from a callback: the destructor joins
      return;
    }
    asio::post(io_, [this] { CloseOnIo(); });
    work_.reset();
    thread_.join();
  }
  StopReconnectThread();
  // The I/O thread is gone: nothing touches the callers' buffers any more,
  // and what transports still hold must not count io_refs any more.
  io_gate_->impl = nullptr;
  for (const auto& op : UnfinishedOps()) {
    if (!op->failed) {
      op->failed = true;
      op->error = MakeError(ErrorCode::kClosed, "the client was closed");
    }
    op->io_refs = 0;
    Finish(op);
  }
}


}  // namespace rackhub::client
