// rackhub-train-demo: one worker of a synchronous data-parallel training job
// whose parameters live on a rackhub hub (docs/architecture.md).
//
// The model is a small MLP written out by hand (no libraries):
//   32 inputs -> 128 (ReLU) -> 128 (ReLU) -> 8 classes, softmax cross-entropy.
// The data is synthetic and learnable: 8 classes, each a mixture of 8 Gaussian
// clusters in 32 dimensions, generated from --seed (identical on every rank);
// 16384 training samples and a held-out set of 2048. Sample i of the training
// set belongs to rank i % W.
//
// Rank 0 declares one key per parameter tensor (Init::kFromClient, server-side
// optimizer, mean reduction) and Init()s it with its random initial weights;
// the other ranks declare the same keys and Pull() those values. Every step
// each rank runs forward/backward on its minibatch, issues PushPull for every
// key's gradient, then waits for all of them: what comes back is the updated
// model (the hub ran the optimizer). Rank 0 prints one line per epoch.
//
// Usage: rackhub-train-demo --hub HOST:PORT --tenant NAME --token-file FILE
//          --rank R --workers W [--epochs 8] [--batch 64] [--seed 1]
//          [--optimizer momentum|adam|sgd] [--lr X]
// (rackhub-train-demo --help describes each option; usage errors exit 2.)
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "rackhub/client/client.h"
#include "rackhub/common/number.h"

namespace {

namespace rc = rackhub::client;
using Clock = std::chrono::steady_clock;

constexpr int kInputs = 32;
constexpr int kHidden = 128;
constexpr int kClasses = 8;
constexpr int kClustersPerClass = 8;
constexpr int kTrainSamples = 16384;
constexpr int kTestSamples = 2048;
constexpr float kClusterSpread = 1.4f;  // noise stddev around a cluster centre

// ---- Command line --------------------------------------------------------

struct Flags {
  std::string hub, tenant, token_file, optimizer = "momentum";
  uint32_t rank = 0, workers = 0;
  int epochs = 8, batch = 64;
  uint64_t seed = 1;
  double lr = 0;  // 0: the optimizer's default below
};

[[noreturn]] void Usage(const std::string& why) {
  std::fprintf(stderr, "rackhub-train-demo: %s (see rackhub-train-demo --help)\n", why.c_str());
  std::exit(2);
}

// CLI11 validator: an unsigned integer (rackhub/common/number.h) up to `max`.
CLI::Validator UnsignedUpTo(uint64_t max) {
  return CLI::Validator(
      [max](std::string& text) {
        const rackhub::Result<uint64_t> v = rackhub::ParseUnsigned(text, max);
        return v.ok() ? std::string() : v.status().message();
      },
      "");
}

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  CLI::App app("rackhub-train-demo: one worker of a synchronous data-parallel MLP training job "
               "on a rackhub hub",
               "rackhub-train-demo");
  app.get_formatter()->column_width(28);
  app.add_option("--hub", f.hub, "the hub's data plane")->type_name("HOST:PORT")->required();
  app.add_option("--tenant", f.tenant, "tenant name")->type_name("NAME")->required();
  app.add_option("--token-file", f.token_file, "file holding the tenant's data-plane token")
      ->type_name("FILE")
      ->required();
  // A whole-number option, at most what its variable holds.
  const auto whole = [&app](const char* name, auto& value, const char* type, const char* what) {
    using T = std::remove_reference_t<decltype(value)>;
    return app.add_option(name, value, what)
        ->type_name(type)
        ->check(UnsignedUpTo(std::numeric_limits<T>::max()));
  };
  whole("--rank", f.rank, "R", "this worker's rank, below --workers")->required();
  whole("--workers", f.workers, "W", "workers of the tenant (per rack)")->required();
  whole("--epochs", f.epochs, "N", "passes over the training set")->capture_default_str();
  whole("--batch", f.batch, "N", "minibatch per worker")->capture_default_str();
  whole("--seed", f.seed, "N", "data and initial weights (the same on every rank)")
      ->capture_default_str();
  app.add_option("--optimizer", f.optimizer, "the keys' optimizer on the hub")
      ->type_name("momentum|adam|sgd")
      ->check(CLI::Validator(
          [](std::string& text) {
            if (text == "momentum" || text == "adam" || text == "sgd") return std::string();
            return "'" + text + "' is not momentum, adam or sgd";
          },
          ""))
      ->capture_default_str();
  app.add_option("--lr", f.lr, "learning rate (default: momentum 0.05, adam 1e-3, sgd 0.2)")
      ->type_name("X")
      ->check(CLI::Validator(
          [](std::string& text) {
            const rackhub::Result<double> v = rackhub::ParseDecimal(text);
            if (!v.ok()) return v.status().message();
            return *v < 0 ? "'" + text + "' is negative" : std::string();
          },
          ""));
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    std::exit(0);
  } catch (const CLI::ParseError& e) {
    std::string message = e.what();
    std::replace(message.begin(), message.end(), '\n', ' ');
    Usage(message);
  }
  if (f.workers == 0) Usage("--workers: must be >= 1");
  if (f.rank >= f.workers) Usage("--rank: must be below --workers");
  if (f.epochs < 1 || f.batch < 1) Usage("--epochs and --batch must be positive");
  if (static_cast<uint64_t>(f.batch) * f.workers > kTrainSamples)
    Usage("--batch times --workers exceeds the training set");
  return f;
}

