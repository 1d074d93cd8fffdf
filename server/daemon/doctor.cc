// rackhubd --doctor: the table, the order of the checks, and the checks of
// the configuration, the cpus and NUMA placement. The RDMA checks are in
// doctor_rdma.cc, the ports and the state directory in doctor_host.cc.
#include "doctor.h"

#include <dirent.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "rackhub/net/rdma/channel.h"

namespace rackhub::server::doctor {
namespace {

// "0-3,8,10-11" (sysfs cpulist(5) format) -> {0,1,2,3,8,10,11}; nullopt
// when it does not parse.
std::optional<std::vector<int>> ParseCpuList(const std::string& text) {
  std::vector<int> cpus;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    while (!item.empty() && (item.back() == '\n' || item.back() == ' ')) item.pop_back();
    if (item.empty()) continue;
    const size_t dash = item.find('-');
    char* end = nullptr;
    const long first = std::strtol(item.c_str(), &end, 10);
    long last = first;
    if (dash != std::string::npos) last = std::strtol(item.c_str() + dash + 1, &end, 10);
    if (*end != '\0' || first < 0 || last < first || last >= CPU_SETSIZE) return std::nullopt;
    for (long c = first; c <= last; ++c) cpus.push_back(static_cast<int>(c));
  }
  return cpus;
}

// {0,1,2,5} -> "0-2,5".
std::string FormatCpuList(std::vector<int> cpus) {
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) out += '-' + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out.empty() ? "none" : out;
}

std::string FormatNodeList(const std::set<int>& nodes) {
  std::string out;
  for (int n : nodes) out += fmt::format("{}{}", out.empty() ? "" : ",", n);
  return out;
}

// NUMA node -> its cpus, from /sys/devices/system/node/nodeN/cpulist.
// Nodes without cpus (memory only) are left out.
std::map<int, std::vector<int>> ReadNumaNodes() {
  std::map<int, std::vector<int>> nodes;
  DIR* dir = opendir("/sys/devices/system/node");
  if (!dir) return nodes;
  while (const dirent* e = readdir(dir)) {
    const std::string name = e->d_name;
    if (name.rfind("node", 0) != 0 || name.size() == 4 ||
        name.find_first_not_of("0123456789", 4) != std::string::npos) {
      continue;
    }
    std::ifstream f("/sys/devices/system/node/" + name + "/cpulist");
    std::string text;
    std::getline(f, text);
    const auto cpus = ParseCpuList(text);
    if (cpus && !cpus->empty()) nodes[std::atoi(name.c_str() + 4)] = *cpus;
  }
  closedir(dir);
  return nodes;
}

}  // namespace

const char* VerdictName(Verdict verdict) {
  switch (verdict) {
    case Verdict::kPass: return "PASS";
    case Verdict::kWarn: return "WARN";
    case Verdict::kFail: return "FAIL";
    case Verdict::kSkip: return "SKIP";
  }
  return "?";
}

std::vector<std::vector<int>> LaneCpus(const Config& config) {
  const std::vector<int> cpus = AllowedCpus();
  const uint32_t lanes = EffectiveLaneCount(config);
  std::vector<std::vector<int>> out;
  for (uint32_t i = 0; i < lanes; ++i) {
    if (config.lanes.pin && !cpus.empty()) {
      out.push_back({cpus[i % cpus.size()]});
    } else {
      out.push_back(cpus);
    }
  }
  return out;
}

Row CheckConfig(const Config& c, const std::string& config_file) {
  Row row{"config", Verdict::kPass, {}, ""};
  row.detail.push_back(config_file.empty() ? "no config file: defaults and flags"
                                           : config_file + " (and flags): valid");
  row.detail.push_back(fmt::format(
      "admin {}, data {}, metrics {}, transport {}, {} lanes{}", c.admin.listen.ToString(),
      c.data.listen.ToString(), c.metrics.enabled ? c.metrics.listen.ToString() : "off",
      c.data.transport, EffectiveLaneCount(c), c.lanes.pin ? " (pinned)" : ""));
  row.detail.push_back("state: " + (c.state.in_memory ? std::string("in memory") : c.state.dir));
  return row;
}

