// rackhubd's configuration: the schema of its fields (names, parsers,
// checks), parsing the TOML file (ParseConfigText) and single fields
// (SetConfigField), etcd endpoints, and the lane count from the CPUs allowed.
// Validation: config_validate.cc; the command line: command_line.cc.
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
        UnsignedField<uint64_t>(
            "data.intake_lead_bytes",
            [](Config& c) -> uint64_t& { return c.data.intake_lead_bytes; }, true),
        UnsignedField<uint32_t>(
            "data.tcp_receive_buffer",
            [](Config& c) -> uint32_t& { return c.data.tcp_receive_buffer; }, true),
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
        StringField("topology.tls_cert_file",
                    [](Config& c) -> std::string& { return c.topology.tls_cert_file; }),
        StringField("topology.tls_key_file",
                    [](Config& c) -> std::string& { return c.topology.tls_key_file; }),
        StringField("topology.tls_ca_file",
                    [](Config& c) -> std::string& { return c.topology.tls_ca_file; }),
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
