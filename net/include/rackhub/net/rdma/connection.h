// RDMA implementation of net::Connection (docs/architecture.md, Transports):
// one data-plane connection of one (worker, lane), the frame protocol of
// net/channel_connection.h over an rdma::Channel (header + payload written
// into the peer's registered ring with RDMA WRITE WITH IMMEDIATE; see
// channel.h). Replies are copied once into the registered staging ring and
// the NIC writes them straight into the client's receive ring.
//
// Thread safety: every member runs on the owning lane's thread only.
#pragma once

#include "rackhub/net/channel_connection.h"
#include "rackhub/net/rdma/channel.h"

namespace rackhub::net::rdma {

using RdmaConnection = ChannelConnection<Channel>;

}  // namespace rackhub::net::rdma
