// The checks every data-plane transport applies to a worker's HELLO before
// the connection is handed to a lane: header, size, message, token, rank,
// rack and lane. One implementation for TCP (tcp_acceptor.cc), RDMA
// (rdma_listener.cc) and the in-memory test transport. Thread-safe (reads the thread-safe Registry).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "config.h"
#include "hub_handshake.h"
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

// Header checks, before the payload is read (INVALID_ARGUMENT naming the field).
Status CheckHelloHeader(const net::FrameHeader& h);
// Everything else, once the payload is in.
HelloResult CheckHello(std::span<const std::byte> payload, const Registry& registry,
                       const TopologyConfig& topology, uint32_t lanes);

// The same for a HUB_HELLO opening a link from another rack's hub: the
// header, then the hub-link version and nonce (CheckHubHelloVersion), rack
// and lane counts. The secret is not in it: the caller then runs the
// challenge-response (hub_handshake.h, HubAcceptor).
Status CheckHubHelloHeader(const net::FrameHeader& h);
Result<data::v1::HubHello> CheckHubHello(std::span<const std::byte> payload,
                                         const TopologyConfig& topology, uint32_t lanes);
// The header of the opener's next handshake frame (HUB_PROOF), before its
// payload is read.
Status CheckHubProofHeader(const net::FrameHeader& h);

}  // namespace rackhub::server