// ---- Deterministic random numbers (same on every rank and build) -----------

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {  // splitmix64
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }  // [0, 1)
  float Normal() {  // Box-Muller
    const double u1 = 1.0 - Uniform(), u2 = Uniform();
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  uint64_t Below(uint64_t n) { return Next() % n; }

 private:
  uint64_t state_;
};

// ---- Data ------------------------------------------------------------------

struct Dataset {
  std::vector<float> x;    // samples x kInputs
  std::vector<int> label;  // samples
  int size() const { return static_cast<int>(label.size()); }
  const float* row(int i) const { return &x[static_cast<size_t>(i) * kInputs]; }
};

// Gaussian clusters; the centres come from `seed`, the samples from `stream`.
Dataset MakeDataset(uint64_t seed, uint64_t stream, int samples) {
  Rng centre_rng(seed * 1000003 + 17);
  std::vector<float> centres(kClasses * kClustersPerClass * kInputs);
  for (float& c : centres) c = centre_rng.Normal();
  Rng rng(seed * 1000003 + stream);
  Dataset d;
  d.x.resize(static_cast<size_t>(samples) * kInputs);
  d.label.resize(samples);
  for (int i = 0; i < samples; ++i) {
    const int cluster = static_cast<int>(rng.Below(kClasses * kClustersPerClass));
    d.label[i] = cluster % kClasses;
    for (int j = 0; j < kInputs; ++j)
      d.x[static_cast<size_t>(i) * kInputs + j] =
          centres[cluster * kInputs + j] + kClusterSpread * rng.Normal();
  }
  return d;
}

// ---- The model ---------------------------------------------------------------

// A fully connected layer: y = W x + b, W is out x in (row-major).
struct Layer {
  int in = 0, out = 0;
  std::string name;
  std::vector<float> w, b, dw, db;  // w/b are also the PushPull `out` buffers
  rc::KeyId w_key = 0, b_key = 0;

  Layer(std::string n, int fan_in, int fan_out)
      : in(fan_in), out(fan_out), name(std::move(n)), w(fan_in * fan_out), b(fan_out),
        dw(w.size()), db(b.size()) {}

  // y[B x out] = x[B x in] W^T + b
  void Forward(const std::vector<float>& x, int batch, std::vector<float>& y) const {
    y.assign(static_cast<size_t>(batch) * out, 0.0f);
    for (int s = 0; s < batch; ++s) {
      const float* xs = &x[static_cast<size_t>(s) * in];
      float* ys = &y[static_cast<size_t>(s) * out];
      for (int o = 0; o < out; ++o) {
        const float* wo = &w[static_cast<size_t>(o) * in];
        float acc = b[o];
        for (int i = 0; i < in; ++i) acc += wo[i] * xs[i];
        ys[o] = acc;
      }
    }
  }

