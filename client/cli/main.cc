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

// The one place a failure is printed (connection.h, "Failures"). `connection`:
// null before one exists.
int Failure(const rackhub::Status& status, const rackhub::cli::Connection* connection) {
  using namespace rackhub::cli;
  if (connection != nullptr && connection->failed_call()) {
    const grpc::Status& call = *connection->failed_call();
    std::cerr << DescribeRpcError(call, connection->options().admin,
                                  connection->options().timeout_seconds)
              << std::endl;
    return ExitCodeFor(call);
  }
  switch (status.code()) {
    case rackhub::StatusCode::kInvalidArgument:
      return UsageFailure(status.message());
    case rackhub::StatusCode::kInternal:
      std::cerr << "rackhubctl: internal error: " << status.message() << std::endl;
      return 1;
    default:
      std::cerr << "rackhubctl: " << status.message() << std::endl;
      return kExitUsage;
  }
}

int PrintHelp(const rackhub::cli::Commands& commands) {
  const rackhub::Result<std::string> help = commands.HelpText();
  if (!help.ok()) return Failure(help.status(), nullptr);
  std::cout << *help;
  return rackhub::cli::kExitOk;
}

int Run(int argc, char** argv) {
  using namespace rackhub::cli;
  if (std::getenv("GRPC_VERBOSITY") == nullptr) gpr_set_log_function(QuietGrpcLog);
  Commands commands;
  commands.app().set_version_flag("--version", "rackhubctl " RACKHUBCTL_VERSION,
                                  "show the version and exit");
  // CLI11 reports what parse() finds by exceptions, also from the commands'
  // callbacks (CLI::ValidationError): caught here, at the top.
  try {
    commands.app().parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    return PrintHelp(commands);
  } catch (const CLI::CallForVersion& e) {
    std::cout << e.what() << "\n";
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    // Leftovers (e.g. an unknown option) explain more.
    if (rackhub::Status s = commands.CheckComplete(); !s.ok()) return Failure(s, nullptr);
    return UsageFailure(commands.Describe(e));
  }
  if (commands.HelpSelected()) return PrintHelp(commands);
  if (rackhub::Status s = commands.CheckComplete(); !s.ok()) return Failure(s, nullptr);
  const CommandLine cl = CollectCommandLine(commands.app());
  rackhub::Result<ConnectionOptions> options = ReadConnectionOptions(cl);
  if (!options.ok()) return Failure(options.status(), nullptr);
  Connection connection(*std::move(options));
  const rackhub::Status status = commands.Run(connection, cl, std::cout);
  std::cout.flush();
  return status.ok() ? kExitOk : Failure(status, &connection);
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
