// rackhub-generation-worker: one process of the replacement loop
// (kill_loop_test.cc, WorkerReplacementLoop), an independent client: it uses
// librackhub's C ABI only (rackhub_c.h), with the default options (shared
// memory when the hub is on this host and offers it, TCP otherwise).
//
// Connects as --rank, declares key "w" (--elements fp32, sum-only, sum
// reduction, zeros) and pushes SaltedGradient(--salt, rank, step, i) at its
// step-th successful PushPull (salted_gradient.h: every process's values are
// its own).
//
// --rounds 0 (a worker of the first generation): PushPull until a call
// fails, then close (BYE) and exit 0. The test kills one of them.
// --rounds K (a fresh process): Pull, then K successful PushPulls, each reply
// written to OUT.replyS (raw fp32, the step S it answers). On WORKER_LOST,
// BAD_ITERATION or ROLLED_BACK it follows the trainer contract (Pull, push
// the same step again; at most 10 times); the test counts any of them as a
// failure, but going on shows what the hub answers next.
//
// Writes one line per event to --out, flushed at once:
//   transport shm|tcp N     after connecting: N shared-memory regions mapped
//                           (one per lane over shm, 0 over TCP)
//   iter S                  step S's PushPull completed (--rounds 0)
//   stopped CODE WIRE TEXT  --rounds 0: the PushPull of the next step failed
//   pull                    the Pull completed (--rounds K)
//   reply S                 step S's reply is in OUT.replyS (--rounds K)
//   resync S CODE WIRE TEXT step S's PushPull failed with a contract error
//   error WHAT CODE WIRE TEXT  anything else (then exit 4)
//   done                    K replies (then exit 0)
// Exit codes: 0 as above, 2 connect failed, 3 declare failed, 4 an operation
// failed, 64 usage.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "rackhub/client/rackhub_c.h"
#include "salted_gradient.h"

namespace {

using rackhub::testing::SaltedGradient;

constexpr uint32_t kWorkerLost = 9;  // docs/errors.md
constexpr uint32_t kBadIteration = 6;
constexpr int kMaxResyncs = 10;

// The shared-memory regions this process has mapped (net/shm maps each
// lane's sealed memfd, named "rackhub-shm").
int ShmRegions() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  int n = 0;
  while (std::getline(maps, line)) n += line.find("/memfd:rackhub-shm") != std::string::npos;
  return n;
}

bool ContractError(int status, uint32_t wire) {
  return status == RACKHUB_ROLLED_BACK ||
         (status == RACKHUB_SERVER && (wire == kWorkerLost || wire == kBadIteration));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("rackhub-generation-worker");
  std::string hub, tenant, token, out_path;
  uint32_t rank = 0, salt = 0, rounds = 0, op_timeout_ms = 30000;
  uint64_t elements = 0;
  app.add_option("--hub", hub)->required();
  app.add_option("--tenant", tenant)->required();
  app.add_option("--token", token)->required();
  app.add_option("--rank", rank)->required();
  app.add_option("--salt", salt)->required()->check(CLI::Range(1u, rackhub::testing::kMaxSalt));
  app.add_option("--elements", elements)
      ->required()
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 26));
  app.add_option("--out", out_path)->required();
  app.add_option("--rounds", rounds);
  app.add_option("--op-timeout-ms", op_timeout_ms);
  std::string go_file;
  app.add_option("--go-file", go_file,
                 "after connecting and declaring, print 'ready' and wait until this file exists");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 64;
  }
  FILE* out = std::fopen(out_path.c_str(), "a");
  if (!out) {
    std::perror(out_path.c_str());
    return 64;
  }
  const auto line = [out](const std::string& s) {
    std::fputs((s + "\n").c_str(), out);
    std::fflush(out);
  };

  rackhub_options o{};
  o.hub = hub.c_str();
  o.tenant = tenant.c_str();
  o.token = token.c_str();
  o.rank = rank;
  o.op_timeout_ms = op_timeout_ms;
  rackhub_client* c = nullptr;
  char err[512] = "";
  if (rackhub_connect(&o, &c, err, sizeof err) != RACKHUB_OK) {
    line(std::string("error connect ") + err);
    return 2;
  }
  const int regions = ShmRegions();
  line(std::string("transport ") + (regions > 0 ? "shm " : "tcp ") + std::to_string(regions));
  const auto failure = [&](int status) {
    std::ostringstream s;
    s << status << " " << rackhub_last_wire_error(c) << " " << rackhub_last_error(c);
    return s.str();
  };

  rackhub_optimizer sum_only{};
  sum_only.type = "sum-only";
  sum_only.reduction = RACKHUB_REDUCTION_SUM;
  uint32_t key = 0;
  if (const int st =
          rackhub_declare_key(c, "w", elements, RACKHUB_FP32, &sum_only, RACKHUB_INIT_ZEROS, &key);
      st != RACKHUB_OK) {
    line("error declare " + failure(st));
    rackhub_close(c);
    return 3;
  }
  if (!go_file.empty()) {
    // The test starts every rank's first push together (an op timeout then
    // measures an iteration, not how long the other processes took to start).
    line("ready");
    while (access(go_file.c_str(), F_OK) != 0) usleep(2000);
  }
  std::vector<float> grad(elements), reply(elements);
  const auto fill = [&](uint64_t step) {
    for (uint64_t i = 0; i < elements; ++i) grad[i] = SaltedGradient(salt, rank, step, i);
  };

  if (rounds == 0) {
    for (uint64_t step = 0;; ++step) {
      fill(step);
      const int st = rackhub_push_pull(c, key, grad.data(), reply.data(), elements);
      if (st != RACKHUB_OK) {
        line("stopped " + failure(st));
        rackhub_close(c);  // BYE: the survivor leaves as a trainer would
        return 0;
      }
      line("iter " + std::to_string(step));
    }
  }

  const auto pull = [&] {
    const int st = rackhub_pull(c, key, reply.data(), elements);
    if (st != RACKHUB_OK) {
      line("error pull " + failure(st));
      rackhub_close(c);
      std::exit(4);
    }
    line("pull");
  };
  pull();
  int resyncs = 0;
  for (uint64_t step = 0; step < rounds;) {
    fill(step);
    const int st = rackhub_push_pull(c, key, grad.data(), reply.data(), elements);
    if (st == RACKHUB_OK) {
      const std::string path = out_path + ".reply" + std::to_string(step);
      FILE* f = std::fopen(path.c_str(), "wb");
      if (!f || std::fwrite(reply.data(), sizeof(float), elements, f) != elements ||
          std::fclose(f) != 0) {
        line("error write " + path);
        rackhub_close(c);
        return 4;
      }
      line("reply " + std::to_string(step));
      ++step;
    } else if (ContractError(st, rackhub_last_wire_error(c)) && resyncs < kMaxResyncs) {
      ++resyncs;
      line("resync " + std::to_string(step) + " " + failure(st));
      pull();
    } else {
      line("error push " + failure(st));
      rackhub_close(c);
      return 4;
    }
  }
  line("done");
  rackhub_close(c);
  return 0;
}
