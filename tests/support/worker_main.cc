// rackhub-test-worker: one training worker for the multi-process client
// tests (tests/integration/client_test.cc). Connects with librackhub,
// declares keys, optionally initializes / pulls them, runs iterations of
// PushPull with deterministic gradients and writes what it saw to --out, one
// line per event, flushed at once:
//   key NAME ID
//   init NAME HEX...            parameters after Init (rank 0) or Pull (others)
//   iter K NAME HEX...          parameters after iteration K (--dump-all: every K)
//   hanging K                   (--hang-at K) the worker stops before pushing K
//   error K CODE WIRE MS MSG    iteration K failed after MS milliseconds
//   done
// HEX is the fp32 bit pattern of each element (8 hex digits).
//
// Usage: rackhub-test-worker --hub H --tenant T --token X --rank R --out FILE
//          --key NAME,ELEMENTS,DTYPE,INIT,OPT... [--key ...] --iterations N
//          [--set-optimizer NAME,FROM,OPT...] [--sleep-max-ms M] [--hang-at K]
//          [--dump-all]
// OPT... = TYPE,LR,MOMENTUM,WD,BETA1,BETA2,EPS,ACC,mean|sum
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#ifdef RACKHUB_WORKER_CAPI
#include "rackhub/client/rackhub_c.h"
#else
#include "rackhub/client/client.h"
#endif

namespace {

// Keep in sync with client_test.cc.
float Gradient(uint32_t rank, uint64_t iteration, uint64_t index) {
  const int64_t k = static_cast<int64_t>((index * 7 + rank * 13 + iteration * 5) % 101) - 50;
  return static_cast<float>(k) / 64.0f + 0.001f * static_cast<float>(index % 7) +
         0.01f * static_cast<float>(rank);
}
[[maybe_unused]] float InitialValue(uint64_t index) {
  return static_cast<float>((static_cast<int64_t>(index % 17) - 8)) * 0.125f +
         0.003f * static_cast<float>(index % 5);
}

}  // namespace

#ifndef RACKHUB_WORKER_CAPI
namespace {

using namespace rackhub::client;

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, sep);) out.push_back(part);
  return out;
}

[[noreturn]] void Usage(const std::string& why) {
  std::fprintf(stderr, "rackhub-test-worker: %s\n", why.c_str());
  std::exit(64);
}

OptimizerSpec ParseOptimizer(const std::vector<std::string>& f, size_t at) {
  if (f.size() < at + 9) Usage("optimizer needs TYPE,LR,MOMENTUM,WD,BETA1,BETA2,EPS,ACC,RED");
  OptimizerSpec o;
  o.type = f[at];
  o.learning_rate = std::stod(f[at + 1]);
  o.momentum = std::stod(f[at + 2]);
  o.weight_decay = std::stod(f[at + 3]);
  o.beta1 = std::stod(f[at + 4]);
  o.beta2 = std::stod(f[at + 5]);
  o.epsilon = std::stod(f[at + 6]);
  o.initial_accumulator = std::stod(f[at + 7]);
  o.sum_reduction = f[at + 8] == "sum";
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
    if (!f_) Usage("cannot open --out " + path);
  }
  ~Output() { std::fclose(f_); }
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

}  // namespace

int main(int argc, char** argv) {
  Options options;
  std::string out_path;
  std::vector<KeyRun> keys;
  std::vector<std::vector<std::string>> set_optimizers;
  uint64_t iterations = 0;
  int sleep_max_ms = 0;
  int64_t hang_at = -1;
  bool dump_all = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) Usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--hub") options.hub = value();
    else if (a == "--tenant") options.tenant = value();
    else if (a == "--token") options.token = value();
    else if (a == "--rank") options.rank = static_cast<uint32_t>(std::stoul(value()));
    else if (a == "--out") out_path = value();
    else if (a == "--iterations") iterations = std::stoull(value());
    else if (a == "--sleep-max-ms") sleep_max_ms = std::stoi(value());
    else if (a == "--hang-at") hang_at = std::stoll(value());
    else if (a == "--dump-all") dump_all = true;
    else if (a == "--set-optimizer") set_optimizers.push_back(Split(value(), ','));
    else if (a == "--key") {
      const auto f = Split(value(), ',');
      if (f.size() < 4) Usage("--key needs NAME,ELEMENTS,DTYPE,INIT[,OPT...]");
      KeyRun k;
      k.decl.name = f[0];
      k.decl.elements = std::stoull(f[1]);
      k.decl.dtype = f[2] == "fp16" ? DType::kFp16 : f[2] == "bf16" ? DType::kBf16 : DType::kFp32;
      k.decl.init = f[3] == "client" ? Init::kFromClient : Init::kZeros;
      if (f.size() > 4) k.decl.optimizer = ParseOptimizer(f, 4);
      keys.push_back(std::move(k));
    } else {
      Usage("unknown argument " + a);
    }
  }
  if (out_path.empty()) Usage("--out is required");
  Output out(out_path);
  options.op_timeout = std::chrono::milliseconds(60000);

  Error e;
  auto client = Client::Connect(options, &e);
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
    if (options.rank == 0) {
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
    for (const auto& f : set_optimizers) {
      const auto id = client->FindKey(f.at(0));
      if (!id) Usage("--set-optimizer: unknown key " + f[0]);
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
  for (uint64_t it = 0; it < iterations; ++it) {
    if (hang_at >= 0 && it == static_cast<uint64_t>(hang_at)) {
      out.Line("hanging " + std::to_string(it));
      while (true) pause();
    }
    if (sleep_max_ms > 0) {
      std::this_thread::sleep_for(
          std::chrono::microseconds(rng() % (static_cast<unsigned>(sleep_max_ms) * 1000 + 1)));
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
    if (dump_all || it + 1 == iterations) {
      for (const auto& k : keys) out.Floats("iter " + std::to_string(it) + " " + k.decl.name, k.params);
    }
  }
  client->Close();
  out.Line("done");
  return 0;
}
#endif  // !RACKHUB_WORKER_CAPI

#ifdef RACKHUB_WORKER_CAPI
// rackhub-test-capi-worker: the same checks through the C ABI only, linked
// against librackhub.so alone. Usage: --hub H --tenant T --token X --out FILE.
// Needs a tenant with 1 worker. Writes `name status [detail]` lines and
// `params NAME HEX...` lines, then `done`.
namespace {

std::FILE* out_file = nullptr;

void Line(const char* name, int status, const char* detail) {
  std::fprintf(out_file, "%s %d %s\n", name, status, detail ? detail : "");
  std::fflush(out_file);
}

void Floats(const char* name, const float* v, size_t n) {
  std::fprintf(out_file, "params %s", name);
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &v[i], 4);
    std::fprintf(out_file, " %08x", bits);
  }
  std::fprintf(out_file, "\n");
  std::fflush(out_file);
}

}  // namespace

