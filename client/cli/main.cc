// rackhubctl: command-line client of rackhubd's admin gRPC API
// (rackhub.admin.v1). The command tree and its help are in commands.cc (CLI11).
#include <grpc/support/log.h>

#include <cstdlib>
#include <exception>
#include <iostream>

#include <CLI/CLI.hpp>

#include "args.h"
#include "commands.h"
#include "connection.h"

#ifndef RACKHUBCTL_VERSION
#define RACKHUBCTL_VERSION "unknown"
#endif

namespace {

// gRPC logs connection failures on its own; rackhubctl reports them itself.
// Setting GRPC_VERBOSITY brings gRPC's log back.
void QuietGrpcLog(gpr_log_func_args* /*args*/) {}

int UsageFailure(const std::string& message) {
  std::cerr << "rackhubctl: " << message << " (see 'rackhubctl --help')" << std::endl;
  return rackhub::cli::kExitUsage;
}

int Run(int argc, char** argv) {
  using namespace rackhub::cli;
  if (std::getenv("GRPC_VERBOSITY") == nullptr) gpr_set_log_function(QuietGrpcLog);
  Commands commands;
  commands.app().set_version_flag("--version", "rackhubctl " RACKHUBCTL_VERSION,
                                  "show the version and exit");
  double timeout_seconds = 10;
  try {
    try {
      commands.app().parse(argc, argv);
    } catch (const CLI::CallForHelp&) {
      std::cout << commands.HelpText();
      return kExitOk;
    } catch (const CLI::CallForVersion& e) {
      std::cout << e.what() << "\n";
      return kExitOk;
    } catch (const CLI::ParseError& e) {
      commands.CheckComplete();  // leftovers (e.g. an unknown option) explain more
      return UsageFailure(commands.Describe(e));
    }
    if (commands.HelpSelected()) {
      std::cout << commands.HelpText();
      return kExitOk;
    }
    commands.CheckComplete();
    const CommandLine cl = CollectCommandLine(commands.app());
    ConnectionOptions options = ReadConnectionOptions(cl);
    timeout_seconds = options.timeout_seconds;
    Connection connection(std::move(options));
    const int code = commands.Run(connection, cl, std::cout);
    std::cout.flush();
    return code;
  } catch (const UsageError& e) {
    return UsageFailure(e.what());
  } catch (const LocalError& e) {
    std::cerr << "rackhubctl: " << e.what() << std::endl;
    return kExitUsage;
  } catch (const RpcError& e) {
    std::cerr << DescribeRpcError(e, timeout_seconds) << std::endl;
    return ExitCodeFor(e.status());
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "rackhubctl: internal error: " << e.what() << std::endl;
    return 1;
  }
}