  // Given dy (dLoss/dy, already divided by the batch size): dw, db, and dx if wanted.
  void Backward(const std::vector<float>& x, const std::vector<float>& dy, int batch,
                std::vector<float>* dx) {
    std::fill(dw.begin(), dw.end(), 0.0f);
    std::fill(db.begin(), db.end(), 0.0f);
    if (dx) dx->assign(static_cast<size_t>(batch) * in, 0.0f);
    for (int s = 0; s < batch; ++s) {
      const float* xs = &x[static_cast<size_t>(s) * in];
      const float* dys = &dy[static_cast<size_t>(s) * out];
      for (int o = 0; o < out; ++o) {
        const float g = dys[o];
        if (g == 0.0f) continue;
        db[o] += g;
        float* dwo = &dw[static_cast<size_t>(o) * in];
        for (int i = 0; i < in; ++i) dwo[i] += g * xs[i];
        if (dx) {
          const float* wo = &w[static_cast<size_t>(o) * in];
          float* dxs = &(*dx)[static_cast<size_t>(s) * in];
          for (int i = 0; i < in; ++i) dxs[i] += g * wo[i];
        }
      }
    }
  }
};

struct Mlp {
  std::array<Layer, 3> layers{Layer("fc1", kInputs, kHidden), Layer("fc2", kHidden, kHidden),
                              Layer("fc3", kHidden, kClasses)};
  // Activations of the last Forward: a[0] input, a[1], a[2] after ReLU, a[3] logits.
  std::array<std::vector<float>, 4> a;
  std::vector<float> grad_a, grad_prev;

  void RandomInit(uint64_t seed) {  // He initialization, zero biases
    Rng rng(seed * 7919 + 3);
    for (Layer& l : layers) {
      const float scale = std::sqrt(2.0f / static_cast<float>(l.in));
      for (float& v : l.w) v = scale * rng.Normal();
      std::fill(l.b.begin(), l.b.end(), 0.0f);
    }
  }

  const std::vector<float>& Forward(const Dataset& d, std::span<const int> rows) {
    const int batch = static_cast<int>(rows.size());
    a[0].resize(static_cast<size_t>(batch) * kInputs);
    for (int s = 0; s < batch; ++s)
      std::copy_n(d.row(rows[s]), kInputs, &a[0][static_cast<size_t>(s) * kInputs]);
    for (size_t l = 0; l < layers.size(); ++l) {
      layers[l].Forward(a[l], batch, a[l + 1]);
      if (l + 1 < layers.size())
        for (float& v : a[l + 1]) v = std::max(v, 0.0f);
    }
    return a[3];
  }

  // Softmax cross-entropy on the last Forward; fills every layer's dw/db and
  // returns the summed loss of the batch.
  double Backward(const Dataset& d, std::span<const int> rows) {
    const int batch = static_cast<int>(rows.size());
    double loss = 0;
    grad_a.resize(a[3].size());
    for (int s = 0; s < batch; ++s) {
      const float* z = &a[3][static_cast<size_t>(s) * kClasses];
      float* g = &grad_a[static_cast<size_t>(s) * kClasses];
      const float m = *std::max_element(z, z + kClasses);
      double sum = 0;
      for (int c = 0; c < kClasses; ++c) sum += std::exp(static_cast<double>(z[c] - m));
      const int y = d.label[rows[s]];
      loss += std::log(sum) - (z[y] - m);
      for (int c = 0; c < kClasses; ++c) {
        const double p = std::exp(static_cast<double>(z[c] - m)) / sum;
        g[c] = static_cast<float>((p - (c == y ? 1.0 : 0.0)) / batch);
      }
    }
    for (int l = static_cast<int>(layers.size()) - 1; l >= 0; --l) {
      layers[l].Backward(a[l], grad_a, batch, l > 0 ? &grad_prev : nullptr);
      if (l == 0) break;
      for (size_t i = 0; i < grad_prev.size(); ++i)  // through the ReLU
        if (a[l][i] <= 0.0f) grad_prev[i] = 0.0f;
      std::swap(grad_a, grad_prev);
    }
    return loss;
  }

