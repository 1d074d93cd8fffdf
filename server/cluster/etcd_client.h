// EtcdClient: the few calls of etcd's v3 gRPC API (proto/etcd/rpc.proto)
// that the cluster registry and membership need (docs/cluster.md): Range,
// Txn, leases and watches, over the project's gRPC.
//
// Endpoints: one channel each; a call goes to the endpoint that answered
// last and, when that one cannot be reached (UNAVAILABLE), to the next, so
// a stopped member of a 3-member cluster is passed over. Every unary call
// has a deadline (EtcdOptions::timeout): with quorum lost etcd does not
// answer writes, and the call fails with UNAVAILABLE naming the endpoints.
// TLS (ca/cert/key files) and etcd's user/password auth (the token is sent
// as the "token" metadata and renewed when etcd says it expired).
//
// Threads: every member may be called from any thread. A Watch blocks its
// calling thread until cancelled (Cancel, from any thread) or broken.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "etcd/rpc.grpc.pb.h"
#include "rackhub/common/status.h"

namespace rackhub::server {

struct EtcdOptions {
  std::vector<std::string> endpoints;  // host:port
  std::string ca_file;                 // PEM: TLS when set
  std::string cert_file;               // PEM client certificate (with key_file)
  std::string key_file;
  std::string user;                    // etcd auth when set
  std::string password;
  std::chrono::milliseconds timeout{3000};
  std::string field = "registry.etcd";  // names the config in messages
};

class EtcdClient {
 public:
  // Builds the channels and makes one call (a Range of `probe_key`) to
  // check that etcd answers; UNAVAILABLE naming the endpoints if none does,
  // INVALID_ARGUMENT for bad options, UNAUTHENTICATED for bad credentials.
  static Result<std::unique_ptr<EtcdClient>> Connect(const EtcdOptions& options,
                                                     const std::string& probe_key);
  ~EtcdClient();

  // "10.0.0.1:2379,10.0.0.2:2379"
  std::string endpoints() const;

  // [key, range_end); range_end empty: just `key`.
  Result<etcdserverpb::RangeResponse> Range(const std::string& key, const std::string& range_end);
  Result<etcdserverpb::TxnResponse> Txn(const etcdserverpb::TxnRequest& request);
  Result<etcdserverpb::PutResponse> Put(const etcdserverpb::PutRequest& request);
  Result<int64_t> LeaseGrant(int64_t ttl_seconds);  // the lease id
  Status LeaseRevoke(int64_t id);
  // One keep-alive round trip; NOT_FOUND when the lease has expired.
  Status LeaseKeepAlive(int64_t id);

  // Watches [key, range_end) from `start_revision`, calling `on_response`
  // for every response (events, compaction notices) until it returns false,
  // Cancel is called or the stream breaks; returns why it ended.
  Status Watch(const std::string& key, const std::string& range_end, int64_t start_revision,
               const std::function<bool(const etcdserverpb::WatchResponse&)>& on_response);
  // Ends a Watch in progress (any thread) and makes later ones end at once.
  void Cancel();

  // The smallest key after every key starting with `prefix` (etcd's prefix
  // range end).
  static std::string PrefixEnd(const std::string& prefix);

 private:
  explicit EtcdClient(EtcdOptions options) : options_(std::move(options)) {}
  Status Authenticate();
  void Prepare(grpc::ClientContext* context, bool deadline);
  // Runs `call` on the current endpoint, then on the others while they are
  // unreachable; re-authenticates once if the token expired.
  Status Call(const char* what, const std::function<grpc::Status(int endpoint,
                                                                 grpc::ClientContext*)>& call,
              bool deadline = true);
  // One unary RPC through Call: `rpc` of the `stubs` (kv_, lease_) of the
  // endpoint Call picks; the response, or Call's error naming `what`.
  template <typename Stub, typename Request, typename Response>
  Result<Response> Unary(const char* what, const std::vector<std::unique_ptr<Stub>>& stubs,
                         grpc::Status (Stub::*rpc)(grpc::ClientContext*, const Request&,
                                                   Response*),
                         const Request& request) {
    Response response;
    Status s = Call(what, [&](int e, grpc::ClientContext* ctx) {
      return ((*stubs[e]).*rpc)(ctx, request, &response);
    });
    if (!s.ok()) return s;
    return response;
  }

  EtcdOptions options_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<etcdserverpb::KV::Stub>> kv_;
  std::vector<std::unique_ptr<etcdserverpb::Lease::Stub>> lease_;
  std::vector<std::unique_ptr<etcdserverpb::Watch::Stub>> watch_;
  std::vector<std::unique_ptr<etcdserverpb::Auth::Stub>> auth_;
  std::atomic<int> current_{0};
  std::mutex mu_;
  std::string token_;                   // GUARDED_BY(mu_)
  grpc::ClientContext* watching_ = nullptr;  // GUARDED_BY(mu_)
  bool cancelled_ = false;                   // GUARDED_BY(mu_)
};

}  // namespace rackhub::server
