// RunWorker (test_worker.h): the C++ API worker.
#include "test_worker.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "rackhub/client/client.h"
#include "rackhub/common/number.h"

namespace rackhub::testing {
namespace {

using namespace rackhub::client;

// Keep in sync with client_test.cc.
float Gradient(uint32_t rank, uint64_t iteration, uint64_t index) {
  const int64_t k = static_cast<int64_t>((index * 7 + rank * 13 + iteration * 5) % 101) - 50;
  return static_cast<float>(k) / 64.0f + 0.001f * static_cast<float>(index % 7) +
         0.01f * static_cast<float>(rank);
}
float InitialValue(uint64_t index) {
  return static_cast<float>((static_cast<int64_t>(index % 17) - 8)) * 0.125f +
         0.003f * static_cast<float>(index % 5);
}

// A usage error: RunWorker prints it and returns 64.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, sep);) out.push_back(part);
  return out;
}

OptimizerSpec ParseOptimizer(const std::vector<std::string>& f, size_t at) {
  if (f.size() < at + 9)
    throw UsageError("optimizer needs TYPE,LR,MOMENTUM,WD,BETA1,BETA2,EPS,ACC,RED");
  OptimizerSpec o;
  o.type = f[at];
  o.learning_rate = std::stod(f[at + 1]);
  o.momentum = std::stod(f[at + 2]);
  o.weight_decay = std::stod(f[at + 3]);
  o.beta1 = std::stod(f[at + 4]);
  o.beta2 = std::stod(f[at + 5]);
  o.epsilon = std::stod(f[at + 6]);
  o.initial_accumulator = std::stod(f[at + 7]);
  o.reduction = f[at + 8];
  return o;
}

struct KeyRun {
  KeyDecl decl;
  KeyId id = 0;
  std::vector<float> grad, params;
};

class Output {
 public:
  explicit Output(const std::string& path) : f_(std::fopen(path.c_str(), "w")) {
    if (!f_) throw UsageError("cannot open --out " + path);
  }
  ~Output() { std::fclose(f_); }
  Output(const Output&) = delete;
  Output& operator=(const Output&) = delete;
  void Line(const std::string& s) {
    std::fprintf(f_, "%s\n", s.c_str());
    std::fflush(f_);
  }
  void Floats(const std::string& prefix, const std::vector<float>& v) {
    std::string s = prefix;
    char buf[16];
    for (float x : v) {
      uint32_t bits;
      std::memcpy(&bits, &x, 4);
      std::snprintf(buf, sizeof buf, " %08x", bits);
      s += buf;
    }
    Line(s);
  }

