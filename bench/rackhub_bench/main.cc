// rackhub-bench coordinator: command line (CLI11), hub, tenant, worker
// processes, report.
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

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include "bench.h"
#include "rackhub/admin/v1/admin.grpc.pb.h"
#include "rackhub/common/number.h"
#include "rackhub/common/size.h"

extern char** environ;

namespace rackhub::bench {
namespace {

namespace pb = rackhub::admin::v1;
namespace agg = rackhub::aggregation;

const char* kDescription =
    "rackhub-bench: runs I iterations of synchronous push_pull of an M-byte model split into\n"
    "K keys across W worker processes through a rackhub hub, verifies every iteration's\n"
    "parameters bit for bit against a local reference, and reports the median iteration time.";

const char* kFooter = R"(Without --hub a hub is started here (rackhubd beside this binary, ephemeral
loopback ports). SIZE: bytes, e.g. 65536, 64KiB, 64MiB, 1GiB.

Comparison with torch.distributed (gloo) all_reduce of the same model:
  --compare gloo interleaves R rounds of [rackhub run, gloo run], both with W
  processes, I iterations, the same size and dtype, and prints the medians of the
  per-round medians and rackhub/gloo. Exit code 3: the comparison could not run
  gloo (torch missing, ...); the rackhub numbers are still printed, with the reason.

Exit codes: 0 verified (or --no-verify), 1 a run failed or did not verify,
2 usage error, 3 see --compare.)";

[[noreturn]] void Usage(const std::string& error) {
  std::fprintf(stderr, "rackhub-bench: %s\n(see rackhub-bench --help)\n", error.c_str());
  std::exit(2);
}

// CLI11 adapters over the rackhub_common parsers. CLI11 reports a failure as
// "--option: <message>", e.g. "--bytes: '12XB' has an unknown unit 'XB' (...)".
CLI::Validator Unsigned32() {
  return CLI::Validator(
      [](std::string& text) {
        const Result<uint64_t> v = ParseUnsigned(text, UINT32_MAX);
        return v.ok() ? std::string() : v.status().message();
      },
      "");
}

// Rewrites the value to its byte count (use with Option::transform).
CLI::Validator Bytes(uint64_t max) {
  return CLI::Validator(
      [max](std::string& text) {
        const Result<uint64_t> v = ParseSize(text);
        if (!v.ok()) return v.status().message();
        if (*v > max) return fmt::format("'{}' is too large (at most {} bytes)", text, max);
        text = std::to_string(*v);
        return std::string();
      },
      "");
}

CLI::Validator Decimal() {
  return CLI::Validator(
      [](std::string& text) {
        const Result<double> v = ParseDecimal(text);
        return v.ok() ? std::string() : v.status().message();
      },
      "");
}

CLI::Validator OneOf(std::vector<std::string> names) {
  return CLI::Validator(
      [names](std::string& text) {
        if (std::find(names.begin(), names.end(), text) != names.end()) return std::string();
        std::string list;
        for (size_t i = 0; i < names.size(); ++i) {
          list += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
        }
        return fmt::format("'{}' is not {}", text, list);
      },
      "");
}

// fp32|fp16|bf16, or the wire value 1|2|3 (how the coordinator passes it to
// workers).
Result<WireType> ParseDType(std::string_view text) {
  if (text == "fp32" || text == "1") return WireType::kFp32;
  if (text == "fp16" || text == "2") return WireType::kFp16;
  if (text == "bf16" || text == "3") return WireType::kBf16;
  return InvalidArgument(fmt::format("'{}' is not fp32, fp16 or bf16", text));
}

// The command line, parsed and checked; usage errors exit 2 (Usage).
struct CommandLine {
  BenchArgs a;
  bool worker = false;
  std::string opt_text;
};

