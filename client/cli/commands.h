// rackhubctl's commands as one CLI11 command tree: the global options, every
// command (tenant create|get|list|update-quotas|delete, key
// create|get|list|delete|set-optimizer, checkpoint create|list|delete|restore,
// stats, top, stalls, help) with its positional arguments, options, validation and help
// text, and one handler per command. The tenant commands live in
// tenant_commands.cc, the key commands in key_commands.cc, the checkpoint
// commands in checkpoint_commands.cc, top and stalls in monitor_commands.cc;
// the helpers these files build commands with are in command_tree.h.
//
// Ownership: Commands owns the CLI11 app and the values its options are bound
// to; CLI11 holds pointers into it, so it is neither copied nor moved.
// Threads: main thread only.
#pragma once

#include <functional>
#include <map>
#include <ostream>
#include <string>

#include <CLI/CLI.hpp>

#include "args.h"
#include "connection.h"
#include "rackhub/common/status.h"

namespace rackhub::cli {

// What a command handler gets.
struct Invocation {
  const CLI::App& command;  // the selected command (count("--lr"): was --lr given)
  const CommandLine& cl;    // every option given, as text
  Connection& connection;
  std::ostream& out;
};

class Commands {
 public:
  Commands();
  Commands(const Commands&) = delete;
  Commands& operator=(const Commands&) = delete;

  CLI::App& app() { return app_; }

  // After app().parse(), whether it threw or not: INVALID_ARGUMENT for what
  // CLI11 leaves to the caller, with a message naming the culprit: arguments
  // no command took (unknown command, unexpected argument, unknown option or
  // one of another command), no command, or a command group without its
  // subcommand ("tenant", "checkpoint").
  Status CheckComplete() const;
  // A CLI11 parse error as one line, naming the command when the error's own
  // text does not name the option.
  std::string Describe(const CLI::ParseError& error) const;

  // The help text --help asked for (the selected command's, else the
  // overview), or the one `help [COMMAND...]` names. INVALID_ARGUMENT for an
  // unknown command after `help`.
  Result<std::string> HelpText() const;
  // Whether the selected command is `help` (it needs no daemon).
  bool HelpSelected() const;

  // Runs the selected command. REQUIRES: CheckComplete() passed and
  // !HelpSelected(). OK, or the failure main() reports (connection.h,
  // "Failures").
  Status Run(Connection& connection, const CommandLine& cl, std::ostream& out) const;

 private:
  // The selected command: the deepest selected subcommand (the root if none).
  const CLI::App& Selected() const;
  // "tenant create" for the selected command.
  std::string SelectedName() const;

  CLI::App app_;
  CLI::App* help_ = nullptr;
  std::vector<std::string> help_words_;  // positional arguments of `help`
  std::map<const CLI::App*, std::function<Status(const Invocation&)>> handlers_;
};

}  // namespace rackhub::cli
