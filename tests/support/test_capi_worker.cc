// RunCApiWorker (test_worker.h): the C ABI worker. Uses rackhub_c.h only.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "rackhub/client/rackhub_c.h"
#include "test_worker.h"

namespace rackhub::testing {
namespace {

// Keep in sync with client_test.cc.
float Gradient(uint32_t rank, uint64_t iteration, uint64_t index) {
  const int64_t k = static_cast<int64_t>((index * 7 + rank * 13 + iteration * 5) % 101) - 50;
  return static_cast<float>(k) / 64.0f + 0.001f * static_cast<float>(index % 7) +
         0.01f * static_cast<float>(rank);
}

class Output {
 public:
  explicit Output(std::FILE* f) : f_(f) {}
  ~Output() { std::fclose(f_); }
  Output(const Output&) = delete;
  Output& operator=(const Output&) = delete;
  void Line(const char* name, int status, const char* detail) {
    std::fprintf(f_, "%s %d %s\n", name, status, detail ? detail : "");
    std::fflush(f_);
  }
  void Floats(const char* name, const float* v, size_t n) {
    std::fprintf(f_, "params %s", name);
    for (size_t i = 0; i < n; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &v[i], 4);
      std::fprintf(f_, " %08x", bits);
    }
    std::fprintf(f_, "\n");
    std::fflush(f_);
  }

 private:
  std::FILE* f_;
};

}  // namespace

int RunCApiWorker(const std::vector<std::string>& args) {
  const char *hub = nullptr, *tenant = nullptr, *token = nullptr, *out_path = nullptr;
  for (size_t i = 0; i + 1 < args.size(); i += 2) {
    const std::string& a = args[i];
    if (a == "--hub")
      hub = args[i + 1].c_str();
    else if (a == "--tenant")
      tenant = args[i + 1].c_str();
    else if (a == "--token")
      token = args[i + 1].c_str();
    else if (a == "--out")
      out_path = args[i + 1].c_str();
  }
  if (!hub || !tenant || !token || !out_path) {
    std::fprintf(stderr, "usage: --hub H --tenant T --token X --out FILE\n");
    return 64;
  }
  std::FILE* file = std::fopen(out_path, "w");
  if (!file) return 65;
  Output out(file);
  char err[512];
  rackhub_options o{};
  o.hub = hub;
  o.tenant = tenant;
  o.token = "wrong-token";
  rackhub_client* c = nullptr;
  out.Line("connect_wrong_token", rackhub_connect(&o, &c, err, sizeof err), err);
  o.token = token;
  int st = rackhub_connect(&o, &c, err, sizeof err);
  out.Line("connect", st, err);
  if (st != RACKHUB_OK) return 2;

  constexpr uint64_t kN = 300;
  rackhub_optimizer sgd{};
  sgd.type = "sgd";
  sgd.learning_rate = 0.5;
  uint32_t key = 0, found = 0;
  out.Line("declare",
           rackhub_declare_key(c, "capi/a", kN, RACKHUB_FP32, &sgd, RACKHUB_INIT_ZEROS, &key),
           rackhub_last_error(c));
  st = rackhub_find_key(c, "capi/a", &found);
  out.Line("find", st, found == key ? "same" : "different");
  out.Line("find_missing", rackhub_find_key(c, "capi/none", &found), rackhub_last_error(c));

  std::vector<float> grad(kN), params(kN);
  for (uint64_t i = 0; i < kN; ++i) grad[i] = Gradient(0, 0, i);
  out.Line("push_pull", rackhub_push_pull(c, key, grad.data(), params.data(), kN),
           rackhub_last_error(c));
  out.Floats("iter0", params.data(), kN);
  for (uint64_t i = 0; i < kN; ++i) grad[i] = Gradient(0, 1, i);
  uint64_t ticket = 0;
  st = rackhub_push_pull_async(c, key, grad.data(), params.data(), kN, &ticket);
  out.Line("push_pull_async", st, "");
  out.Line("wait", rackhub_wait(c, ticket), rackhub_last_error(c));
  out.Floats("iter1", params.data(), kN);
  out.Line("wait_again", rackhub_wait(c, ticket), rackhub_last_error(c));
  out.Line("push_pull_bad_size", rackhub_push_pull(c, key, grad.data(), params.data(), kN - 1),
           rackhub_last_error(c));
  rackhub_optimizer slower{};
  slower.type = "sgd";
  slower.learning_rate = 0.25;
  out.Line("set_optimizer", rackhub_set_optimizer(c, key, &slower, 2), rackhub_last_error(c));
  for (uint64_t i = 0; i < kN; ++i) grad[i] = Gradient(0, 2, i);
  out.Line("push_pull2", rackhub_push_pull(c, key, grad.data(), params.data(), kN),
           rackhub_last_error(c));
  out.Floats("iter2", params.data(), kN);
  std::vector<float> pulled(kN);
  out.Line("pull", rackhub_pull(c, key, pulled.data(), kN), rackhub_last_error(c));
  out.Floats("pulled", pulled.data(), kN);
  out.Line("lanes", static_cast<int>(rackhub_lanes(c)), "");
  rackhub_close(c);
  out.Line("done", 0, "");
  return 0;
}

}  // namespace rackhub::testing
