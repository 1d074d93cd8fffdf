#include "hello_check.h"

namespace rackhub::server {

using net::WireError;

Status CheckHelloHeader(const net::FrameHeader& h) {
  if (Status s = net::CheckHeader(h); !s.ok()) return s;
  if (h.opcode != net::Opcode::kHello) return InvalidArgument("opcode: the first frame must be HELLO");
  if (h.payload_bytes == 0 || h.payload_bytes > kMaxHelloBytes) {
    return InvalidArgument("payload_bytes: HELLO must be 1.." + std::to_string(kMaxHelloBytes) +
                           " bytes");
  }
  return {};
}

Status CheckHubHelloHeader(const net::FrameHeader& h) {
  if (!net::CheckHeader(h).ok() || h.opcode != net::Opcode::kHubHello || h.payload_bytes == 0 ||
      h.payload_bytes > kMaxHelloBytes) {
    return InvalidArgument("the first frame is not a HUB_HELLO");
  }
  return {};
}

Status CheckHubProofHeader(const net::FrameHeader& h) {
  if (!net::CheckHeader(h).ok() || h.opcode != net::Opcode::kHubProof ||
      h.payload_bytes > kMaxHubAuthBytes) {
    return InvalidArgument("the frame after HUB_CHALLENGE is not a HUB_PROOF (got " +
                           std::string(net::OpcodeName(h.opcode)) + ")");
  }
  return {};
}

Result<data::v1::HubHello> CheckHubHello(std::span<const std::byte> payload,
                                         const TopologyConfig& topo, uint32_t lanes) {
  data::v1::HubHello hello;
  if (!hello.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return InvalidArgument("HUB_HELLO is not a HubHello");
  }
  if (Status s = CheckHubHelloVersion(hello); !s.ok()) return s;
  if (hello.racks() != topo.rack_count() || hello.rack() >= topo.rack_count() ||
      hello.rack() == topo.rack) {
    return InvalidArgument("rack " + std::to_string(hello.rack()) + " of " +
                           std::to_string(hello.racks()) + " does not fit this hub's topology");
  }
  if (hello.lanes() != lanes || hello.lane() >= lanes) {
    return InvalidArgument("the hubs must run the same number of lanes (peer " +
                           std::to_string(hello.lanes()) + ", here " + std::to_string(lanes) +
                           ")");
  }
  return hello;
}

HelloResult CheckHello(std::span<const std::byte> payload, const Registry& registry,
                       const TopologyConfig& topo, uint32_t lanes) {
  HelloResult r;
  auto fail = [&r](WireError code, std::string text) {
    r.code = code;
    r.text = std::move(text);
    return r;
  };
  if (!r.hello.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return fail(WireError::kMalformed, "payload: HELLO is not a Hello message");
  }
  const auto& hello = r.hello;
  const Status auth = registry.Authenticate(hello.tenant(), hello.token(), &r.tenant);
  if (!auth.ok()) return fail(WireError::kUnauthenticated, auth.message());
  if (hello.rank() >= r.tenant.workers_per_rack) {
    return fail(WireError::kInvalidArgument,
                "rank: " + std::to_string(hello.rank()) + " is out of range; tenant '" +
                    r.tenant.name + "' has " + std::to_string(r.tenant.workers_per_rack) +
                    " workers per rack");
  }
  if (topo.racks.empty() && hello.rack() != 0) {
    return fail(WireError::kInvalidArgument,
                "rack: " + std::to_string(hello.rack()) +
                    " is unknown; this hub serves a single rack (rack 0)");
  }
  if (!topo.racks.empty() && hello.rack() >= topo.rack_count()) {
    return fail(WireError::kInvalidArgument,
                "rack: " + std::to_string(hello.rack()) + " is out of range; there are " +
                    std::to_string(topo.rack_count()) + " racks");
  }
  if (topo.multi_rack_exchange() && hello.rack() != topo.rack) {
    return fail(WireError::kInvalidArgument,
                "rack: this hub serves rack " + std::to_string(topo.rack) + ", not rack " +
                    std::to_string(hello.rack()) + "; connect to that rack's hub at " +
                    topo.racks[hello.rack()].data.ToString());
  }
  if (hello.lane() >= lanes) {
    return fail(WireError::kInvalidArgument,
                "lane: " + std::to_string(hello.lane()) + " is out of range; the hub has " +
                    std::to_string(lanes) + " lanes");
  }
  r.ok = true;
  return r;
}

}  // namespace rackhub::server