  double Accuracy(const Dataset& d) {
    std::vector<int> rows(d.size());
    std::iota(rows.begin(), rows.end(), 0);
    int correct = 0;
    const int step = 256;
    for (int start = 0; start < d.size(); start += step) {
      const auto part = std::span(rows).subspan(start, std::min(step, d.size() - start));
      const auto& z = Forward(d, part);
      for (size_t s = 0; s < part.size(); ++s) {
        const float* zs = &z[s * kClasses];
        correct += (std::max_element(zs, zs + kClasses) - zs) == d.label[part[s]];
      }
    }
    return static_cast<double>(correct) / d.size();
  }
};

// ---- Talking to the hub ------------------------------------------------------

std::string g_who = "rackhub-train-demo";

[[noreturn]] void Fail(const std::string& what, const rc::Error& e) {
  std::fprintf(stderr, "%s: %s: %s: %s\n", g_who.c_str(), what.c_str(), rc::ErrorCodeName(e.code),
               e.message.c_str());
  std::exit(1);
}

std::string ReadToken(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "%s: cannot read token file %s\n", g_who.c_str(), path.c_str());
    std::exit(1);
  }
  std::string token;
  in >> token;  // the token, without surrounding whitespace
  if (token.empty()) {
    std::fprintf(stderr, "%s: token file %s is empty\n", g_who.c_str(), path.c_str());
    std::exit(1);
  }
  return token;
}

rc::OptimizerSpec MakeOptimizer(const Flags& f) {
  rc::OptimizerSpec o;
  o.type = f.optimizer;
  o.reduction = "mean";  // mean of the workers' gradients
  if (f.optimizer == "momentum") o.learning_rate = 0.05, o.momentum = 0.9;
  if (f.optimizer == "adam") o.learning_rate = 1e-3;  // betas/epsilon: the hub's defaults
  if (f.optimizer == "sgd") o.learning_rate = 0.2;
  if (f.lr > 0) o.learning_rate = f.lr;
  return o;
}

// Declares every parameter key; rank 0 supplies the initial values, the others
// pull them, so all ranks start from the same model.
void SetUpKeys(rc::Client& client, Mlp& model, const Flags& f) {
  const rc::OptimizerSpec optimizer = MakeOptimizer(f);
  std::vector<std::pair<rc::KeyId, std::vector<float>*>> keys;
  for (Layer& l : model.layers) {
    for (auto [suffix, values, id] : {std::tuple{".weight", &l.w, &l.w_key},
                                      std::tuple{".bias", &l.b, &l.b_key}}) {
      rc::KeyDecl decl{l.name + suffix, values->size(), rc::DType::kFp32, optimizer,
                       rc::Init::kFromClient};
      if (rc::Error e = client.DeclareKey(decl, id); !e.ok()) Fail("declare key " + decl.name, e);
      keys.emplace_back(*id, values);
    }
  }
  std::vector<rc::Ticket> tickets;
  for (auto& [id, values] : keys)
    tickets.push_back(f.rank == 0 ? client.Init(id, *values) : client.Pull(id, *values));
  for (rc::Ticket t : tickets)
    if (rc::Error e = client.Wait(t); !e.ok()) Fail(f.rank == 0 ? "init" : "pull", e);
}

