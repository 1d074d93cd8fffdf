// Bounded tenants spanning racks under a staggered schedule (issue 31;
// docs/consistency.md "Across racks"), with real hubs on loopback, 1 and 2
// lanes, 2 and 3 racks of 2 workers each, bounded:1. Rack 0's workers run
// one step ahead, the last rack's workers lag and step only when the test
// lets them, one at a time:
//  - a fast worker S + 1 ahead of the slowest live member is held at every
//    chunk's home (its own hub's and the other racks'): a Pull it sends
//    after its push is answered first, and stays so while any lagging
//    worker is behind; the reply comes once the last lagging worker
//    pushed, with slowest = that worker's new count;
//  - every reply's (updates, slowest) suffix satisfies the guarantee with
//    W = every rack's workers;
//  - the final parameters equal a reference computed from the inputs and
//    one flat hub's, bit for bit;
//  - the same with sparse (top-k) pushes: entries not listed are zero.
// Two keys ("w" and "v1") relay together, of 2 chunks each, or with 2
// lanes of 6: tenant chunk g is homed on rack (g / 2) % R, on lane g % 2,
// so every rack homes chunks of both lanes. Slot s is key s / chunks, its
// chunk s % chunks (Worker::Use).
#include <map>

#include "multi_rack_bounded.h"

namespace rackhub {
namespace {

using namespace bounded_test;  // NOLINT(build/namespaces): the suite's support

constexpr Mode kMode = kBounded1;
constexpr uint32_t kWorkers = 2;
constexpr uint64_t kIterations = 4;
constexpr float kTopk = 0.125f;  // k = 128 of 1024 entries
constexpr uint32_t kKeys = 2;    // "w" and "v1", `chunks` chunks each

// Whether entry `e` is in worker (rack, rank)'s sparse push of `chunk` at
// `iteration`: every tenth entry, from an offset of its own (103 or 102).
bool Listed(uint32_t rack, uint32_t rank, uint64_t iteration, uint32_t chunk, uint32_t e) {
  return (e + rack * 5 + rank * 3 + iteration + chunk) % 10 == 0;
}

// The gradient a worker pushes: Gradient, or (sparse) its listed entries
// with zeros elsewhere; the wire payload goes to `payload`.
std::vector<float> Sent(bool sparse, uint32_t all, uint32_t rack, uint32_t rank,
                        uint64_t iteration, uint32_t chunk, std::string* payload = nullptr) {
  std::vector<float> g = Gradient(all, rack, rank, iteration, chunk);
  if (!sparse) {
    if (payload) *payload = testing::Floats(g);
    return g;
  }
  std::vector<uint32_t> index;
  std::vector<float> value;
  for (uint32_t e = 0; e < kElems; ++e) {
    if (Listed(rack, rank, iteration, chunk, e)) {
      index.push_back(e);
      value.push_back(g[e]);
    } else {
      g[e] = 0.0f;
    }
  }
  if (payload) {
    const uint32_t count = static_cast<uint32_t>(index.size());
    payload->assign(reinterpret_cast<const char*>(&count), 4);
    payload->append(reinterpret_cast<const char*>(index.data()), 4 * index.size());
    payload->append(testing::Floats(value));
  }
  return g;
}

class Schedule {
 public:
  Schedule(Racks& racks, uint32_t rack_count, uint32_t chunks, bool sparse)
      : rack_count_(rack_count), chunks_(chunks), slots_(kKeys * chunks), sparse_(sparse) {
    for (uint32_t h = 0; h < racks.hubs(); ++h) {
      CreateTenant(racks.hub(h).admin_address(), kMode, kWorkers, chunks, pb::ZEROS,
                   sparse ? kTopk : 0.0f);
      for (uint32_t k = 1; k < kKeys; ++k) {
        CreateKey(racks.hub(h).admin_address(), KeyName(k), chunks, pb::ZEROS,
                  sparse ? kTopk : 0.0f);
      }
    }
    for (uint32_t r = 0; r < rack_count; ++r) {
      for (uint32_t k = 0; k < kWorkers; ++k) ws_.push_back(Connect(racks, r, k));
    }
    // Every worker counts at every home from its first request there.
    for (auto& w : ws_) {
      std::map<uint64_t, uint32_t> pulls;
      for (uint32_t s = 0; s < slots_; ++s) pulls[w.Pull(w.Use(s, chunks))] = s;
      for (const auto& [request, slot] : pulls) {
        EXPECT_EQ(ParamsOf(w.On(w.Use(slot, chunks)).Receive()).clock, 0u);
      }
    }
  }

