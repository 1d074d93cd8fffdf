// rackhubd entry point: parse the command line and config, then run.
#include <cstdio>

#include "config.h"
#include "daemon.h"
#include "doctor.h"
#include "rackhub/net/endpoint.h"

#ifndef RACKHUB_VERSION
#define RACKHUB_VERSION "0.0.0"
#endif

int main(int argc, char** argv) {
  using namespace rackhub::server;
  const ParseResult parsed = ParseCommandLine(argc, argv);
  if (parsed.command_line.help) {
    std::fputs(UsageText().c_str(), stdout);
    return kExitOk;
  }
  if (parsed.command_line.version) {
    std::printf("rackhubd %s\n", RACKHUB_VERSION);
    return kExitOk;
  }
  if (!parsed.ok()) {
    for (const auto& e : parsed.errors) std::fprintf(stderr, "rackhubd: config error: %s\n", e.c_str());
    return kExitConfigError;
  }
  const Config& c = parsed.config;
  if (parsed.command_line.doctor) {
    return RunDoctor(c, parsed.command_line.config_file, stdout) ? kExitOk : kExitRuntimeError;
  }
  if (parsed.command_line.check_config) {
    std::printf("rackhubd: configuration OK: admin %s, data %s, %u lanes%s, admin auth %s, TLS %s\n",
                c.admin.listen.ToString().c_str(), c.data.listen.ToString().c_str(),
                EffectiveLaneCount(c), c.lanes.pin ? " (pinned)" : "",
                c.admin.token_file.empty() ? "off" : "token",
                c.admin.tls_cert_file.empty()
                    ? "off"
                    : (c.admin.tls_client_ca_file.empty() ? "on" : "on, client certificates"));
    std::printf("rackhubd: state: %s\n",
                c.state.in_memory ? "in memory (nothing is stored)" : c.state.dir.c_str());
    if (c.registry.backend == "etcd") {
      std::printf("rackhubd: registry: etcd at %s, prefix %s\n", c.registry.etcd_endpoints.c_str(),
                  c.registry.etcd_prefix.c_str());
    }
    if (c.topology.racks_from == "etcd") {
      std::printf("rackhubd: topology: rack %u of %u from etcd, %s, hub links on %s\n",
                  c.topology.rack, c.topology.discover_racks, c.topology.mode.c_str(),
                  c.topology.interhub.ToString().c_str());
    }
    if (!c.topology.racks.empty()) {
      std::printf("rackhubd: topology: rack %u of %u, %s, hub links on %s\n", c.topology.rack,
                  c.topology.rack_count(), c.topology.mode.c_str(),
                  c.topology.racks[c.topology.rack].interhub.ToString().c_str());
    }
    return kExitOk;
  }
  return RunDaemon(c, parsed.notices);
}