// Sends every layer's gradients and receives the new parameters into w/b:
// all PushPulls are issued first (they pipeline over the lanes), then awaited.
void PushPullAll(rc::Client& client, Mlp& model) {
  std::vector<rc::Ticket> tickets;
  for (Layer& l : model.layers) {
    tickets.push_back(client.PushPull(l.w_key, l.dw, l.w));
    tickets.push_back(client.PushPull(l.b_key, l.db, l.b));
  }
  rc::Error first;
  for (rc::Ticket t : tickets)  // wait for all, even after a failure: they borrow our buffers
    if (rc::Error e = client.Wait(t); !e.ok() && first.ok()) first = e;
  if (!first.ok()) Fail("push_pull", first);
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

int main(int argc, char** argv) {
  const Flags f = ParseFlags(argc, argv);
  g_who = "rackhub-train-demo[rank " + std::to_string(f.rank) + "]";

  rc::Options options;
  options.hub = f.hub;
  options.tenant = f.tenant;
  options.token = ReadToken(f.token_file);
  options.rank = f.rank;
  rc::Error error;
  std::unique_ptr<rc::Client> client = rc::Client::Connect(options, &error);
  if (!client) Fail("connect to " + f.hub, error);
  if (client->workers() != f.workers) {
    std::fprintf(stderr, "%s: --workers %u but tenant '%s' has %u workers per rack\n",
                 g_who.c_str(), f.workers, f.tenant.c_str(), client->workers());
    return 1;
  }

  const Dataset train = MakeDataset(f.seed, 1, kTrainSamples);
  const Dataset test = MakeDataset(f.seed, 2, kTestSamples);
  std::vector<int> shard;  // this rank's samples
  for (int i = static_cast<int>(f.rank); i < kTrainSamples; i += static_cast<int>(f.workers))
    shard.push_back(i);
  // Same number of steps on every rank (synchronous): the smallest shard decides.
  const int steps = kTrainSamples / static_cast<int>(f.workers) / f.batch;

  Mlp model;
  if (f.rank == 0) model.RandomInit(f.seed);
  SetUpKeys(*client, model, f);

  const bool lead = f.rank == 0;
  if (lead) {
    size_t params = 0;
    for (const Layer& l : model.layers) params += l.w.size() + l.b.size();
    std::printf("training a %d-%d-%d-%d MLP (%zu parameters, 6 keys on %u hub lanes), "
                "%u workers x batch %d, %d steps/epoch, optimizer %s lr %g on the hub\n",
                kInputs, kHidden, kHidden, kClasses, params, client->lanes(), f.workers, f.batch,
                steps, f.optimizer.c_str(), MakeOptimizer(f).learning_rate);
    std::printf("held-out accuracy before training: %.1f%%\n", 100.0 * model.Accuracy(test));
    std::printf("%5s  %10s  %9s  %10s  %12s\n", "epoch", "train loss", "held-out", "samples/s",
                "ms/push_pull");
    std::fflush(stdout);
  }

  Rng shuffle_rng(f.seed * 31 + 1000 + f.rank);
  double first_loss = 0, last_loss = 0;
  for (int epoch = 1; epoch <= f.epochs; ++epoch) {
    for (size_t i = shard.size() - 1; i > 0; --i)  // Fisher-Yates
      std::swap(shard[i], shard[shuffle_rng.Below(i + 1)]);
    double loss_sum = 0;
    Clock::duration comm{};
    const auto epoch_start = Clock::now();
    for (int step = 0; step < steps; ++step) {
      const auto rows = std::span(shard).subspan(static_cast<size_t>(step) * f.batch, f.batch);
      model.Forward(train, rows);
      loss_sum += model.Backward(train, rows);
      const auto comm_start = Clock::now();
      PushPullAll(*client, model);
      comm += Clock::now() - comm_start;
    }
    const double elapsed = Seconds(Clock::now() - epoch_start);
    if (!lead) continue;
    const double loss = loss_sum / (static_cast<double>(steps) * f.batch);
    if (epoch == 1) first_loss = loss;
    last_loss = loss;
    std::printf("%5d  %10.4f  %8.1f%%  %10.0f  %12.3f\n", epoch, loss,
                100.0 * model.Accuracy(test),
                static_cast<double>(steps) * f.batch * f.workers / elapsed,
                1e3 * Seconds(comm) / steps);
    std::fflush(stdout);
  }
  if (lead)
    std::printf("training loss (rank 0's shard): epoch 1 %.4f -> epoch %d %.4f\n", first_loss,
                f.epochs, last_loss);
  client->Close();
  return 0;
}
