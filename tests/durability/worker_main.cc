// rackhub-durability-worker: one rank of the worker-kill loop
// (kill_loop_test.cc, WorkerKill9Loop). Connects, declares key "w"
// (--elements, Adam), Pulls, then trains with Gradient() until killed or
// until --iterations, recovering as docs/durability.md tells a trainer to.
// Writes one line per event to --out, flushed at once:
//   pull V HASH          after a Pull: the key's iteration and params hash
//   iter V HASH          after a PushPull: the new iteration and params hash
//   resync CODE MESSAGE  a PushPull needed a Pull (kRolledBack, WORKER_LOST, ...)
//   error WHAT MESSAGE   anything else (then exit 4)
// Exit codes: 0 reached --iterations, 2 connect failed, 3 declare failed,
// 4 an operation failed without recovery, 64 usage.
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "training.h"

namespace {

using namespace rackhub;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("rackhub-durability-worker");
  client::Options o;
  std::string out_path;
  uint64_t elements = 0, iterations = UINT64_MAX;
  uint32_t op_timeout_ms = 30000;
  app.add_option("--hub", o.hub)->required();
  app.add_option("--tenant", o.tenant)->required();
  app.add_option("--token", o.token)->required();
  app.add_option("--rank", o.rank)->required();
  app.add_option("--out", out_path)->required();
  app.add_option("--elements", elements)->required()->check(CLI::Range(uint64_t{1}, uint64_t{1} << 28));
  app.add_option("--iterations", iterations);
  app.add_option("--op-timeout-ms", op_timeout_ms);
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
  o.op_timeout = std::chrono::milliseconds(op_timeout_ms);
  client::Error e;
  auto c = client::Client::Connect(o, &e);
  if (!c) {
    line("error connect " + e.message);
    return 2;
  }
  line(std::string("transport ") + c->transport());
  client::KeyDecl d;
  d.name = "w";
  d.elements = elements;
  client::OptimizerSpec adam;
  adam.type = "adam";
  adam.learning_rate = 0.001;
  d.optimizer = adam;
  testing::TrainingKey key;
  key.seed = 7;
  if (e = c->DeclareKey(d, &key.id); !e.ok()) {
    line("error declare " + e.message);
    return 3;
  }
  key.params.resize(elements);
  key.grad.resize(elements);
  key.out.resize(elements);
  const auto pull = [&] {
    if (!testing::PullKey(*c, key, &e)) {
      line("error pull " + e.message);
      std::exit(4);
    }
    line("pull " + std::to_string(key.iteration) + " " + testing::HashFloats(key.params));
  };
  pull();
  while (key.iteration < iterations) {
    testing::Gradient(key.seed, key.iteration, o.rank, key.params, key.grad);
    e = c->Wait(c->PushPull(key.id, key.grad, key.out));
    if (e.ok()) {
      key.params.swap(key.out);
      ++key.iteration;
      line("iter " + std::to_string(key.iteration) + " " + testing::HashFloats(key.params));
    } else if (testing::NeedsResync(e)) {
      line(std::string("resync ") + client::ErrorCodeName(e.code) + " " + e.message);
      pull();
    } else {
      line(std::string("error push ") + client::ErrorCodeName(e.code) + " " + e.message);
      return 4;
    }
  }
  return 0;
}
