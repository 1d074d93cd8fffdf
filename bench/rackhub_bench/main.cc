// rackhub-bench coordinator: hub, tenant, worker processes, report.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "bench.h"
#include "rackhub/admin/v1/admin.grpc.pb.h"

extern char** environ;

namespace rackhub::bench {
namespace {

namespace pb = rackhub::admin::v1;
namespace agg = rackhub::aggregation;

const char* kUsage = R"(usage: rackhub-bench [options]

Runs I iterations of synchronous push_pull of an M-byte model split into K keys
across W worker processes through a rackhub hub, verifies every iteration's
parameters bit for bit against a local reference, and reports the median
iteration time.

options:
  --workers W            worker processes                      [2]
  --bytes SIZE           model size in fp32 bytes (e.g. 64MiB)  [64MiB]
  --keys K               keys the model is split into           [4]
  --iterations I         timed iterations                       [20]
  --warmup N             untimed (still verified) iterations    [2]
  --dtype fp32|fp16|bf16 wire dtype                             [fp32]
  --optimizer NAME       sgd|momentum|nesterov|adam|adamw|adagrad|sum-only [sgd]
  --lr X                 learning rate                          [0.01]
  --no-verify            skip the reference computation
  --hub HOST:PORT        use a running hub's data plane (with --admin)
  --admin HOST:PORT      its admin API
  --admin-token-file F   admin token for --admin
  --lanes N              lanes of the hub started locally (0 = cores) [0]
  --transport T          tcp|rdma|auto data-plane transport of the workers [tcp]
  --rdma-hub HOST:PORT   the hub's RDMA (rdma_cm) address; a hub started here
                         listens there (HOST: an IP of the RDMA interface)
  --chunk-bytes SIZE     the tenant's chunk size (hub default: 32KiB)
  --racks R              racks of --workers workers each           [1]
  --topology MODE        hierarchical (one hub per rack, hubs exchange rack
                         sums) or flat (one hub for every rack)  [hierarchical]
  --rack-addrs A0,A1,..  hub of rack r (flat: the one hub, rack 0) listens on
                         IP Ar (data, admin, inter-hub) instead of 127.0.0.1,
                         with a generated admin token and hub secret
  --hub-netns-prefix P   run the hub of rack r in network namespace P<r>
  --worker-netns-prefix P  run the workers of rack r in network namespace P<r>
  --netns-prefix P       both (see bench/multirack_netns.sh; needs root)
  --json                 print one JSON object instead of a table
  -h, --help

comparison with torch.distributed (gloo) all_reduce of the same model:
  --compare gloo         interleave R rounds of [rackhub run, gloo run], both with
                         W processes, I iterations, the same size and dtype; print
                         the medians of the per-round medians and rackhub/gloo
  --rounds R             rounds                                 [5]
  --gloo-script PATH     the gloo benchmark [<source dir>/bench/gloo_allreduce.py]
  --python PATH          interpreter with torch                 [/usr/bin/python3]
  exit code 3: the comparison could not run gloo (torch missing, ...): the
  rackhub numbers are still printed, with the reason
)";

[[noreturn]] void Usage(const std::string& error) {
  std::fprintf(stderr, "rackhub-bench: %s\n(see rackhub-bench --help)\n", error.c_str());
  std::exit(2);
}

uint64_t ParseSizeArg(const std::string& flag, const std::string& text) {
  size_t pos = 0;
  uint64_t n = 0;
  try {
    n = std::stoull(text, &pos);
  } catch (...) {
    Usage(flag + ": '" + text + "' is not a size");
  }
  const std::string unit = text.substr(pos);
  static const std::map<std::string, int> shifts = {{"", 0},   {"B", 0},    {"K", 10},
                                                    {"KiB", 10}, {"M", 20}, {"MiB", 20},
                                                    {"G", 30}, {"GiB", 30}};
  const auto it = shifts.find(unit);
  if (it == shifts.end()) Usage(flag + ": unknown unit '" + unit + "'");
  return n << it->second;
}

uint32_t ParseUint(const std::string& flag, const std::string& text) {
  try {
    size_t pos = 0;
    const unsigned long v = std::stoul(text, &pos);
    if (pos == text.size() && v <= UINT32_MAX) return static_cast<uint32_t>(v);
  } catch (...) {
  }
  Usage(flag + ": '" + text + "' is not a non-negative integer");
}

WireType ParseDType(const std::string& text) {
  if (text == "fp32") return WireType::kFp32;
  if (text == "fp16") return WireType::kFp16;
  if (text == "bf16") return WireType::kBf16;
  Usage("--dtype: '" + text + "' is not fp32, fp16 or bf16");
}

}  // namespace

