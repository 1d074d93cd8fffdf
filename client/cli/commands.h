// rackhubctl commands: the command table (words, positional arguments,
// accepted options) and one handler per command.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "args.h"
#include "connection.h"

namespace rackhub::cli {

struct Invocation {
  const CommandLine& cl;
  std::vector<std::string> args;  // positional arguments after the command words
  Connection& connection;
  std::ostream& out;
};

struct CommandSpec {
  std::vector<std::string> words;      // e.g. {"tenant", "create"}
  std::vector<std::string> args;       // positional argument names, e.g. {"NAME"}
  size_t optional_args = 0;            // how many of the trailing `args` may be left out
  std::vector<std::string> options;    // command-specific options accepted
  std::vector<std::string> required;   // options that must be given
  int (*run)(const Invocation&);       // returns the exit code; throws RpcError/UsageError
};

// Options every command accepts.
const std::vector<std::string>& GlobalOptions();

// Finds the command named by the leading `words` of `cl` and checks the
// positional arguments and options against it. Returns the command and fills
// `args` with its positional arguments. Throws UsageError.
const CommandSpec& ResolveCommand(const CommandLine& cl, std::vector<std::string>* args);

}  // namespace rackhub::cli
