// control_fuzz: the protobuf control payloads of the data plane and the
// checks each receiver applies to them, with real state where the check
// needs it (an in-memory Registry with two tenants and a key).
// Input: byte 0 picks the message, byte 1 the receiver's setting (topology,
// lane count, chunk size); the rest is the payload.
//
//   HELLO          server/transports/hello_check.h CheckHelloHeader + CheckHello
//   HUB_HELLO      CheckHubHelloHeader + CheckHubHello (hub-link version, nonce,
//                  racks, lanes), then server/lanes/hub_handshake.h HubAcceptor
//   DECLARE        server/lanes/declare_check.h CheckDeclare, then
//                  Registry::DeclareKey as WorkerProtocol::OnDeclare does
//   SET_OPTIMIZER  OptimizerFromProto + Registry::SetOptimizer (OnSetOptimizer)
//   WELCOME        the client's checks (client/api/connect.cc AcceptWelcome:
//                  lanes, chunk size, every key through ToKeyInfo)
//   KEY_INFO       the client's ToKeyInfo (client/api/wire.h)
//
// Contract checked: nothing crashes, leaks or hits UB; an accepted HELLO
// names a tenant whose token it carries and a rank, rack and lane in range;
// an accepted HUB_HELLO is of hub-link version 2 with a 32-byte nonce and
// names another rack of this topology, and no fuzzed HUB_PROOF authenticates
// against the acceptor's fresh nonce; a declared key is found again by a second DECLARE, its chunks
// cover its elements exactly; a key entry the client accepts has chunks
// that cover its elements.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "declare_check.h"
#include "hello_check.h"
#include "proto_convert.h"
#include "rackhub/data/v1/control.pb.h"
#include "registry.h"
#include "wire.h"  // client/api: ToKeyInfo

namespace {

namespace net = rackhub::net;
namespace srv = rackhub::server;
namespace dpb = rackhub::data::v1;

constexpr char kToken[] = "fuzz-token-0123456789abcdef-0123456789";  // 32-128 chars
constexpr char kSecret[] = "fuzz-hub-secret-0123456789";

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "control_fuzz: contract broken: %s\n", what);
    std::abort();
  }
}

// The receiver's setting, from one byte.
struct Setting {
  uint32_t lanes;
  srv::TopologyConfig topology;
  uint32_t chunk_bytes;
};

Setting MakeSetting(uint8_t b) {
  Setting s;
  s.lanes = 1 + (b & 3);
  s.chunk_bytes = (b & 4) ? 4096 : 32 * 1024;
  switch ((b >> 3) % 3) {
    case 0: break;  // single rack
    case 1:         // three racks, this hub is rack 1
    case 2:         // the same, flat mode
      for (uint16_t port = 7700; port < 7703; ++port) {
        s.topology.racks.push_back({{"10.0.0.1", port}, {"10.0.0.1", uint16_t(port + 100)}});
      }
      s.topology.rack = 1;
      s.topology.mode = (b >> 3) % 3 == 1 ? "hierarchical" : "flat";
      s.topology.secret_file = "/nonexistent";
      break;
  }
  return s;
}

struct World {
  std::unique_ptr<srv::Registry> registry;
  srv::TenantInfo tenant;  // "alpha": 3 workers per rack, key "w" declared
  srv::KeyInfo key;
};

World MakeWorld(const Setting& s) {
  World w;
  srv::TenantDefaults defaults;
  defaults.chunk_bytes = s.chunk_bytes;
  defaults.max_keys = 8;
  defaults.max_parameter_bytes = 64ull << 20;
  w.registry = std::make_unique<srv::Registry>(s.lanes, defaults);
  std::string token;
  for (const char* name : {"alpha", "beta"}) {
    srv::TenantSpec spec;
    spec.name = name;
    spec.workers_per_rack = 3;
    spec.token = kToken;
    Check(w.registry->CreateTenant(spec, &w.tenant, &token).ok(), "tenant created");
  }
  Check(w.registry->GetTenant("alpha", &w.tenant).ok(), "tenant found");
  srv::KeySpec key;
  key.tenant = "alpha";
  key.name = "w";
  key.elements = 10000;
  Check(w.registry->CreateKey(key, &w.key).ok(), "key created");
  return w;
}

net::FrameHeader HeaderFor(net::Opcode op, size_t payload) {
  net::FrameHeader h;
  h.opcode = op;
  h.payload_bytes = static_cast<uint32_t>(payload);
  return h;
}

void FuzzHello(const Setting& s, std::span<const std::byte> payload) {
  if (!srv::CheckHelloHeader(HeaderFor(net::Opcode::kHello, payload.size())).ok()) return;
  World w = MakeWorld(s);
  const srv::HelloResult r = srv::CheckHello(payload, *w.registry, s.topology, s.lanes);
  if (!r.ok) {
    Check(!r.text.empty(), "a refused HELLO says why");
    return;
  }
  Check(r.hello.token() == kToken && (r.hello.tenant() == "alpha" || r.hello.tenant() == "beta"),
        "an accepted HELLO names a tenant and its token");
  Check(r.tenant.name == r.hello.tenant(), "the tenant returned is the one named");
  Check(r.hello.rank() < 3 && r.hello.lane() < s.lanes && r.hello.rack() < s.topology.rack_count(),
        "rank, lane and rack in range");
  Check(!s.topology.multi_rack_exchange() || r.hello.rack() == s.topology.rack,
        "a hierarchical hub serves its own rack only");
}

