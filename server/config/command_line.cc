// rackhubd's command line, parsed with CLI11: action flags (--help,
// --version, --check-config [FILE], --doctor [FILE]), the config file, and
// flags that override config fields (FlagFields(); applied after the file,
// whatever their position, through the same setters as the file's values).
// Errors name the flag (and its field); every error is collected, none is
// fatal here (main prints them and exits 78).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <unistd.h>

#include <cstdlib>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <toml++/toml.h>

#include "config.h"

namespace rackhub::server {
namespace {

// Command-line flag -> config field. Flags that are not config fields
// (--config, --check-config, ...) are declared in ParseCommandLine.
const std::map<std::string, std::string>& FlagFields() {
  static const std::map<std::string, std::string> flags = {
      {"--log-level", "log_level"},
      {"--ready-file", "ready_file"},
      {"--admin-listen", "admin.listen"},
      {"--admin-token-file", "admin.token_file"},
      {"--admin-readonly-token-file", "admin.readonly_token_file"},
      {"--admin-tls-cert", "admin.tls_cert_file"},
      {"--admin-tls-key", "admin.tls_key_file"},
      {"--admin-tls-client-ca", "admin.tls_client_ca_file"},
      {"--data-listen", "data.listen"},
      {"--transport", "data.transport"},
      {"--rdma-listen", "data.rdma_listen"},
      {"--rdma-device", "data.rdma_device"},
      {"--rdma-poll", "data.rdma_poll"},
      {"--shm", "data.shm"},
      {"--shm-ring-bytes", "data.shm_ring_bytes"},
      {"--shm-poll", "data.shm_poll"},
      {"--straggler-timeout-ms", "data.straggler_timeout_ms"},
      {"--hello-timeout-ms", "data.hello_timeout_ms"},
      {"--max-queued-bytes-per-connection", "data.max_queued_bytes_per_connection"},
      {"--intake-lead-bytes", "data.intake_lead_bytes"},
      {"--tcp-receive-buffer", "data.tcp_receive_buffer"},
      {"--scheduler", "data.scheduler"},
      {"--max-unauthenticated-connections", "data.max_unauthenticated_connections"},
      {"--metrics-listen", "metrics.listen"},
      {"--lanes", "lanes.count"},
      {"--pin-lanes", "lanes.pin"},
      {"--rack", "topology.rack"},
      {"--racks", "topology.racks"},
      {"--topology-mode", "topology.mode"},
      {"--hub-secret-file", "topology.secret_file"},
      {"--hub-tls-cert", "topology.tls_cert_file"},
      {"--hub-tls-key", "topology.tls_key_file"},
      {"--hub-tls-ca", "topology.tls_ca_file"},
      {"--racks-from", "topology.racks_from"},
      {"--rack-count", "topology.rack_count"},
      {"--interhub", "topology.interhub"},
      {"--discover-timeout-s", "topology.discover_timeout_s"},
      {"--advertise-data", "topology.advertise_data"},
      {"--registry", "registry.backend"},
      {"--etcd-endpoints", "registry.etcd_endpoints"},
      {"--etcd-prefix", "registry.etcd_prefix"},
      {"--etcd-timeout-ms", "registry.etcd_timeout_ms"},
      {"--lease-ttl-s", "registry.lease_ttl_s"},
      {"--state-dir", "state.dir"},
      {"--checkpoint-every-iterations", "checkpoint.every_iterations"},
      {"--checkpoint-every-seconds", "checkpoint.every_seconds"},
      {"--checkpoint-keep", "checkpoint.keep"},
  };
  return flags;
}

// Two names of one file: the same text or the same file (hard links,
// symlinks, "./x" and "x").
bool SameFile(const std::string& a, const std::string& b) {
  if (a == b) return true;
  std::error_code ec;
  return std::filesystem::equivalent(a, b, ec) && !ec;
}

// The config file from --config FILE and the FILE of --check-config /
// --doctor: any of them, and all must name the same file.
void ResolveConfigFile(const std::optional<std::string>& config_flag_file,
                       const std::vector<std::pair<std::string, std::string>>& action_files,
                       CommandLine* command_line, std::vector<std::string>* errors) {
  if (config_flag_file) {
    command_line->config_file = *config_flag_file;
    command_line->config_option = "--config";
  }
  for (const auto& [option, file] : action_files) {
    if (command_line->config_file.empty()) {
      command_line->config_file = file;
      command_line->config_option = option;
    } else if (!SameFile(command_line->config_file, file)) {
      errors->push_back(fmt::format("{}: '{}' is not the file {} names ('{}'); give the file once",
                                    option, file, command_line->config_option,
                                    command_line->config_file));
    }
  }
}


// state.dir when neither the config file nor --state-dir sets it: the
// system directory (/var/lib/rackhub, what the systemd unit provides) when
// this user can write it or create it, else a per-user one, as etcd or
// Prometheus run for a normal user: $XDG_STATE_HOME/rackhub, or
// ~/.local/state/rackhub. Without a home the system directory stays and
// its error names the flags that fix it.
bool CanWriteOrCreate(const std::filesystem::path& dir) {
  std::error_code ec;
  if (std::filesystem::exists(dir, ec)) return access(dir.c_str(), W_OK | X_OK) == 0;
  for (std::filesystem::path p = dir.parent_path(); !p.empty(); p = p.parent_path()) {
    if (std::filesystem::exists(p, ec)) return access(p.c_str(), W_OK | X_OK) == 0;
    if (p == p.root_path()) break;
  }
  return false;
}

// True if the config file's text has state.dir (ParseConfigText reports
// the file's errors).
bool SetsStateDir(const std::string& text) {
  try {
    const toml::table table = toml::parse(text);
    return table["state"]["dir"].node() != nullptr;
  } catch (const toml::parse_error&) {
    return false;
  }
}

void ChooseStateDir(Config* config, std::vector<std::string>* notices) {
  const std::string system_dir = kSystemStateDir;
  if (config->state.in_memory || CanWriteOrCreate(system_dir)) return;
  std::string base;
  if (const char* xdg = std::getenv("XDG_STATE_HOME"); xdg != nullptr && xdg[0] == '/') {
    base = xdg;
  } else if (const char* home = std::getenv("HOME"); home != nullptr && home[0] == '/') {
    base = std::string(home) + "/.local/state";
  } else {
    return;
  }
  config->state.dir = base + "/rackhub";
  notices->push_back("state.dir: not set and " + system_dir +
                     " is not writable by this user: using the per-user " + config->state.dir +
                     " (set --state-dir DIR, or --in-memory to keep no state)");
}
}  // namespace

ParseResult ParseCommandLine(int argc, const char* const* argv) {
  ParseResult r;
  CLI::App app{"rackhub aggregation daemon"};
  app.set_help_flag();     // --help prints UsageText(), main decides
  app.allow_extras(true);  // unknown options are reported below, each by name
  app.add_flag("-h,--help", r.command_line.help);
  app.add_flag("--version", r.command_line.version);
  std::string config_file, check_file, doctor_file;
  CLI::Option* config = app.add_option("-c,--config", config_file)
                            ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  // Optional FILE: "=FILE", or the next argument unless it is an option.
  CLI::Option* check = app.add_option("--check-config", check_file)->expected(0, 1);
  CLI::Option* doctor = app.add_option("--doctor", doctor_file)->expected(0, 1);
  std::map<std::string, std::string> overrides;  // field -> text (the last flag wins)
  for (const auto& [flag, field] : FlagFields()) {
    app.add_option_function<std::string>(
           flag, [&overrides, field = field](const std::string& v) { overrides[field] = v; })
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  }
  bool no_pin = false, no_metrics = false, in_memory = false;
  app.add_flag("--no-pin-lanes", no_pin);
  app.add_flag("--no-metrics", no_metrics);
  app.add_flag("--in-memory", in_memory);

  const std::vector<std::string> args(argv + 1, argv + argc);
  try {
    std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 pops from the back
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    // "--lanes: 1 required TEXT missing" -> "--lanes: missing value".
    const std::string what = e.what();
    const auto colon = what.find(':');
    r.errors.push_back(e.get_name() == "ArgumentMismatch" && colon != std::string::npos
                           ? what.substr(0, colon) + ": missing value"
                           : what);
    return r;
  }
  for (const std::string& extra : app.remaining()) {
    r.errors.push_back(extra + (extra.rfind('-', 0) == 0 ? ": unknown option (see --help)"
                                                         : ": unexpected argument (see --help)"));
  }
  if (no_pin) overrides["lanes.pin"] = "false";
  if (no_metrics) overrides["metrics.enabled"] = "false";
  if (in_memory) overrides["state.in_memory"] = "true";
  r.command_line.check_config = check->count() > 0;
  r.command_line.doctor = doctor->count() > 0;
  if (r.command_line.check_config && r.command_line.doctor) {
    r.errors.push_back("--doctor: cannot be combined with --check-config (--doctor checks the "
                       "configuration too)");
  }
  std::vector<std::pair<std::string, std::string>> action_files;  // --check-config FILE, ...
  for (const auto& [name, opt, file] :
       {std::tuple{"--check-config", check, check_file}, std::tuple{"--doctor", doctor, doctor_file}}) {
    if (std::find(args.begin(), args.end(), std::string(name) + "=") != args.end()) {
      r.errors.push_back(std::string(name) + ": '=' without a file name");
    } else if (opt->count() > 0 && !file.empty()) {
      action_files.emplace_back(name, file);
    }
  }
  const std::optional<std::string> config_flag_file =
      config->count() > 0 ? std::optional(config_file) : std::nullopt;
  ResolveConfigFile(config_flag_file, action_files, &r.command_line, &r.errors);
  bool state_dir_given = overrides.count("state.dir") > 0;
  if (!r.command_line.config_file.empty()) {
    std::ifstream f(r.command_line.config_file, std::ios::binary);
    if (!f) {
      r.errors.push_back(r.command_line.config_option + ": cannot read '" +
                         r.command_line.config_file + "'");
    } else {
      std::stringstream ss;
      ss << f.rdbuf();
      ParseConfigText(ss.str(), r.command_line.config_file, &r.config, &r.errors);
      state_dir_given = state_dir_given || SetsStateDir(ss.str());
    }
  }
  for (const auto& [field, value] : overrides) {
    if (Status s = SetConfigField(field, value, &r.config); !s.ok()) {
      std::string flag = field;
      for (const auto& [f, name] : FlagFields())
        if (name == field) flag = f;
      r.errors.push_back(fmt::format("{} ({}): {}", flag, field, s.message()));
    }
  }
  // Given (even as "", which validation refuses) means used as given.
  if (!state_dir_given) ChooseStateDir(&r.config, &r.notices);
  if (r.errors.empty()) ValidateConfig(r.config, &r.errors);
  return r;
}

std::string UsageText() {
  return R"(usage: rackhubd [options]
       rackhubd --check-config [FILE] [options]
       rackhubd --doctor [FILE] [options]

rackhub aggregation daemon: a rack-scale parameter server.

options (flags override the config file):
  -c, --config FILE                 TOML config file (see deploy/rackhubd.toml)
      --check-config [FILE]         validate the configuration (FILE, the same as
                                    --config FILE) and exit: 0 = valid, 78 = not
      --doctor [FILE]               check this host for what breaks a start (config,
                                    memlock, verbs devices and GIDs, ports, state
                                    directory, lanes vs cores, NUMA), print a table
                                    with a fix for each problem and exit: 0 = no FAIL,
                                    1 = some FAIL, 78 = the configuration is invalid
      --data-listen HOST:PORT       data-plane address          [127.0.0.1:7700]
      --transport tcp|rdma|auto     data-plane transports (TCP always runs) [auto]
      --rdma-listen HOST:PORT       RDMA (rdma_cm) address [data host:7702]
      --rdma-device NAME            verbs device to use (multi-NIC hosts)
      --rdma-poll events|busy       RDMA completion handling [events]
      --admin-listen HOST:PORT      admin gRPC address           [127.0.0.1:7701]
      --straggler-timeout-ms MS     fail a waiting iteration after MS [30000]
      --hello-timeout-ms MS         close a connection without HELLO after MS [10000]
      --max-queued-bytes-per-connection SIZE  unwritten bytes per connection
                                    before it is closed (QUOTA_EXCEEDED) [64MiB]
      --intake-lead-bytes SIZE      workers in step: do not read a worker's TCP
                                    connection while its pushes waiting for
                                    updates exceed SIZE; 0 = off     [1MiB]
      --tcp-receive-buffer SIZE     SO_RCVBUF of worker TCP connections;
                                    0 = the kernel's autotuning     [256KiB]
      --scheduler fair|fifo         order of tenants' work on a lane  [fair]
      --max-unauthenticated-connections N  connections waiting for HELLO [1024]
      --metrics-listen HOST:PORT    Prometheus /metrics address   [127.0.0.1:7704]
      --no-metrics                  do not serve /metrics
      --lanes N                     lanes (pinned threads); 0 = one per core [0]
      --no-pin-lanes                do not pin lane threads to cores
      --admin-token-file FILE       admin token; required beyond loopback
      --admin-readonly-token-file FILE  token for read-only admin calls
      --admin-tls-cert FILE         TLS certificate (PEM) for the admin API
      --admin-tls-key FILE          TLS private key (PEM)
      --admin-tls-client-ca FILE    require client certificates signed by this CA
      --rack N                      this hub's rack index                 [0]
      --racks D=I,D=I,...           every rack's data=interhub addresses (multi-rack)
      --topology-mode MODE          hierarchical|flat                      [hierarchical]
      --hub-secret-file FILE        secret shared by the hubs (required with --racks)
      --hub-tls-cert FILE           TLS certificate (PEM) for hub links (mutual TLS)
      --hub-tls-key FILE            its private key (PEM)
      --hub-tls-ca FILE             CA (PEM) the other hubs' certificates must chain to
      --racks-from config|etcd      rack addresses from --racks or from etcd [config]
      --rack-count N                racks to wait for (--racks-from etcd)
      --interhub HOST:PORT          this hub's interhub address (--racks-from etcd)
      --advertise-data HOST:PORT    address workers use (--racks-from etcd) [data]
      --discover-timeout-s N        wait N s for the other racks (--racks-from etcd) [120]
      --registry sqlite|etcd        where tenants and keys live          [sqlite]
      --etcd-endpoints H:P,H:P      etcd members (--registry etcd)
      --etcd-prefix PREFIX          prefix of rackhub's etcd keys     [/rackhub/]
      --etcd-timeout-ms MS          deadline of each etcd call            [3000]
      --lease-ttl-s N               a dead hub leaves the cluster after N s  [5]
      --state-dir DIR               registry database and checkpoints [/var/lib/rackhub;
                                    for a user who cannot write it ~/.local/state/rackhub]
      --in-memory                   keep no state on disk; a restart starts empty
                                    (tests and benchmarks only)
      --checkpoint-every-iterations N  checkpoint a tenant every N updates; 0 = off [0]
      --checkpoint-every-seconds N  checkpoint every tenant every N s; 0 = off [300]
      --checkpoint-keep N           newest checkpoints kept per tenant (>= 1) [3]
      --log-level LEVEL             trace|debug|info|warn|error|critical|off [info]
      --ready-file FILE             write "admin ADDR", "data ADDR" (and "metrics
                                    ADDR") lines once listening
      --version                     print the version and exit
  -h, --help                        this text
)";
}

}  // namespace rackhub::server