Row CheckLanesVsCores(const Config& config) {
  Row row{"lanes vs cores", Verdict::kPass, {}, ""};
  const std::vector<int> cpus = AllowedCpus();
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  const uint32_t lanes = EffectiveLaneCount(config);
  if (cpus.empty()) {
    row.verdict = Verdict::kWarn;
    row.detail.push_back("sched_getaffinity: cannot read the cpus this process may use");
    row.fix = "run --doctor where the daemon runs (a Linux host with /proc)";
    return row;
  }
  row.detail.push_back(fmt::format(
      "{} lanes{} on {} available cpus ({}{})", lanes,
      config.lanes.count == 0 ? " (lanes.count = 0: one per cpu)" : "", cpus.size(),
      FormatCpuList(cpus),
      online > 0 && static_cast<size_t>(online) != cpus.size()
          ? fmt::format("; {} online, the affinity mask allows {}", online, cpus.size())
          : ""));
  if (lanes > cpus.size()) {
    row.verdict = Verdict::kWarn;
    row.detail.push_back(fmt::format(
        "more lanes than cpus: {} lanes take turns on {} cpus{}; a lane waiting for its cpu "
        "adds a scheduler time slice (milliseconds) to every reply it owes, for no throughput",
        lanes, cpus.size(), config.lanes.pin ? " (pinned round-robin)" : ""));
    row.fix = fmt::format(
        "set lanes.count = {} (or 0: one lane per available cpu), or give the service more "
        "cpus (CPUAffinity= / AllowedCPUs= in the unit, `taskset -c`)",
        cpus.size());
    return row;
  }
  if (config.lanes.pin) {
    const auto lane_cpus = LaneCpus(config);
    std::string map;
    for (size_t i = 0; i < lane_cpus.size() && i < 16; ++i) {
      map += fmt::format("{}lane {}: cpu {}", i == 0 ? "" : ", ", i, lane_cpus[i][0]);
    }
    if (lane_cpus.size() > 16) map += fmt::format(", ... ({} more)", lane_cpus.size() - 16);
    row.detail.push_back("pinned: " + map);
    if (lanes == cpus.size()) {
      row.detail.push_back(
          "note: every available cpu runs a pinned lane; the daemon's other threads (I/O, "
          "admin gRPC, checkpoints) and any worker processes on this host share those cpus "
          "with the lanes: on a shared host keep the workers on other cpus (taskset, "
          "CPUAffinity=) or run fewer lanes (lanes.count)");
    }
  } else {
    row.detail.push_back("lanes.pin = false: the kernel schedules the lanes on any of these cpus");
  }
  return row;
}

Row CheckNuma(const Config& config, const std::vector<VerbsDevice>& devices, bool rdma_runs) {
  Row row{"NUMA", Verdict::kPass, {}, ""};
  const auto nodes = ReadNumaNodes();
  if (nodes.empty()) {
    row.verdict = Verdict::kSkip;
    row.detail.push_back("/sys/devices/system/node lists no node with cpus: no NUMA information");
    return row;
  }
  std::map<int, int> node_of_cpu;
  std::string node_list;
  for (const auto& [node, cpus] : nodes) {
    for (int c : cpus) node_of_cpu[c] = node;
    node_list += fmt::format("{}node{}: cpus {}", node_list.empty() ? "" : ", ", node,
                             FormatCpuList(cpus));
  }
  row.detail.push_back(fmt::format("{} NUMA node{} ({})", nodes.size(),
                                   nodes.size() == 1 ? "" : "s", node_list));
  // Lanes by node.
  std::map<int, std::vector<int>> lanes_on_node;
  const auto lane_cpus = LaneCpus(config);
  for (size_t lane = 0; lane < lane_cpus.size(); ++lane) {
    std::set<int> lane_nodes;
    for (int c : lane_cpus[lane]) {
      if (const auto it = node_of_cpu.find(c); it != node_of_cpu.end()) lane_nodes.insert(it->second);
    }
    for (int n : lane_nodes) lanes_on_node[n].push_back(static_cast<int>(lane));
  }
  std::set<int> lane_nodes;
  std::string lanes_text;
  for (const auto& [node, lanes] : lanes_on_node) {
    lane_nodes.insert(node);
    lanes_text += fmt::format("{}node {}: lanes {}", lanes_text.empty() ? "" : "; ", node,
                              FormatCpuList(lanes));
  }
  row.detail.push_back((config.lanes.pin ? "pinned lanes: " : "unpinned lanes may run on: ") +
                       (lanes_text.empty() ? std::string("unknown") : lanes_text));
  std::vector<std::string> fixes;
  if (lane_nodes.size() > 1) {
    row.verdict = Verdict::kWarn;
    row.detail.push_back(fmt::format(
        "the lanes span nodes {}: a worker's connections and the chunks of one key cross the "
        "inter-node link",
        FormatNodeList(lane_nodes)));
  }
  // The NIC's node, for the devices RDMA would use.
  std::set<int> nic_nodes;
  for (const auto& d : devices) {
    const bool used = rdma_runs && d.active_ports() > 0 &&
                      (config.data.rdma_device.empty() || d.name == config.data.rdma_device);
    if (!used) continue;
    if (d.numa_node < 0) {
      row.detail.push_back(d.name + ": NUMA node unknown (sysfs numa_node is -1)");
      continue;
    }
    nic_nodes.insert(d.numa_node);
    const bool local = lane_nodes.count(d.numa_node) > 0;
    row.detail.push_back(fmt::format("{}: on node {}{}", d.name, d.numa_node,
                                     local ? "" : ", remote from every lane"));
    if (!local) row.verdict = Verdict::kWarn;
  }
  if (!rdma_runs) row.detail.push_back("no RDMA device in use: no NIC to place the lanes near");
  if (row.verdict == Verdict::kWarn) {
    const int target = nic_nodes.empty() ? nodes.begin()->first : *nic_nodes.begin();
    row.fix = fmt::format(
        "keep the lanes on one node{}: CPUAffinity={} (and NUMAPolicy=bind NUMAMask={}) in the "
        "unit, or `numactl --cpunodebind={} --membind={}`; lanes.count = 0 then runs one lane "
        "per cpu of that node",
        nic_nodes.empty() ? "" : ", the NIC's", FormatCpuList(nodes.at(target)), target, target,
        target);
  }
  return row;
}

