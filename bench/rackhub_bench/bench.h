// rackhub-bench: end-to-end push_pull benchmark with verification.
//
// The coordinator (main) starts or uses a hub, creates a tenant through the
// admin API, spawns W worker processes (this same binary in worker mode), and
// aggregates what they report. Each worker runs I iterations of push_pull over
// K keys holding M bytes in all, and checks every iteration's parameters
// bit for bit against a local reference: the same gradients of every rank
// (generated deterministically), summed in rank order, then the same fused
// optimizer kernel the hub runs.
//
// With --compare gloo (compare.cc), the coordinator interleaves R rounds of
// rackhub runs with runs of bench/gloo_allreduce.py (torch.distributed gloo
// all_reduce of the same model) and reports both medians and their ratio.
//
// Single-threaded code apart from the client library's I/O thread.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "rackhub/admin/v1/admin.pb.h"
#include "rackhub/aggregation/optimizer_config.h"

namespace rackhub::bench {

enum class WireType : uint8_t { kFp32 = 1, kFp16 = 2, kBf16 = 3 };

struct WorkerParams {
  std::string hub;         // data-plane HOST:PORT
  // shm | tcp | rdma | auto: auto = shared memory with a hub on this host,
  // else RDMA when a device is present, else TCP (client::Options::transport
  // and ::shm); tcp forces TCP.
  std::string transport = "auto";
  std::string rdma_hub;    // the hub's RDMA HOST:PORT (rdma, auto)
  std::string tenant;
  std::string token_file;
  std::string result_file;  // where the worker writes its JSON result
  // Workers meet here before every iteration (a file per worker and
  // iteration) so no worker's gradient generation overlaps another's timed
  // push_pull: the same as the barrier the gloo benchmark uses. Empty: none.
  std::string barrier_dir;
  uint32_t rank = 0;
  uint32_t workers = 2;
  uint64_t bytes = 64ull << 20;  // fp32 model bytes over all keys
  uint32_t keys = 4;
  // Model profile (profiles.cc): "even" = bytes split evenly over keys,
  // "resnet50" = ResNet-50's 161 parameter tensors (sets keys and bytes).
  std::string profile = "even";
  uint32_t iterations = 20;
  uint32_t warmup = 2;  // extra untimed (but verified) iterations first
  WireType dtype = WireType::kFp32;
  aggregation::OptimizerConfig optimizer;  // normalized, as the hub holds it
  bool verify = true;
  // Shared memory: poll 50 us before sleeping on a doorbell (workers and a
  // hub started here: data.shm_poll = busy).
  bool busy_poll = false;
  // Gradients in leased memory (Client::Lease): over shared memory the hub
  // reads them in place.
  bool lease = false;
  // Multi-rack runs: `workers` per rack, `racks` racks, this worker's rack.
  // Gradients are those of member rack * workers + rank; the reference sums
  // each rack in rank order, then the racks in rack order (as the hubs do).
  uint32_t racks = 1;
  uint32_t rack = 0;
};

// --profile: sets w->keys and w->bytes for a named profile; false if unknown.
bool ApplyProfile(const std::string& profile, WorkerParams* w);
// Elements of each key, in key order.
std::vector<uint64_t> KeyElements(const WorkerParams& w);

// Runs one worker; returns the process exit code.
int RunWorker(const WorkerParams& params);

// Deterministic gradient of element `index` of key `key` for (rank, iteration).
float Gradient(uint32_t rank, uint64_t iteration, uint32_t key, uint64_t index);

// Serializes the optimizer for the worker command line and back.
std::string EncodeOptimizer(const aggregation::OptimizerConfig& c);
bool DecodeOptimizer(const std::string& text, aggregation::OptimizerConfig* c);

// ---- Coordinator side (main.cc), shared with compare.cc ----

// The coordinator's command line.
struct BenchArgs {
  WorkerParams w;  // rank/tenant/token/result unused here
  std::string admin, admin_token_file;
  uint32_t lanes = 0;  // of a hub started locally; 0 = one per core
  std::vector<std::string> hub_args;  // more rackhubd options for hubs started here
  bool json = false;
  std::string optimizer = "sgd";
  double lr = 0.01;
  // --compare gloo
  std::string compare;      // "" or "gloo"
  uint32_t rounds = 5;      // interleaved rackhub + gloo rounds
  std::string gloo_script;  // "" = <source dir>/bench/gloo_allreduce.py
  std::string python = "/usr/bin/python3";
  // Multi-rack: racks (each with w.workers workers) and how they exchange:
  // "hierarchical" (one hub per rack, hubs exchange rack sums) or "flat"
  // (one hub serves every rack's workers).
  uint32_t racks = 1;
  std::string topology = "hierarchical";
  // Racks as network namespaces (bench/multirack_netns.sh): the hub of rack
  // r (flat: the one hub, rack 0) runs under `ip netns exec <hub_netns_prefix>r`,
  // the workers of rack r under `ip netns exec <worker_netns_prefix>r`; the
  // hub of rack r listens (data, admin, inter-hub) on rack_addrs[r] instead of
  // 127.0.0.1, with a generated admin token and hub secret. Empty: loopback.
  std::string hub_netns_prefix, worker_netns_prefix;
  // A rack on one machine (bench/rack_netns.sh): worker r runs under `ip
  // netns exec <netns_per_worker>r` (overrides worker_netns_prefix), and so
  // does gloo's rank r in --compare gloo, rendezvousing at gloo_master_addr
  // (worker 0's address) over interface gloo_ifname.
  std::string netns_per_worker, gloo_master_addr, gloo_ifname;
  // --compare gloo with a multi-key profile (resnet50): gloo all_reduces the
  // profile's tensors one by one (0) or in buckets of at most this many MiB
  // of consecutive tensors, last tensor first, as DDP does (bucket_cap_mb).
  uint32_t gloo_bucket_mib = 0;
  std::vector<std::string> rack_addrs;
  // --etcd H:P,..: the hubs share one registry in etcd and find each other
  // there (registry.backend = "etcd", topology.racks_from = "etcd"); the
  // tenant is created once, on hub 0 (docs/cluster.md).
  std::string etcd;
  uint32_t chunk_bytes = 0;  // tenant chunk size; 0 = the hub's default (32 KiB)
};

// The hub the run talks to: either started here (`rackhubd` beside this
// binary, on ephemeral loopback ports, SIGTERMed at destruction) or the one
// given by --hub/--admin. Not copyable.
class Hub {
 public:
  Hub() = default;
  Hub(const Hub&) = delete;
  Hub& operator=(const Hub&) = delete;
  ~Hub();
  // Starts or adopts the hub; `dir` holds its ready file and log. False
  // (with a message on stderr) when it cannot.
  // `wait` false: only starts it; WaitReady then waits (hubs that find each
  // other through etcd are ready only once all of them run).
  bool Open(const BenchArgs& a, const std::string& dir,
            const std::vector<std::string>& extra_args = {}, bool wait = true);
  bool WaitReady();