void FuzzHubHello(const Setting& s, std::span<const std::byte> payload) {
  if (!srv::CheckHubHelloHeader(HeaderFor(net::Opcode::kHubHello, payload.size())).ok()) return;
  const auto r = srv::CheckHubHello(payload, s.topology, s.lanes);
  if (!r.ok()) return;
  Check(r->link_version() == srv::kHubLinkVersion && r->nonce().size() == srv::kHubNonceBytes,
        "hub-link version 2 with a nonce");
  Check(r->rack() < s.topology.rack_count() && r->rack() != s.topology.rack &&
            r->racks() == s.topology.rack_count(),
        "another rack of this topology");
  Check(r->lane() < s.lanes && r->lanes() == s.lanes, "the same lanes");
  srv::HubAcceptor acceptor(kSecret, s.topology.rack);
  Check(acceptor.OnHello(*r).ok(), "an accepted HUB_HELLO gets a challenge");
  // The same bytes as the HUB_PROOF: a proof over a nonce drawn after the
  // input was made never matches.
  Check(!acceptor.OnProof(payload).ok(), "no fuzzed HUB_PROOF authenticates");
}

void CheckChunksCover(const srv::Registry& registry, const srv::KeyInfo& k) {
  uint64_t covered = 0;
  for (const auto& c : registry.ChunksOf(k)) covered += c.elements;
  Check(covered == k.elements, "a key's chunks cover its elements exactly");
}

void FuzzDeclare(const Setting& s, std::span<const std::byte> payload) {
  const srv::DeclareCheck d = srv::CheckDeclare(payload, "alpha");
  if (!d.ok) {
    Check(!d.text.empty() && d.fatal == (d.code == net::WireError::kMalformed),
          "a refused DECLARE says why; only MALFORMED is fatal");
    return;
  }
  World w = MakeWorld(s);
  srv::KeyInfo first;
  bool created = false;
  if (!w.registry->DeclareKey(d.spec, &first, &created).ok()) return;
  CheckChunksCover(*w.registry, first);
  srv::KeyInfo again;
  bool created_again = true;
  Check(w.registry->DeclareKey(d.spec, &again, &created_again).ok() && !created_again &&
            again.id == first.id,
        "a second DECLARE finds the same key");
  srv::TenantInfo t;
  Check(w.registry->GetTenant("alpha", &t).ok() && t.parameter_bytes <= t.quotas.max_parameter_bytes,
        "a tenant stays within its quota");
}

void FuzzSetOptimizer(const Setting& s, std::span<const std::byte> payload) {
  dpb::OptimizerUpdate update;
  if (!update.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) return;
  const auto opt = srv::OptimizerFromProto(update.optimizer());
  if (!opt.ok()) return;
  World w = MakeWorld(s);
  srv::KeyInfo info;
  if (w.registry->SetOptimizer("alpha", "w", opt->config, opt->unspecified_type, &info, 1).ok()) {
    Check(info.optimizer.type == w.key.optimizer.type, "the optimizer type never changes");
  }
}

// What the client accepts from a hub.
void CheckClientKey(const dpb::KeyEntry& entry, uint32_t chunk_elements) {
  const auto k = rackhub::client::internal::ToKeyInfo(entry, chunk_elements);
  if (!k.ok()) return;
  Check(k->elements > 0 && chunk_elements > 0, "a key has elements and chunks");
  // The chunks cover the elements: neither fewer (the client would index
  // past its last chunk) nor a whole chunk more.
  const unsigned __int128 cover = static_cast<unsigned __int128>(k->chunk_count) * chunk_elements;
  Check(cover >= k->elements && cover - k->elements < chunk_elements,
        "an accepted key entry's chunk count fits its elements");
}

void FuzzWelcome(std::span<const std::byte> payload) {
  dpb::Welcome welcome;
  if (!welcome.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) return;
  if (welcome.lanes() == 0 || welcome.chunk_elements() == 0 || welcome.lanes() > 4096) return;
  for (const auto& entry : welcome.keys()) CheckClientKey(entry, welcome.chunk_elements());
}

void FuzzKeyInfo(const Setting& s, std::span<const std::byte> payload) {
  dpb::KeyEntry entry;
  if (!entry.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) return;
  CheckClientKey(entry, s.chunk_bytes / 4);
  CheckClientKey(entry, 1);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const Setting s = MakeSetting(data[1]);
  const auto payload = std::as_bytes(std::span(data + 2, size - 2));
  switch (data[0] % 6) {
    case 0: FuzzHello(s, payload); break;
    case 1: FuzzHubHello(s, payload); break;
    case 2: FuzzDeclare(s, payload); break;
    case 3: FuzzSetOptimizer(s, payload); break;
    case 4: FuzzWelcome(payload); break;
    case 5: FuzzKeyInfo(s, payload); break;
  }
  return 0;
}
