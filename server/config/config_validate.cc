// rackhubd's configuration: validation (ValidateConfig): the values' ranges
// and combinations, registry.* and topology (docs/cluster.md), and the files
// the configuration names being readable. Parsing (the schema, the TOML
// file, single fields): config.cc; the command line: command_line.cc.
#include <fstream>
#include <string>
#include <vector>

#include "config.h"
#include "pem_file.h"
#include "rackhub/aggregation/chunk_layout.h"
#include "token.h"

namespace rackhub::server {
namespace {

constexpr uint32_t kMaxLanes = 1024;

// Checks that a file named by `field` can be read and is not empty.
void CheckReadableFile(const std::string& field, const std::string& path,
                       std::vector<std::string>* errors) {
  if (path.empty()) return;
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    errors->push_back(field + ": cannot read '" + path + "'");
    return;
  }
  if (f.peek() == std::ifstream::traits_type::eof()) {
    errors->push_back(field + ": '" + path + "' is empty");
  }
}

}  // namespace

// registry.* and topology.racks_from (docs/cluster.md).
static void CheckRegistry(const Config& c, std::vector<std::string>* errors) {
  const RegistryConfig& r = c.registry;
  const TopologyConfig& topo = c.topology;
  if (r.backend == "etcd") {
    if (r.etcd_endpoints.empty()) {
      errors->push_back("registry.etcd_endpoints: required with registry.backend = \"etcd\" "
                        "(HOST:PORT,HOST:PORT,...)");
    } else {
      for (const std::string& item : EtcdEndpoints(r)) {
        if (Result<net::Endpoint> e = net::ParseEndpoint(item); !e.ok() || e->port == 0) {
          errors->push_back("registry.etcd_endpoints: '" + item + "' is not HOST:PORT");
        }
      }
    }
    if (r.etcd_prefix.empty() || r.etcd_prefix.back() != '/') {
      errors->push_back("registry.etcd_prefix: '" + r.etcd_prefix + "' must end with '/'");
    }
    if (r.etcd_timeout_ms < 100 || r.etcd_timeout_ms > 600000) {
      errors->push_back("registry.etcd_timeout_ms: must be in [100, 600000]");
    }
    if (r.lease_ttl_s < 2 || r.lease_ttl_s > 3600) {
      errors->push_back("registry.lease_ttl_s: must be in [2, 3600]");
    }
    if (r.etcd_cert_file.empty() != r.etcd_key_file.empty()) {
      errors->push_back("registry.etcd_cert_file: a client certificate needs both "
                        "registry.etcd_cert_file and registry.etcd_key_file");
    }
    if (r.etcd_user.empty() != r.etcd_password_file.empty()) {
      errors->push_back("registry.etcd_user: etcd auth needs both registry.etcd_user and "
                        "registry.etcd_password_file");
    }
    CheckReadableFile("registry.etcd_ca_file", r.etcd_ca_file, errors);
    CheckReadableFile("registry.etcd_cert_file", r.etcd_cert_file, errors);
    CheckReadableFile("registry.etcd_key_file", r.etcd_key_file, errors);
    CheckReadableFile("registry.etcd_password_file", r.etcd_password_file, errors);
  }
  if (topo.racks_from != "etcd") return;
  if (r.backend != "etcd") {
    errors->push_back("topology.racks_from: \"etcd\" needs registry.backend = \"etcd\"");
  }
  if (!topo.racks.empty()) {
    errors->push_back("topology.racks: give either topology.racks or topology.racks_from = "
                      "\"etcd\", not both");
  }
  if (topo.discover_racks == 0 || topo.discover_racks > 256) {
    errors->push_back("topology.rack_count: must be in [1, 256] with topology.racks_from = "
                      "\"etcd\"");
  } else if (topo.rack >= topo.discover_racks) {
    errors->push_back("topology.rack: " + std::to_string(topo.rack) + " is not below " +
                      "topology.rack_count " + std::to_string(topo.discover_racks));
  }
  if (topo.discover_racks > 1 && topo.interhub.port == 0) {
    errors->push_back("topology.interhub: this hub's interhub HOST:PORT (with a fixed port) is "
                      "required with topology.racks_from = \"etcd\"");
  }
  if (topo.discover_racks > 1 && topo.mode == "hierarchical" && topo.secret_file.empty()) {
    errors->push_back("topology.secret_file: required with " + std::to_string(topo.discover_racks) +
                      " racks: the hubs authenticate their links with a shared secret");
  }
  const net::Endpoint& data = topo.advertise_data.port ? topo.advertise_data : c.data.listen;
  for (const net::Endpoint* e : {&data, &topo.interhub}) {
    if (e->port != 0 && (e->host == "0.0.0.0" || e->host == "::")) {
      errors->push_back(std::string(e == &data ? "topology.advertise_data"
                                               : "topology.interhub") +
                        ": " + e->ToString() + " is not an address other hosts can reach; "
                        "give this hub's routable address");
    }
  }
}