CommandLine Parse(int argc, char** argv) {
  CommandLine cl;
  BenchArgs& a = cl.a;
  std::string dtype = "fp32", netns_prefix;
  CLI::App app(kDescription, "rackhub-bench");
  app.footer(kFooter);
  app.get_formatter()->column_width(30);
  const auto number = [&](const char* name, uint32_t* v, const char* type, const char* what) {
    return app.add_option(name, *v, what)
        ->type_name(type)
        ->check(Unsigned32())
        ->capture_default_str();
  };
  number("--workers", &a.w.workers, "W", "worker processes (per rack)");
  app.add_option("--bytes", a.w.bytes, "model size in fp32 bytes (e.g. 64MiB)")
      ->type_name("SIZE")
      ->transform(Bytes(UINT64_MAX))
      ->default_str("64MiB");
  number("--keys", &a.w.keys, "K", "keys the model is split into");
  app.add_option("--profile", a.w.profile,
                 "model profile: even = --bytes split evenly over --keys; resnet50 =\n"
                 "ResNet-50's 161 parameter tensors (25.6 M fp32 parameters) as 161 keys\n"
                 "(sets --keys and --bytes)")
      ->type_name("even|resnet50")
      ->check(OneOf({"even", "resnet50"}))
      ->capture_default_str();
  number("--iterations", &a.w.iterations, "I", "timed iterations");
  number("--warmup", &a.w.warmup, "N", "untimed (still verified) iterations first");
  app.add_option("--dtype", dtype, "wire dtype")
      ->type_name("fp32|fp16|bf16")
      ->check(CLI::Validator(
          [](std::string& text) {
            const Result<WireType> t = ParseDType(text);
            return t.ok() ? std::string() : t.status().message();
          },
          ""))
      ->capture_default_str();
  app.add_option("--optimizer", a.optimizer, "hub optimizer")
      ->type_name("NAME")
      ->check(OneOf({"sgd", "momentum", "nesterov", "adam", "adamw", "adagrad", "sum-only"}))
      ->capture_default_str();
  app.add_option("--lr", a.lr, "learning rate")
      ->type_name("X")
      ->check(Decimal())
      ->capture_default_str();
  app.add_option("--hub-arg", a.hub_args,
                 "one more rackhubd option for the hubs started here (repeat; e.g. "
                 "--hub-arg=--intake-lead-bytes=0)")
      ->allow_extra_args(false);
  app.add_flag("--busy-poll", a.w.busy_poll,
               "shared memory: workers and a hub started here poll 50 us before sleeping");
  app.add_flag("--lease", a.w.lease,
               "workers push from leased memory (Client::Lease): zero copy over shared memory");
  app.add_flag("--verify,!--no-verify", a.w.verify,
               "check every iteration against the local reference (--no-verify: skip it)");
  app.add_option("--hub", a.w.hub, "use a running hub's data plane (with --admin)")
      ->type_name("HOST:PORT");
  app.add_option("--admin", a.admin, "its admin API")->type_name("HOST:PORT");
  app.add_option("--admin-token-file", a.admin_token_file, "admin token for --admin")
      ->type_name("FILE");
  number("--lanes", &a.lanes, "N", "lanes of the hub started here (0 = one per core)");
  app.add_option("--transport", a.w.transport, "data-plane transport of the workers")
      ->type_name("auto|shm|tcp|rdma")
      ->check(OneOf({"auto", "shm", "tcp", "rdma"}))
      ->capture_default_str();
  app.add_option("--rdma-hub", a.w.rdma_hub,
                 "the hub's RDMA (rdma_cm) address; a hub started here listens there\n"
                 "(HOST: an IP of the RDMA interface)")
      ->type_name("HOST:PORT");
  app.add_option("--chunk-bytes", a.chunk_bytes, "the tenant's chunk size (hub default: 32KiB)")
      ->type_name("SIZE")
      ->transform(Bytes(UINT32_MAX));
  number("--racks", &a.racks, "R", "racks of --workers workers each");
  app.add_option("--etcd", a.etcd,
                 "the hubs started here keep their registry in etcd at these endpoints and\n"
                 "find each other there; the tenant is created once (docs/cluster.md)")
      ->type_name("H:P,..");
  app.add_option("--topology", a.topology,
                 "hierarchical (one hub per rack, hubs exchange rack sums) or flat (one hub\n"
                 "for every rack)")
      ->type_name("MODE")
      ->check(OneOf({"hierarchical", "flat"}))
      ->capture_default_str();
  app.add_option("--rack-addrs", a.rack_addrs,
                 "hub of rack r (flat: the one hub, rack 0) listens on IP Ar (data, admin,\n"
                 "inter-hub) instead of 127.0.0.1, with a generated admin token and hub secret")
      ->type_name("A0,A1,..")
      ->delimiter(',');
  CLI::Option* hub_netns =
      app.add_option("--hub-netns-prefix", a.hub_netns_prefix,
                     "run the hub of rack r in network namespace P<r>")
          ->type_name("P");
  CLI::Option* worker_netns =
      app.add_option("--worker-netns-prefix", a.worker_netns_prefix,
                     "run the workers of rack r in network namespace P<r>")
          ->type_name("P");
  CLI::Option* both_netns =
      app.add_option("--netns-prefix", netns_prefix,
                     "both (see bench/multirack_netns.sh; needs root)")
          ->type_name("P");
  app.add_option("--netns-per-worker", a.netns_per_worker,
                 "run worker r (and, with --compare gloo, gloo's rank r) in network namespace\n"
                 "P<r> (see bench/rack_netns.sh; needs root)")
      ->type_name("P");
  app.add_flag("--json", a.json, "print one JSON object instead of a table");
  const char* compare = "Comparison with gloo";
  app.add_option("--compare", a.compare, "interleave rounds of rackhub and gloo runs")
      ->type_name("gloo")
      ->check(OneOf({"gloo"}))
      ->group(compare);
  number("--rounds", &a.rounds, "R", "rounds")->group(compare);
  app.add_option("--gloo-script", a.gloo_script,
                 "the gloo benchmark [<source dir>/bench/gloo_allreduce.py]")
      ->type_name("PATH")
      ->group(compare);
  app.add_option("--gloo-master-addr", a.gloo_master_addr,
                 "with --netns-per-worker: gloo's rendezvous address (worker 0's IP)")
      ->type_name("IP")
      ->group(compare);
  app.add_option("--gloo-ifname", a.gloo_ifname,
                 "with --netns-per-worker: gloo's interface in each namespace")
      ->type_name("IF")
      ->group(compare);
  number("--gloo-bucket-mib", &a.gloo_bucket_mib, "MIB",
         "with --profile resnet50: gloo all_reduces the tensors one by one (0) or in\n"
         "buckets of at most MIB MiB, last tensor first, as DDP's bucket_cap_mb")
      ->group(compare);
  app.add_option("--python", a.python, "interpreter with torch")
      ->type_name("PATH")
      ->capture_default_str()
      ->group(compare);
  // Worker mode: how the coordinator starts its workers (not in --help).
  CLI::Option* worker_rank = app.add_option("--worker-rank", a.w.rank)->check(Unsigned32());
  app.add_option("--rack", a.w.rack)->check(Unsigned32());
  app.add_option("--tenant", a.w.tenant);
  app.add_option("--token-file", a.w.token_file);
  app.add_option("--opt", cl.opt_text);
  app.add_option("--barrier-dir", a.w.barrier_dir);
  app.add_option("--result", a.w.result_file);
  for (const char* internal : {"--worker-rank", "--rack", "--tenant", "--token-file", "--opt",
                               "--barrier-dir", "--result"}) {
    app.get_option(internal)->group("");
  }

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
  if (!app.remaining().empty()) Usage("unexpected argument '" + app.remaining().front() + "'");
  a.w.dtype = *ParseDType(dtype);
  a.w.racks = a.racks;
  ApplyProfile(a.w.profile, &a.w);  // checked by OneOf
  if (both_netns->count() > 0) {
    if (hub_netns->count() == 0) a.hub_netns_prefix = netns_prefix;
    if (worker_netns->count() == 0) a.worker_netns_prefix = netns_prefix;
  }
  cl.worker = worker_rank->count() > 0;
  if (!cl.worker && !a.netns_per_worker.empty() &&
      (a.rack_addrs.empty() || a.hub_netns_prefix.empty())) {
    Usage("--netns-per-worker needs --hub-netns-prefix and --rack-addrs (the workers' namespaces "
          "cannot reach a hub on this namespace's loopback)");
  }
  if (!cl.worker && !a.netns_per_worker.empty() && !a.compare.empty() &&
      (a.gloo_master_addr.empty() || a.gloo_ifname.empty())) {
    Usage("--netns-per-worker with --compare gloo needs --gloo-master-addr and --gloo-ifname");
  }
  if (a.rounds == 0) Usage("--rounds: must be >= 1");
  if (a.w.workers == 0 || a.w.keys == 0 || a.w.iterations == 0) {
    Usage("--workers, --keys and --iterations must be >= 1");
  }
  if (a.w.bytes < 4ull * a.w.keys) Usage("--bytes: too small for that many keys");
  return cl;
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
  const uint64_t wire = a.w.dtype == WireType::kFp32 ? 4 : 2;
  uint64_t bytes = 0;
  for (uint64_t n : KeyElements(a.w)) {
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
    // The hubs of a topology share a secret (required with racks > 1, on
    // loopback too).
    const std::string secret_file = dir + "/hub.secret";
    if (a.racks > 1) std::ofstream(secret_file) << RandomHex() << "\n";
    // With etcd, each run gets its own key prefix (runs never see each
    // other's tenants).
    const std::string prefix = "/rackhub-bench-" + RandomHex() + "/";
    for (uint32_t i = 0; i < hub_count && ok; ++i) {
      std::vector<std::string> extra;
      if (!a.etcd.empty()) {
        extra = {"--registry", "etcd", "--etcd-endpoints", a.etcd, "--etcd-prefix", prefix};
      }
      if (a.racks > 1 && !a.etcd.empty() && a.topology == "hierarchical") {
        const std::string host = a.rack_addrs.empty() ? "127.0.0.1" : a.rack_addrs[i];
        extra.insert(extra.end(),
                     {"--racks-from", "etcd", "--rack-count", std::to_string(hub_count), "--rack",
                      std::to_string(i), "--interhub", host + ":" + std::to_string(FreePort()),
                      "--topology-mode", a.topology, "--hub-secret-file", secret_file});
      } else if (a.racks > 1) {
        extra.insert(extra.end(), {"--racks",         racks,      "--rack",           std::to_string(i),
                 "--topology-mode", a.topology, "--hub-secret-file", secret_file});
      }
      const std::string hub_dir = dir + "/hub" + std::to_string(i);
      std::filesystem::create_directories(hub_dir);
      hubs.push_back(std::make_unique<Hub>());
      if (!a.rack_addrs.empty()) hubs.back()->listen_host = a.rack_addrs[i];
      if (!a.hub_netns_prefix.empty()) hubs.back()->netns = a.hub_netns_prefix + std::to_string(i);
      ok = hubs.back()->Open(a, hub_dir, extra, a.etcd.empty());
      view.push_back(hubs.back().get());
    }
    // Hubs that find each other through etcd are ready together.
    for (auto& h : hubs) ok = ok && h->WaitReady();
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
        "\"optimizer\":\"%s\",\"transport\":\"%s\",\"median_ms\":%.3f,\"p10_ms\":%.3f,"
        "\"p50_ms\":%.3f,\"p90_ms\":%.3f,\"p99_ms\":%.3f,\"hub_cpu_s_per_gb\":%.4f,"
        "\"gbps_per_worker\":%.3f,\"verified\":%s,\"racks\":%u,\"topology\":\"%s\","
        "\"digest\":\"%s\",\"interhub_bytes_per_iteration\":%.1f,"
        "\"interhub_bytes_analytic\":%llu}\n",
        a.w.workers, static_cast<unsigned long long>(a.w.bytes), a.w.keys, a.w.iterations,
        dtype_name, a.optimizer.c_str(), r.transport.c_str(), median,
        Percentile(iteration_ms, 0.1), median, Percentile(iteration_ms, 0.9),
        Percentile(iteration_ms, 0.99), r.HubCpuPerGb(), gbps, verified ? "true" : "false", a.racks,
        a.topology.c_str(), r.digest.c_str(),
        static_cast<double>(r.interhub_chunk_bytes) / (a.w.iterations + a.w.warmup),
        static_cast<unsigned long long>(AnalyticInterhubBytes(a)));
  } else {
    std::printf("rackhub-bench: %u workers, %.1f MiB in %u keys, %s on the wire, %s\n",
                a.w.workers, static_cast<double>(a.w.bytes) / (1 << 20), a.w.keys, dtype_name,
                a.optimizer.c_str());
    std::printf("  iterations        %u (+%u warm-up)\n", a.w.iterations, a.w.warmup);
    std::printf("  transport         %s\n", r.transport.c_str());
    std::printf("  median iteration  %.3f ms   (p10 %.3f, p90 %.3f, p99 %.3f)\n", median,
                Percentile(iteration_ms, 0.1), Percentile(iteration_ms, 0.9),
                Percentile(iteration_ms, 0.99));
    if (r.HubCpuPerGb() >= 0) {
      std::printf("  hub CPU           %.3f s per GB of gradient received\n", r.HubCpuPerGb());
    }
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
  CommandLine cl = Parse(argc, argv);
  BenchArgs& a = cl.a;
  if (cl.worker) {
    if (!DecodeOptimizer(cl.opt_text, &a.w.optimizer)) Usage("--opt: malformed");
    return RunWorker(a.w);
  }
  if (!a.w.hub.empty() && a.admin.empty()) Usage("--hub needs --admin (to create the tenant)");
  if (!a.rack_addrs.empty() && a.rack_addrs.size() != std::max<uint32_t>(a.racks, 1)) {
    Usage("--rack-addrs: needs one address per rack (--racks)");
  }
  if (a.racks > 1 && !a.compare.empty()) Usage("--compare: one rack only (--racks 1)");
  if (a.w.transport == "rdma" && a.w.rdma_hub.empty()) {
    Usage("--transport rdma needs --rdma-hub HOST:PORT (an IP of the RDMA interface)");
  }
  const std::string self = argv[0][0] == '/' ? argv[0] : SelfDir() + "/rackhub-bench";
  if (!a.compare.empty()) return Compare(a, self);
  return Coordinate(a, self);
}