namespace {

// A free loopback port (bound, then released) for a hub's fixed inter-hub
// address; the hubs of a multi-rack run must know each other's in advance.
uint16_t FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sa;
  bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  close(fd);
  return ntohs(sa.sin_port);
}

// Bytes the hub links must carry per iteration (see admin.proto RackLink).
uint64_t AnalyticInterhubBytes(const BenchArgs& a) {
  if (a.racks < 2 || a.topology != "hierarchical") return 0;
  const uint64_t chunk = (a.chunk_bytes ? a.chunk_bytes : 32 * 1024) / 4;  // in elements
  const uint64_t total = a.w.bytes / 4;
  const uint64_t wire = a.w.dtype == WireType::kFp32 ? 4 : 2;
  uint64_t bytes = 0;
  for (uint32_t k = 0; k < a.w.keys; ++k) {
    uint64_t n = total / a.w.keys + (k + 1 == a.w.keys ? total % a.w.keys : 0);
    for (; n > 0; n -= std::min(n, chunk)) {
      const uint64_t e = std::min(n, chunk);
      bytes += (a.racks - 1) * (2 * 40 + e * (4 + wire));
    }
  }
  return bytes;
}

int Coordinate(const BenchArgs& a, const std::string& self) {
  const std::string dir = MakeRunDir();
  RunResult r;
  {
    // One hub per rack (hierarchical), or one hub for every rack (flat).
    std::vector<std::unique_ptr<Hub>> hubs;
    std::vector<const Hub*> view;
    const uint32_t hub_count = a.racks > 1 && a.topology == "hierarchical" ? a.racks : 1;
    std::string racks;
    for (uint32_t i = 0; i < a.racks && a.racks > 1; ++i) {
      const std::string host = a.rack_addrs.empty() ? "127.0.0.1" : a.rack_addrs[i];
      racks += (i ? "," : "") + host + ":0=" + host + ":" + std::to_string(FreePort());
    }
    bool ok = true;
    // Hubs exchanging beyond loopback share a secret.
    const std::string secret_file = dir + "/hub.secret";
    if (a.racks > 1 && !a.rack_addrs.empty()) std::ofstream(secret_file) << RandomHex() << "\n";
    for (uint32_t i = 0; i < hub_count && ok; ++i) {
      std::vector<std::string> extra;
      if (a.racks > 1) {
        extra = {"--racks", racks, "--rack", std::to_string(i), "--topology-mode", a.topology};
        if (!a.rack_addrs.empty()) extra.insert(extra.end(), {"--hub-secret-file", secret_file});
      }
      const std::string hub_dir = dir + "/hub" + std::to_string(i);
      std::filesystem::create_directories(hub_dir);
      hubs.push_back(std::make_unique<Hub>());
      if (!a.rack_addrs.empty()) hubs.back()->listen_host = a.rack_addrs[i];
      if (!a.hub_netns_prefix.empty()) hubs.back()->netns = a.hub_netns_prefix + std::to_string(i);
      ok = hubs.back()->Open(a, hub_dir, extra);
      view.push_back(hubs.back().get());
    }
    if (ok) r = RunPushPull(a, self, view, dir, "bench-" + std::to_string(getpid()));
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (!r.ok) return 1;
  const std::vector<double>& iteration_ms = r.iteration_ms;
  const bool verified = r.verified;
  const double median = Percentile(iteration_ms, 0.5);
  const double gbps = static_cast<double>(a.w.bytes) / (median * 1e-3) / 1e9;
  const char* dtype_name = DTypeName(a.w.dtype);
  if (a.json) {
    std::printf(
        "{\"workers\":%u,\"bytes\":%llu,\"keys\":%u,\"iterations\":%u,\"dtype\":\"%s\","
        "\"optimizer\":\"%s\",\"median_ms\":%.3f,\"p10_ms\":%.3f,\"p90_ms\":%.3f,"
        "\"gbps_per_worker\":%.3f,\"verified\":%s,\"racks\":%u,\"topology\":\"%s\","
        "\"digest\":\"%s\",\"interhub_bytes_per_iteration\":%.1f,"
        "\"interhub_bytes_analytic\":%llu}\n",
        a.w.workers, static_cast<unsigned long long>(a.w.bytes), a.w.keys, a.w.iterations,
        dtype_name, a.optimizer.c_str(), median, Percentile(iteration_ms, 0.1),
        Percentile(iteration_ms, 0.9), gbps, verified ? "true" : "false", a.racks,
        a.topology.c_str(), r.digest.c_str(),
        static_cast<double>(r.interhub_chunk_bytes) / (a.w.iterations + a.w.warmup),
        static_cast<unsigned long long>(AnalyticInterhubBytes(a)));
  } else {
    std::printf("rackhub-bench: %u workers, %.1f MiB in %u keys, %s on the wire, %s\n",
                a.w.workers, static_cast<double>(a.w.bytes) / (1 << 20), a.w.keys, dtype_name,
                a.optimizer.c_str());
    std::printf("  iterations        %u (+%u warm-up)\n", a.w.iterations, a.w.warmup);
    std::printf("  median iteration  %.3f ms   (p10 %.3f, p90 %.3f)\n", median,
                Percentile(iteration_ms, 0.1), Percentile(iteration_ms, 0.9));
    std::printf("  per worker        %.3f GB/s of model (push %.1f MiB + pull %.1f MiB each)\n",
                gbps, static_cast<double>(a.w.bytes) / (1 << 20),
                static_cast<double>(a.w.bytes) / (1 << 20));
    if (a.racks > 1) {
      std::printf("  racks             %u x %u workers, %s\n", a.racks, a.w.workers,
                  a.topology.c_str());
      std::printf("  hub links         %.0f bytes per iteration (analytic %llu)\n",
                  static_cast<double>(r.interhub_chunk_bytes) / (a.w.iterations + a.w.warmup),
                  static_cast<unsigned long long>(AnalyticInterhubBytes(a)));
    }
    std::printf("  parameters digest %s\n", r.digest.c_str());
    std::printf("  verified: %s\n", verified ? "true" : (a.w.verify ? "false" : "skipped"));
  }
  return verified || !a.w.verify ? 0 : 1;
}

}  // namespace
}  // namespace rackhub::bench

