// hub_lane_fuzz: a stateful target. One real in-process hub (server/daemon/hub.h:
// two lanes, in-memory state, no disk) runs for the whole fuzzing process;
// each input is a fresh tenant whose workers connect over the in-memory
// transport (net/testing/memory_connection.h, after the same HELLO checks as
// TCP) and play a sequence of frames and admin changes decoded from the
// input, interleaved across ranks and lanes; then the tenant is deleted.
// Workers reconnect after a fatal error. A bystander tenant ("victim") with
// one key lives for the whole run; frames may name its handle.
//
// Input: 8-byte operations (hub_ops.h describes the encoding), byte 0 of the
// input also picks the tenant's shape (1 or 2 workers, optimizer).
//
// Contract checked: nothing crashes, leaks or hits UB in the hub; every frame
// the hub sends passes CheckHeader and names this tenant's handle (or 0
// before WELCOME); ERROR bodies decode; a HEARTBEAT sent after the input is
// answered within 10 s on every connection still open (no lane is stuck and
// frames are processed in order); deleting the tenant closes every one of
// its connections within 10 s; the victim's key is never changed.
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "data_plane.h"
#include "hub.h"
#include "hub_link.h"
#include "hub_ops.h"
#include "registry.h"

namespace {

namespace srv = rackhub::server;
namespace fuzz = rackhub::fuzz;

constexpr char kToken[] = "fuzz-token-0123456789abcdef-0123456789";

// The hub and the bystander, for the whole process.
struct World {
  std::unique_ptr<srv::Hub> hub;
  std::unique_ptr<fuzz::LinkIo> io;
  srv::TenantInfo victim;
  srv::KeyInfo victim_key;
  uint64_t next_tenant = 0;
};

World& TheWorld() {
  static World* w = [] {
    spdlog::set_level(spdlog::level::off);
    std::vector<const char*> argv = {"rackhubd", "--admin-listen", "127.0.0.1:0",
                                     "--data-listen", "127.0.0.1:0", "--no-pin-lanes", "--no-metrics",
                                     "--in-memory", "--lanes", "2", "--transport", "tcp",
                                     "--straggler-timeout-ms", "200",
                                     "--checkpoint-every-seconds", "0"};
    const srv::ParseResult parsed =
        srv::ParseCommandLine(static_cast<int>(argv.size()), argv.data());
    fuzz::Require(parsed.ok(), "hub config");
    auto* world = new World;
    world->hub = std::make_unique<srv::Hub>(parsed.config);
    fuzz::Require(world->hub->Start().ok(), "hub start");
    world->io = std::make_unique<fuzz::LinkIo>();
    srv::TenantSpec spec;
    spec.name = "victim";
    spec.workers_per_rack = 1;
    spec.chunk_bytes = 1024;
    spec.token = kToken;
    std::string token;
    fuzz::Require(world->hub->registry().CreateTenant(spec, &world->victim, &token).ok(),
                  "victim tenant");
    srv::KeySpec key;
    key.tenant = "victim";
    key.name = "v";
    key.elements = 1000;
    fuzz::Require(world->hub->registry().CreateKey(key, &world->victim_key).ok(), "victim key");
    return world;
  }();
  return *w;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  World& w = TheWorld();
  srv::Registry& registry = w.hub->registry();

  fuzz::TenantShape shape = fuzz::ShapeOf(data[0]);
  srv::TenantSpec spec;
  spec.name = "t" + std::to_string(w.next_tenant++);
  spec.workers_per_rack = shape.workers;
  spec.chunk_bytes = 1024;  // 256 elements: small frames, several chunks per key
  spec.default_optimizer = shape.optimizer;
  spec.token = kToken;
  srv::TenantInfo tenant;
  std::string token;
  if (const rackhub::Status s = registry.CreateTenant(spec, &tenant, &token); !s.ok()) {
    std::fprintf(stderr, "hub_lane_fuzz: CreateTenant %s: %s\n", spec.name.c_str(),
                 s.message().c_str());
    fuzz::Require(false, "a tenant is created for each input");
  }

  fuzz::Session session(w.hub->data_plane(), *w.io, tenant, kToken, w.victim.handle);
  session.AddKey("k0", 700, srv::WireDType::kFp32, srv::InitMode::kZeros);
  session.AddKey("k1", 300, srv::WireDType::kBf16, srv::InitMode::kFromClient);
  for (size_t off = 1; off + fuzz::kOpBytes <= size; off += fuzz::kOpBytes) {
    session.Play(fuzz::DecodeOp(data + off));
  }
  session.ExpectLive();  // HEARTBEAT answered on every open link
  fuzz::Require(registry.DeleteTenant(spec.name).ok(), "tenant deleted");
  session.ExpectAllClosed();

  srv::KeyInfo v;
  fuzz::Require(registry.GetKey("victim", "v", &v).ok() && v.id == w.victim_key.id &&
                    v.elements == w.victim_key.elements,
                "the victim's key is untouched");
  return 0;
}
