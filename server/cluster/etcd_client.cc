#include "etcd_client.h"

#include <fstream>
#include <sstream>

namespace rackhub::server {
namespace {

namespace pb = etcdserverpb;

Result<std::string> ReadPem(const std::string& field, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgument(field + ": cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool TokenExpired(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
         s.error_message().find("invalid auth token") != std::string::npos;
}

// True when etcd did not answer in time or could not be reached. Besides
// the gRPC codes, etcd's server passes Go's context errors through with
// code UNKNOWN when the request's deadline (ours, propagated) expires on
// the server before our side notices, e.g. while a cluster without
// quorum waits for a leader; that is the same "no answer in time".
bool NoAnswer(const grpc::Status& s) {
  switch (s.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::CANCELLED:
      return true;
    case grpc::StatusCode::UNKNOWN:
      return s.error_message() == "context deadline exceeded" ||
             s.error_message() == "context canceled";
    default:
      return false;
  }
}

}  // namespace

Result<std::unique_ptr<EtcdClient>> EtcdClient::Connect(const EtcdOptions& options,
                                                        const std::string& probe_key) {
  if (options.endpoints.empty()) {
    return InvalidArgument(options.field + "_endpoints: no etcd endpoint given (HOST:PORT,...)");
  }
  std::unique_ptr<EtcdClient> c(new EtcdClient(options));
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!options.ca_file.empty() || !options.cert_file.empty()) {
    grpc::SslCredentialsOptions ssl;
    if (!options.ca_file.empty()) {
      Result<std::string> ca = ReadPem(options.field + "_ca_file", options.ca_file);
      if (!ca.ok()) return ca.status();
      ssl.pem_root_certs = *ca;
    }
    if (options.cert_file.empty() != options.key_file.empty()) {
      return InvalidArgument(options.field +
                             "_cert_file, _key_file: a client certificate needs both");
    }
    if (!options.cert_file.empty()) {
      Result<std::string> cert = ReadPem(options.field + "_cert_file", options.cert_file);
      if (!cert.ok()) return cert.status();
      Result<std::string> key = ReadPem(options.field + "_key_file", options.key_file);
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = *cert;
      ssl.pem_private_key = *key;
    }
    creds = grpc::SslCredentials(ssl);
  }
  for (const std::string& endpoint : options.endpoints) {
    grpc::ChannelArguments args;
    // A member that comes back is used again within 2 s. gRPC also
    // takes the minimum backoff as the least time one connection attempt
    // gets: at 100 ms a loaded host's etcd missed it at start-up
    // ("connection attempt timed out before receiving SETTINGS frame"), so
    // an attempt gets 2 s (a member that is down refuses at once anyway).
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 2000);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
    args.SetMaxReceiveMessageSize(256 << 20);
    auto channel = grpc::CreateCustomChannel(endpoint, creds, args);
    c->kv_.push_back(pb::KV::NewStub(channel));
    c->lease_.push_back(pb::Lease::NewStub(channel));
    c->watch_.push_back(pb::Watch::NewStub(channel));
    c->auth_.push_back(pb::Auth::NewStub(channel));
    c->channels_.push_back(std::move(channel));
  }
  if (!options.user.empty()) {
    if (Status s = c->Authenticate(); !s.ok()) return s;
  }
  Result<pb::RangeResponse> probe = c->Range(probe_key, "");
  if (!probe.ok()) return probe.status();
  return c;
}

EtcdClient::~EtcdClient() { Cancel(); }

std::string EtcdClient::endpoints() const {
  std::string s;
  for (const auto& e : options_.endpoints) s += (s.empty() ? "" : ",") + e;
  return s;
}

std::string EtcdClient::PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

Status EtcdClient::Authenticate() {
  pb::AuthenticateRequest req;
  req.set_name(options_.user);
  req.set_password(options_.password);
  pb::AuthenticateResponse resp;
  const int n = static_cast<int>(channels_.size());
  grpc::Status last;
  for (int i = 0; i < n; ++i) {
    const int e = (current_.load() + i) % n;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + options_.timeout);
    last = auth_[e]->Authenticate(&ctx, req, &resp);
    if (last.ok()) {
      std::lock_guard lock(mu_);
      token_ = resp.token();
      current_ = e;
      return Status::Ok();
    }
    if (!NoAnswer(last)) break;
  }
  if (NoAnswer(last)) {
    return Unavailable(options_.field + ": cannot reach etcd at " + endpoints() + ": " +
                       last.error_message());
  }
  return Unauthenticated(options_.field + "_user: etcd refused user '" + options_.user +
                         "': " + last.error_message());
}

void EtcdClient::Prepare(grpc::ClientContext* context, bool deadline) {
  if (deadline) context->set_deadline(std::chrono::system_clock::now() + options_.timeout);
  std::lock_guard lock(mu_);
  if (!token_.empty()) context->AddMetadata("token", token_);
}