  // Rack 0 (fast) pushes iteration t + 1 while the others push t; the
  // last rack's workers (lagging) push t one by one, and only the last of
  // them releases the fast workers' held replies.
  std::vector<float> Run() {
    for (Worker* w : Rack(0)) Answered(*w, Push(*w, 0), 1);
    for (uint64_t t = 0; t < kIterations; ++t) {
      SCOPED_TRACE("round " + std::to_string(t));
      for (uint32_t r = 1; r + 1 < rack_count_; ++r) {
        for (Worker* w : Rack(r)) Answered(*w, Push(*w, t), t + 1);
      }
      const bool ahead = t + 1 < kIterations;
      std::map<Worker*, std::map<uint64_t, uint32_t>> held;
      if (ahead) {
        for (Worker* w : Rack(0)) {
          held[w] = Push(*w, t + 1);  // count t + 2 > slowest t + S
          ExpectHeld(*w, slots_, chunks_);
        }
      }
      const auto lagging = Rack(rack_count_ - 1);
      for (size_t k = 0; k < lagging.size(); ++k) {
        Answered(*lagging[k], Push(*lagging[k], t), t + 1);
        if (k + 1 == lagging.size()) break;
        for (auto& [w, pushes] : held) ExpectHeld(*w, slots_, chunks_);  // another one lags still
      }
      for (auto& [w, pushes] : held) {
        for (const Reply& r : Answered(*w, pushes, t + 2)) {
          EXPECT_EQ(r.slowest, t + 1) << "released by the last lagging worker's push";
        }
      }
    }
    return PullAll(ws_, slots_, uint64_t{rack_count_} * kWorkers * kIterations, chunks_);
  }

 private:
  uint32_t rack_count_, chunks_, slots_;  // slot s: key KeyName(s / chunks_), chunk s % chunks_
  bool sparse_;
  std::vector<Worker> ws_;

  std::vector<Worker*> Rack(uint32_t r) {
    std::vector<Worker*> out;
    for (auto& w : ws_) {
      if (w.rack == r) out.push_back(&w);
    }
    return out;
  }
  // `w` pushes every slot at `iteration`: request -> slot.
  std::map<uint64_t, uint32_t> Push(Worker& w, uint64_t iteration) {
    std::map<uint64_t, uint32_t> sent;
    for (uint32_t s = 0; s < slots_; ++s) {
      const uint32_t c = w.Use(s, chunks_);
      std::string payload;
      Sent(sparse_, rack_count_ * kWorkers, w.rack, w.rank, iteration, s, &payload);
      FrameHeader h = w.Header(net::Opcode::kPush, c);
      h.iteration = iteration;
      if (sparse_) h.flags |= net::kFlagSparse;
      w.On(c).Send(h, payload);
      sent[h.request_id] = s;
    }
    return sent;
  }
  // The replies to `pushes`, each at count `clock` and within the bound.
  std::vector<Reply> Answered(Worker& w, const std::map<uint64_t, uint32_t>& pushes,
                              uint64_t clock) {
    std::vector<Reply> replies;
    for (const auto& [request, slot] : pushes) {
      const Reply r = ParamsOf(w.On(w.Use(slot, chunks_)).Receive());
      EXPECT_TRUE(pushes.count(r.request)) << "request " << r.request;
      EXPECT_EQ(r.clock, clock) << "rack " << w.rack << " rank " << w.rank;
      ExpectBound(r, kMode, rack_count_ * kWorkers);
      replies.push_back(r);
    }
    return replies;
  }
};

void RunBoth(uint32_t lanes, bool sparse) {
  const uint32_t chunks = lanes == 1 ? 2 : 6;  // per key
  for (const uint32_t rack_count : {2u, 3u}) {
    SCOPED_TRACE(std::to_string(rack_count) + " racks, " + std::to_string(lanes) + " lane(s)");
    std::vector<float> hierarchical, flat;
    {
      Racks racks(rack_count, false, {}, {}, lanes);
      hierarchical = Schedule(racks, rack_count, chunks, sparse).Run();
    }
    {
      Racks racks(rack_count, true, {}, {}, lanes);
      flat = Schedule(racks, rack_count, chunks, sparse).Run();
    }
    const auto reference =
        Reference(rack_count, kWorkers, kKeys * chunks, kIterations,
                  [sparse](uint32_t all, uint32_t rack, uint32_t rank, uint64_t i, uint32_t c) {
                    return Sent(sparse, all, rack, rank, i, c);
                  });
    EXPECT_TRUE(testing::SameBits(hierarchical, reference)) << "hierarchical vs reference";
    EXPECT_TRUE(testing::SameBits(flat, reference)) << "flat vs reference";
  }
}

TEST(MultiRackBoundedScheduleTest, TheFastRackIsHeldByTheSlowestOfEveryRack) { RunBoth(1, false); }

TEST(MultiRackBoundedScheduleTest, TwoLanesHoldAndSumAsOne) { RunBoth(2, false); }

TEST(MultiRackBoundedScheduleTest, SparsePushesAcrossRacksAndLanes) {
  RunBoth(1, true);
  RunBoth(2, true);
}

}  // namespace
}  // namespace rackhub
