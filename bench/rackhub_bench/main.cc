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

pb::OptimizerType ParseOptimizer(const std::string& text) {
  static const std::map<std::string, pb::OptimizerType> types = {
      {"sgd", pb::SGD},   {"momentum", pb::MOMENTUM}, {"nesterov", pb::NESTEROV},
      {"adam", pb::ADAM}, {"adamw", pb::ADAMW},       {"adagrad", pb::ADAGRAD},
      {"sum-only", pb::SUM_ONLY}};
  const auto it = types.find(text);
  if (it == types.end()) Usage("--optimizer: unknown optimizer '" + text + "'");
  return it->second;
}

std::string SelfDir() {
  return std::filesystem::read_symlink("/proc/self/exe").parent_path().string();
}

// 16 random bytes as hex (generated admin tokens and hub secrets).
std::string RandomHex() {
  unsigned char b[16] = {};
  std::ifstream("/dev/urandom", std::ios::binary).read(reinterpret_cast<char*>(b), sizeof b);
  std::string out;
  char two[3];
  for (unsigned char c : b) {
    std::snprintf(two, sizeof two, "%02x", c);
    out += two;
  }
  return out;
}

// argv run in network namespace `netns` (none when empty).
std::vector<std::string> InNetns(const std::string& netns, std::vector<std::string> argv) {
  if (!netns.empty()) argv.insert(argv.begin(), {"ip", "netns", "exec", netns});
  return argv;
}

}  // namespace

pid_t Spawn(const std::vector<std::string>& argv, const std::string& stderr_file,
            const std::string& stdout_file) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!stderr_file.empty()) {
    posix_spawn_file_actions_addopen(&actions, 2, stderr_file.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
  }
  if (!stdout_file.empty()) {
    posix_spawn_file_actions_addopen(&actions, 1, stdout_file.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
  }
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    std::fprintf(stderr, "rackhub-bench: cannot start %s: %s\n", args[0], std::strerror(rc));
    return -1;
  }
  return pid;
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string MakeRunDir() {
  static int serial = 0;
  const std::string dir =
      std::filesystem::temp_directory_path() /
      ("rackhub-bench-" + std::to_string(getpid()) + "-" + std::to_string(serial++));
  std::filesystem::create_directories(dir);
  return dir;
}

Hub::~Hub() {
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    int status;
    waitpid(pid_, &status, 0);
  }
}

