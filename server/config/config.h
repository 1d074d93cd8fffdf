// rackhubd configuration: a typed struct parsed once at start-up from a TOML
// file (--config) and command-line flags (flags override the file), then
// validated as a whole. Every error names the field ("admin.listen: ...").
//
// Plain values; built on the main thread before any other thread starts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "rackhub/net/endpoint.h"

namespace rackhub::server {

struct AdminConfig {
  net::Endpoint listen{"127.0.0.1", 7701};
  std::string token_file;           // empty: no admin auth (loopback only)
  std::string readonly_token_file;  // optional: token allowed to read only
  std::string tls_cert_file;        // PEM; with tls_key_file enables TLS
  std::string tls_key_file;
  std::string tls_client_ca_file;   // PEM; set: clients must present a cert signed by it
  uint64_t max_message_bytes = 4u << 20;
};

struct DataConfig {
  net::Endpoint listen{"127.0.0.1", 7700};
  // A chunk that has some but not all contributions for this long fails its
  // waiting workers with WORKER_LOST (a hung or partitioned worker).
  uint32_t straggler_timeout_ms = 30000;
  // A new connection must complete HELLO within this time.
  uint32_t hello_timeout_ms = 10000;
  // Data-plane transports: "tcp" (TCP only), "rdma" (TCP and RDMA; start-up
  // fails without a usable verbs device), "auto" (RDMA too when a verbs
  // device is present). TCP always runs (HELLO fallback, mixed clients).
  std::string transport = "auto";
  // rdma_cm listen address; host "" = data.listen's host, port 0 there =
  // kDefaultRdmaPort (net/rdma/channel.h).
  net::Endpoint rdma_listen{"", 0};
  std::string rdma_device;           // "" = whichever device rdma_listen routes to
  uint32_t rdma_port = 0;            // 0 = any port of that device
  uint32_t rdma_gid_index = UINT32_MAX;  // set: fail if rdma_cm picks another GID
  std::string rdma_poll = "events";  // "events" | "busy" (busy-poll, back off to events)
  uint32_t rdma_ring_bytes = 4u << 20;   // receive ring (and staging ring) per connection
  // Shared memory for workers on this host (net/shm/channel.h): "auto"
  // (offered to every worker; a listener that cannot start is a warning),
  // "on" (start-up fails without it), "off". Rings per connection and
  // direction: shm_ring_bytes, raised to hold four of the tenant's chunks.
  std::string shm = "auto";
  uint32_t shm_ring_bytes = 4u << 20;
  std::string shm_poll = "events";  // "events" | "busy" (poll 50 us before sleeping)
  // Bytes of frames waiting to be written to one connection (plus replies
  // held for it) before it is closed with QUOTA_EXCEEDED; reading it pauses
  // above half of this (docs/architecture.md, Bounded send queues).
  uint64_t max_queued_bytes_per_connection = 64ull << 20;
  // Workers in step (docs/architecture.md): a worker connection whose
  // pushes waiting for updates on a lane exceed this is not read (TCP) until
  // they are down to half; 0 = off.
  uint64_t intake_lead_bytes = 1ull << 20;
  // SO_RCVBUF of worker TCP connections (the kernel doubles it for its own
  // bookkeeping); 0 = the kernel's autotuning. Small and fixed, every
  // worker's flow is window-limited: the flows share a link evenly and a
  // connection that is not read stops its worker within this many bytes.
  uint32_t tcp_receive_buffer = 256u << 10;
  // How a lane orders the work of its worker connections (docs/architecture.md,
  // Fair share of a lane): "fair" (weighted fair queueing over tenants,
  // Quotas::weight) or "fifo" (as frames arrive, for comparison).
  std::string scheduler = "fair";
  // Connections accepted but not authenticated yet (HELLO pending), over all
  // clients; more are closed at once until some finish or time out.
  uint32_t max_unauthenticated_connections = 1024;
};

// Prometheus /metrics (docs/metrics.md). Beyond loopback a scrape must
// authenticate like the admin API: HTTP basic auth whose password is the
// admin token or the read-only token (any user name).
struct MetricsConfig {
  bool enabled = true;
  net::Endpoint listen{"127.0.0.1", 7704};
};

struct LaneConfig {
  uint32_t count = 0;  // 0: one per core available to the process
  bool pin = true;     // pin lane i to the i-th available core
};

// One rack's hub as its peers see it.
struct RackAddress {
  net::Endpoint data;      // where that rack's workers connect
  net::Endpoint interhub;  // where the other hubs connect (rack exchange)
};

// Several racks (docs/architecture.md, Hierarchical rack exchange). Empty
// `racks`: a single-rack hub.
struct TopologyConfig {
  uint32_t rack = 0;                // this hub's rack index
  std::vector<RackAddress> racks;   // every rack, by index
  // "hierarchical": each rack's workers use their own rack's hub; hubs
  // exchange rack sums. "flat": every worker of every rack uses this hub
  // (for comparison), the others are not involved.
  std::string mode = "hierarchical";
  std::string secret_file;          // shared by the hubs; required with racks > 1 (hierarchical)
  // Mutual TLS on hub links over TCP (docs/cluster.md): all three or none.
  // Set: every hub link, dialed or accepted, is TLS 1.2+ and the peer's
  // certificate must chain to tls_ca_file; the secret's handshake runs inside.
  std::string tls_cert_file;        // PEM certificate (chain) of this hub
  std::string tls_key_file;         // PEM private key (unencrypted)
  std::string tls_ca_file;          // PEM CA(s) the other hubs' certificates chain to
  bool hub_tls() const { return !tls_cert_file.empty(); }
  // "config": `racks` as given. "etcd" (registry.backend = "etcd"): every hub
  // registers its addresses in etcd under a lease and start-up waits for
  // `rack_count` racks (docs/cluster.md); `racks` is then filled from etcd.
  std::string racks_from = "config";
  uint32_t discover_racks = 0;       // racks_from = "etcd": how many racks
  net::Endpoint interhub;            // racks_from = "etcd": this hub's interhub address
  net::Endpoint advertise_data;      // racks_from = "etcd": workers' address of this hub (default data.listen)
  uint32_t discover_timeout_s = 120; // racks_from = "etcd": wait for the other racks this long
  uint32_t rack_count() const { return racks.empty() ? 1 : static_cast<uint32_t>(racks.size()); }
  bool multi_rack_exchange() const { return racks.size() > 1 && mode == "hierarchical"; }
};

// Defaults for tenants created without explicit values.
struct TenantDefaults {
  uint32_t chunk_bytes = 32 * 1024;
  uint64_t max_parameter_bytes = 4ull << 30;  // hub memory of a tenant's keys (key_memory.h)
  uint32_t max_keys = 65536;
  uint32_t max_workers = 256;
  uint32_t max_tenants = 1024;
};

// The state directory the systemd unit provides (and a root daemon uses
// unless told otherwise).
inline constexpr const char* kSystemStateDir = "/var/lib/rackhub";

// Durable state (docs/durability.md): the registry database and the
// tenants' checkpoints live under `dir`. `in_memory`: nothing is written and
// a restart starts empty (tests and benchmarks only; must be asked for).
struct StateConfig {
  std::string dir = kSystemStateDir;  // registry.db, checkpoints/<tenant>/
  bool in_memory = false;
};

// Checkpoints of every tenant's parameters and optimizer state.
struct CheckpointConfig {
  uint64_t every_iterations = 0;  // 0: off; else when the newest key version advanced by N
  uint32_t every_seconds = 300;   // 0: off; a crash loses at most this much training
  uint32_t keep = 3;              // newest valid checkpoints kept per tenant (>= 1)
  bool on_shutdown = true;        // checkpoint every tenant on SIGTERM before exiting
};

// Where the registry lives (registry_backend.h, docs/cluster.md): "sqlite"
// (state.dir, one hub) or "etcd" (shared by the hubs of a cluster).
struct RegistryConfig {
  std::string backend = "sqlite";
  std::string etcd_endpoints;            // "HOST:PORT,HOST:PORT,..."
  std::string etcd_prefix = "/rackhub/";  // every key rackhubd writes starts with it
  uint32_t etcd_timeout_ms = 3000;        // per etcd call
  std::string etcd_ca_file;               // PEM: TLS to etcd when set
  std::string etcd_cert_file;             // PEM client certificate (with etcd_key_file)
  std::string etcd_key_file;
  std::string etcd_user;                  // etcd auth (with etcd_password_file)
  std::string etcd_password_file;
  uint32_t lease_ttl_s = 5;               // membership: a dead hub is noticed after this
};

// The items of registry.etcd_endpoints ("a:1,b:2" -> {"a:1", "b:2"}).
std::vector<std::string> EtcdEndpoints(const RegistryConfig& registry);

struct Config {
  std::string log_level = "info";  // trace, debug, info, warn, error, critical, off
  std::string ready_file;          // written once all listeners are bound
  AdminConfig admin;
  DataConfig data;
  MetricsConfig metrics;
  LaneConfig lanes;
  TenantDefaults tenants;
  TopologyConfig topology;
  StateConfig state;
  CheckpointConfig checkpoint;
  RegistryConfig registry;
};

// What the command line asked for besides configuration values.
struct CommandLine {
  std::string config_file;
  // The option that named config_file ("--config", or "--check-config" /
  // "--doctor" for their positional FILE), for messages.
  std::string config_option = "--config";
  bool check_config = false;  // --check-config [FILE]: validate and exit
  bool doctor = false;        // --doctor [FILE]: check the host (doctor.h) and exit
  bool help = false;
  bool version = false;
};

// Result of parsing: either a config or a list of errors, each naming its
// field and (for the file) the line.
struct ParseResult {
  Config config;
  CommandLine command_line;
  std::vector<std::string> errors;
  // Choices made for the user that the daemon logs at start (e.g. the
  // per-user state directory).
  std::vector<std::string> notices;
  bool ok() const { return errors.empty(); }
};

// Parses the TOML text of a config file into `config` (which holds defaults
// or earlier values). Unknown keys, wrong types and bad values are errors.
void ParseConfigText(const std::string& text, const std::string& source_name, Config* config,
                     std::vector<std::string>* errors);

// Sets one field (its dotted name, e.g. "lanes.count") from its text form,
// as a flag gives it; INVALID_ARGUMENT says what is wrong with the text.
Status SetConfigField(const std::string& field, const std::string& text, Config* config);

// Full start-up parse (command_line.cc, with CLI11): reads --config FILE (if
// given), then applies flags, then validates. argv[0] is skipped.
// `--check-config FILE` and `--doctor FILE` (or `=FILE`) name the config file
// like `--config FILE`: the argument after them is their FILE unless it
// starts with '-'; naming two different files is an error.
ParseResult ParseCommandLine(int argc, const char* const* argv);

// Cross-field checks (e.g. non-loopback admin listen requires a token).
void ValidateConfig(const Config& config, std::vector<std::string>* errors);

// Lanes to run: config.lanes.count or the number of usable cores.
uint32_t EffectiveLaneCount(const Config& config);

// The CPUs this process may run on (sched_getaffinity), ascending; lane i is
// pinned to the i-th of them, wrapping around (LaneSet::Start, --doctor).
std::vector<int> AllowedCpus();

// The --help text (command_line.cc).
std::string UsageText();

}  // namespace rackhub::server
