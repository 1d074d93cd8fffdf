// rackhub-bench: starting hubs and running one benchmark (tenant, worker
// processes, timing, verification results). Shared by plain runs, --compare
// and multi-rack runs.
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

namespace pb = rackhub::admin::v1;
namespace agg = rackhub::aggregation;

pb::OptimizerType ParseOptimizer(const std::string& text) {
  static const std::map<std::string, pb::OptimizerType> types = {
      {"sgd", pb::SGD},   {"momentum", pb::MOMENTUM}, {"nesterov", pb::NESTEROV},
      {"adam", pb::ADAM}, {"adamw", pb::ADAMW},       {"adagrad", pb::ADAGRAD},
      {"sum-only", pb::SUM_ONLY}};
  const auto it = types.find(text);
  if (it == types.end()) {
    std::fprintf(stderr, "rackhub-bench: --optimizer: unknown optimizer '%s'\n", text.c_str());
    std::exit(2);
  }
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

double Hub::CpuSeconds() const {
  if (pid_ <= 0) return -1;
  // /proc/PID/stat: fields 14 and 15 are utime and stime in clock ticks
  // (proc(5)); the command name (field 2) is in parentheses.
  const std::string stat = ReadAll("/proc/" + std::to_string(pid_) + "/stat");
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream in(stat.substr(close + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && in >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

bool Hub::Open(const BenchArgs& a, const std::string& dir,
               const std::vector<std::string>& extra_args, bool wait) {
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
      "--in-memory",  // a benchmark: no registry database
      "--metrics-listen", listen_host + ":0",
      "--transport", a.w.transport == "rdma" || a.w.transport == "auto" ? a.w.transport : "tcp",
      "--rdma-listen",
      a.w.rdma_hub.empty() ? "127.0.0.1:0" : a.w.rdma_hub, "--shm-poll",
      a.w.busy_poll ? "busy" : "events"};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  argv.insert(argv.end(), a.hub_args.begin(), a.hub_args.end());
  if (listen_host != "127.0.0.1") {  // beyond loopback the hub needs an admin token
    admin_token = RandomHex();
    std::ofstream(dir + "/admin.token") << admin_token << "\n";
    argv.insert(argv.end(), {"--admin-token-file", dir + "/admin.token"});
  }
  pid_ = Spawn(InNetns(netns, argv), log);
  if (pid_ < 0) return false;
  dir_ = dir;
  return !wait || WaitReady();
}

bool Hub::WaitReady() {
  if (pid_ <= 0 && !admin.empty() && !data.empty()) return true;  // adopted (--hub)
  const std::string ready = dir_ + "/ready";
  const std::string log = dir_ + "/rackhubd.log";
  for (int i = 0; i < 1200 && pid_ > 0; ++i) {
    std::istringstream in(ReadAll(ready));
    std::string what, addr;
    while (in >> what >> addr) {
      if (what == "admin") admin = addr;
      if (what == "data") data = addr;
    }
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
  // The quota counts hub memory (parameters x2, optimizer state, accumulator,
  // parked contributions, rack stages: docs/architecture.md, Memory a key
  // holds); this bound leaves room for any optimizer, worker and rack count.
  req.mutable_quotas()->set_max_parameter_bytes(
      (std::max<uint64_t>(a.w.bytes, 1) * (8 + 2ull * a.w.workers) + (64ull << 20)) *
      std::max<uint64_t>(a.racks, 1));
  pb::CreateTenantResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!hub.admin_token.empty()) ctx.AddMetadata("authorization", "Bearer " + hub.admin_token);
  if (auto s = tenants->CreateTenant(&ctx, req, &resp); !s.ok()) {
    std::fprintf(stderr, "rackhub-bench: creating tenant on %s: %s\n", hub.admin.c_str(),
                 s.error_message().c_str());
    return result;
  }
  // A tenant spanning racks exists on every rack's hub, with the same token
  // (with etcd: created once, every hub has it).
  for (size_t h = 1; h < hubs.size() && a.etcd.empty(); ++h) {
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

  const std::string barrier_dir = dir + "/barrier-" + tenant;
  std::filesystem::create_directories(barrier_dir);
  auto result_file = [&](uint32_t r) {
    return dir + "/" + tenant + "-worker-" + std::to_string(r) + ".json";
  };
  const uint32_t members = a.racks * a.w.workers;
  double cpu_before = 0;
  for (const Hub* h : hubs) {
    const double s = h->CpuSeconds();
    cpu_before = s < 0 || cpu_before < 0 ? -1 : cpu_before + s;
  }
  std::vector<pid_t> pids;
  for (uint32_t r = 0; r < members; ++r) {
    const uint32_t rack = r / a.w.workers;
    const Hub& to = *hubs[hierarchical ? rack : 0];
    const std::string netns =
        !a.netns_per_worker.empty()
            ? a.netns_per_worker + std::to_string(r)
            : (a.worker_netns_prefix.empty() ? "" : a.worker_netns_prefix + std::to_string(rack));
    std::vector<std::string> argv = {self, "--worker-rank", std::to_string(r % a.w.workers), "--rack",
                          std::to_string(rack), "--racks", std::to_string(a.racks), "--hub",
                          to.data, "--tenant",
                          tenant, "--token-file", token_file, "--workers",
                          std::to_string(a.w.workers), "--bytes", std::to_string(a.w.bytes),
                          "--keys", std::to_string(a.w.keys), "--profile", a.w.profile,
                          "--iterations",
                          std::to_string(a.w.iterations), "--warmup", std::to_string(a.w.warmup),
                          "--dtype", std::to_string(static_cast<int>(a.w.dtype)), "--opt",
                          EncodeOptimizer(normalized), "--result", result_file(r), "--barrier-dir", barrier_dir,
                          a.w.verify ? "--verify" : "--no-verify", "--transport", a.w.transport,
                          "--rdma-hub", a.w.rdma_hub};
    if (a.w.busy_poll) argv.push_back("--busy-poll");
    if (a.w.lease) argv.push_back("--lease");
    pids.push_back(Spawn(InNetns(netns, std::move(argv))));
  }
  bool ok = true;
  for (pid_t pid : pids) {
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0) {
      ok = false;
    }
  }
  double cpu_after = 0;
  for (const Hub* h : hubs) {
    const double s = h->CpuSeconds();
    cpu_after = s < 0 || cpu_after < 0 ? -1 : cpu_after + s;
  }
  if (cpu_before >= 0 && cpu_after >= 0) result.hub_cpu_seconds = cpu_after - cpu_before;
  result.gradient_bytes = uint64_t{members} * (a.w.bytes / 4) *
                          (a.w.dtype == WireType::kFp32 ? 4 : 2) *
                          (a.w.iterations + a.w.warmup);
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
    if (r == 0) {
      result.digest = digest;
      const auto t = json.find("\"transport\":\"");
      if (t != std::string::npos) result.transport = json.substr(t + 13, json.find('"', t + 13) - t - 13);
    }
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
  std::filesystem::remove_all(barrier_dir, ec);
  if (!ok) std::fprintf(stderr, "rackhub-bench: a worker failed (see its message above)\n");
  result.ok = ok;
  return result;
}

}  // namespace rackhub::bench