// topology.tls_* (docs/cluster.md, TLS for hub links): all or none; the
// files readable PEM, the key matching the certificate (loaded as the hub
// will load them).
static void CheckHubTls(const TopologyConfig& topo, std::vector<std::string>* errors) {
  const std::pair<const char*, const std::string*> files[] = {
      {"topology.tls_cert_file", &topo.tls_cert_file},
      {"topology.tls_key_file", &topo.tls_key_file},
      {"topology.tls_ca_file", &topo.tls_ca_file}};
  size_t set = 0;
  for (const auto& [field, path] : files) set += path->empty() ? 0 : 1;
  if (set == 0) return;
  if (set < 3) {
    for (const auto& [field, path] : files) {
      if (path->empty()) {
        errors->push_back(std::string(field) +
                          ": TLS for hub links needs all of topology.tls_cert_file, "
                          "topology.tls_key_file and topology.tls_ca_file");
      }
    }
    return;
  }
  const size_t before = errors->size();
  for (const auto& [field, path] : files) CheckReadableFile(field, *path, errors);
  if (errors->size() != before) return;
  if (auto ctx = LoadHubTlsContext(topo); !ctx.ok()) errors->push_back(ctx.status().message());
}

void ValidateConfig(const Config& c, std::vector<std::string>* errors) {
  if (c.lanes.count > kMaxLanes) {
    errors->push_back("lanes.count: " + std::to_string(c.lanes.count) + " is more than " +
                      std::to_string(kMaxLanes));
  }
  if (!aggregation::ChunkLayout::IsValidChunkBytes(c.tenants.chunk_bytes)) {
    errors->push_back("tenants.default_chunk_bytes: " + std::to_string(c.tenants.chunk_bytes) +
                      " must be a multiple of 64 in [1024, 67108864]");
  }
  if (c.data.straggler_timeout_ms < 100 || c.data.straggler_timeout_ms > 3600000)
    errors->push_back("data.straggler_timeout_ms: must be in [100, 3600000]");
  if (c.data.hello_timeout_ms < 100 || c.data.hello_timeout_ms > 600000)
    errors->push_back("data.hello_timeout_ms: must be in [100, 600000]");
  if (c.data.rdma_ring_bytes < (64u << 10) || c.data.rdma_ring_bytes > (1u << 30))
    errors->push_back("data.rdma_ring_bytes: must be in [64KiB, 1GiB]");
  if (c.data.shm_ring_bytes < (64u << 10) || c.data.shm_ring_bytes > (1u << 30) ||
      c.data.shm_ring_bytes % 4096 != 0)
    errors->push_back("data.shm_ring_bytes: must be a multiple of 4096 in [64KiB, 1GiB]");
  if (c.data.rdma_port > 255) errors->push_back("data.rdma_port: must be in [0, 255]");
  if (c.data.max_queued_bytes_per_connection < (1ull << 20) ||
      c.data.max_queued_bytes_per_connection > (1ull << 40))
    errors->push_back("data.max_queued_bytes_per_connection: must be in [1MiB, 1TiB]");
  if (c.data.intake_lead_bytes != 0 &&
      (c.data.intake_lead_bytes < (64ull << 10) || c.data.intake_lead_bytes > (1ull << 30)))
    errors->push_back("data.intake_lead_bytes: must be 0 (off) or in [64KiB, 1GiB]");
  if (c.data.tcp_receive_buffer != 0 &&
      (c.data.tcp_receive_buffer < (4u << 10) || c.data.tcp_receive_buffer > (256u << 20)))
    errors->push_back("data.tcp_receive_buffer: must be 0 (the kernel's autotuning) or in [4KiB, 256MiB]");
  if (c.data.max_unauthenticated_connections < 1 ||
      c.data.max_unauthenticated_connections > 1000000)
    errors->push_back("data.max_unauthenticated_connections: must be in [1, 1000000]");
  if (c.tenants.max_keys == 0) errors->push_back("tenants.default_max_keys: must be >= 1");
  if (c.tenants.max_workers == 0) errors->push_back("tenants.default_max_workers: must be >= 1");
  if (c.tenants.max_tenants == 0) errors->push_back("tenants.max_tenants: must be >= 1");
  if (c.tenants.max_parameter_bytes == 0)
    errors->push_back("tenants.default_max_parameter_bytes: must be >= 1");
  if (!c.state.in_memory && c.state.dir.empty()) {
    errors->push_back("state.dir: is empty; set a directory or state.in_memory = true");
  }
  if (c.checkpoint.keep == 0) errors->push_back("checkpoint.keep: must be >= 1");
  if (c.admin.max_message_bytes < 4096 || c.admin.max_message_bytes > (1ull << 30)) {
    errors->push_back("admin.max_message_bytes: must be in [4KiB, 1GiB]");
  }
  const bool tls = !c.admin.tls_cert_file.empty() || !c.admin.tls_key_file.empty();
  if (tls && (c.admin.tls_cert_file.empty() || c.admin.tls_key_file.empty())) {
    errors->push_back(std::string(c.admin.tls_cert_file.empty() ? "admin.tls_cert_file"
                                                                : "admin.tls_key_file") +
                      ": TLS needs both admin.tls_cert_file and admin.tls_key_file");
  }
  if (!c.admin.tls_client_ca_file.empty() && !tls) {
    errors->push_back(
        "admin.tls_client_ca_file: client certificates need TLS (admin.tls_cert_file and "
        "admin.tls_key_file)");
  }
  CheckReadableFile("admin.token_file", c.admin.token_file, errors);
  CheckReadableFile("admin.readonly_token_file", c.admin.readonly_token_file, errors);
  CheckReadableFile("admin.tls_cert_file", c.admin.tls_cert_file, errors);
  CheckReadableFile("admin.tls_key_file", c.admin.tls_key_file, errors);
  CheckReadableFile("admin.tls_client_ca_file", c.admin.tls_client_ca_file, errors);
  if (!c.admin.readonly_token_file.empty() && c.admin.token_file.empty()) {
    errors->push_back(
        "admin.readonly_token_file: needs admin.token_file too (otherwise the read-only token "
        "would be the only credential while unauthenticated calls may write)");
  }
  const bool authenticated = !c.admin.token_file.empty() || !c.admin.tls_client_ca_file.empty();
  if (!c.admin.listen.IsLoopback() && !authenticated) {
    errors->push_back("admin.listen: refusing to listen on " + c.admin.listen.ToString() +
                      " beyond loopback without authentication; set admin.token_file (and "
                      "preferably TLS) or listen on 127.0.0.1");
  }
  if (c.metrics.enabled && !c.metrics.listen.IsLoopback() && c.admin.token_file.empty()) {
    errors->push_back("metrics.listen: refusing to serve /metrics on " +
                      c.metrics.listen.ToString() +
                      " beyond loopback without authentication; set admin.token_file (scrapes "
                      "then use HTTP basic auth with the token as password), listen on "
                      "127.0.0.1, or set metrics.enabled = false");
  }
  CheckRegistry(c, errors);
  CheckHubTls(c.topology, errors);
  const auto& topo = c.topology;
  const size_t errors_before_secret = errors->size();
  CheckReadableFile("topology.secret_file", topo.secret_file, errors);
  const bool secret_readable = errors->size() == errors_before_secret;
  if (!topo.racks.empty()) {
    if (topo.rack >= topo.racks.size()) {
      errors->push_back("topology.rack: " + std::to_string(topo.rack) + " is not one of the " +
                        std::to_string(topo.racks.size()) + " racks in topology.racks");
    } else if (topo.multi_rack_exchange()) {
      const auto& me = topo.racks[topo.rack].interhub;
      // Hub links are authenticated by the shared secret on every address:
      // loopback is no trust boundary on a shared host.
      if (topo.secret_file.empty()) {
        errors->push_back("topology.secret_file: required with " +
                          std::to_string(topo.racks.size()) +
                          " racks: the hubs authenticate their links (" + me.ToString() +
                          ") with a shared secret; give every hub the same file of at least " +
                          std::to_string(kMinHubSecretBytes) + " characters");
      } else if (secret_readable) {
        if (Result<std::string> secret = ReadHubSecret(topo.secret_file); !secret.ok()) {
          errors->push_back(secret.status().message());
        }
      }
      if (me.port == 0) {
        errors->push_back("topology.racks: rack " + std::to_string(topo.rack) +
                          " needs a fixed interhub port (its peers connect to it)");
      }
    }
  } else if (topo.rack != 0 && topo.racks_from != "etcd") {
    errors->push_back("topology.rack: " + std::to_string(topo.rack) +
                      " without topology.racks (a single-rack hub is rack 0)");
  }
  if (c.admin.listen.port != 0 && c.admin.listen.port == c.data.listen.port &&
      c.admin.listen.host == c.data.listen.host) {
    errors->push_back("data.listen: " + c.data.listen.ToString() +
                      " is the same address as admin.listen");
  }
  for (const net::Endpoint* other : {&c.admin.listen, &c.data.listen}) {
    if (c.metrics.enabled && c.metrics.listen.port != 0 &&
        c.metrics.listen.port == other->port && c.metrics.listen.host == other->host) {
      errors->push_back("metrics.listen: " + c.metrics.listen.ToString() + " is the same address as " +
                        (other == &c.admin.listen ? "admin.listen" : "data.listen"));
    }
  }
}

}  // namespace rackhub::server
