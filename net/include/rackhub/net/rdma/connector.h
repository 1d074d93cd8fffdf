// net::Connector over RDMA (hub to hub links): rdma_cm connect
// (rdma::Channel::Connect, rdma_cm(7)) to the peer's endpoint, then an
// rdma::RdmaConnection on the caller's io_context. The caller sees a
// net::Connection exactly as from MakeTcpConnector (connector.h).
//
// Channel::Connect blocks (address and route resolution, rdma_connect(3) and
// the ESTABLISHED event), so it runs on a helper thread (one std::thread per
// connect, bounded by `timeout`); its result is posted back to the caller's
// io_context, where the RdmaConnection is built (the channel is attached to
// that thread only when the caller Start()s it) and `done` runs, exactly
// once. The connect request's private data names the lane: the caller's
// ConnectionIdentity::lane (rdma::RingDescriptor::lane).
//
// Ownership: the caller owns the Connector and must keep it alive while
// connects are in flight (connector.h). If it is destroyed anyway, the
// destructor waits (at most `timeout` plus a grace period) for the helper
// threads to finish, and connects still in flight are abandoned: their
// `done` never runs, their channel is closed. Nothing touches the Connector
// or the caller's io_context after that.
// Threading: Connect on the thread running `io` (a lane); `done` on that
// thread; the destructor on any thread except a helper thread.
#pragma once

#include <chrono>
#include <memory>

#include "rackhub/net/connector.h"
#include "rackhub/net/rdma/channel.h"

namespace rackhub::net {

// Default bound of one RDMA connect (resolve + route + connect). Soft-RoCE
// under emulation needs a few seconds; a real fabric far less.
inline constexpr std::chrono::milliseconds kRdmaConnectTimeout{5000};

// `options` are this side's ring, polling mode and required device/port.
std::unique_ptr<Connector> MakeRdmaConnector(
    const rdma::ChannelOptions& options,
    std::chrono::milliseconds timeout = kRdmaConnectTimeout);

}  // namespace rackhub::net
