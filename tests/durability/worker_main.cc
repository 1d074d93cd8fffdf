// rackhub-durability-worker: one rank of the worker-kill loop
// (kill_loop_test.cc, WorkerKill9Loop). Connects, declares key "w"
// (--elements, Adam) or, with --table-rows R, a row-sparse table "t" of R x
// 16 (row-wise AdaGrad; each step pushes 64 rows picked from the iteration
// and rank, their gradients from Gradient() over the whole table, and asks
// for every row back), Pulls, then trains until killed or until
// --iterations, recovering as docs/durability.md tells a trainer to.
// Writes one line per event to --out, flushed at once:
//   pull V HASH          after a Pull: the key's iteration and params hash
//   iter V HASH          after a PushPull: the new iteration and params hash
//   resync CODE MESSAGE  a PushPull needed a Pull (kRolledBack, WORKER_LOST, ...)
//   bound V UPDATES SLOWEST  (--bounded) after a PushPull: the worker's
//                        iteration, the updates applied and the slowest live
//                        worker's iteration the hub reported
// --topk R declares "w" with top-k compression (error feedback on);
// --bounded S says the tenant is bounded:S (lines "bound" instead of "iter":
// parameters differ between workers there).
//   error WHAT MESSAGE   anything else (then exit 4)
// Across racks (cross_rack_recovery_test.cc): --rack R is the worker's rack
// (its gradient is Gradient(seed, it, 64 * R + rank, params), so every rank
// of every rack pushes other values); --optimizer sgd|momentum|adam with --lr
// and --momentum picks "w"'s optimizer (default adam, lr 0.001);
// --dump-pulls appends the pulled parameters to a "pull" line of values
// other than the last ones it dumped (one 8-digit hex fp32 bit pattern per
// element, no separator) for a reference to start from; --max-resyncs N
// (default 100) ends a worker that needed N resyncs in a row without a
// PushPull going through (a hub refusing every push must not make it spin
// forever: "error resync ..."); --stop-file F: while F holds a number N, the worker stops at
// iteration N (read before every push; --iterations still bounds it).
// Exit codes: 0 reached --iterations, 2 connect failed, 3 declare failed,
// 4 an operation failed without recovery, 64 usage.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "training.h"

