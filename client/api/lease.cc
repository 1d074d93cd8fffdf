// Client::Lease: memory lent to the hubs on this host (net/shm/lend.h).
#include "client_impl.h"
#include "rackhub/net/shm/lend.h"

namespace rackhub::client {

Error Client::LeaseElements(size_t elements, LeasedBuffer* out) {
  if (elements == 0 || elements > net::shm::kMaxLendBytes / sizeof(float)) {
    return MakeError(ErrorCode::kInvalidArgument,
                               "lease: " + std::to_string(elements) +
                                   " elements is not in [1, " +
                                   std::to_string(net::shm::kMaxLendBytes / sizeof(float)) + "]");
  }
  Result<std::shared_ptr<net::shm::LendRegion>> region =
      net::shm::LendRegion::Create(elements * sizeof(float));
  if (!region.ok()) return MakeError(ErrorCode::kResource, region.status().message());
  const std::span<std::byte> bytes = (*region)->bytes();
  out->floats_ = std::span<float>(reinterpret_cast<float*>(bytes.data()), elements);
  out->region_ = *std::move(region);
  return {};
}

Error Client::Lease(KeyId key, LeasedBuffer* out) const {
  const std::optional<KeyInfo> info = GetKeyInfo(key);
  if (!info) {
    return MakeError(ErrorCode::kInvalidArgument,
                               "lease: unknown key " + std::to_string(key));
  }
  if (info->rows != 0) {
    return MakeError(ErrorCode::kInvalidArgument,
                               "lease: key '" + info->name +
                                   "' is a row-sparse table (PushPullRows copies its rows)");
  }
  return LeaseElements(static_cast<size_t>(info->elements), out);
}

}  // namespace rackhub::client