 private:
  std::FILE* f_;
};

struct WorkerArgs {
  Options options;
  std::string out_path;
  std::vector<KeyRun> keys;
  std::vector<std::vector<std::string>> set_optimizers;
  uint64_t iterations = 0;
  int sleep_max_ms = 0;
  int64_t hang_at = -1;
  bool dump_all = false;
  bool help = false;  // --help: printed, nothing to run
};

// CLI11 validator: an unsigned integer (rackhub/common/number.h) up to `max`.
CLI::Validator UnsignedUpTo(uint64_t max) {
  return CLI::Validator(
      [max](std::string& text) {
        const Result<uint64_t> v = ParseUnsigned(text, max);
        return v.ok() ? std::string() : v.status().message();
      },
      "");
}

WorkerArgs Parse(const std::vector<std::string>& argv) {
  WorkerArgs w;
  Options& options = w.options;
  std::vector<std::string> keys, set_optimizers;
  std::string transport = "tcp";
  uint64_t hang_at = 0, connect_ms = 10000, op_ms = 60000;
  CLI::App app("rackhub-test-worker: one training worker of the client suite",
               "rackhub-test-worker");
  app.add_option("--hub", options.hub, "the hub's TCP data plane")
      ->type_name("HOST:PORT")
      ->required();
  app.add_option("--tenant", options.tenant, "tenant name")->required();
  app.add_option("--token", options.token, "the tenant's data-plane token");
  app.add_option("--rank", options.rank, "worker rank")->check(UnsignedUpTo(UINT32_MAX));
  app.add_option("--rack", options.rack, "the worker's rack (multi-rack tenants)")
      ->check(UnsignedUpTo(UINT32_MAX));
  app.add_option("--out", w.out_path, "event file")->type_name("FILE")->required();
  app.add_option("--key", keys, "a key (repeatable)")
      ->type_name("NAME,ELEMENTS,DTYPE,INIT[,OPT...]")
      ->allow_extra_args(false);
  app.add_option("--iterations", w.iterations, "PushPull iterations")
      ->check(UnsignedUpTo(UINT64_MAX));
  app.add_option("--set-optimizer", set_optimizers, "rank 0: SetOptimizer (repeatable)")
      ->type_name("NAME,FROM,OPT...")
      ->allow_extra_args(false);
  app.add_option("--sleep-max-ms", w.sleep_max_ms, "random sleep before each iteration")
      ->check(UnsignedUpTo(INT32_MAX));
  CLI::Option* hang = app.add_option("--hang-at", hang_at, "stop before pushing iteration K")
                          ->type_name("K")
                          ->check(UnsignedUpTo(INT64_MAX));
  app.add_flag("--dump-all", w.dump_all, "write the parameters after every iteration");
  app.add_option("--transport", transport,
                 "data-plane transport (tcp: TCP only; shm: shared memory required; auto: "
                 "shared memory with a hub on this host, else RDMA with a device, else TCP)")
      ->check(CLI::IsMember({"tcp", "rdma", "shm", "auto"}))
      ->capture_default_str();
  app.add_option("--rdma-hub", options.rdma_hub, "the hub's RDMA listener")->type_name("HOST:PORT");
  app.add_option("--rdma-ring-bytes", options.rdma_ring_bytes, "registered ring per lane")
      ->check(UnsignedUpTo(UINT32_MAX));
  app.add_option("--connect-timeout-ms", connect_ms, "Options::connect_timeout")
      ->check(UnsignedUpTo(INT32_MAX))
      ->capture_default_str();
  app.add_option("--op-timeout-ms", op_ms, "Options::op_timeout")
      ->check(UnsignedUpTo(INT32_MAX))
      ->capture_default_str();
  std::vector<std::string> reversed(argv.rbegin(), argv.rend());  // CLI11 takes them backwards
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    w.help = true;
    return w;
  } catch (const CLI::ParseError& e) {
    std::string message = e.what();
    std::replace(message.begin(), message.end(), '\n', ' ');
    throw UsageError(message);
  }
  options.transport = transport == "rdma"   ? Transport::kRdma
                      : transport == "auto" ? Transport::kAuto
                                            : Transport::kTcp;
  options.shm = transport == "shm"    ? client::Shm::kOn
                : transport == "auto" ? client::Shm::kAuto
                                      : client::Shm::kOff;
  options.connect_timeout = std::chrono::milliseconds(connect_ms);
  options.op_timeout = std::chrono::milliseconds(op_ms);
  if (hang->count() > 0) w.hang_at = static_cast<int64_t>(hang_at);
  for (const std::string& spec : keys) {
    const auto f = Split(spec, ',');
    if (f.size() < 4) throw UsageError("--key needs NAME,ELEMENTS,DTYPE,INIT[,OPT...]");
    KeyRun k;
    k.decl.name = f[0];
    k.decl.elements = std::stoull(f[1]);
    k.decl.dtype = f[2] == "fp16" ? DType::kFp16 : f[2] == "bf16" ? DType::kBf16 : DType::kFp32;
    k.decl.init = f[3] == "client" ? Init::kFromClient : Init::kZeros;
    if (f.size() > 4) k.decl.optimizer = ParseOptimizer(f, 4);
    w.keys.push_back(std::move(k));
  }
  for (const std::string& spec : set_optimizers) {
    w.set_optimizers.push_back(Split(spec, ','));
    if (w.set_optimizers.back().size() < 2) {
      throw UsageError("--set-optimizer needs NAME,FROM,OPT...");
    }
    ParseOptimizer(w.set_optimizers.back(), 2);
  }
  return w;
}

