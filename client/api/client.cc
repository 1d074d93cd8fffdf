// rackhub::client::Client: the public face; everything happens in Impl.
#include "rackhub/client/client.h"

#include "client_impl.h"

namespace rackhub::client {

const char* ErrorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk: return "OK";
    case ErrorCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case ErrorCode::kConnectFailed: return "CONNECT_FAILED";
    case ErrorCode::kUnauthenticated: return "UNAUTHENTICATED";
    case ErrorCode::kConnectionLost: return "CONNECTION_LOST";
    case ErrorCode::kTimeout: return "TIMEOUT";
    case ErrorCode::kServer: return "SERVER";
    case ErrorCode::kClosed: return "CLOSED";
    case ErrorCode::kRolledBack: return "ROLLED_BACK";
    case ErrorCode::kResource: return "RESOURCE";
  }
  return "UNKNOWN";
}

const char* WireErrorName(WireError code) {
  if (code == WireError::kNone) return "NONE";
  return net::WireErrorName(static_cast<net::WireError>(code));  // "UNKNOWN" if not known
}

std::unique_ptr<Client> Client::Connect(const Options& options, Error* error) {
  auto impl = std::make_unique<Impl>(options);
  Error e = impl->Connect();
  if (error) *error = e;
  if (!e.ok()) return nullptr;
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() { Close(); }

uint32_t Client::tenant_handle() const { return impl_->tenant_handle(); }
uint32_t Client::lanes() const { return impl_->lanes(); }
uint32_t Client::workers() const { return impl_->workers(); }
uint32_t Client::chunk_elements() const { return impl_->chunk_elements(); }
uint32_t Client::straggler_timeout_ms() const { return impl_->straggler_timeout_ms(); }
uint64_t Client::reconnects() const { return impl_->reconnects(); }
const char* Client::transport() const { return impl_->transport(); }

Error Client::DeclareKey(const KeyDecl& decl, KeyId* out) { return impl_->DeclareKey(decl, out); }
std::optional<KeyId> Client::FindKey(const std::string& name) const {
  return impl_->FindKey(name);
}
std::optional<KeyInfo> Client::GetKeyInfo(KeyId key) const { return impl_->GetKeyInfo(key); }

Ticket Client::PushPullRows(KeyId key, std::span<const uint64_t> ids,
                            std::span<const float> grads, std::span<const uint64_t> want,
                            std::span<float> out, Callback done) {
  return impl_->PushPullRows(key, ids, grads, want, out, std::move(done));
}

Ticket Client::PullRows(KeyId key, std::span<const uint64_t> ids, std::span<float> out,
                        Callback done) {
  return impl_->PullRows(key, ids, out, std::move(done));
}

Ticket Client::PushPull(KeyId key, std::span<const float> grad, std::span<float> out,
                        Callback done) {
  return impl_->PushPull(key, grad, out, std::move(done));
}
Ticket Client::Init(KeyId key, std::span<const float> values, Callback done) {
  return impl_->InitKey(key, values, std::move(done));
}
Ticket Client::Pull(KeyId key, std::span<float> out, Callback done) {
  return impl_->Pull(key, out, std::move(done));
}
Ticket Client::SetOptimizer(KeyId key, const OptimizerSpec& spec, uint64_t from_iteration,
                            Callback done) {
  return impl_->SetOptimizer(key, spec, from_iteration, std::move(done));
}

Ticket Client::CommitElastic(uint64_t commit, Callback done) {
  return impl_->Elastic(internal::OpKind::kCommit, commit, std::move(done));
}

Ticket Client::RollbackElastic(uint64_t commit, Callback done) {
  return impl_->Elastic(internal::OpKind::kRollback, commit, std::move(done));
}

Error Client::Wait(Ticket ticket) { return impl_->Wait(ticket, std::nullopt); }
Error Client::WaitFor(Ticket ticket, std::chrono::milliseconds timeout) {
  return impl_->Wait(ticket, timeout);
}

void Client::Close() {
  if (impl_) impl_->Close();
}

}  // namespace rackhub::client