int main(int argc, char** argv) {
  const char *hub = nullptr, *tenant = nullptr, *token = nullptr, *out_path = nullptr;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--hub") hub = argv[i + 1];
    else if (a == "--tenant") tenant = argv[i + 1];
    else if (a == "--token") token = argv[i + 1];
    else if (a == "--out") out_path = argv[i + 1];
  }
  if (!hub || !tenant || !token || !out_path) {
    std::fprintf(stderr, "usage: --hub H --tenant T --token X --out FILE\n");
    return 64;
  }
  out_file = std::fopen(out_path, "w");
  if (!out_file) return 65;
  char err[512];
  rackhub_options o{};
  o.hub = hub;
  o.tenant = tenant;
  o.token = "wrong-token";
  rackhub_client* c = nullptr;
  Line("connect_wrong_token", rackhub_connect(&o, &c, err, sizeof err), err);
  o.token = token;
  int st = rackhub_connect(&o, &c, err, sizeof err);
  Line("connect", st, err);
  if (st != RACKHUB_OK) return 2;

  constexpr uint64_t kN = 300;
  rackhub_optimizer sgd{};
  sgd.type = "sgd";
  sgd.learning_rate = 0.5;
  uint32_t key = 0, found = 0;
  Line("declare", rackhub_declare_key(c, "capi/a", kN, RACKHUB_FP32, &sgd, RACKHUB_INIT_ZEROS, &key),
       rackhub_last_error(c));
  st = rackhub_find_key(c, "capi/a", &found);
  Line("find", st, found == key ? "same" : "different");
  Line("find_missing", rackhub_find_key(c, "capi/none", &found), rackhub_last_error(c));

  std::vector<float> grad(kN), params(kN);
  for (uint64_t i = 0; i < kN; ++i) grad[i] = Gradient(0, 0, i);
  Line("push_pull", rackhub_push_pull(c, key, grad.data(), params.data(), kN),
       rackhub_last_error(c));
  Floats("iter0", params.data(), kN);
  for (uint64_t i = 0; i < kN; ++i) grad[i] = Gradient(0, 1, i);
  uint64_t ticket = 0;
  st = rackhub_push_pull_async(c, key, grad.data(), params.data(), kN, &ticket);
  Line("push_pull_async", st, "");
  Line("wait", rackhub_wait(c, ticket), rackhub_last_error(c));
  Floats("iter1", params.data(), kN);
  Line("wait_again", rackhub_wait(c, ticket), rackhub_last_error(c));
  Line("push_pull_bad_size", rackhub_push_pull(c, key, grad.data(), params.data(), kN - 1),
       rackhub_last_error(c));
  rackhub_optimizer slower{};
  slower.type = "sgd";
  slower.learning_rate = 0.25;
  Line("set_optimizer", rackhub_set_optimizer(c, key, &slower, 2), rackhub_last_error(c));
  for (uint64_t i = 0; i < kN; ++i) grad[i] = Gradient(0, 2, i);
  Line("push_pull2", rackhub_push_pull(c, key, grad.data(), params.data(), kN),
       rackhub_last_error(c));
  Floats("iter2", params.data(), kN);
  std::vector<float> pulled(kN);
  Line("pull", rackhub_pull(c, key, pulled.data(), kN), rackhub_last_error(c));
  Floats("pulled", pulled.data(), kN);
  Line("lanes", static_cast<int>(rackhub_lanes(c)), "");
  rackhub_close(c);
  Line("done", 0, "");
  std::fclose(out_file);
  return 0;
}
#endif  // RACKHUB_WORKER_CAPI