int main(int argc, char** argv) {
  using namespace rackhub::bench;
  BenchArgs a;
  bool worker = false;
  std::string opt_text;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Usage(f + ": missing value");
      return argv[++i];
    };
    if (f == "-h" || f == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (f == "--workers") {
      a.w.workers = ParseUint(f, value());
    } else if (f == "--bytes") {
      a.w.bytes = ParseSizeArg(f, value());
    } else if (f == "--keys") {
      a.w.keys = ParseUint(f, value());
    } else if (f == "--iterations") {
      a.w.iterations = ParseUint(f, value());
    } else if (f == "--warmup") {
      a.w.warmup = ParseUint(f, value());
    } else if (f == "--dtype") {
      const std::string d = value();
      a.w.dtype = std::isdigit(static_cast<unsigned char>(d[0]))
                      ? static_cast<WireType>(ParseUint(f, d))
                      : ParseDType(d);
    } else if (f == "--optimizer") {
      a.optimizer = value();
      ParseOptimizer(a.optimizer);
    } else if (f == "--lr") {
      a.lr = std::atof(value().c_str());
    } else if (f == "--no-verify") {
      a.w.verify = false;
    } else if (f == "--verify") {
      a.w.verify = true;
    } else if (f == "--hub") {
      a.w.hub = value();
    } else if (f == "--admin") {
      a.admin = value();
    } else if (f == "--admin-token-file") {
      a.admin_token_file = value();
    } else if (f == "--transport") {
      a.w.transport = value();
      if (a.w.transport != "tcp" && a.w.transport != "rdma" && a.w.transport != "auto") {
        Usage("--transport: '" + a.w.transport + "' is not tcp, rdma or auto");
      }
    } else if (f == "--rdma-hub") {
      a.w.rdma_hub = value();
    } else if (f == "--lanes") {
      a.lanes = ParseUint(f, value());
    } else if (f == "--json") {
      a.json = true;
    } else if (f == "--compare") {
      a.compare = value();
      if (a.compare != "gloo") Usage("--compare: '" + a.compare + "' is not gloo");
    } else if (f == "--rounds") {
      a.rounds = ParseUint(f, value());
      if (a.rounds == 0) Usage("--rounds must be >= 1");
    } else if (f == "--gloo-script") {
      a.gloo_script = value();
    } else if (f == "--python") {
      a.python = value();
    } else if (f == "--chunk-bytes") {
      a.chunk_bytes = static_cast<uint32_t>(ParseSizeArg(f, value()));
    } else if (f == "--racks") {
      a.racks = ParseUint(f, value());
      a.w.racks = a.racks;
    } else if (f == "--rack") {  // internal: worker mode
      a.w.rack = ParseUint(f, value());
    } else if (f == "--rack-addrs") {
      std::istringstream in(value());
      a.rack_addrs.clear();
      for (std::string addr; std::getline(in, addr, ',');) a.rack_addrs.push_back(addr);
    } else if (f == "--hub-netns-prefix") {
      a.hub_netns_prefix = value();
    } else if (f == "--worker-netns-prefix") {
      a.worker_netns_prefix = value();
    } else if (f == "--netns-prefix") {
      a.hub_netns_prefix = a.worker_netns_prefix = value();
    } else if (f == "--topology") {
      a.topology = value();
      if (a.topology != "hierarchical" && a.topology != "flat") {
        Usage("--topology: '" + a.topology + "' is not hierarchical or flat");
      }
    } else if (f == "--worker-rank") {  // internal: worker mode
      worker = true;
      a.w.rank = ParseUint(f, value());
    } else if (f == "--tenant") {
      a.w.tenant = value();
    } else if (f == "--token-file") {
      a.w.token_file = value();
    } else if (f == "--opt") {
      opt_text = value();
    } else if (f == "--barrier-dir") {  // internal: worker mode
      a.w.barrier_dir = value();
    } else if (f == "--result") {
      a.w.result_file = value();
    } else {
      Usage(f + ": unknown option");
    }
  }
  if (a.w.workers == 0 || a.w.keys == 0 || a.w.iterations == 0) {
    Usage("--workers, --keys and --iterations must be >= 1");
  }
  if (a.w.bytes < 4ull * a.w.keys) Usage("--bytes: too small for that many keys");
  if (worker) {
    if (!DecodeOptimizer(opt_text, &a.w.optimizer)) Usage("--opt: malformed");
    return RunWorker(a.w);
  }
  if (!a.w.hub.empty() && a.admin.empty()) Usage("--hub needs --admin (to create the tenant)");
  if (!a.rack_addrs.empty() && a.rack_addrs.size() != std::max<uint32_t>(a.racks, 1)) {
    Usage("--rack-addrs: needs one address per rack (--racks)");
  }
  if (!a.rack_addrs.empty() && !a.compare.empty()) Usage("--rack-addrs: not with --compare");
  if (a.w.transport == "rdma" && a.w.rdma_hub.empty()) {
    Usage("--transport rdma needs --rdma-hub HOST:PORT (an IP of the RDMA interface)");
  }
  const std::string self = argv[0][0] == '/' ? argv[0] : SelfDir() + "/rackhub-bench";
  if (!a.compare.empty()) return Compare(a, self);
  return Coordinate(a, self);
}
