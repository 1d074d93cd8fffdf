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
//    KEY_BIND by name, and the relayed frames of that key with it; the
//    tenant created again with the same settings relays both ways;
//  - relay ids do not repeat across a hub's processes, and an answer
//    naming another chunk than its relay's is dropped.
//  - a newer link from a rack's hub supersedes the older one: it closes,
//    and its relayed members are gone (their held replies released);
//  - a member's gone notice is not parked behind its key's frames, and a
//    frame of the member that was parked is refused after it, not served;
//  - a relay the home never answers (its link up) fails after the relay
//    deadline with a non-fatal WORKER_LOST naming the rack, and at once
//    when the home's link that carries its answers closes;
//  - frames behind a fatal answer to a relayed frame are refused, not
//    applied;
//  - a relayed worker replaced by a new process on its hub while frames of
//    the old one straggle: the home neither applies them nor lets them (or
//    the old one's late gone notice) end the new one.
#include "multi_rack_bounded.h"

namespace rackhub {
namespace {

using namespace bounded_test;  // NOLINT(build/namespaces): the suite's support

// Rack 0's hub with tenant "t" (one worker per rack, key "w" of 2 chunks:
// chunk 0 homed on rack 0) and its worker a; the test plays rack 1's hub:
// `replies` is rack 0's hub's link to it (where relays are answered), and
// OpenLink() a link of rack 1's hub to rack 0's, authenticated, with "w"
// bound (rack 1's tenant handle 77).
struct PlayedRack1 {
  Racks racks;
  std::unique_ptr<RawClient> replies;
  Worker a;
  explicit PlayedRack1(Mode mode, std::vector<std::string> extra = {})
      : racks(2, false, std::move(extra), 1), mode_(mode) {
    replies = racks.AcceptLinkFrom(0);
    CreateTenant(racks.hub(0).admin_address(), mode, 1, 2);
    a = Connect(racks, 0, 0);
  }
  std::unique_ptr<RawClient> OpenLink() {
    auto link = std::make_unique<RawClient>(racks.interhub(0));
    EXPECT_TRUE(testing::OpenHubLink(*link, std::string(48, 's'), {1, 0, 0, 2, 1}));
    FrameHeader kb;
    kb.opcode = net::Opcode::kKeyBind;
    kb.tenant = 77;
    kb.key = a.key;
    link->Send(kb, KeyBindOf(mode_, a.key, 2).SerializeAsString());
    return link;
  }

