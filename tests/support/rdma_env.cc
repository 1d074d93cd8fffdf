#include "rdma_env.h"

#include <arpa/inet.h>
#include <ifaddrs.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include "rackhub/net/rdma/device.h"

namespace rackhub::testing {

std::string RdmaAddress() {
  if (const char* ip = std::getenv("RACKHUB_TEST_RDMA_IP")) return ip;
  std::vector<std::string> netdevs;
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const auto& dev : fs::directory_iterator("/sys/class/infiniband", ec)) {
    for (const auto& nd : fs::directory_iterator(dev.path() / "ports/1/gid_attrs/ndevs", ec)) {
      std::ifstream f(nd.path());
      std::string name;
      if (f >> name) netdevs.push_back(name);
    }
  }
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* a = list; a && found.empty(); a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET) continue;
    if (std::find(netdevs.begin(), netdevs.end(), a->ifa_name) == netdevs.end()) continue;
    char text[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof text);
    found = text;
  }
  freeifaddrs(list);
  return found;
}

bool HaveRdma(std::string* ip, std::string* why) {
  if (!net::rdma::DevicePresent()) {
    *why = "no RDMA verbs device with an active port here; run tests/rdma/run.sh (Soft-RoCE VM)";
    return false;
  }
  *ip = RdmaAddress();
  if (ip->empty()) {
    *why = "an RDMA device but no IPv4 address on its interface (set RACKHUB_TEST_RDMA_IP)";
    return false;
  }
  return true;
}

}  // namespace rackhub::testing
