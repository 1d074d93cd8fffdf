// The checks every data-plane transport applies to a worker's HELLO before
// the connection is handed to a lane: header, size, message, token, rank,
// rack and lane. One implementation for TCP (data_plane.cc) and RDMA
// (rdma_listener.cc). Thread-safe (reads the thread-safe Registry).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "config.h"
#include "rackhub/data/v1/control.pb.h"
#include "rackhub/net/frame.h"
#include "registry.h"

namespace rackhub::server {

// HELLO is small: tenant, token and a few integers.
inline constexpr uint32_t kMaxHelloBytes = 64 * 1024;

struct HelloResult {
  bool ok = false;
  net::WireError code = net::WireError::kMalformed;  // when !ok
  std::string text;                                   // when !ok: names the field
  data::v1::Hello hello;
  TenantInfo tenant;
};

// Header checks, before the payload is read: "" or the reason.
std::string CheckHelloHeader(const net::FrameHeader& h);
// Everything else, once the payload is in.
HelloResult CheckHello(std::span<const std::byte> payload, const Registry& registry,
                       const TopologyConfig& topology, uint32_t lanes);

}  // namespace rackhub::server
