#include "config.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <sstream>

#include <toml++/toml.h>

#include <fmt/format.h>

#include "rackhub/aggregation/chunk_layout.h"
#include "rackhub/common/size.h"
#include "token.h"

namespace rackhub::server {
namespace {

constexpr uint32_t kMaxLanes = 1024;
constexpr std::array kLogLevels = {"trace", "debug", "info", "warn", "error", "critical", "off"};

// One settable field: its dotted name and how to set it from text (flags) or
// from a TOML node (file). Setters return OK or INVALID_ARGUMENT with the
// reason (the caller puts the field name in front).
struct Field {
  std::string name;
  std::function<Status(Config&, const std::string&)> from_text;
  std::function<Status(Config&, const toml::node&)> from_node;
};

Status SetEndpoint(net::Endpoint* out, const std::string& text) {
  Result<net::Endpoint> ep = net::ParseEndpoint(text);
  if (!ep.ok()) return ep.status();
  *out = *std::move(ep);
  return Status::Ok();
}

Result<uint64_t> ParseUnsigned(const std::string& text) {
  uint64_t v = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size()) {
    return InvalidArgument(fmt::format("'{}' is not a non-negative integer", text));
  }
  return v;
}

template <typename T>
Status SetUnsigned(T* out, const std::string& text, bool allow_size_suffix) {
  const Result<uint64_t> v = allow_size_suffix ? ParseSize(text) : ParseUnsigned(text);
  if (!v.ok()) return v.status();
  if (*v > std::numeric_limits<T>::max()) {
    return InvalidArgument(
        fmt::format("{} is too large (max {})", *v, std::numeric_limits<T>::max()));
  }
  *out = static_cast<T>(*v);
  return Status::Ok();
}

Status SetBool(bool* out, const std::string& text) {
  if (text == "true" || text == "1" || text == "yes") {
    *out = true;
  } else if (text == "false" || text == "0" || text == "no") {
    *out = false;
  } else {
    return InvalidArgument(fmt::format("'{}' is not a boolean (true/false)", text));
  }
  return Status::Ok();
}

// Node adapters: check the TOML type, then reuse the text setter.
Result<std::string> NodeAsString(const toml::node& n) {
  if (!n.is_string()) return InvalidArgument("expected a string");
  return *n.value<std::string>();
}

Result<std::string> NodeAsUnsignedText(const toml::node& n, bool allow_size) {
  if (n.is_integer()) {
    const int64_t v = *n.value<int64_t>();
    if (v < 0) return InvalidArgument(fmt::format("{} is negative", v));
    return std::to_string(v);
  }
  if (allow_size && n.is_string()) return *n.value<std::string>();
  return InvalidArgument(allow_size ? "expected an integer or a size string such as \"32KiB\""
                                    : "expected an integer");
}

Field StringField(std::string name, std::function<std::string&(Config&)> ref,
                  std::function<Status(const std::string&)> check = nullptr) {
  auto from_text = [ref, check](Config& c, const std::string& t) {
    if (check) {
      if (Status s = check(t); !s.ok()) return s;
    }
    ref(c) = t;
    return Status::Ok();
  };
  auto from_node = [from_text](Config& c, const toml::node& n) {
    const Result<std::string> t = NodeAsString(n);
    return t.ok() ? from_text(c, *t) : t.status();
  };
  return {std::move(name), from_text, from_node};
}

// A StringField check accepting exactly `choices`.
std::function<Status(const std::string&)> OneOf(std::vector<std::string> choices) {
  return [choices = std::move(choices)](const std::string& t) {
    if (std::find(choices.begin(), choices.end(), t) != choices.end()) return Status::Ok();
    std::string list;
    for (size_t i = 0; i < choices.size(); ++i) {
      list += i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ";
      list += choices[i];
    }
    return InvalidArgument(fmt::format("'{}' is not {}", t, list));
  };
}

Field EndpointField(std::string name, std::function<net::Endpoint&(Config&)> ref) {
  auto from_text = [ref](Config& c, const std::string& t) { return SetEndpoint(&ref(c), t); };
  auto from_node = [from_text](Config& c, const toml::node& n) {
    const Result<std::string> t = NodeAsString(n);
    return t.ok() ? from_text(c, *t) : t.status();
  };
  return {std::move(name), from_text, from_node};
}

template <typename T>
Field UnsignedField(std::string name, std::function<T&(Config&)> ref, bool size) {
  auto from_text = [ref, size](Config& c, const std::string& t) {
    return SetUnsigned<T>(&ref(c), t, size);
  };
  auto from_node = [from_text, size](Config& c, const toml::node& n) {
    const Result<std::string> t = NodeAsUnsignedText(n, size);
    return t.ok() ? from_text(c, *t) : t.status();
  };
  return {std::move(name), from_text, from_node};
}

Field BoolField(std::string name, std::function<bool&(Config&)> ref) {
  auto from_text = [ref](Config& c, const std::string& t) { return SetBool(&ref(c), t); };
  auto from_node = [ref](Config& c, const toml::node& n) {
    if (!n.is_boolean()) return InvalidArgument("expected true or false");
    ref(c) = *n.value<bool>();
    return Status::Ok();
  };
  return {std::move(name), from_text, from_node};
}

// "DATA=INTERHUB,DATA=INTERHUB,..." (flags) or an array of tables
// { data = "...", interhub = "..." } (file).
Result<RackAddress> ParseRack(const std::string& data, const std::string& interhub) {
  Result<net::Endpoint> d = net::ParseEndpoint(data);
  if (!d.ok()) return d.status().WithContext("data");
  Result<net::Endpoint> i = net::ParseEndpoint(interhub);
  if (!i.ok()) return i.status().WithContext("interhub");
  return RackAddress{*std::move(d), *std::move(i)};
}

Field RacksField() {
  auto from_text = [](Config& c, const std::string& t) -> Status {
    std::vector<RackAddress> racks;
    size_t start = 0;
    while (start <= t.size()) {
      const size_t comma = t.find(',', start);
      const std::string item = t.substr(start, comma == std::string::npos ? std::string::npos
                                                                         : comma - start);
      const size_t eq = item.find('=');
      if (eq == std::string::npos) {
        return InvalidArgument(fmt::format("'{}' is not DATA_HOST:PORT=INTERHUB_HOST:PORT", item));
      }
      Result<RackAddress> r = ParseRack(item.substr(0, eq), item.substr(eq + 1));
      if (!r.ok()) return r.status().WithContext(fmt::format("rack {}", racks.size()));
      racks.push_back(*std::move(r));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    c.topology.racks = std::move(racks);
    return Status::Ok();
  };
  auto from_node = [](Config& c, const toml::node& n) -> Status {
    const auto* arr = n.as_array();
    if (!arr) {
      return InvalidArgument(
          "expected an array of { data = \"HOST:PORT\", interhub = \"HOST:PORT\" }");
    }
    std::vector<RackAddress> racks;
    for (const auto& item : *arr) {
      const auto* t = item.as_table();
      const std::string where = fmt::format("rack {}", racks.size());
      if (!t) return InvalidArgument(where + ": expected a table { data = ..., interhub = ... }");
      for (auto&& [k, v] : *t) {
        if (k.str() != "data" && k.str() != "interhub") {
          return InvalidArgument(fmt::format("{}: unknown key '{}'", where, k.str()));
        }
      }
      const auto data = t->get("data"), interhub = t->get("interhub");
      if (!data || !data->is_string() || !interhub || !interhub->is_string()) {
        return InvalidArgument(where + ": needs data and interhub strings");
      }
      Result<RackAddress> r =
          ParseRack(*data->value<std::string>(), *interhub->value<std::string>());
      if (!r.ok()) return r.status().WithContext(where);
      racks.push_back(*std::move(r));
    }
    c.topology.racks = std::move(racks);
    return Status::Ok();
  };
  return {"topology.racks", from_text, from_node};
}

Status CheckLogLevel(const std::string& t) {
  if (std::find(kLogLevels.begin(), kLogLevels.end(), t) != kLogLevels.end()) return Status::Ok();
  return InvalidArgument(
      fmt::format("'{}' is not one of trace, debug, info, warn, error, critical, off", t));
}

// The schema: every config field, by its dotted name in the file.
const std::map<std::string, Field>& Schema() {
  static const std::map<std::string, Field> schema = [] {
    std::vector<Field> fields = {
        StringField("log_level", [](Config& c) -> std::string& { return c.log_level; },
                    CheckLogLevel),
        StringField("ready_file", [](Config& c) -> std::string& { return c.ready_file; }),
        EndpointField("admin.listen", [](Config& c) -> net::Endpoint& { return c.admin.listen; }),
        StringField("admin.token_file",
                    [](Config& c) -> std::string& { return c.admin.token_file; }),
        StringField("admin.readonly_token_file",
                    [](Config& c) -> std::string& { return c.admin.readonly_token_file; }),
        StringField("admin.tls_cert_file",
                    [](Config& c) -> std::string& { return c.admin.tls_cert_file; }),
        StringField("admin.tls_key_file",
                    [](Config& c) -> std::string& { return c.admin.tls_key_file; }),
        StringField("admin.tls_client_ca_file",
                    [](Config& c) -> std::string& { return c.admin.tls_client_ca_file; }),
        UnsignedField<uint64_t>(
            "admin.max_message_bytes",
            [](Config& c) -> uint64_t& { return c.admin.max_message_bytes; }, true),
        EndpointField("data.listen", [](Config& c) -> net::Endpoint& { return c.data.listen; }),
        UnsignedField<uint32_t>(
            "data.straggler_timeout_ms",
            [](Config& c) -> uint32_t& { return c.data.straggler_timeout_ms; }, false),
        UnsignedField<uint32_t>(
            "data.hello_timeout_ms",
            [](Config& c) -> uint32_t& { return c.data.hello_timeout_ms; }, false),
        StringField("data.transport", [](Config& c) -> std::string& { return c.data.transport; },
                    OneOf({"tcp", "rdma", "auto"})),
        EndpointField("data.rdma_listen",
                      [](Config& c) -> net::Endpoint& { return c.data.rdma_listen; }),
        StringField("data.rdma_device",
                    [](Config& c) -> std::string& { return c.data.rdma_device; }),
        UnsignedField<uint32_t>(
            "data.rdma_port", [](Config& c) -> uint32_t& { return c.data.rdma_port; }, false),
        UnsignedField<uint32_t>(
            "data.rdma_gid_index", [](Config& c) -> uint32_t& { return c.data.rdma_gid_index; },
            false),
        StringField("data.rdma_poll", [](Config& c) -> std::string& { return c.data.rdma_poll; },
                    OneOf({"events", "busy"})),
        UnsignedField<uint32_t>(
            "data.rdma_ring_bytes",
            [](Config& c) -> uint32_t& { return c.data.rdma_ring_bytes; }, true),
        StringField("data.shm", [](Config& c) -> std::string& { return c.data.shm; },
                    OneOf({"auto", "on", "off"})),
        UnsignedField<uint32_t>(
            "data.shm_ring_bytes", [](Config& c) -> uint32_t& { return c.data.shm_ring_bytes; },
            true),
        StringField("data.shm_poll", [](Config& c) -> std::string& { return c.data.shm_poll; },
                    OneOf({"events", "busy"})),
        UnsignedField<uint64_t>(
            "data.max_queued_bytes_per_connection",
            [](Config& c) -> uint64_t& { return c.data.max_queued_bytes_per_connection; }, true),
        StringField("data.scheduler", [](Config& c) -> std::string& { return c.data.scheduler; },
                    OneOf({"fair", "fifo"})),
        UnsignedField<uint32_t>(
            "data.max_unauthenticated_connections",
            [](Config& c) -> uint32_t& { return c.data.max_unauthenticated_connections; }, false),
        BoolField("metrics.enabled", [](Config& c) -> bool& { return c.metrics.enabled; }),
        EndpointField("metrics.listen",
                      [](Config& c) -> net::Endpoint& { return c.metrics.listen; }),
        UnsignedField<uint32_t>(
            "lanes.count", [](Config& c) -> uint32_t& { return c.lanes.count; }, false),
        BoolField("lanes.pin", [](Config& c) -> bool& { return c.lanes.pin; }),
        UnsignedField<uint32_t>(
            "topology.rack", [](Config& c) -> uint32_t& { return c.topology.rack; }, false),
        RacksField(),
        StringField("topology.mode", [](Config& c) -> std::string& { return c.topology.mode; },
                    OneOf({"hierarchical", "flat"})),
        StringField("topology.secret_file",
                    [](Config& c) -> std::string& { return c.topology.secret_file; }),
        UnsignedField<uint32_t>(
            "tenants.default_chunk_bytes",
            [](Config& c) -> uint32_t& { return c.tenants.chunk_bytes; }, true),
        UnsignedField<uint64_t>(
            "tenants.default_max_parameter_bytes",
            [](Config& c) -> uint64_t& { return c.tenants.max_parameter_bytes; }, true),
        UnsignedField<uint32_t>(
            "tenants.default_max_keys", [](Config& c) -> uint32_t& { return c.tenants.max_keys; },
            false),
        UnsignedField<uint32_t>(
            "tenants.default_max_workers",
            [](Config& c) -> uint32_t& { return c.tenants.max_workers; }, false),
        UnsignedField<uint32_t>(
            "tenants.max_tenants", [](Config& c) -> uint32_t& { return c.tenants.max_tenants; },
            false),
        StringField("topology.racks_from",
                    [](Config& c) -> std::string& { return c.topology.racks_from; },
                    OneOf({"config", "etcd"})),
        UnsignedField<uint32_t>(
            "topology.rack_count", [](Config& c) -> uint32_t& { return c.topology.discover_racks; },
            false),
        EndpointField("topology.interhub",
                      [](Config& c) -> net::Endpoint& { return c.topology.interhub; }),
        EndpointField("topology.advertise_data",
                      [](Config& c) -> net::Endpoint& { return c.topology.advertise_data; }),
        UnsignedField<uint32_t>(
            "topology.discover_timeout_s",
            [](Config& c) -> uint32_t& { return c.topology.discover_timeout_s; }, false),
        StringField("registry.backend", [](Config& c) -> std::string& { return c.registry.backend; },
                    OneOf({"sqlite", "etcd"})),
        StringField("registry.etcd_endpoints",
                    [](Config& c) -> std::string& { return c.registry.etcd_endpoints; }),
        StringField("registry.etcd_prefix",
                    [](Config& c) -> std::string& { return c.registry.etcd_prefix; }),
        UnsignedField<uint32_t>(
            "registry.etcd_timeout_ms",
            [](Config& c) -> uint32_t& { return c.registry.etcd_timeout_ms; }, false),
        StringField("registry.etcd_ca_file",
                    [](Config& c) -> std::string& { return c.registry.etcd_ca_file; }),
        StringField("registry.etcd_cert_file",
                    [](Config& c) -> std::string& { return c.registry.etcd_cert_file; }),
        StringField("registry.etcd_key_file",
                    [](Config& c) -> std::string& { return c.registry.etcd_key_file; }),
        StringField("registry.etcd_user",
                    [](Config& c) -> std::string& { return c.registry.etcd_user; }),
        StringField("registry.etcd_password_file",
                    [](Config& c) -> std::string& { return c.registry.etcd_password_file; }),
        UnsignedField<uint32_t>(
            "registry.lease_ttl_s", [](Config& c) -> uint32_t& { return c.registry.lease_ttl_s; },
            false),
        StringField("state.dir", [](Config& c) -> std::string& { return c.state.dir; }),
        BoolField("state.in_memory", [](Config& c) -> bool& { return c.state.in_memory; }),
        UnsignedField<uint64_t>(
            "checkpoint.every_iterations",
            [](Config& c) -> uint64_t& { return c.checkpoint.every_iterations; }, false),
        UnsignedField<uint32_t>(
            "checkpoint.every_seconds",
            [](Config& c) -> uint32_t& { return c.checkpoint.every_seconds; }, false),
        UnsignedField<uint32_t>(
            "checkpoint.keep", [](Config& c) -> uint32_t& { return c.checkpoint.keep; }, false),
        BoolField("checkpoint.on_shutdown",
                  [](Config& c) -> bool& { return c.checkpoint.on_shutdown; }),
    };
    std::map<std::string, Field> m;
    for (auto& f : fields) m.emplace(f.name, std::move(f));
    return m;
  }();
  return schema;
}

std::string Where(const std::string& source, const toml::node& n) {
  const auto& begin = n.source().begin;
  if (begin.line == 0) return source;
  return source + ":" + std::to_string(begin.line);
}

void WalkTable(const toml::table& table, const std::string& prefix, const std::string& source,
               Config* config, std::vector<std::string>* errors) {
  const auto& schema = Schema();
  for (auto&& [key, node] : table) {
    const std::string name = prefix.empty() ? std::string(key.str())
                                            : prefix + "." + std::string(key.str());
    if (const auto* sub = node.as_table()) {
      bool is_section = false;
      for (const auto& [field_name, unused] : schema) {
        if (field_name.rfind(name + ".", 0) == 0) is_section = true;
      }
      if (!is_section) {
        errors->push_back(name + ": unknown section (" + Where(source, node) + ")");
        continue;
      }
      WalkTable(*sub, name, source, config, errors);
      continue;
    }
    const auto it = schema.find(name);
    if (it == schema.end()) {
      errors->push_back(name + ": unknown key (" + Where(source, node) + ")");
      continue;
    }
    if (Status s = it->second.from_node(*config, node); !s.ok()) {
      errors->push_back(fmt::format("{}: {} ({})", name, s.message(), Where(source, node)));
    }
  }
}

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

void ParseConfigText(const std::string& text, const std::string& source_name, Config* config,
                     std::vector<std::string>* errors) {
  toml::table table;
  try {
    table = toml::parse(text, source_name);
  } catch (const toml::parse_error& e) {
    const auto& begin = e.source().begin;
    errors->push_back(source_name + ":" + std::to_string(begin.line) + ":" +
                      std::to_string(begin.column) + ": TOML syntax error: " +
                      std::string(e.description()));
    return;
  }
  WalkTable(table, "", source_name, config, errors);
}

std::vector<std::string> EtcdEndpoints(const RegistryConfig& registry) {
  std::vector<std::string> out;
  const std::string& text = registry.etcd_endpoints;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    out.push_back(text.substr(start, comma == std::string::npos ? std::string::npos
                                                                : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

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

Status SetConfigField(const std::string& field, const std::string& text, Config* config) {
  const auto& schema = Schema();
  const auto it = schema.find(field);
  if (it == schema.end()) return InvalidArgument(field + ": unknown field");
  return it->second.from_text(*config, text);
}

std::vector<int> AllowedCpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

uint32_t EffectiveLaneCount(const Config& config) {
  if (config.lanes.count != 0) return config.lanes.count;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return static_cast<uint32_t>(n);
  }
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<uint32_t>(n) : 1;
}

}  // namespace rackhub::server
