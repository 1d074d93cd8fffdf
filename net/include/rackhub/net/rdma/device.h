// RDMA device discovery and the locked-memory check (no connection state).
//
// Thread-safe: plain functions; libibverbs' device list calls are thread-safe
// (ibv_get_device_list(3)).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "rackhub/common/status.h"

namespace rackhub::net::rdma {

// Data-plane transport as chosen in configs and client options.
enum class Transport { kTcp, kRdma, kAuto };
// "tcp" | "rdma" | "auto"; nullopt otherwise.
std::optional<Transport> ParseTransport(const std::string& text);
const char* TransportName(Transport t);

struct DeviceInfo {
  std::string name;          // e.g. "mlx5_0", "rxe0"
  uint32_t active_ports = 0; // ports in IBV_PORT_ACTIVE state
};
// Verbs devices of this host (ibv_get_device_list(3) + ibv_query_port(3)).
std::vector<DeviceInfo> ListDevices();
// True if some device has an active port (optionally: the named one).
bool DevicePresent(const std::string& name = "");

// Locked memory: RDMA registration pins pages and counts against
// RLIMIT_MEMLOCK (getrlimit(2)) unless the process has CAP_IPC_LOCK
// (capabilities(7)).
struct MemlockStatus {
  uint64_t limit = 0;      // bytes; UINT64_MAX = unlimited
  bool cap_ipc_lock = false;
};
MemlockStatus CurrentMemlock();
// OK if `planned` bytes may be registered under `status`, else
// RESOURCE_EXHAUSTED "<what> registers ..." naming the limit and how to raise
// it (`LimitMEMLOCK=infinity`, `ulimit -l`).
Status CheckMemlock(uint64_t planned, const MemlockStatus& status, const std::string& what);

}  // namespace rackhub::net::rdma