bool Hub::Open(const BenchArgs& a, const std::string& dir,
               const std::vector<std::string>& extra_args) {
  if (!a.w.hub.empty()) {
    admin = a.admin;
    data = a.w.hub;
    if (!a.admin_token_file.empty()) {
      std::ifstream f(a.admin_token_file);
      f >> admin_token;
    }
    return true;
  }
  const std::string ready = dir + "/ready";
  const std::string log = dir + "/rackhubd.log";
  std::vector<std::string> argv = {
      SelfDir() + "/rackhubd", "--admin-listen", listen_host + ":0", "--data-listen", listen_host + ":0",
      "--lanes", std::to_string(a.lanes), "--ready-file", ready, "--log-level", "warn",
      "--transport", a.w.transport == "tcp" ? "tcp" : a.w.transport, "--rdma-listen",
      a.w.rdma_hub.empty() ? "127.0.0.1:0" : a.w.rdma_hub};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  if (listen_host != "127.0.0.1") {  // beyond loopback the hub needs an admin token
    admin_token = RandomHex();
    std::ofstream(dir + "/admin.token") << admin_token << "\n";
    argv.insert(argv.end(), {"--admin-token-file", dir + "/admin.token"});
  }
  pid_ = Spawn(InNetns(netns, argv), log);
  if (pid_ < 0) return false;
  for (int i = 0; i < 400; ++i) {
    std::istringstream in(ReadAll(ready));
    std::string what, addr;
    while (in >> what >> addr) (what == "admin" ? admin : data) = addr;
    if (!admin.empty() && !data.empty()) return true;
    int status;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  std::fprintf(stderr, "rackhub-bench: the local rackhubd did not start:\n%s",
               ReadAll(log).c_str());
  return false;
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

const char* DTypeName(WireType t) {
  return t == WireType::kFp32 ? "fp32" : t == WireType::kFp16 ? "fp16" : "bf16";
}

namespace {

// The numbers of "name":[...] in a worker's result.
bool NumberArray(const std::string& json, const std::string& name, std::vector<double>* out) {
  const std::string tag = "\"" + name + "\":[";
  const auto t = json.find(tag);
  if (t == std::string::npos) return false;
  const auto begin = t + tag.size();
  std::istringstream in(json.substr(begin, json.find(']', begin) - begin));
  std::string num;
  while (std::getline(in, num, ',')) {
    if (!num.empty()) out->push_back(std::stod(num));
  }
  return true;
}

// Start/end times of every iteration and the verified flag.
bool ParseResult(const std::string& json, std::vector<double>* start, std::vector<double>* end,
                 bool* verified) {
  *verified = json.find("\"verified\":true") != std::string::npos;
  return NumberArray(json, "start_ms", start) && NumberArray(json, "end_ms", end) &&
         start->size() == end->size();
}

}  // namespace

namespace {

// RACK_SUM + RACK_PARAMS bytes sent so far over every hub link of `hub`.
uint64_t InterhubChunkBytes(const Hub& hub) {
  auto stats = pb::StatsService::NewStub(
      grpc::CreateChannel(hub.admin, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!hub.admin_token.empty()) ctx.AddMetadata("authorization", "Bearer " + hub.admin_token);
  pb::GetStatsResponse resp;
  if (!stats->GetStats(&ctx, {}, &resp).ok()) return 0;
  uint64_t total = 0;
  for (const auto& l : resp.daemon().rack_links()) total += l.chunk_bytes_out();
  return total;
}

}  // namespace

RunResult RunPushPull(const BenchArgs& a, const std::string& self,
                      const std::vector<const Hub*>& hubs, const std::string& dir,
                      const std::string& tenant) {
  RunResult result;
  const Hub& hub = *hubs.front();
  const bool hierarchical = a.racks > 1 && a.topology == "hierarchical";
  auto channel = grpc::CreateChannel(hub.admin, grpc::InsecureChannelCredentials());
  auto tenants = pb::TenantService::NewStub(channel);
  pb::CreateTenantRequest req;
  req.set_name(tenant);
  req.set_workers_per_rack(a.w.workers);
  req.set_chunk_bytes(a.chunk_bytes);
  auto* opt = req.mutable_default_optimizer();
  opt->set_type(ParseOptimizer(a.optimizer));
  if (opt->type() != pb::SUM_ONLY) opt->set_learning_rate(a.lr);
  if (opt->type() == pb::MOMENTUM || opt->type() == pb::NESTEROV) opt->set_momentum(0.9);
  req.mutable_quotas()->set_max_parameter_bytes(std::max<uint64_t>(a.w.bytes, 1) * 2);
  pb::CreateTenantResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!hub.admin_token.empty()) ctx.AddMetadata("authorization", "Bearer " + hub.admin_token);
  if (auto s = tenants->CreateTenant(&ctx, req, &resp); !s.ok()) {
    std::fprintf(stderr, "rackhub-bench: creating tenant on %s: %s\n", hub.admin.c_str(),
                 s.error_message().c_str());
    return result;
  }
  // A tenant spanning racks exists on every rack's hub, with the same token.
  for (size_t h = 1; h < hubs.size(); ++h) {
    auto other = pb::TenantService::NewStub(
        grpc::CreateChannel(hubs[h]->admin, grpc::InsecureChannelCredentials()));
    pb::CreateTenantRequest same = req;
    same.set_token(resp.token());
    pb::CreateTenantResponse ignored;
    grpc::ClientContext octx;
    octx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!hubs[h]->admin_token.empty()) {
      octx.AddMetadata("authorization", "Bearer " + hubs[h]->admin_token);
    }
    if (auto s = other->CreateTenant(&octx, same, &ignored); !s.ok()) {
      std::fprintf(stderr, "rackhub-bench: creating tenant on %s: %s\n",
                   hubs[h]->admin.c_str(), s.error_message().c_str());
      return result;
    }
  }
  uint64_t interhub_before = 0;
  for (const Hub* h : hubs) interhub_before += InterhubChunkBytes(*h);
  const auto& o = resp.tenant().default_optimizer();
  agg::OptimizerConfig normalized;
  normalized.type = static_cast<agg::OptimizerType>(o.type());
  normalized.learning_rate = o.learning_rate();
  normalized.momentum = o.momentum();
  normalized.weight_decay = o.weight_decay();
  normalized.beta1 = o.beta1();
  normalized.beta2 = o.beta2();
  normalized.epsilon = o.epsilon();
  normalized.initial_accumulator = o.initial_accumulator();
  normalized.reduction = o.reduction() == pb::SUM ? agg::Reduction::kSum : agg::Reduction::kMean;
  const std::string token_file = dir + "/token-" + tenant;
  std::ofstream(token_file) << resp.token() << "\n";

  auto result_file = [&](uint32_t r) {
    return dir + "/" + tenant + "-worker-" + std::to_string(r) + ".json";
  };
  const uint32_t members = a.racks * a.w.workers;
  std::vector<pid_t> pids;
  for (uint32_t r = 0; r < members; ++r) {
    const uint32_t rack = r / a.w.workers;
    const Hub& to = *hubs[hierarchical ? rack : 0];
    const std::string netns =
        a.worker_netns_prefix.empty() ? "" : a.worker_netns_prefix + std::to_string(rack);
    pids.push_back(Spawn(InNetns(netns, {self, "--worker-rank", std::to_string(r % a.w.workers), "--rack",
                          std::to_string(rack), "--racks", std::to_string(a.racks), "--hub",
                          to.data, "--tenant",
                          tenant, "--token-file", token_file, "--workers",
                          std::to_string(a.w.workers), "--bytes", std::to_string(a.w.bytes),
                          "--keys", std::to_string(a.w.keys), "--iterations",
                          std::to_string(a.w.iterations), "--warmup", std::to_string(a.w.warmup),
                          "--dtype", std::to_string(static_cast<int>(a.w.dtype)), "--opt",
                          EncodeOptimizer(normalized), "--result", result_file(r),
                          a.w.verify ? "--verify" : "--no-verify", "--transport", a.w.transport,
                          "--rdma-hub", a.w.rdma_hub})));
  }
  bool ok = true;
  for (pid_t pid : pids) {
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0) {
      ok = false;
    }
  }
  // An iteration lasts from the moment the last worker started it (no
  // collective can finish earlier) until the last worker has its result:
  // the same as timing after a barrier, as the gloo benchmark does.
  result.iteration_ms.assign(a.w.iterations, 0);
  result.verified = a.w.verify;
  std::vector<double> last_start(a.w.iterations, 0), last_end(a.w.iterations, 0);
  for (uint32_t r = 0; r < members && ok; ++r) {
    std::vector<double> start, end;
    bool v = false;
    const std::string json = ReadAll(result_file(r));
    if (!ParseResult(json, &start, &end, &v) || start.size() != a.w.iterations) {
      ok = false;
      break;
    }
    result.verified = result.verified && v;
    const auto d = json.find("\"digest\":\"");
    const std::string digest = d == std::string::npos ? "" : json.substr(d + 10, json.find('"', d + 10) - d - 10);
    if (r == 0) result.digest = digest;
    if (digest != result.digest) result.digest = "workers-disagree";
    for (size_t i = 0; i < start.size(); ++i) {
      last_start[i] = std::max(last_start[i], start[i]);
      last_end[i] = std::max(last_end[i], end[i]);
    }
  }
  for (size_t i = 0; i < result.iteration_ms.size(); ++i) {
    result.iteration_ms[i] = last_end[i] - last_start[i];
  }
  for (const Hub* h : hubs) result.interhub_chunk_bytes += InterhubChunkBytes(*h);
  result.interhub_chunk_bytes -= interhub_before;
  for (const Hub* h : hubs) {
    auto stub = pb::TenantService::NewStub(
        grpc::CreateChannel(h->admin, grpc::InsecureChannelCredentials()));
    pb::DeleteTenantRequest del;
    del.set_name(tenant);
    pb::DeleteTenantResponse ignored;
    grpc::ClientContext dctx;
    dctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!h->admin_token.empty()) dctx.AddMetadata("authorization", "Bearer " + h->admin_token);
    stub->DeleteTenant(&dctx, del, &ignored);
  }
  std::error_code ec;
  std::filesystem::remove(token_file, ec);
  for (uint32_t r = 0; r < members; ++r) std::filesystem::remove(result_file(r), ec);
  if (!ok) std::fprintf(stderr, "rackhub-bench: a worker failed (see its message above)\n");
  result.ok = ok;
  return result;
}

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