Status EtcdClient::Call(const char* what,
                        const std::function<grpc::Status(int, grpc::ClientContext*)>& call,
                        bool deadline) {
  const int n = static_cast<int>(channels_.size());
  bool reauthenticated = false;
  grpc::Status last;
  for (int i = 0; i < n; ++i) {
    const int e = (current_.load() + i) % n;
    grpc::ClientContext ctx;
    Prepare(&ctx, deadline);
    last = call(e, &ctx);
    if (last.ok()) {
      current_ = e;
      return Status::Ok();
    }
    if (!options_.user.empty() && TokenExpired(last) && !reauthenticated) {
      reauthenticated = true;
      if (Authenticate().ok()) {
        --i;  // the same endpoint again
        continue;
      }
    }
    if (last.error_code() != grpc::StatusCode::UNAVAILABLE) break;
  }
  const std::string detail = std::string(what) + " failed: " + last.error_message();
  if (NoAnswer(last)) {
    return Unavailable(options_.field + ": etcd at " + endpoints() + " did not answer (" +
                       detail + ")");
  }
  switch (last.error_code()) {
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED:
      return PermissionDenied(options_.field + ": etcd refused the call (" + detail + ")");
    default:
      return Internal(options_.field + ": etcd at " + endpoints() + ": " + detail +
                      " (gRPC code " + std::to_string(static_cast<int>(last.error_code())) +
                      ")");
  }
}

Result<pb::RangeResponse> EtcdClient::Range(const std::string& key, const std::string& range_end) {
  pb::RangeRequest req;
  req.set_key(key);
  req.set_range_end(range_end);
  return Unary("range", kv_, &pb::KV::Stub::Range, req);
}

Result<pb::TxnResponse> EtcdClient::Txn(const pb::TxnRequest& request) {
  return Unary("txn", kv_, &pb::KV::Stub::Txn, request);
}

Result<pb::PutResponse> EtcdClient::Put(const pb::PutRequest& request) {
  return Unary("put", kv_, &pb::KV::Stub::Put, request);
}

Result<int64_t> EtcdClient::LeaseGrant(int64_t ttl_seconds) {
  pb::LeaseGrantRequest req;
  req.set_ttl(ttl_seconds);
  Result<pb::LeaseGrantResponse> resp =
      Unary("lease grant", lease_, &pb::Lease::Stub::LeaseGrant, req);
  if (!resp.ok()) return resp.status();
  if (!resp->error().empty()) return Internal(options_.field + ": lease grant: " + resp->error());
  return resp->id();
}

Status EtcdClient::LeaseRevoke(int64_t id) {
  pb::LeaseRevokeRequest req;
  req.set_id(id);
  return Unary("lease revoke", lease_, &pb::Lease::Stub::LeaseRevoke, req).status();
}

Status EtcdClient::LeaseKeepAlive(int64_t id) {
  pb::LeaseKeepAliveResponse resp;
  Status s = Call("lease keep-alive", [&](int e, grpc::ClientContext* ctx) {
    auto stream = lease_[e]->LeaseKeepAlive(ctx);
    pb::LeaseKeepAliveRequest req;
    req.set_id(id);
    if (!stream->Write(req) || !stream->Read(&resp)) {
      stream->WritesDone();
      grpc::Status st = stream->Finish();
      return st.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "keep-alive stream closed")
                     : st;
    }
    stream->WritesDone();
    ctx->TryCancel();
    (void)stream->Finish();
    return grpc::Status::OK;
  });
  if (!s.ok()) return s;
  if (resp.ttl() <= 0) return NotFound(options_.field + ": lease " + std::to_string(id) + " expired");
  return Status::Ok();
}

Status EtcdClient::Watch(const std::string& key, const std::string& range_end,
                         int64_t start_revision,
                         const std::function<bool(const pb::WatchResponse&)>& on_response) {
  grpc::ClientContext ctx;
  Prepare(&ctx, false);
  {
    std::lock_guard lock(mu_);
    if (cancelled_) return Status(StatusCode::kAborted, "watch cancelled");
    watching_ = &ctx;
  }
  const int e = current_.load();
  auto stream = watch_[e]->Watch(&ctx);
  pb::WatchRequest req;
  auto* create = req.mutable_create_request();
  create->set_key(key);
  create->set_range_end(range_end);
  create->set_start_revision(start_revision);
  Status result = Status::Ok();
  if (stream->Write(req)) {
    pb::WatchResponse resp;
    while (stream->Read(&resp)) {
      if (!on_response(resp)) break;
    }
  }
  ctx.TryCancel();
  grpc::Status st = stream->Finish();
  {
    std::lock_guard lock(mu_);
    watching_ = nullptr;
    if (cancelled_) return Status(StatusCode::kAborted, "watch cancelled");
  }
  if (!st.ok() && st.error_code() != grpc::StatusCode::CANCELLED) {
    // Try another member next time.
    current_ = (e + 1) % static_cast<int>(channels_.size());
    return Unavailable(options_.field + ": watch on " + options_.endpoints[e] +
                       " ended: " + st.error_message());
  }
  return result;
}

void EtcdClient::Cancel() {
  std::lock_guard lock(mu_);
  cancelled_ = true;
  if (watching_) watching_->TryCancel();
}

}  // namespace rackhub::server
