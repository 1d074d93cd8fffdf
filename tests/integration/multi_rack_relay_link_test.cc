// Bounded/async tenants across racks (issue 31, item 3): the relay frames
// on the hub links themselves (docs/wire-protocol.md 7d), with real hubs on
// loopback and, where a test plays a hub, raw authenticated links:
//  - 2 x 2000 relays of two workers at once with 1 MiB per connection: the
//    hub links do not stall (a home answers on its own link);
//  - bad relay frames on an authenticated link are refused by name (a rank
//    the tenant lacks, a chunk homed elsewhere, an opcode not relayed, a
//    relay id never issued, a key never declared, a short payload), and a
//    good one is served like a worker's PULL, its answer on the home's own
//    link to the relaying rack (the test plays rack 1's hub);
//  - an answer from a hub that is not the relay's home is refused by name;
//  - hubs disagreeing on a tenant's consistency refuse each other's
//    KEY_BIND by name, and the relayed frames of that key with it.
#include "multi_rack_bounded.h"

namespace rackhub {
namespace {

using namespace bounded_test;  // NOLINT(build/namespaces): the suite's support

// Relays put bulk on the hub links both ways: each direction on its own
// link (a home answers on its outgoing link to the worker's rack), so no
// link stalls with both of its ends paused on their send backlogs. With
// 1 MiB per connection (links pause reading at 512 KiB), two workers push
// 2000 4-KiB chunks twice, all at once (half of each worker's relayed):
// every reply comes, and every chunk ends at the reference (-4 * 1 / 2).
TEST(MultiRackRelayLinkTest, ManyRelaysAtOnceDoNotStallTheLinks) {
  constexpr uint32_t kChunks = 2000, kPushes = 2;
  Racks racks(2, false, {"--max-queued-bytes-per-connection", "1048576"});
  for (uint32_t h = 0; h < 2; ++h) CreateTenant(racks.hub(h).admin_address(), kAsync, 1, kChunks);
  std::vector<Worker> ws;
  ws.push_back(Connect(racks, 0, 0));
  ws.push_back(Connect(racks, 1, 0));
  // Both count at every home before anyone pushes (a member that joins
  // later starts at the slowest other's count; docs/consistency.md).
  for (auto& w : ws) {
    for (uint32_t c = 0; c < kChunks; ++c) w.Pull(c);
    for (uint32_t c = 0; c < kChunks; ++c) {
      EXPECT_EQ(ParamsOf(w.link->Receive(std::chrono::seconds(30))).clock, 0u);
    }
  }
  const std::string grad = testing::Floats(kElems, 1.0f);
  std::vector<std::thread> threads;
  std::array<size_t, 2> answered{};
  for (size_t i = 0; i < ws.size(); ++i) {
    // The worker's requests: made up front (FrameHeader's ids), sent by
    // one thread while another reads the replies.
    std::vector<FrameHeader> pushes;
    for (uint32_t k = 0; k < kPushes; ++k) {
      for (uint32_t c = 0; c < kChunks; ++c) {
        pushes.push_back(ws[i].Header(net::Opcode::kPush, c));
        pushes.back().iteration = k;
      }
    }
    threads.emplace_back([&, i, pushes] {
      for (const auto& h : pushes) ws[i].link->Send(h, grad);
    });
    threads.emplace_back([&, i] {
      for (size_t n = 0; n < kPushes * kChunks; ++n) {
        const auto f = ws[i].link->Receive(std::chrono::seconds(30));
        if (!f || f->h.opcode != net::Opcode::kParams) {
          ADD_FAILURE() << "worker " << i << ": reply " << n << ": " << Describe(f);
          return;
        }
        ++answered[i];
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(answered[0], kPushes * kChunks);
  EXPECT_EQ(answered[1], kPushes * kChunks);
  for (uint32_t c = 0; c < kChunks; ++c) ws[1].Pull(c);
  for (uint32_t c = 0; c < kChunks; ++c) {
    const Reply r = ParamsOf(ws[1].link->Receive(std::chrono::seconds(30)));
    EXPECT_EQ(r.updates, 2u * kPushes);
    ASSERT_EQ(r.params.size(), kElems);
    EXPECT_EQ(r.params[0], -2.0f);
    EXPECT_EQ(r.params[kElems - 1], -2.0f);
  }
}


TEST(MultiRackRelayLinkTest, BadRelayFramesAreRefusedByName) {
  Racks racks(2, false, {}, 1);  // the test plays rack 1's hub
  const auto replies = racks.AcceptLinkFrom(0);  // where rack 0's hub answers relays
  CreateTenant(racks.hub(0).admin_address(), kBounded1, 1, 2);
  Worker a = Connect(racks, 0, 0);  // for the key's id
  RawClient link(racks.interhub(0));
  ASSERT_TRUE(testing::OpenHubLink(link, std::string(48, 's'), {1, 0, 0, 2, 1}));
  data::v1::KeyBind bind;
  bind.set_tenant("t");
  bind.set_key("w");
  bind.set_key_id(a.key);
  bind.set_elements(2 * kElems);
  bind.set_dtype(pb::FP32);
  bind.set_first_chunk(0);
  bind.set_chunk_elements(kElems);
  bind.set_workers_per_rack(1);
  bind.set_init(pb::ZEROS);
  bind.set_consistency(pb::BOUNDED);
  bind.set_staleness(1);
  FrameHeader kb;
  kb.opcode = net::Opcode::kKeyBind;
  kb.tenant = 77;
  kb.key = a.key;
  FrameHeader relay;
  relay.opcode = net::Opcode::kRackRelay;
  relay.tenant = 77;
  relay.key = a.key;
  relay.dtype = net::DType::kFp32;
  // Whose answer is a RACK_RELAY_REPLY holding an ERROR (or a PARAMS), on
  // rack 0's hub's own link to rack 1 (its KEY_BINDs and member notices
  // skipped).
  const auto answer = [&](uint64_t relay_id,
                          std::chrono::milliseconds timeout = testing::kReceiveTimeout) {
    auto f = replies->Receive(timeout);
    while (f && f->h.opcode != net::Opcode::kRackRelayReply &&
           f->h.opcode != net::Opcode::kError) {
      f = replies->Receive(timeout);
    }
    EXPECT_TRUE(f && f->h.opcode == net::Opcode::kRackRelayReply) << Describe(f);
    std::optional<Frame> inner;
    if (!f || f->payload.size() < net::kHeaderBytes) return inner;
    EXPECT_EQ(f->h.request_id, relay_id);
    inner = Frame{net::DecodeHeader(std::span<const std::byte, net::kHeaderBytes>(
                      reinterpret_cast<const std::byte*>(f->payload.data()), net::kHeaderBytes)),
                  f->payload.substr(net::kHeaderBytes)};
    return inner;
  };
  // A rank the tenant does not have (one worker per rack).
  relay.request_id = 1;
  link.SendRaw(RawFrame(kb, bind.SerializeAsString()) +
               RawFrame(relay, RelayPrefix(net::RelayKind::kFrame, net::Opcode::kPull, 5)));
  ExpectError(answer(1), net::WireError::kInvalidArgument,
              "RACK_RELAY: rank 5 of rack 1 is not a worker of tenant 't'", false);
  // A chunk homed on rack 1, not here.
  relay.request_id = 2;
  relay.chunk = 1;
  link.Send(relay, RelayPrefix(net::RelayKind::kFrame, net::Opcode::kPull, 0));
  ExpectError(answer(2), net::WireError::kInvalidArgument,
              "RACK_RELAY: chunk 1 of key 'w' is not homed on rack 0's hub", false);
  // An opcode that is not relayed.
  relay.request_id = 3;
  relay.chunk = 0;
  link.Send(relay, RelayPrefix(net::RelayKind::kFrame, net::Opcode::kDeclare, 0));
  ExpectError(answer(3), net::WireError::kInvalidArgument,
              "RACK_RELAY: opcode 10 is not PUSH, INIT or PULL", false);
  // A relay id rack 0's hub never issued.
  FrameHeader reply;
  reply.opcode = net::Opcode::kRackRelayReply;
  reply.request_id = 4242;
  link.Send(reply, std::string(net::kHeaderBytes, '\0'));
  ExpectError(link.Receive(), net::WireError::kInvalidArgument,
              "RACK_RELAY_REPLY: relay id 4242 was never issued by rack 0's hub", false);
  // A well-formed relayed PULL is served like a worker's.
  relay.request_id = 5;
  link.Send(relay, RelayPrefix(net::RelayKind::kFrame, net::Opcode::kPull, 0));
  const auto pulled = answer(5);
  EXPECT_TRUE(pulled && pulled->h.opcode == net::Opcode::kParams) << Describe(pulled);
  // A key rack 0's hub never declares: parked for 5 s, then answered.
  data::v1::KeyBind other = bind;
  other.set_key("nokey");
  other.set_key_id(a.key + 1);
  kb.key = a.key + 1;
  relay.key = a.key + 1;
  relay.request_id = 7;
  link.SendRaw(RawFrame(kb, other.SerializeAsString()) +
               RawFrame(relay, RelayPrefix(net::RelayKind::kFrame, net::Opcode::kPull, 0)));
  ExpectError(answer(7, std::chrono::seconds(15)), net::WireError::kUnknownKey,
              "key: id " + std::to_string(a.key + 1) + " was never declared on rack 0's hub",
              false);
  relay.key = a.key;
  // A payload shorter than the relay prefix closes the link.
  relay.request_id = 6;
  link.Send(relay, "abc");
  ExpectError(link.Receive(), net::WireError::kMalformed,
              "RACK_RELAY: 3 bytes, shorter than its 16-byte prefix");
  EXPECT_TRUE(link.ClosedByPeer());
}

// A tenant's hubs must agree on its consistency and staleness: the home
// refuses the other rack's KEY_BIND by name and answers its relayed
// frames with that refusal, in both directions (bounded:1 on rack 0's
// hub, async on rack 1's; key "w": chunk 0 homed on rack 0, chunk 1 on 1).
TEST(MultiRackRelayLinkTest, AConsistencyMismatchIsRefusedByName) {
  Racks racks(2, false);
  CreateTenant(racks.hub(0).admin_address(), kBounded1, 1, 2);
  CreateTenant(racks.hub(1).admin_address(), kAsync, 1, 2);
  Worker a = Connect(racks, 0, 0), b = Connect(racks, 1, 0);
  a.Pull(1);
  ExpectError(a.link->Receive(std::chrono::seconds(10)), net::WireError::kInvalidArgument,
              "key bind: tenant 't' is async on rack 1's hub but bounded:1 on rack 0's "
              "(create the tenant with the same consistency and staleness on every hub)",
              false);
  b.Pull(0);
  ExpectError(b.link->Receive(std::chrono::seconds(10)), net::WireError::kInvalidArgument,
              "key bind: tenant 't' is bounded:1 on rack 0's hub but async on rack 1's", false);
  // Their own chunks are served as ever.
  a.Pull(0);
  EXPECT_EQ(ParamsOf(a.link->Receive()).clock, 0u);
}

// An answer to a relay must come from the hub it went to: rack 0's hub
// relays a's push of chunk 1 to rack 1's hub (held there by b); a hub link
// from "rack 2" answering that relay id is refused by name and closed, and
// the real answer still comes when b pushes.
TEST(MultiRackRelayLinkTest, AReplyFromAHubThatIsNotTheHomeIsRefused) {
  Racks racks(3, false);
  for (uint32_t h = 0; h < 3; ++h) CreateTenant(racks.hub(h).admin_address(), kBounded0, 1, 3);
  Worker a = Connect(racks, 0, 0), b = Connect(racks, 1, 0);
  b.Pull(1);
  EXPECT_EQ(ParamsOf(b.link->Receive()).clock, 0u);
  a.Pull(1);  // relay id 1
  EXPECT_EQ(ParamsOf(a.link->Receive()).clock, 0u);
  a.Push(1, 0, testing::Floats(kElems, 3.0f));  // relay id 2: held by b at rack 1's hub
  const uint64_t pull = a.Pull(1);               // relay id 3
  EXPECT_EQ(ParamsOf(a.link->Receive()).request, pull) << "the push is held";
  RawClient forged(racks.interhub(0));
  ASSERT_TRUE(testing::OpenHubLink(forged, std::string(48, 's'), {2, 0, 0, 3, 1}));
  FrameHeader params;
  params.opcode = net::Opcode::kParams;
  params.dtype = net::DType::kFp32;
  params.request_id = 2;
  FrameHeader reply;
  reply.opcode = net::Opcode::kRackRelayReply;
  reply.request_id = 2;
  forged.Send(reply, RawFrame(params, testing::Floats(kElems, 9.0f)));
  ExpectError(forged.Receive(), net::WireError::kInvalidArgument,
              "RACK_RELAY_REPLY: relay id 2 went to rack 1's hub (the chunk's home), not to "
              "rack 2's");
  EXPECT_TRUE(forged.ClosedByPeer());
  b.Push(1, 0, testing::Floats(kElems, 1.0f));
  EXPECT_EQ(ParamsOf(b.link->Receive()).clock, 1u);
  const Reply released = ParamsOf(a.link->Receive(std::chrono::seconds(10)));
  EXPECT_EQ(released.clock, 1u);
  EXPECT_EQ(released.updates, 2u);
  EXPECT_EQ(released.params[0], -(3.0f + 1.0f) / 3.0f) << "the forged values were not taken";
}

}  // namespace
}  // namespace rackhub
