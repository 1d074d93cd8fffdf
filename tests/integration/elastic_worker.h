// The worker of the elastic tenant tests (elastic_test,
// multi_rack_elastic_test; docs/elastic.md): a forked child process of the
// test, one C++ Client (one rank), driven over a socketpair. The test tells
// it which step to push; it pushes its gradient of that step to two sum-only
// keys (reduction sum and mean), retries after WORKER_LOST (Pull, push the
// same gradient again) and reports each reply with the membership the hub
// named. Also the gradients and the reference the replies are compared
// with, bit for bit. Header-only test code.
#pragma once

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "rackhub/client/client.h"

namespace rackhub::testing::elastic {

namespace rc = rackhub::client;

// 600 floats: three chunks of 256 (1 KiB chunks) over two lanes.
constexpr uint32_t kElements = 600;

// Rank r's gradient of step s: distinct for every (rank, step, element), with
// low-order bits set so that a missing or extra contribution, or another
// summation order, changes the bits.
inline float Gradient(uint32_t rank, uint32_t step, uint32_t i) {
  uint64_t z = (uint64_t{rank} << 48) ^ (uint64_t{step} << 20) ^ i;
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<double>(z >> 40) / double(1ull << 24) * 2.0 - 1.0);
}

// What the hub must reply for `racks` (each rack's members, ascending
// global ranks; a rack without members is skipped) at `step`: each rack's
// fp32 sum in rank order, then the racks' sums added in rack order; the mean
// is that sum times float(1 / count of every member). One rack: the sum in
// rank order.
inline std::vector<float> ReferenceSum(const std::vector<std::vector<uint32_t>>& racks,
                                       uint32_t step) {
  std::vector<float> out(kElements, 0.0f);
  for (uint32_t i = 0; i < kElements; ++i) {
    bool first = true;
    float total = 0.0f;
    for (const std::vector<uint32_t>& members : racks) {
      if (members.empty()) continue;
      float acc = Gradient(members[0], step, i);
      for (size_t k = 1; k < members.size(); ++k) acc += Gradient(members[k], step, i);
      total = first ? acc : total + acc;
      first = false;
    }
    out[i] = total;
  }
  return out;
}
inline std::vector<float> ReferenceMean(const std::vector<std::vector<uint32_t>>& racks,
                                        uint32_t step) {
  std::vector<float> out = ReferenceSum(racks, step);
  size_t count = 0;
  for (const auto& members : racks) count += members.size();
  const float scale = static_cast<float>(1.0 / static_cast<double>(count));
  for (float& v : out) v *= scale;
  return out;
}

inline std::vector<float> ReferenceSum(const std::vector<uint32_t>& members, uint32_t step) {
  return ReferenceSum(std::vector<std::vector<uint32_t>>{members}, step);
}
inline std::vector<float> ReferenceMean(const std::vector<uint32_t>& members, uint32_t step) {
  return ReferenceMean(std::vector<std::vector<uint32_t>>{members}, step);
}

// ---- The worker (a forked child) ------------------------------------------

enum : uint32_t { kCmdStep = 1, kCmdBye = 2 };
struct Command {
  uint32_t op = 0;
  uint32_t step = 0;
};

enum : int32_t { kReady = 0, kStepDone = 1, kPausedSeen = 2, kFailed = -1 };
struct KeyResult {
  uint64_t version = 0;  // the key's version after the reply (diagnostics)
  uint64_t generation = 0;
  uint32_t members = 0;
  uint32_t mixed = 0;
  float values[kElements] = {};
};
struct Report {
  int32_t kind = kFailed;
  uint32_t rank = 0;
  uint32_t step = 0;
  uint32_t retries = 0;
  char message[512] = {};
  KeyResult sum, mean;
};