std::vector<Row> RunChecks(const Config& config, const std::string& config_file) {
  std::vector<Row> rows;
  const std::vector<VerbsDevice> devices = ReadVerbsDevices();
  const bool rdma_runs = RdmaWouldRun(config, devices);
  const std::optional<long> lock_holder = StateLockHolder(config);
  rows.push_back(CheckConfig(config, config_file));
  rows.push_back(CheckVerbsDevices(config, devices));
  rows.push_back(CheckMemlock(config, rdma_runs));
  rows.push_back(CheckTcpPort("data port", "data.listen", config.data.listen, lock_holder));
  rows.push_back(CheckTcpPort("admin port", "admin.listen", config.admin.listen, lock_holder));
  if (config.metrics.enabled) {
    rows.push_back(
        CheckTcpPort("metrics port", "metrics.listen", config.metrics.listen, lock_holder));
  } else {
    rows.push_back({"metrics port", Verdict::kSkip, {"metrics.enabled = false"}, ""});
  }
  net::Endpoint rdma_listen = config.data.rdma_listen;  // as RdmaListener::Listen
  if (rdma_listen.host.empty()) {
    rdma_listen.host = config.data.listen.host;
    if (rdma_listen.port == 0) rdma_listen.port = net::rdma::kDefaultRdmaPort;
  }
  rows.push_back(CheckRdmaPort("rdma port", "data.rdma_listen", rdma_listen, rdma_runs));
  if (config.topology.multi_rack_exchange()) {
    const auto& topo = config.topology;
    const std::string field = fmt::format("topology.racks[{}].interhub", topo.rack);
    const net::Endpoint& interhub = topo.racks[topo.rack].interhub;
    // Hub links use RDMA when it runs (RdmaListener::ListenForHubs), else TCP.
    if (rdma_runs) {
      if (interhub.host != rdma_listen.host || interhub.port != rdma_listen.port) {
        rows.push_back(CheckRdmaPort("interhub port", field, interhub, true));
      }
    } else {
      rows.push_back(CheckTcpPort("interhub port", field, interhub, lock_holder));
    }
  }
  rows.push_back(CheckStateDir(config));
  rows.push_back(CheckStateLock(config, lock_holder));
  rows.push_back(CheckRegistryFile(config));
  rows.push_back(CheckLanesVsCores(config));
  rows.push_back(CheckNuma(config, devices, rdma_runs));
  return rows;
}

std::string FormatTable(const std::vector<Row>& rows) {
  size_t width = 5;  // "CHECK"
  for (const auto& r : rows) width = std::max(width, r.check.size());
  width += 2;
  const std::string indent(width + 8, ' ');
  std::string out = fmt::format("{:<{}}{:<8}{}\n", "CHECK", width, "RESULT", "DETAIL");
  std::map<Verdict, int> counts;
  for (const auto& r : rows) {
    ++counts[r.verdict];
    for (size_t i = 0; i < std::max<size_t>(r.detail.size(), 1); ++i) {
      const std::string& line = i < r.detail.size() ? r.detail[i] : "";
      out += i == 0 ? fmt::format("{:<{}}{:<8}{}\n", r.check, width, VerdictName(r.verdict), line)
                    : indent + line + "\n";
    }
    if (r.verdict == Verdict::kWarn || r.verdict == Verdict::kFail) {
      if (r.fix.empty()) std::abort();  // REQUIRES: every WARN and FAIL says how to fix it
      out += indent + "fix: " + r.fix + "\n";
    }
  }
  out += fmt::format("\n{} PASS, {} WARN, {} FAIL, {} SKIP: {}\n", counts[Verdict::kPass],
                     counts[Verdict::kWarn], counts[Verdict::kFail], counts[Verdict::kSkip],
                     counts[Verdict::kFail] > 0 ? "a start is likely to fail; fix the FAIL rows"
                                                : "nothing found that stops a start");
  return out;
}

}  // namespace rackhub::server::doctor

namespace rackhub::server {

bool RunDoctor(const Config& config, const std::string& config_file, std::FILE* out) {
  const std::vector<doctor::Row> rows = doctor::RunChecks(config, config_file);
  std::fprintf(out,
               "rackhubd --doctor: checks as uid %d with this process's limits; a systemd unit "
               "runs with its own User= and Limit*= settings\n\n",
               static_cast<int>(geteuid()));
  std::fputs(doctor::FormatTable(rows).c_str(), out);
  std::fflush(out);
  return std::none_of(rows.begin(), rows.end(),
                      [](const doctor::Row& r) { return r.verdict == doctor::Verdict::kFail; });
}

}  // namespace rackhub::server
