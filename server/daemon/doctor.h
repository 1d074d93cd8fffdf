// rackhubd --doctor: checks this host for what commonly breaks a start of
// rackhubd with a given (valid) Config, and prints one row per check: PASS,
// WARN, FAIL or SKIP, what was found, and for every WARN and FAIL the fix.
//
// Every check reads the real system (getrlimit(2), capget(2), the verbs
// device list, bind(2) / rdma_bind_addr(3) probes, /sys, /proc/locks) and
// returns a row; a check that cannot tell says so in its row and the others
// still run. Nothing here starts a daemon thread, holds a port past its
// check, takes the state directory's lock, or opens the registry database
// with SQLite: the state directory only sees a probe file (or directory)
// that is removed at once, and the registry file is only read.
//
// Plain functions on the main thread, before any other thread exists.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "config.h"
#include "rackhub/net/endpoint.h"

namespace rackhub::server::doctor {

enum class Verdict { kPass, kWarn, kFail, kSkip };
// "PASS", "WARN", "FAIL", "SKIP".
const char* VerdictName(Verdict verdict);

struct Row {
  std::string check;                // short name, e.g. "memlock", "data port"
  Verdict verdict = Verdict::kPass;
  std::vector<std::string> detail;  // what was found, one line each
  std::string fix;                  // REQUIRES: not empty for kWarn and kFail
};

// One GID table entry in use (ibv_query_gid(3); type and netdev from sysfs
// ports/N/gid_attrs/, empty where the kernel has none).
struct VerbsGid {
  int index = 0;
  std::string gid;     // IPv6 notation
  std::string type;    // "IB/RoCE v1", "RoCE v2"
  std::string netdev;  // RoCE: the Ethernet interface
};
struct VerbsPort {
  uint32_t number = 0;     // from 1 (ibv_query_port(3))
  bool active = false;     // IBV_PORT_ACTIVE
  std::string state;       // ibv_port_state_str(3)
  std::string link_layer;  // "InfiniBand", "Ethernet"
  std::vector<VerbsGid> gids;
};
struct VerbsDevice {
  std::string name;
  int numa_node = -1;  // /sys/class/infiniband/DEV/device/numa_node; -1: unknown
  std::string error;   // not empty: the device could not be opened or queried
  std::vector<VerbsPort> ports;
  uint32_t active_ports() const;
};
// The verbs devices of this host (ibv_get_device_list(3)).
std::vector<VerbsDevice> ReadVerbsDevices();

// Whether rackhubd would start its RDMA data plane with `config` on these
// devices (RdmaListener::ListenConfigured): data.transport rdma or auto and
// an active port on data.rdma_device (any device when that is empty).
bool RdmaWouldRun(const Config& config, const std::vector<VerbsDevice>& devices);

// The pid holding <state.dir>/rackhubd.lock (a running rackhubd), from
// /proc/locks; nullopt when no process holds it or it does not exist.
std::optional<long> StateLockHolder(const Config& config);

// The cpus lane i is pinned to (LaneSet::Start: the i-th available cpu,
// wrapping round), or every available cpu for each lane when lanes.pin is
// false. One entry per lane.
std::vector<std::vector<int>> LaneCpus(const Config& config);

// The checks, one row each.
Row CheckConfig(const Config& config, const std::string& config_file);
Row CheckVerbsDevices(const Config& config, const std::vector<VerbsDevice>& devices);
Row CheckMemlock(const Config& config, bool rdma_runs);
// A TCP listen address (bind(2) with SO_REUSEADDR, then listen(2), as the
// daemon's listeners do). `field` names the config field to change.
Row CheckTcpPort(const std::string& check, const std::string& field, const net::Endpoint& endpoint,
                 std::optional<long> lock_holder);
// An rdma_cm listen address (rdma_bind_addr(3)), when RDMA would run.
Row CheckRdmaPort(const std::string& check, const std::string& field,
                  const net::Endpoint& endpoint, bool rdma_runs);
Row CheckStateDir(const Config& config);
Row CheckStateLock(const Config& config, std::optional<long> lock_holder);
Row CheckRegistryFile(const Config& config);
Row CheckLanesVsCores(const Config& config);
Row CheckNuma(const Config& config, const std::vector<VerbsDevice>& devices, bool rdma_runs);

// Every check, in the order they are printed.
std::vector<Row> RunChecks(const Config& config, const std::string& config_file);

// The aligned table (CHECK, RESULT, DETAIL; a "fix:" line under each WARN
// and FAIL) and a summary line.
std::string FormatTable(const std::vector<Row>& rows);

}  // namespace rackhub::server::doctor

namespace rackhub::server {

// Runs every check and prints the table to `out`. Returns true when no
// check FAILed (exit 0), false otherwise (exit 1).
// REQUIRES: config passed ValidateConfig.
bool RunDoctor(const Config& config, const std::string& config_file, std::FILE* out);

}  // namespace rackhub::server