inline bool WriteAll(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    // A socket (socketpair): no SIGPIPE when the other side died (a worker
    // killed, or the test gone): the write fails instead.
    const ssize_t w = ::send(fd, c, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}
inline bool ReadAll(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

struct WorkerConfig {
  std::string hub, tenant, token;
  uint32_t rank = 0;  // in its rack
  bool shm = false;
  uint32_t rack = 0;
  uint32_t global = 0;  // rack * max_workers + rank: its gradients are Gradient(global, ...)
};

[[noreturn]] inline void WorkerMain(const WorkerConfig& cfg, int fd) {
  Report report;
  report.rank = cfg.global;
  const auto fail = [&](const std::string& what) {
    report.kind = kFailed;
    std::snprintf(report.message, sizeof report.message, "%s", what.c_str());
    WriteAll(fd, &report, sizeof report);
    _exit(1);
  };
  rc::Options o;
  o.hub = cfg.hub;
  o.tenant = cfg.tenant;
  o.token = cfg.token;
  o.rank = cfg.rank;
  o.rack = cfg.rack;
  o.shm = cfg.shm ? rc::Shm::kOn : rc::Shm::kOff;
  o.op_timeout = std::chrono::milliseconds(120000);
  rc::Error err;
  std::unique_ptr<rc::Client> client = rc::Client::Connect(o, &err);
  if (!client) fail("connect: " + err.message);
  rc::KeyId keys[2] = {0, 0};
  for (int k = 0; k < 2; ++k) {
    rc::KeyDecl d;
    d.name = k == 0 ? "sum" : "mean";
    d.elements = kElements;
    rc::OptimizerSpec spec;
    spec.type = "sum-only";
    spec.reduction = k == 0 ? "sum" : "mean";
    d.optimizer = spec;
    if (rc::Error e = client->DeclareKey(d, &keys[k]); !e.ok()) fail("declare: " + e.message);
  }
  std::vector<float> out[2] = {std::vector<float>(kElements), std::vector<float>(kElements)};
  // A wait longer than the test's report timeout fails naming what hung.
  const auto wait = [&](rc::Ticket t, const std::string& what) {
    const rc::Error e = client->WaitFor(t, std::chrono::milliseconds(25000));
    if (e.code == rc::ErrorCode::kTimeout) {
      const rc::KeyInfo a = *client->GetKeyInfo(keys[0]), b = *client->GetKeyInfo(keys[1]);
      fail(what + " did not complete in 25 s (sum at " + std::to_string(a.next_iteration) +
           ", mean at " + std::to_string(b.next_iteration) + ")");
    }
    return e;
  };
  const auto pull = [&](int k) {
    const rc::Error e = wait(client->Pull(keys[k], out[k]), k ? "pull of mean" : "pull of sum");
    if (!e.ok()) fail("pull: " + e.message);
  };
  // Joining: the Pull is held by the hub until this rank is a member (or
  // the tenant runs): then it is ready to push at the next boundary.
  pull(0);
  pull(1);
  report.kind = kReady;
  if (!WriteAll(fd, &report, sizeof report)) _exit(1);
  std::vector<float> grad(kElements);
  for (;;) {
    Command cmd;
    if (!ReadAll(fd, &cmd, sizeof cmd)) _exit(0);
    if (cmd.op == kCmdBye) {
      client->Close();
      _exit(0);
    }
    for (uint32_t i = 0; i < kElements; ++i) grad[i] = Gradient(cfg.global, cmd.step, i);
    report = Report{};
    report.rank = cfg.global;
    report.step = cmd.step;
    bool done[2] = {false, false};
    bool told_paused = false;
    while (!done[0] || !done[1]) {
      rc::Ticket t[2] = {0, 0};
      for (int k = 0; k < 2; ++k) {
        if (!done[k]) t[k] = client->PushPull(keys[k], grad, out[k]);
      }
      for (int k = 0; k < 2; ++k) {
        if (done[k]) continue;
        const rc::Error e = wait(t[k], std::string(k ? "push-pull of mean" : "push-pull of sum") +
                                          " (retry " + std::to_string(report.retries) + ")");
        if (e.ok()) {
          done[k] = true;
          const rc::KeyInfo info = *client->GetKeyInfo(keys[k]);
          KeyResult& r = k == 0 ? report.sum : report.mean;
          r.generation = info.membership_generation;
          r.version = info.version;
          r.members = info.members;
          r.mixed = info.membership_mixed ? 1 : 0;
          std::memcpy(r.values, out[k].data(), sizeof r.values);
          continue;
        }
        const bool retry = e.code == rc::ErrorCode::kRolledBack ||
                           (e.code == rc::ErrorCode::kServer &&
                            (e.wire == rc::WireError::kWorkerLost ||
                             e.wire == rc::WireError::kBadIteration));
        if (!retry) fail("push-pull: " + e.message);
        if (!told_paused && e.message.find("paused") != std::string::npos) {
          told_paused = true;
          Report p = report;
          p.kind = kPausedSeen;
          std::snprintf(p.message, sizeof p.message, "%s", e.message.c_str());
          if (!WriteAll(fd, &p, sizeof p)) _exit(1);
        }
        ++report.retries;
        pull(k);  // held while the tenant recovers or is paused
      }
    }
    report.kind = kStepDone;
    if (!WriteAll(fd, &report, sizeof report)) _exit(1);
  }
}

}  // namespace rackhub::testing::elastic
