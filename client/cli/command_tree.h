// Building blocks of rackhubctl's CLI11 command tree, shared by the files that
// add commands: commands.cc (tenant, key, stats, help) and
// checkpoint_commands.cc (checkpoint). Each command is a CLI11 subcommand plus
// one Handler, registered in Commands' handler map. Main thread only.
#pragma once

#include <functional>
#include <map>
#include <string>

#include <CLI/CLI.hpp>

#include "commands.h"
#include "connection.h"
#include "format.h"

namespace rackhub::cli {

using Handler = std::function<Status(const Invocation&)>;
using Handlers = std::map<const CLI::App*, Handler>;

// A command under `parent`: `summary` (one line) is listed in the parent's
// help; `details` (may be empty) opens the command's own help footer.
CLI::App* AddCommand(CLI::App* parent, const std::string& name, const std::string& summary,
                     const std::string& details = "");

// A required positional argument, shown as NAME (not "NAME TEXT").
CLI::Option* AddArgument(CLI::App* command, const std::string& name, std::string* value,
                         const std::string& what);

// Whether `option` ("--lr", or a positional's name) was given to `command`.
bool Given(const CLI::App& command, const std::string& option);

// Emits `message` as JSON (--json, PrintJson's Status) or through `human`.
template <typename Message, typename Human>
Status Emit(const Invocation& inv, const Message& message, Human human) {
  if (inv.connection.options().json) return PrintJson(inv.out, message);
  human();
  return Status::Ok();
}

// checkpoint create|list|delete|restore under `checkpoint`
// (checkpoint_commands.cc).
void AddCheckpointCommands(CLI::App* checkpoint, Handlers* handlers);

// top and stalls under the root `app` (monitor_commands.cc).
void AddMonitorCommands(CLI::App* app, Handlers* handlers);

}  // namespace rackhub::cli