int Run(WorkerArgs& w, const WorkerHooks& hooks) {
  const Options& options = w.options;
  std::vector<KeyRun>& keys = w.keys;
  Output out(w.out_path);

  Error e;
  auto client = hooks.connect ? hooks.connect(options, &e) : Client::Connect(options, &e);
  if (!client) {
    out.Line("connect_error " + std::to_string(static_cast<int>(e.code)) + " " + e.message);
    return 2;
  }
  for (auto& k : keys) {
    if (Error d = client->DeclareKey(k.decl, &k.id); !d.ok()) {
      out.Line("declare_error " + k.decl.name + " " + std::to_string(static_cast<int>(d.code)) +
               " " + std::to_string(static_cast<uint32_t>(d.wire)) + " " + d.message);
      return 3;
    }
    out.Line("key " + k.decl.name + " " + std::to_string(k.id));
    k.grad.resize(k.decl.elements);
    k.params.resize(k.decl.elements);
  }
  for (auto& k : keys) {
    if (k.decl.init != Init::kFromClient) continue;
    Error r;
    // One worker initializes: rank 0 (of rack 0 when the tenant spans racks).
    if (options.rank == 0 && options.rack == 0) {
      std::vector<float> values(k.decl.elements);
      for (uint64_t i = 0; i < values.size(); ++i) values[i] = InitialValue(i);
      r = client->Wait(client->Init(k.id, values));
    }
    if (r.ok()) r = client->Wait(client->Pull(k.id, k.params));
    if (!r.ok()) {
      out.Line("init_error " + k.decl.name + " " + std::to_string(static_cast<int>(r.code)) + " " +
               r.message);
      return 3;
    }
    out.Floats("init " + k.decl.name, k.params);
  }
  if (options.rank == 0) {
    for (const auto& f : w.set_optimizers) {
      const auto id = client->FindKey(f.at(0));
      if (!id) throw UsageError("--set-optimizer: unknown key " + f[0]);
      const Error r =
          client->Wait(client->SetOptimizer(*id, ParseOptimizer(f, 2), std::stoull(f.at(1))));
      if (!r.ok()) {
        out.Line("set_optimizer_error " + std::to_string(static_cast<int>(r.code)) + " " +
                 r.message);
        return 3;
      }
      out.Line("set_optimizer " + f[0]);
    }
  }

  std::mt19937 rng(1234 + options.rank);
  for (uint64_t it = 0; it < w.iterations; ++it) {
    if (w.hang_at >= 0 && it == static_cast<uint64_t>(w.hang_at)) {
      out.Line("hanging " + std::to_string(it));
      if (!hooks.hang) {
        while (true) pause();
      }
      hooks.hang();
      return kKilledExitCode;
    }
    if (w.sleep_max_ms > 0) {
      std::this_thread::sleep_for(
          std::chrono::microseconds(rng() % (static_cast<unsigned>(w.sleep_max_ms) * 1000 + 1)));
    }
    const auto start = std::chrono::steady_clock::now();
    std::vector<Ticket> tickets;
    for (auto& k : keys) {
      for (uint64_t i = 0; i < k.grad.size(); ++i) k.grad[i] = Gradient(options.rank, it, i);
      tickets.push_back(client->PushPull(k.id, k.grad, k.params));
    }
    for (size_t j = 0; j < keys.size(); ++j) {
      const Error r = client->Wait(tickets[j]);
      if (!r.ok()) {
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::steady_clock::now() - start)
                            .count();
        out.Line("error " + std::to_string(it) + " " + std::to_string(static_cast<int>(r.code)) +
                 " " + std::to_string(static_cast<uint32_t>(r.wire)) + " " + std::to_string(ms) +
                 " " + r.message);
        return 4;
      }
    }
    if (w.dump_all || it + 1 == w.iterations) {
      for (const auto& k : keys) {
        out.Floats("iter " + std::to_string(it) + " " + k.decl.name, k.params);
      }
    }
  }
  client->Close();
  out.Line("done");
  return 0;
}

}  // namespace

int RunWorker(const std::vector<std::string>& args, const WorkerHooks& hooks) {
  try {
    WorkerArgs w = Parse(args);
    return w.help ? 0 : Run(w, hooks);
  } catch (const std::exception& e) {  // UsageError, or a number that does not parse
    std::fprintf(stderr, "rackhub-test-worker: %s\n", e.what());
    return 64;
  }
}

}  // namespace rackhub::testing
