// rackhubctl: command-line client of rackhubd's admin gRPC API
// (rackhub.admin.v1). See help.cc for the usage text.
#include <grpc/support/log.h>

#include <cstdlib>
#include <exception>
#include <iostream>

#include "args.h"
#include "commands.h"
#include "connection.h"
#include "help.h"

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
  double timeout_seconds = 10;
  try {
    const CommandLine cl = Tokenize(argc, argv);
    if (cl.help) {
      std::cout << kHelpText;
      return kExitOk;
    }
    if (cl.version) {
      std::cout << "rackhubctl " << RACKHUBCTL_VERSION << "\n";
      return kExitOk;
    }
    if (!cl.words.empty() && cl.words[0] == "help") {
      std::cout << kHelpText;
      return kExitOk;
    }
    std::vector<std::string> args;
    const CommandSpec& command = ResolveCommand(cl, &args);
    ConnectionOptions options = ReadConnectionOptions(cl);
    timeout_seconds = options.timeout_seconds;
    Connection connection(std::move(options));
    const Invocation invocation{cl, std::move(args), connection, std::cout};
    const int code = command.run(invocation);
    std::cout.flush();
    return code;
  } catch (const UsageError& e) {
    return UsageFailure(e.what());
  } catch (const LocalError& e) {
    std::cerr << "rackhubctl: " << e.what() << std::endl;
    return kExitUsage;
  } catch (const RpcError& e) {
    std::cerr << DescribeRpcError(e, timeout_seconds) << std::endl;
    return ExitCodeFor(e.status().error_code());
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
