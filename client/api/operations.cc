// Client::Impl: issuing operations (caller threads): creating the Impl,
// registering tickets, checking a key's buffers, PushPull / Init / Pull /
// SetOptimizer / DeclareKey, the key table, and Wait. Running them on the I/O
// thread: operation_io.cc; connection loss and Close: close.cc.
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
    case OpKind::kCommit: return "CommitElastic";
    case OpKind::kRollback: return "RollbackElastic";
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

internal::OperationPtr Client::Impl::NewOperation(OpKind kind, KeyId key, Callback done) {
  auto op = std::make_shared<Operation>();
  op->kind = kind;
  op->key = key;
  op->callback = std::move(done);
  return op;
}

Ticket Client::Impl::Issue(OperationPtr op) {
  Error e;
  {
    std::lock_guard lock(mu_);
    e = UsableLocked();
    if (e.ok()) e = AdmitLocked(op.get());
    if (e.ok()) Register(op);
  }
  if (!e.ok()) return CompleteNow(std::move(op), std::move(e));
  const Ticket t = op->ticket;
  Post(std::move(op));
  return t;
}

Error Client::Impl::KeyGone(OpKind kind, const std::string& name) {
  return MakeError(ErrorCode::kServer,
                   std::string(internal::OpKindName(kind)) + " of key '" + name +
                       "': the hub no longer has this key (or has it with another layout) "
                       "since the client reconnected: UNKNOWN_KEY",
                   WireError::kUnknownKey);
}

Error Client::Impl::AdmitLocked(Operation* op) {
  const auto it = keys_.find(op->key);
  if (op->kind == OpKind::kCommit || op->kind == OpKind::kRollback) return {};  // no key
  if (op->kind == OpKind::kSetOptimizer) {  // any known key; it takes no slot
    if (it != keys_.end()) return {};
    return MakeError(ErrorCode::kInvalidArgument, "unknown key id " + std::to_string(op->key));
  }
  if (it == keys_.end()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "unknown key id " + std::to_string(op->key) + " (declare it first)");
  }
  KeyState& k = it->second;
  const char* kind = internal::OpKindName(op->kind);
  const bool push = op->kind == OpKind::kPushPull || op->kind == OpKind::kPushPullRows;
  const bool check_in = op->kind == OpKind::kPushPull || op->kind == OpKind::kInit;
  const bool check_out = op->kind == OpKind::kPushPull || op->kind == OpKind::kPull;
  if (check_in && op->in.size() != k.info.elements) {
    return MakeError(ErrorCode::kInvalidArgument,
                     std::string(kind) + " of key '" + k.info.name + "': input has " +
                         std::to_string(op->in.size()) + " elements, the key has " +
                         std::to_string(k.info.elements));
  }
  if (check_out && op->out.size() != k.info.elements) {
    return MakeError(ErrorCode::kInvalidArgument,
                     std::string(kind) + " of key '" + k.info.name + "': output has " +
                         std::to_string(op->out.size()) + " elements, the key has " +
                         std::to_string(k.info.elements));
  }
  if (k.gone) return KeyGone(op->kind, k.info.name);
  if (push && k.info.resync_needed && !k.busy) return k.resync_error;
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
  OperationPtr op = NewOperation(OpKind::kPushPull, key, std::move(done));
  op->in = grad;
  op->out = out;
  return Issue(std::move(op));
}

Ticket Client::Impl::InitKey(KeyId key, std::span<const float> values, Callback done) {
  OperationPtr op = NewOperation(OpKind::kInit, key, std::move(done));
  op->in = values;
  return Issue(std::move(op));
}

Ticket Client::Impl::Pull(KeyId key, std::span<float> out, Callback done) {
  OperationPtr op = NewOperation(OpKind::kPull, key, std::move(done));
  op->out = out;
  return Issue(std::move(op));
}

Ticket Client::Impl::SetOptimizer(KeyId key, const OptimizerSpec& spec, uint64_t from_iteration,
                                  Callback done) {
  OperationPtr op = NewOperation(OpKind::kSetOptimizer, key, std::move(done));
  op->iteration = from_iteration;
  Result<admin::v1::Optimizer> proto = internal::ToProtoOptimizer(spec);
  if (!proto.ok()) {
    return CompleteNow(std::move(op), MakeError(ErrorCode::kInvalidArgument,
                                                "SetOptimizer: " + proto.status().message()));
  }
  data::v1::OptimizerUpdate update;
  *update.mutable_optimizer() = *std::move(proto);
  update.SerializeToString(&op->control);
  return Issue(std::move(op));
}

Ticket Client::Impl::Elastic(OpKind kind, uint64_t commit, Callback done) {
  OperationPtr op = NewOperation(kind, 0, std::move(done));
  op->iteration = commit;
  return Issue(std::move(op));
}

Error Client::Impl::DeclareKey(const KeyDecl& decl, KeyId* out) {
  OperationPtr op = NewOperation(OpKind::kDeclare, 0, nullptr);
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
  d.set_topk_ratio(static_cast<float>(decl.topk_ratio));
  d.set_topk_ratio_exact(decl.topk_ratio);
  for (uint32_t rank : decl.participants) d.add_participants(rank);
  Error e;
  if (decl.name.empty()) e = MakeError(ErrorCode::kInvalidArgument, "DeclareKey: empty name");
  if (e.ok() && !(decl.topk_ratio >= 0.0 && decl.topk_ratio <= 1.0)) {
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
  if (op.kind == OpKind::kSetOptimizer || op.kind == OpKind::kDeclare ||
      op.kind == OpKind::kCommit || op.kind == OpKind::kRollback) {
    return {};
  }
  std::lock_guard lock(mu_);
  const auto it = keys_.find(op.key);
  if (it == keys_.end()) return {};
  const KeyState& k = it->second;
  if (k.gone) return KeyGone(op.kind, k.info.name);
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

}  // namespace rackhub::client
