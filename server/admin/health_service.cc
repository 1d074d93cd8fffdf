#include "health_service.h"

#include <chrono>

#include "rackhub/common/log_safe.h"

namespace rackhub::server {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

namespace {

// How often a Watch looks whether its caller cancelled (the synchronous API
// has no notification for it).
constexpr auto kCancelPoll = std::chrono::milliseconds(200);

}  // namespace

HealthService::HealthService(std::set<std::string> services) : services_(std::move(services)) {}

void HealthService::SetServing(bool serving) {
  std::lock_guard lock(mu_);
  if (serving_ == serving) return;
  serving_ = serving;
  ++version_;
  changed_.notify_all();
}

void HealthService::Shutdown() {
  std::lock_guard lock(mu_);
  shut_down_ = true;
  serving_ = false;
  ++version_;
  changed_.notify_all();
}

grpc::Status HealthService::Check(grpc::ServerContext* /*context*/,
                                  const HealthCheckRequest* request,
                                  HealthCheckResponse* response) {
  if (!request->service().empty() && services_.count(request->service()) == 0) {
    return {grpc::StatusCode::NOT_FOUND, "unknown service " + QuoteForLog(request->service(), 128) +
                                             " (known: \"\" and the rackhub.admin.v1 services)"};
  }
  std::lock_guard lock(mu_);
  response->set_status(serving_ ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING);
  return grpc::Status::OK;
}

grpc::Status HealthService::Watch(grpc::ServerContext* context, const HealthCheckRequest* request,
                                  grpc::ServerWriter<HealthCheckResponse>* writer) {
  const bool known = request->service().empty() || services_.count(request->service()) > 0;
  std::unique_lock lock(mu_);
  if (shut_down_) return {grpc::StatusCode::UNAVAILABLE, "rackhubd is shutting down"};
  if (watchers_ >= kMaxWatchers) {
    return {grpc::StatusCode::RESOURCE_EXHAUSTED,
            "too many health watchers (at most " + std::to_string(kMaxWatchers) + ")"};
  }
  ++watchers_;
  uint64_t sent = version_ + 1;  // nothing sent yet
  bool ended = false;
  while (!ended) {
    if (sent != version_) {
      HealthCheckResponse r;
      r.set_status(!known     ? HealthCheckResponse::SERVICE_UNKNOWN
                   : serving_ ? HealthCheckResponse::SERVING
                              : HealthCheckResponse::NOT_SERVING);
      sent = version_;
      const bool last = shut_down_;
      lock.unlock();
      const bool written = writer->Write(r);
      lock.lock();
      if (!written || last) break;
    }
    // A change made while the lock was released for Write is seen here.
    changed_.wait_for(lock, kCancelPoll, [&] { return sent != version_; });
    ended = context->IsCancelled();
  }
  --watchers_;
  return grpc::Status::OK;
}

}  // namespace rackhub::server