  std::string admin, data, admin_token;
  // CPU seconds (user + system) the hub started here has used so far; -1 for
  // an adopted hub (--hub) or when /proc cannot tell.
  double CpuSeconds() const;
  // Set before Open (hubs started here): the address it listens on and the
  // network namespace it runs in (empty: none). Beyond loopback, Open gives
  // it a generated admin token (--admin-token-file).
  std::string listen_host = "127.0.0.1";
  std::string netns;

 private:
  pid_t pid_ = -1;
  std::string dir_;
};

struct RunResult {
  bool ok = false;        // every worker ran and reported (else a message was printed)
  bool verified = false;  // every worker's every iteration matched the reference
  std::vector<double> iteration_ms;  // per timed iteration, the slowest worker's time
  std::string digest;                // of the final parameters (all workers agree)
  uint64_t interhub_chunk_bytes = 0; // RACK_SUM + RACK_PARAMS bytes over all hub links
  std::string transport;             // what worker 0's lanes used ("shm", "tcp", ...)
  // CPU seconds (user + system) the hubs started here spent during the run
  // (-1: not measured, e.g. --hub), and the gradient bytes they received.
  double hub_cpu_seconds = -1;
  uint64_t gradient_bytes = 0;
  // Hub CPU-seconds per GB of gradient received (-1: not measured).
  double HubCpuPerGb() const {
    return hub_cpu_seconds < 0 || gradient_bytes == 0 ? -1 : hub_cpu_seconds / (gradient_bytes / 1e9);
  }
};

// One benchmark run: creates tenant `tenant` on `hub`, runs the W worker
// processes (`self` in worker mode) through a.w.iterations timed iterations,
// deletes the tenant. `dir` holds the token and result files.
RunResult RunPushPull(const BenchArgs& a, const std::string& self,
                      const std::vector<const Hub*>& hubs,
                      const std::string& dir, const std::string& tenant);

// --compare gloo: see compare.cc. Returns the process exit code.
int Compare(const BenchArgs& a, const std::string& self);

// Helpers.
double Percentile(std::vector<double> v, double q);  // nearest rank, q in [0, 1]
const char* DTypeName(WireType t);
// Starts argv[0] (searched in PATH when it has no '/'); stderr/stdout go to
// the given files when non-empty. -1 (with a message) on failure.
pid_t Spawn(const std::vector<std::string>& argv, const std::string& stderr_file = "",
            const std::string& stdout_file = "");
std::string ReadAll(const std::string& path);
// A fresh directory under $TMPDIR for this run's files.
std::string MakeRunDir();
// Shared helpers of the coordinator (run.cc).
admin::v1::OptimizerType ParseOptimizer(const std::string& name);  // exits 2 if unknown
std::string SelfDir();     // directory of this executable
std::string RandomHex();   // 16 random bytes as hex
// argv to run in network namespace `netns` (unchanged when empty).
std::vector<std::string> InNetns(const std::string& netns, std::vector<std::string> argv);

}  // namespace rackhub::bench
