#include "rackhub/net/rdma/device.h"

#include <infiniband/verbs.h>
#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace rackhub::net::rdma {

std::optional<Transport> ParseTransport(const std::string& text) {
  if (text == "tcp") return Transport::kTcp;
  if (text == "rdma") return Transport::kRdma;
  if (text == "auto") return Transport::kAuto;
  return std::nullopt;
}

const char* TransportName(Transport t) {
  switch (t) {
    case Transport::kTcp: return "tcp";
    case Transport::kRdma: return "rdma";
    case Transport::kAuto: return "auto";
  }
  return "?";
}

std::vector<DeviceInfo> ListDevices() {
  std::vector<DeviceInfo> out;
  int count = 0;
  // ibv_get_device_list(3): NULL-terminated array, freed with ibv_free_device_list.
  ibv_device** list = ibv_get_device_list(&count);
  if (!list) return out;
  for (int i = 0; i < count; ++i) {
    DeviceInfo info;
    info.name = ibv_get_device_name(list[i]);
    if (ibv_context* ctx = ibv_open_device(list[i])) {
      ibv_device_attr attr{};
      if (ibv_query_device(ctx, &attr) == 0) {
        // Ports are numbered from 1 (ibv_query_port(3)).
        for (uint8_t p = 1; p <= attr.phys_port_cnt; ++p) {
          ibv_port_attr pa{};
          if (ibv_query_port(ctx, p, &pa) == 0 && pa.state == IBV_PORT_ACTIVE) {
            ++info.active_ports;
          }
        }
      }
      ibv_close_device(ctx);
    }
    out.push_back(std::move(info));
  }
  ibv_free_device_list(list);
  return out;
}

bool DevicePresent(const std::string& name) {
  for (const auto& d : ListDevices()) {
    if (d.active_ports > 0 && (name.empty() || d.name == name)) return true;
  }
  return false;
}

MemlockStatus CurrentMemlock() {
  MemlockStatus s;
  rlimit rl{};
  if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
    s.limit = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : static_cast<uint64_t>(rl.rlim_cur);
  }
  // capget(2) without libcap: version 3 uses two 32-bit words per set.
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  if (syscall(SYS_capget, &header, data) == 0) {
    s.cap_ipc_lock = (data[CAP_IPC_LOCK / 32].effective >> (CAP_IPC_LOCK % 32)) & 1u;
  }
  return s;
}

Status CheckMemlock(uint64_t planned, const MemlockStatus& status, const std::string& what) {
  if (status.cap_ipc_lock || status.limit == UINT64_MAX || planned <= status.limit) {
    return Status::Ok();
  }
  const auto kib = [](uint64_t b) { return std::to_string((b + 1023) / 1024) + " KiB"; };
  return ResourceExhausted(
      what + " registers " + kib(planned) + " of RDMA memory but the locked-memory limit " +
      "(RLIMIT_MEMLOCK, `ulimit -l`) is " + kib(status.limit) +
      "; raise it: LimitMEMLOCK=infinity in the systemd unit, `ulimit -l unlimited` in a "
      "shell, or memlock in /etc/security/limits.conf (or give the process CAP_IPC_LOCK)");
}

}  // namespace rackhub::net::rdma