 private:
  Mode mode_;
};

// A PARAMS answer of relay id X (`chunk`, values `v`, versions suffix
// 0/0), as a home played by the test sends it.
std::string ParamsAnswer(uint32_t key, uint32_t chunk, uint64_t relay_id, float v) {
  FrameHeader p;
  p.opcode = net::Opcode::kParams;
  p.key = key;
  p.chunk = chunk;
  p.dtype = net::DType::kFp32;
  p.flags = net::kFlagVersions;
  p.request_id = relay_id;
  return RawFrame(p, testing::Floats(kElems, v) + std::string(net::kVersionsSuffixBytes, '\0'));
}

// The relay id of the next RACK_RELAY frame (not a notice) on `from0`.
uint64_t NextRelayId(RawClient& from0) {
  auto f = from0.Receive();
  while (f && !(f->h.opcode == net::Opcode::kRackRelay && f->h.request_id != 0)) {
    f = from0.Receive();  // KEY_BINDs and member notices
  }
  EXPECT_TRUE(f) << "a frame was relayed";
  return f ? f->h.request_id : 0;
}

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
  const data::v1::KeyBind bind = KeyBindOf(kBounded1, a.key, 2);
  FrameHeader kb;
  kb.opcode = net::Opcode::kKeyBind;
  kb.tenant = 77;
  kb.key = a.key;
  FrameHeader relay;
  relay.opcode = net::Opcode::kRackRelay;
  relay.tenant = 77;
  relay.key = a.key;
  relay.dtype = net::DType::kFp32;
  // Its answers: RACK_RELAY_REPLYs on rack 0's hub's own link to rack 1.
  const auto answer = [&](uint64_t relay_id,
                          std::chrono::milliseconds timeout = testing::kReceiveTimeout) {
    return RelayAnswer(*replies, relay_id, timeout);
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
  // As the refusal asks: "t" is created again on rack 1's hub, bounded:1.
  // Relays go both ways now (rack 0's hub sends no new KEY_BIND: rack 1's
  // hub binds the one it refused again).
  {
    auto channel = grpc::CreateChannel(racks.hub(1).admin_address(),
                                       grpc::InsecureChannelCredentials());
    grpc::ClientContext ctx;
    pb::DeleteTenantRequest del;
    del.set_name("t");
    pb::DeleteTenantResponse gone;
    ASSERT_TRUE(pb::TenantService::NewStub(channel)->DeleteTenant(&ctx, del, &gone).ok());
  }
  CreateTenant(racks.hub(1).admin_address(), kBounded1, 1, 2);
  Worker b2 = Connect(racks, 1, 0);
  a.Pull(1);
  EXPECT_EQ(ParamsOf(a.link->Receive(std::chrono::seconds(10))).clock, 0u);
  b2.Pull(0);
  EXPECT_EQ(ParamsOf(b2.link->Receive(std::chrono::seconds(10))).clock, 0u);
}

// An answer to a relay must come from the hub it went to: rack 0's hub
// relays a's push of chunk 1 to rack 1's hub (held there by b); rack 2's
// hub (played by the test; home of chunk 2, which learns rack 0's relay ids
// from a's relayed PULL of it: they are consecutive) answering that relay
// id is refused by name and its link closed, and the real answer still
// comes when b pushes.
TEST(MultiRackRelayLinkTest, AReplyFromAHubThatIsNotTheHomeIsRefused) {
  Racks racks(3, false, {}, 2);
  for (uint32_t h = 0; h < 2; ++h) CreateTenant(racks.hub(h).admin_address(), kBounded0, 1, 3);
  const auto from0 = racks.AcceptLinkFrom(0);
  Worker a = Connect(racks, 0, 0), b = Connect(racks, 1, 0);
  const uint64_t pull2 = a.Pull(2);
  const uint64_t base = NextRelayId(*from0);
  b.Pull(1);
  EXPECT_EQ(ParamsOf(b.link->Receive()).clock, 0u);
  a.Pull(1);  // relay id base + 1
  EXPECT_EQ(ParamsOf(a.link->Receive()).clock, 0u);
  a.Push(1, 0, testing::Floats(kElems, 3.0f));  // base + 2: held by b at rack 1's hub
  const uint64_t pull = a.Pull(1);               // base + 3
  EXPECT_EQ(ParamsOf(a.link->Receive()).request, pull) << "the push is held";
  RawClient forged(racks.interhub(0));
  ASSERT_TRUE(testing::OpenHubLink(forged, std::string(48, 's'), {2, 0, 0, 3, 1}));
  FrameHeader reply;
  reply.opcode = net::Opcode::kRackRelayReply;
  reply.request_id = base;  // its own relay: answered
  forged.SendRaw(RawFrame(reply, ParamsAnswer(a.key, 2, base, 5.0f)));
  EXPECT_EQ(ParamsOf(a.link->Receive()).request, pull2);
  reply.request_id = base + 2;
  forged.Send(reply, ParamsAnswer(a.key, 1, base + 2, 9.0f));
  ExpectError(forged.Receive(), net::WireError::kInvalidArgument,
              "RACK_RELAY_REPLY: relay id " + std::to_string(base + 2) +
                  " went to rack 1's hub (the chunk's home), not to rack 2's");
  EXPECT_TRUE(forged.ClosedByPeer());
  b.Push(1, 0, testing::Floats(kElems, 1.0f));
  EXPECT_EQ(ParamsOf(b.link->Receive()).clock, 1u);
  const Reply released = ParamsOf(a.link->Receive(std::chrono::seconds(10)));
  EXPECT_EQ(released.clock, 1u);
  EXPECT_EQ(released.updates, 2u);
  EXPECT_EQ(released.params[0], -(3.0f + 1.0f) / 3.0f) << "the forged values were not taken";
}

// Rack 1's hub (played by the test) owns its worker's generations: rank 0
// there runs as session 1, then a new process, session 2, is announced
// while session 1's frames straggle (as one parked behind its key would).
// The home refuses session 1's late frames with a non-fatal WORKER_LOST
// (not applied), its late gone notice does not end session 2, and session
// 2's requests are served: chunk 0 ends at the reference -(1 + 2) / 2.
TEST(MultiRackRelayLinkTest, AReplacedRelayedWorkersStragglersAreRefused) {
  PlayedRack1 played(kAsync);
  Worker& a = played.a;
  RawClient& replies = *played.replies;
  const auto link = played.OpenLink();
  const auto relay = [&](net::RelayKind kind, net::Opcode op, uint64_t session,
                         uint64_t relay_id, uint64_t iteration = 0, std::string grad = "") {
    FrameHeader h;
    h.opcode = net::Opcode::kRackRelay;
    h.tenant = 77;
    h.key = a.key;
    h.dtype = net::DType::kFp32;
    h.iteration = iteration;
    h.request_id = relay_id;
    link->Send(h, RelayPrefix(kind, op, 0, session) + grad);
  };
  const auto frame = net::RelayKind::kFrame;
  relay(net::RelayKind::kMemberBack, net::Opcode::kHeartbeat, 1, 0);
  relay(frame, net::Opcode::kPull, 1, 1);
  EXPECT_EQ(ParamsOf(RelayAnswer(replies, 1)).clock, 0u);
  relay(frame, net::Opcode::kPush, 1, 2, 0, testing::Floats(kElems, 1.0f));
  EXPECT_EQ(ParamsOf(RelayAnswer(replies, 2)).clock, 1u);
  // Session 2 is announced; session 1's push straggles in after it.
  relay(net::RelayKind::kMemberBack, net::Opcode::kHeartbeat, 2, 0);
  relay(frame, net::Opcode::kPush, 1, 3, 1, testing::Floats(kElems, 100.0f));
  ExpectError(RelayAnswer(replies, 3), net::WireError::kWorkerLost,
              "RACK_RELAY: rank 0 of rack 1 (session 1) is not its current session on rack 0's "
              "hub (2)",
              false);
  // Session 1's gone notice, late: session 2 goes on.
  relay(net::RelayKind::kMemberGone, net::Opcode::kHeartbeat, 1, 0);
  relay(frame, net::Opcode::kPull, 2, 4);
  const Reply pulled = ParamsOf(RelayAnswer(replies, 4));
  EXPECT_EQ(pulled.updates, 1u);
  relay(frame, net::Opcode::kPush, 2, 5, pulled.clock, testing::Floats(kElems, 2.0f));
  EXPECT_EQ(ParamsOf(RelayAnswer(replies, 5)).clock, pulled.clock + 1);
  relay(frame, net::Opcode::kPull, 1, 6);
  ExpectError(RelayAnswer(replies, 6), net::WireError::kWorkerLost,
              "RACK_RELAY: rank 0 of rack 1 (session 1) is gone from rack 1's hub", false);
  a.Pull(0);
  const Reply r = ParamsOf(a.link->Receive());
  EXPECT_EQ(r.updates, 2u);
  ASSERT_EQ(r.params.size(), kElems);
  EXPECT_EQ(r.params[0], -(1.0f + 2.0f) / 2.0f);
  EXPECT_EQ(r.params[kElems - 1], -(1.0f + 2.0f) / 2.0f);
}

// A relayed frame refused fatally at the home (an INIT from rank 0 of rack
// 1: only rank 0 of rack 0 INITs) ends that session there: a push its hub
// (played by the test) sent right behind it is refused with a non-fatal
// WORKER_LOST, not applied by a fresh connection of the member.
TEST(MultiRackRelayLinkTest, FramesBehindAFatalAnswerAreNotApplied) {
  PlayedRack1 played(kAsync);
  Worker& a = played.a;
  const auto link = played.OpenLink();
  FrameHeader h;
  h.opcode = net::Opcode::kRackRelay;
  h.tenant = 77;
  h.key = a.key;
  h.dtype = net::DType::kFp32;
  h.request_id = 1;
  const std::string init = RawFrame(
      h, RelayPrefix(net::RelayKind::kFrame, net::Opcode::kInit, 0, 1) +
             testing::Floats(kElems, 5.0f));
  h.request_id = 2;
  link->SendRaw(init + RawFrame(h, RelayPrefix(net::RelayKind::kFrame, net::Opcode::kPush, 0, 1) +
                                       testing::Floats(kElems, 1.0f)));
  ExpectError(RelayAnswer(*played.replies, 1), net::WireError::kInvalidArgument,
              "rank: only rank 0 of rack 0 may INIT a key", true);
  ExpectError(RelayAnswer(*played.replies, 2), net::WireError::kWorkerLost,
              "RACK_RELAY: rank 0 of rack 1 (session 1) is gone from rack 1's hub (or was ended "
              "on rack 0's by a fatal error)",
              false);
  a.Pull(0);
  const Reply r = ParamsOf(a.link->Receive());
  EXPECT_EQ(r.updates, 0u) << "the push behind the fatal INIT was not applied";
  ASSERT_EQ(r.params.size(), kElems);
  EXPECT_EQ(r.params[0], 0.0f);
}

// A relay whose answer never comes (the home, played by the test, takes it
// and stays silent on links that stay up) fails on the relaying hub after
// the relay deadline (the straggler timeout, 1 s here, plus 2 x 5 s of
// link holds) with a non-fatal WORKER_LOST naming the rack; the worker's
// connection stays and its own rack's chunk is served.
TEST(MultiRackRelayLinkTest, ARelayNeverAnsweredFailsNamingTheRack) {
  PlayedRack1 played(kAsync, {"--straggler-timeout-ms", "1000"});
  Worker& a = played.a;
  RawClient& from0 = *played.replies;
  const auto start = std::chrono::steady_clock::now();
  const uint64_t push = a.Push(1, 0, testing::Floats(kElems, 1.0f));  // homed on rack 1
  auto f = from0.Receive();
  while (f && !(f->h.opcode == net::Opcode::kRackRelay && f->h.request_id != 0)) {
    f = from0.Receive();  // its KEY_BIND and member notice
  }
  ASSERT_TRUE(f) << "the push was relayed to rack 1";
  const auto failed = a.link->Receive(std::chrono::seconds(30));
  ExpectError(failed, net::WireError::kWorkerLost,
              "rack link: no answer from the hub of rack 1 within 11 s; rack 1's hub is home to "
              "chunk 1 of key 'w'",
              false);
  EXPECT_TRUE(failed && failed->h.request_id == push) << Describe(failed);
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, std::chrono::seconds(10));
  // At most the deadline (1 s + 10 s) + the sweep period (1 s), with 5 s of
  // slack for a timer late on a loaded machine: a sweep re-armed late (or
  // at the deadline's period) fails it 11 s later or more.
  EXPECT_LT(took, std::chrono::seconds(11 + 1 + 5));
  a.Pull(0);
  EXPECT_EQ(ParamsOf(a.link->Receive()).clock, 0u) << "a's connection stays";
}

// With 2 lanes, the home refuses a relay that comes on another lane's link
// than its chunk's owner lane, by name and non-fatally (on that lane's
// link back), and serves it on the owner lane.
TEST(MultiRackRelayLinkTest, ARelayOnAnotherLanesLinkIsRefused) {
  Racks racks(2, false, {}, 1, 2);  // the test plays rack 1's hub; 2 lanes
  CreateTenant(racks.hub(0).admin_address(), kBounded1, 1, 4);
  Worker a = Connect(racks, 0, 0);  // for the key's id
  FrameHeader kb;
  kb.opcode = net::Opcode::kKeyBind;
  kb.tenant = 77;
  kb.key = a.key;
  FrameHeader relay = kb;
  relay.opcode = net::Opcode::kRackRelay;
  relay.dtype = net::DType::kFp32;
  relay.chunk = 0;  // tenant chunk 0: rack 0's, on lane 0
  for (const uint32_t lane : {1u, 0u}) {
    const auto replies = racks.AcceptLinkFrom(0, lane);
    RawClient link(racks.interhub(0));
    ASSERT_TRUE(testing::OpenHubLink(link, std::string(48, 's'), {1, 0, lane, 2, 2}));
    relay.request_id = 10 + lane;
    link.SendRaw(RawFrame(kb, KeyBindOf(kBounded1, a.key, 4).SerializeAsString()) +
                 RawFrame(relay, RelayPrefix(net::RelayKind::kFrame, net::Opcode::kPull, 0)));
    const auto answered = RelayAnswer(*replies, relay.request_id);
    if (lane == 1) {
      ExpectError(answered, net::WireError::kInvalidArgument,
                  "RACK_RELAY: chunk 0 of key 'w' lives on lane 0, not lane 1", false);
    } else {
      EXPECT_TRUE(answered && answered->h.opcode == net::Opcode::kParams) << Describe(answered);
    }
  }
}

// Relay ids do not repeat across a hub's processes, and an answer is
// matched by its key and chunk too: rack 1's hub (played by the test, home
// of chunk 1) answers a's relayed PULL first with another chunk's PARAMS
// (a stale answer: dropped) and then with its own (forwarded to a). Rack
// 0's hub restarted issues relay ids other than its first process's.
TEST(MultiRackRelayLinkTest, AStaleAnswerIsDroppedAndRelayIdsDoNotRepeat) {
  PlayedRack1 played(kAsync);
  Worker& a = played.a;
  const uint64_t pull = a.Pull(1);
  const uint64_t first = NextRelayId(*played.replies);
  const auto link = played.OpenLink();
  FrameHeader reply;
  reply.opcode = net::Opcode::kRackRelayReply;
  reply.request_id = first;
  link->SendRaw(RawFrame(reply, ParamsAnswer(a.key, 0, first, 9.0f)) +
                RawFrame(reply, ParamsAnswer(a.key, 1, first, 7.0f)));
  const Reply answered = ParamsOf(a.link->Receive());
  EXPECT_EQ(answered.request, pull);
  ASSERT_EQ(answered.params.size(), kElems);
  EXPECT_EQ(answered.params[0], 7.0f) << "chunk 1's answer, not chunk 0's stale one";
  // A new process of rack 0's hub (without state).
  EXPECT_EQ(played.racks.hub(0).Stop(SIGKILL), 128 + SIGKILL);
  played.racks.Start(0);
  const auto replies = played.racks.AcceptLinkFrom(0);
  CreateTenant(played.racks.hub(0).admin_address(), kAsync, 1, 2);
  Worker again = Connect(played.racks, 0, 0);
  again.Pull(1);
  const uint64_t second = NextRelayId(*replies);
  EXPECT_NE(second, first) << "the new process issued its previous process's relay id";
  EXPECT_NE(second, first + 1);
}

// The home's answers come on its own link to the relaying hub: when that
// link closes (the other direction up), the relays waiting on it fail at
// once with a non-fatal WORKER_LOST naming the rack, not at the relay
// deadline (40 s here); a's connection stays.
TEST(MultiRackRelayLinkTest, LosingTheHomesLinkFailsTheRelaysWaitingOnIt) {
  PlayedRack1 played(kAsync);
  Worker& a = played.a;
  auto answers = played.OpenLink();  // rack 1's hub's link to rack 0's
  const uint64_t push = a.Push(1, 0, testing::Floats(kElems, 1.0f));  // homed on rack 1
  NextRelayId(*played.replies);
  const auto start = std::chrono::steady_clock::now();
  answers.reset();
  const auto failed = a.link->Receive(std::chrono::seconds(30));
  ExpectError(failed, net::WireError::kWorkerLost,
              "rack link: lost the link from the hub of rack 1, which carries its answers", false);
  EXPECT_TRUE(failed && failed->h.request_id == push) << Describe(failed);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  a.Pull(0);
  EXPECT_EQ(ParamsOf(a.link->Receive()).clock, 0u) << "a's connection stays";
}

// After a partition rack 1's hub (played by the test) dials again while
// rack 0's hub still holds its old, half-open link: the newer
// authenticated link supersedes it. The old link is closed and its relayed
// member (rank 0 of rack 1, the slowest) is gone at once, so the reply it
// held for a (bounded:0) is released, not kept until TCP keepalive.
TEST(MultiRackRelayLinkTest, ANewerLinkFromTheSameRackSupersedesTheOld) {
  PlayedRack1 played(kBounded0);
  Worker& a = played.a;
  const auto old_link = played.OpenLink();
  FrameHeader pull;
  pull.opcode = net::Opcode::kRackRelay;
  pull.tenant = 77;
  pull.key = a.key;
  pull.dtype = net::DType::kFp32;
  pull.request_id = 1;
  old_link->Send(pull, RelayPrefix(net::RelayKind::kFrame, net::Opcode::kPull, 0, 5));
  EXPECT_EQ(ParamsOf(RelayAnswer(*played.replies, 1)).clock, 0u) << "rank 0 of rack 1 is a member";
  a.Push(0, 0, testing::Floats(kElems, 1.0f));  // held: rank 0 of rack 1 is at 0
  const uint64_t probe = a.Pull(0);
  EXPECT_EQ(ParamsOf(a.link->Receive()).request, probe) << "the push is held";
  const auto new_link = played.OpenLink();
  EXPECT_TRUE(old_link->ClosedByPeer()) << "superseded";
  const Reply released = ParamsOf(a.link->Receive());
  EXPECT_EQ(released.clock, 1u) << "released: the old link's member is gone";
}

// Member notices are about a worker of the tenant, not of a key: rank 0 of
// rack 1 (played by the test, session 1) is live at rack 0's hub and holds
// a's push (bounded:0); its PULL of key "w2", not declared at the home yet,
// is parked; its gone notice, bound with "w2" too, is handled at once (a's
// reply is released). When "w2" is declared the parked PULL is refused
// (WORKER_LOST, its member is gone), never resurrecting it.
TEST(MultiRackRelayLinkTest, AGoneNoticeIsNotParkedAndNothingResurrectsItsMember) {
  PlayedRack1 played(kBounded0);
  Worker& a = played.a;
  RawClient& replies = *played.replies;
  const uint32_t w2 = a.key + 1;  // the tenant's next key: chunks 2 and 3 (home of 2: rack 0)
  const auto link = played.OpenLink();
  FrameHeader h;
  h.tenant = 77;
  h.dtype = net::DType::kFp32;
  const auto send = [&](net::Opcode op, uint32_t key, uint64_t relay_id, const std::string& body) {
    h.opcode = op;
    h.key = key;
    h.request_id = relay_id;
    link->Send(h, body);
  };
  send(net::Opcode::kKeyBind, w2, 0, KeyBindOf(kBounded0, w2, 2, "w2", 2).SerializeAsString());
  const auto prefix = [](net::RelayKind kind) {
    return RelayPrefix(kind, kind == net::RelayKind::kFrame ? net::Opcode::kPull
                                                             : net::Opcode::kHeartbeat,
                       0, 1);
  };
  send(net::Opcode::kRackRelay, a.key, 0, prefix(net::RelayKind::kMemberBack));
  send(net::Opcode::kRackRelay, a.key, 1, prefix(net::RelayKind::kFrame));
  EXPECT_EQ(ParamsOf(RelayAnswer(replies, 1)).clock, 0u);
  a.Push(0, 0, testing::Floats(kElems, 1.0f));  // held: rank 0 of rack 1 is at 0
  const uint64_t probe = a.Pull(0);
  EXPECT_EQ(ParamsOf(a.link->Receive()).request, probe) << "the push is held";
  send(net::Opcode::kRackRelay, w2, 2, prefix(net::RelayKind::kFrame));  // parked: no "w2"
  send(net::Opcode::kRackRelay, w2, 0, prefix(net::RelayKind::kMemberGone));
  EXPECT_EQ(ParamsOf(a.link->Receive()).clock, 1u) << "released by the gone notice at once";
  CreateKey(played.racks.hub(0).admin_address(), "w2", 2);
  ExpectError(RelayAnswer(replies, 2, std::chrono::seconds(10)), net::WireError::kWorkerLost,
              "RACK_RELAY: rank 0 of rack 1 (session 1) is gone from rack 1's hub", false);
}

}  // namespace
}  // namespace rackhub
