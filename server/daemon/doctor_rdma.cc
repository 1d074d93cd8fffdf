// rackhubd --doctor: the RDMA checks (verbs devices, ports and GIDs; locked
// memory; the rdma_cm listen address). doctor.h has the contract.
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include <fmt/format.h>

#include "doctor.h"
#include "rackhub/net/rdma/channel.h"
#include "rackhub/net/rdma/device.h"

namespace rackhub::server::doctor {
namespace {

// GIDs listed per port; a RoCE port can have dozens (one per address).
constexpr size_t kMaxGidsShown = 8;

std::string ReadFirstLine(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

std::string Kib(uint64_t bytes) {
  if (bytes >= (1ull << 30) && bytes % (1ull << 30) == 0) return fmt::format("{} GiB", bytes >> 30);
  if (bytes >= (1ull << 20) && bytes % (1ull << 20) == 0) return fmt::format("{} MiB", bytes >> 20);
  return fmt::format("{} KiB", (bytes + 1023) / 1024);
}

bool Used(const Config& config, const VerbsDevice& d) {
  return config.data.rdma_device.empty() || d.name == config.data.rdma_device;
}

std::string DescribeDevice(const VerbsDevice& d, std::vector<std::string>* lines) {
  if (!d.error.empty()) return d.name + ": " + d.error;
  std::string head = d.name + (d.numa_node >= 0 ? fmt::format(" (NUMA node {})", d.numa_node) : "");
  if (d.ports.empty()) return head + ": no ports";
  for (const auto& p : d.ports) {
    bool v2 = false;
    for (const auto& g : p.gids) v2 = v2 || g.type == "RoCE v2";
    lines->push_back(fmt::format("{} port {}: {}, {}, {} GID{}{}", head, p.number, p.state,
                                 p.link_layer, p.gids.size(), p.gids.size() == 1 ? "" : "s",
                                 p.link_layer == "Ethernet" && !p.gids.empty()
                                     ? (v2 ? " (RoCE v2 present)"
                                           : " (no RoCE v2 GID: RoCE v1 does not cross an IP "
                                             "router)")
                                     : ""));
    for (size_t i = 0; i < p.gids.size() && i < kMaxGidsShown; ++i) {
      const VerbsGid& g = p.gids[i];
      lines->push_back(fmt::format("  gid {}: {}{}{}", g.index, g.gid,
                                   g.type.empty() ? "" : " " + g.type,
                                   g.netdev.empty() ? "" : " on " + g.netdev));
    }
    if (p.gids.size() > kMaxGidsShown) {
      lines->push_back(fmt::format("  ... {} more GIDs", p.gids.size() - kMaxGidsShown));
    }
  }
  return "";
}

}  // namespace

uint32_t VerbsDevice::active_ports() const {
  uint32_t n = 0;
  for (const auto& p : ports) n += p.active ? 1 : 0;
  return n;
}

std::vector<VerbsDevice> ReadVerbsDevices() {
  std::vector<VerbsDevice> out;
  int count = 0;
  // ibv_get_device_list(3): NULL-terminated, freed with ibv_free_device_list.
  ibv_device** list = ibv_get_device_list(&count);
  if (!list) return out;
  for (int i = 0; i < count; ++i) {
    VerbsDevice d;
    d.name = ibv_get_device_name(list[i]);
    const std::string sys = "/sys/class/infiniband/" + d.name;
    const std::string numa = ReadFirstLine(sys + "/device/numa_node");
    d.numa_node = numa.empty() ? -1 : std::atoi(numa.c_str());
    ibv_context* ctx = ibv_open_device(list[i]);
    if (!ctx) {
      d.error = std::string("ibv_open_device: ") + std::strerror(errno) +
                " (permission on /dev/infiniband/uverbs*?)";
      out.push_back(std::move(d));
      continue;
    }
    ibv_device_attr attr{};
    if (ibv_query_device(ctx, &attr) != 0) {
      d.error = std::string("ibv_query_device: ") + std::strerror(errno);
    } else {
      // Ports are numbered from 1 (ibv_query_port(3)).
      for (uint32_t p = 1; p <= attr.phys_port_cnt; ++p) {
        ibv_port_attr pa{};
        if (ibv_query_port(ctx, static_cast<uint8_t>(p), &pa) != 0) continue;
        VerbsPort port;
        port.number = p;
        port.active = pa.state == IBV_PORT_ACTIVE;
        port.state = ibv_port_state_str(pa.state);
        port.link_layer = pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand";
        const std::string attrs = fmt::format("{}/ports/{}/gid_attrs", sys, p);
        for (int idx = 0; idx < pa.gid_tbl_len; ++idx) {
          ibv_gid gid{};
          if (ibv_query_gid(ctx, static_cast<uint8_t>(p), idx, &gid) != 0) continue;
          bool zero = true;
          for (uint8_t b : gid.raw) zero = zero && b == 0;
          if (zero) continue;  // an unused table entry
          char text[INET6_ADDRSTRLEN] = "";
          inet_ntop(AF_INET6, gid.raw, text, sizeof text);
          port.gids.push_back({idx, text, ReadFirstLine(fmt::format("{}/types/{}", attrs, idx)),
                               ReadFirstLine(fmt::format("{}/ndevs/{}", attrs, idx))});
        }
        d.ports.push_back(std::move(port));
      }
    }
    ibv_close_device(ctx);
    out.push_back(std::move(d));
  }
  ibv_free_device_list(list);
  return out;
}

bool RdmaWouldRun(const Config& config, const std::vector<VerbsDevice>& devices) {
  if (config.data.transport == "tcp") return false;
  for (const auto& d : devices) {
    if (d.active_ports() > 0 && Used(config, d)) return true;
  }
  return false;
}

Row CheckVerbsDevices(const Config& config, const std::vector<VerbsDevice>& devices) {
  Row row{"verbs devices", Verdict::kPass, {}, ""};
  for (const auto& d : devices) {
    if (const std::string line = DescribeDevice(d, &row.detail); !line.empty()) {
      row.detail.push_back(line);
    }
  }
  const std::string& transport = config.data.transport;
  if (transport == "tcp") {
    row.verdict = Verdict::kSkip;
    row.detail.insert(row.detail.begin(),
                      fmt::format("data.transport = tcp: RDMA not used ({} verbs device{} here)",
                                  devices.size(), devices.size() == 1 ? "" : "s"));
    return row;
  }
  // With "rdma" the daemon refuses to start without a device; with "auto"
  // it serves TCP only (RdmaListener::ListenConfigured).
  const Verdict missing = transport == "rdma" ? Verdict::kFail : Verdict::kWarn;
  const std::string outcome = transport == "rdma" ? "rackhubd refuses to start (exit 1)"
                                                  : "rackhubd serves TCP only";
  const std::string& wanted = config.data.rdma_device;
  const VerbsDevice* chosen = nullptr;
  for (const auto& d : devices) {
    if (d.active_ports() > 0 && Used(config, d) && !chosen) chosen = &d;
  }
  if (!chosen) {
    row.verdict = missing;
    std::string what;
    if (devices.empty()) {
      what = "no verbs device (ibv_get_device_list lists none)";
    } else if (!wanted.empty()) {
      what = "no device named '" + wanted + "' with an active port (data.rdma_device)";
    } else {
      what = "no verbs device with an active port";
    }
    row.detail.insert(row.detail.begin(),
                      fmt::format("data.transport = {}: {}: {}", transport, what, outcome));
    bool unopened = false;
    for (const auto& d : devices) unopened = unopened || !d.error.empty();
    if (devices.empty()) {
      row.fix =
          "load the NIC's RDMA driver and rdma-core (`ibv_devices` must list a device; Soft-RoCE "
          "on any Ethernet port: `rdma link add rxe0 type rxe netdev IFACE`)";
    } else if (unopened) {
      row.fix = "let the service's user open /dev/infiniband/uverbs* (`ls -l /dev/infiniband`; "
                "a unit needs DeviceAllow=char-uverbs rw)";
    } else if (!wanted.empty()) {
      row.fix = "set data.rdma_device to one of the devices listed (or \"\" for any)";
    } else {
      row.fix = "bring a port up (`ibv_devinfo` shows its state; check the link: cable, switch, "
                "`ip link`)";
    }
    row.fix += transport == "rdma" ? ", or set data.transport = auto (TCP when RDMA is missing)"
                                   : ", or set data.transport = tcp when TCP only is intended";
    return row;
  }
  row.detail.insert(row.detail.begin(),
                    fmt::format("data.transport = {}: RDMA on {}", transport, chosen->name));
  // data.rdma_port and data.rdma_gid_index: the daemon checks them against
  // what rdma_cm picks at start-up; here: do they exist at all.
  const uint32_t want_port = config.data.rdma_port;
  const VerbsPort* port = nullptr;
  for (const auto& p : chosen->ports) {
    if (p.active && (want_port == 0 || p.number == want_port) && !port) port = &p;
  }
  if (!port) {
    row.verdict = missing;
    row.detail.push_back(fmt::format("data.rdma_port = {}: {} has no active port {}: {}",
                                     want_port, chosen->name, want_port, outcome));
    row.fix = "set data.rdma_port to an active port listed here (or 0 for any)";
    return row;
  }
  if (config.data.rdma_gid_index != UINT32_MAX) {
    bool found = false;
    for (const auto& g : port->gids) found = found || g.index == static_cast<int>(config.data.rdma_gid_index);
    if (!found) {
      row.verdict = missing;
      row.detail.push_back(fmt::format("data.rdma_gid_index = {}: {} port {} has no such GID: {}",
                                       config.data.rdma_gid_index, chosen->name, port->number,
                                       outcome));
      row.fix = "set data.rdma_gid_index to a GID listed here (rdma_cm picks the GID of "
                "data.rdma_listen's address), or leave it unset";
    }
  }
  return row;
}

Row CheckMemlock(const Config& config, bool rdma_runs) {
  Row row{"memlock", Verdict::kPass, {}, ""};
  if (config.data.transport == "tcp") {
    row.verdict = Verdict::kSkip;
    row.detail.push_back("data.transport = tcp: no memory is registered");
    return row;
  }
  if (!rdma_runs && config.data.transport == "auto") {
    row.verdict = Verdict::kSkip;
    row.detail.push_back("data.transport = auto and no active verbs device: RDMA will not run, "
                         "no memory is registered");
    return row;
  }
  net::rdma::ChannelOptions options;
  options.ring_bytes = config.data.rdma_ring_bytes;
  const uint64_t per_connection = net::rdma::Channel::RegisteredBytes(options);
  const uint64_t lanes = EffectiveLaneCount(config);
  const auto& topo = config.topology;
  // As RdmaListener::Listen: one worker on every lane, and per lane and peer
  // rack an incoming and an outgoing hub link.
  const uint64_t hub_links = topo.multi_rack_exchange() ? lanes * (topo.rack_count() - 1) * 2 : 0;
  const uint64_t planned = per_connection * (lanes + hub_links);
  const net::rdma::MemlockStatus status = net::rdma::CurrentMemlock();
  row.detail.push_back(fmt::format(
      "{} per connection (receive ring + staging ring, 2 x data.rdma_ring_bytes = {}); each "
      "worker opens one per lane: {} lanes{}",
      Kib(per_connection), Kib(config.data.rdma_ring_bytes), lanes,
      hub_links ? fmt::format(", {} hub links", hub_links) : ""));
  if (status.cap_ipc_lock || status.limit == UINT64_MAX) {
    row.detail.push_back(status.cap_ipc_lock
                             ? "CAP_IPC_LOCK: no locked-memory limit applies"
                             : "RLIMIT_MEMLOCK unlimited: no locked-memory limit applies");
    return row;
  }
  const uint64_t connections = status.limit / per_connection;
  const uint64_t workers = connections > hub_links ? (connections - hub_links) / lanes : 0;
  row.detail.push_back(fmt::format(
      "RLIMIT_MEMLOCK {} (this process's; a unit's LimitMEMLOCK= applies to the service): room "
      "for {} connection{} = {} worker{} at once",
      Kib(status.limit), connections, connections == 1 ? "" : "s", workers,
      workers == 1 ? "" : "s"));
  const std::string fix =
      "set LimitMEMLOCK=infinity in the unit (deploy/rackhubd.service), `ulimit -l unlimited` "
      "before starting by hand, or memlock in /etc/security/limits.conf; or lower "
      "data.rdma_ring_bytes (registered twice per connection)";
  if (planned > status.limit) {
    // "rdma" refuses to start; "auto" starts without RDMA (RdmaListener).
    row.verdict = config.data.transport == "rdma" ? Verdict::kFail : Verdict::kWarn;
    row.detail.push_back(fmt::format(
        "start-up needs {} (one worker per lane{}) and is refused: data.transport = {}{}",
        Kib(planned), hub_links ? " and the hub links" : "", config.data.transport,
        config.data.transport == "rdma" ? " stops the start" : " falls back to TCP only"));
    row.fix = fix;
    return row;
  }
  const uint64_t tenant_workers = config.tenants.max_workers;
  if (workers < tenant_workers) {
    row.verdict = Verdict::kWarn;
    row.detail.push_back(fmt::format(
        "a tenant of tenants.default_max_workers = {} workers needs {}; past {} workers RDMA "
        "connections are refused",
        tenant_workers, Kib(per_connection * (lanes * tenant_workers + hub_links)), workers));
    row.fix = fix;
  }
  return row;
}

Row CheckRdmaPort(const std::string& check, const std::string& field,
                  const net::Endpoint& endpoint, bool rdma_runs) {
  Row row{check, Verdict::kPass, {}, ""};
  if (!rdma_runs) {
    row.verdict = Verdict::kSkip;
    row.detail.push_back(field + " " + endpoint.ToString() + ": RDMA will not run");
    return row;
  }
  const std::string where = field + " " + endpoint.ToString();
  rdma_event_channel* channel = rdma_create_event_channel();
  if (!channel) {
    row.verdict = Verdict::kFail;
    row.detail.push_back(where + ": rdma_create_event_channel: " + std::strerror(errno));
    row.fix = "load rdma_ucm (`modprobe rdma_ucm`: /dev/infiniband/rdma_cm) and allow the "
              "service that device (DeviceAllow=/dev/infiniband/rdma_cm rw)";
    return row;
  }
  rdma_cm_id* id = nullptr;
  if (rdma_create_id(channel, &id, nullptr, RDMA_PS_TCP) != 0) {
    row.verdict = Verdict::kFail;
    row.detail.push_back(where + ": rdma_create_id: " + std::strerror(errno));
    row.fix = "check the rdma_cm module (`rdma link`, `dmesg`)";
    rdma_destroy_event_channel(channel);
    return row;
  }
  rdma_addrinfo hints{};
  rdma_addrinfo* ai = nullptr;
  hints.ai_flags = RAI_PASSIVE;
  hints.ai_port_space = RDMA_PS_TCP;
  const std::string port = std::to_string(endpoint.port);
  if (rdma_getaddrinfo(endpoint.host.c_str(), port.c_str(), &hints, &ai) != 0 || !ai) {
    row.verdict = Verdict::kFail;
    row.detail.push_back(where + ": cannot resolve '" + endpoint.host + "'");
    row.fix = "set " + field + " to an IP address of the RDMA interface";
  } else if (rdma_bind_addr(id, ai->ai_src_addr) != 0) {
    const int err = errno;
    row.verdict = Verdict::kFail;
    row.detail.push_back(where + ": rdma_bind_addr: " + std::strerror(err));
    if (err == EADDRINUSE) {
      row.fix = fmt::format(
          "another process (a running rackhubd?) has an rdma_cm id on port {}: `rdma resource "
          "show cm_id` lists them; stop it or change {}",
          endpoint.port, field);
    } else {
      row.fix = "set " + field + " to the IP address of an RDMA interface (`rdma link` names "
                "its netdev, `ip -br addr show NETDEV` its address)";
    }
  } else {
    row.detail.push_back(where + ": free (rdma_bind_addr) on " +
                         (id->verbs ? std::string(ibv_get_device_name(id->verbs->device)) +
                                          " port " + std::to_string(id->port_num)
                                    : std::string("any device (wildcard address)")));
  }
  if (ai) rdma_freeaddrinfo(ai);
  rdma_destroy_id(id);
  rdma_destroy_event_channel(channel);
  return row;
}

}  // namespace rackhub::server::doctor
