// Private to net/rdma: what channel.cc (data path) and channel_setup.cc
// (resources and rdma_cm connection set-up) share.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

namespace rackhub::net::rdma::internal {

// Send work requests in flight per QP (frames + one credit report). One slot
// stays reserved for the credit report so replies can never starve it.
inline constexpr uint32_t kSendQueueDepth = 256;
// Receives beyond 2 * slots: slack for the one credit report in flight.
inline constexpr uint32_t kSpareRecvs = 16;

inline std::string Errno(const char* call) {
  return std::string(call) + ": " + std::strerror(errno);
}

}  // namespace rackhub::net::rdma::internal