namespace {

using namespace rackhub;

constexpr uint32_t kTableDim = 16;
constexpr uint64_t kRowsPerStep = 64;

template <typename Line>
int TrainTable(client::Client& c, uint32_t rank, uint64_t rows, uint64_t iterations,
               const Line& line) {
  client::KeyDecl d;
  d.name = "t";
  d.rows = rows;
  d.dim = kTableDim;
  d.init = client::Init::kRandom;
  d.init_scale = 0.05f;
  d.init_seed = 11;
  client::OptimizerSpec adagrad;
  adagrad.type = "adagrad";
  adagrad.learning_rate = 0.05;
  d.optimizer = adagrad;
  client::KeyId key = 0;
  if (client::Error e = c.DeclareKey(d, &key); !e.ok()) {
    line("error declare " + e.message);
    return 3;
  }
  std::vector<uint64_t> all(rows);
  for (uint64_t i = 0; i < rows; ++i) all[i] = i;
  std::vector<float> table(rows * kTableDim), out(rows * kTableDim), dense(rows * kTableDim);
  uint64_t iteration = 0;
  const auto pull = [&] {
    if (client::Error e = c.Wait(c.PullRows(key, all, table)); !e.ok()) {
      line("error pull " + e.message);
      std::exit(4);
    }
    iteration = c.GetKeyInfo(key)->next_iteration;
    line("pull " + std::to_string(iteration) + " " + testing::HashFloats(table));
  };
  pull();
  while (iteration < iterations) {
    testing::Gradient(7, iteration, rank, table, dense);
    std::vector<uint64_t> ids;
    std::vector<float> grads;
    for (uint64_t i = 0; i < kRowsPerStep; ++i) {
      const uint64_t id = (i * 2654435761u + iteration * 40503u + rank * 977u) % rows;
      ids.push_back(id);
      grads.insert(grads.end(), dense.begin() + id * kTableDim,
                   dense.begin() + (id + 1) * kTableDim);
    }
    const client::Error e = c.Wait(c.PushPullRows(key, ids, grads, all, out));
    if (e.ok()) {
      table.swap(out);
      ++iteration;
      line("iter " + std::to_string(iteration) + " " + testing::HashFloats(table));
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

// The iteration to stop at: --stop-file's number if it holds one, at most
// --iterations.
uint64_t StopAt(const std::string& stop_file, uint64_t iterations) {
  if (stop_file.empty()) return iterations;
  std::ifstream in(stop_file);
  uint64_t n = 0;
  return in >> n ? std::min(n, iterations) : iterations;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("rackhub-durability-worker");
  client::Options o;
  std::string out_path;
  uint64_t elements = 0, iterations = UINT64_MAX, table_rows = 0;
  float topk = 0;
  int64_t bounded = -1;
  uint32_t op_timeout_ms = 30000;
  std::string optimizer = "adam", stop_file;
  double lr = 0.001, momentum = 0;
  bool dump_pulls = false;
  uint32_t max_resyncs = 100;
  app.add_option("--hub", o.hub)->required();
  app.add_option("--tenant", o.tenant)->required();
  app.add_option("--token", o.token)->required();
  app.add_option("--rank", o.rank)->required();
  app.add_option("--out", out_path)->required();
  app.add_option("--elements", elements)->check(CLI::Range(uint64_t{1}, uint64_t{1} << 28));
  app.add_option("--table-rows", table_rows)->check(CLI::Range(uint64_t{1}, uint64_t{1} << 22));
  app.add_option("--iterations", iterations);
  app.add_option("--topk", topk)->check(CLI::Range(0.0f, 1.0f));
  app.add_option("--bounded", bounded)->check(CLI::Range(int64_t{0}, int64_t{1000}));
  app.add_option("--op-timeout-ms", op_timeout_ms);
  app.add_option("--rack", o.rack)->check(CLI::Range(0u, 63u));
  app.add_option("--optimizer", optimizer)->check(CLI::IsMember({"sgd", "momentum", "adam"}));
  app.add_option("--lr", lr)->check(CLI::PositiveNumber);
  app.add_option("--momentum", momentum)->check(CLI::Range(0.0, 1.0));
  app.add_flag("--dump-pulls", dump_pulls);
  app.add_option("--stop-file", stop_file);
  app.add_option("--max-resyncs", max_resyncs);
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
  if (table_rows > 0) return TrainTable(*c, o.rank, table_rows, iterations, line);
  if (elements == 0) {
    line("error usage: --elements or --table-rows");
    return 64;
  }
  client::KeyDecl d;
  d.name = "w";
  d.elements = elements;
  d.topk_ratio = topk;
  client::OptimizerSpec spec;
  spec.type = optimizer;
  spec.learning_rate = lr;
  spec.momentum = momentum;
  d.optimizer = spec;
  testing::TrainingKey key;
  key.seed = 7;
  std::string dumped;  // "VERSION HASH" of the values this process wrote last
  uint32_t resyncs_in_a_row = 0;
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
    // A version seen again may hold other values (a checkpoint restored).
    const std::string pulled = std::to_string(key.iteration) + " " + testing::HashFloats(key.params);
    const bool dump = dump_pulls && pulled != dumped;
    line("pull " + pulled + (dump ? " " + testing::HexFloats(key.params) : ""));
    if (dump) dumped = pulled;
  };
  pull();
  const uint32_t gradient_rank = 64 * o.rack + o.rank;
  while (key.iteration < StopAt(stop_file, iterations)) {
    testing::Gradient(key.seed, key.iteration, gradient_rank, key.params, key.grad);
    e = c->Wait(c->PushPull(key.id, key.grad, key.out));
    if (e.ok()) {
      resyncs_in_a_row = 0;
      key.params.swap(key.out);
      ++key.iteration;
      if (bounded >= 0) {
        const client::KeyInfo k = *c->GetKeyInfo(key.id);
        key.iteration = k.next_iteration;
        line("bound " + std::to_string(k.next_iteration) + " " + std::to_string(k.updates) + " " +
             std::to_string(k.slowest_iteration));
      } else {
        line("iter " + std::to_string(key.iteration) + " " + testing::HashFloats(key.params));
      }
    } else if (testing::NeedsResync(e)) {
      line(std::string("resync ") + client::ErrorCodeName(e.code) + " " + e.message);
      if (++resyncs_in_a_row > max_resyncs) {
        line("error resync: " + std::to_string(resyncs_in_a_row) +
             " resyncs in a row without a PushPull going through (--max-resyncs)");
        return 4;
      }
      pull();
    } else {
      line(std::string("error push ") + client::ErrorCodeName(e.code) + " " + e.message);
      return 4;
    }
  }
  return 0;
}
