// Building blocks of rackhubctl's CLI11 command tree, shared by the files that
// add commands: commands.cc (stats, help, the tree), tenant_commands.cc,
// key_commands.cc, checkpoint_commands.cc and monitor_commands.cc, and the
// option groups several commands share (option_groups.cc). Each command is a
// CLI11 subcommand plus one Handler, registered in Commands' handler map.
// Main thread only.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

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

// The names of `choices` (for OneOfValidator).
template <typename T>
std::vector<std::string> Names(const std::vector<std::pair<std::string, T>>& choices) {
  std::vector<std::string> names;
  for (const auto& [name, value] : choices) names.push_back(name);
  return names;
}

// Whether any of `options` was given to `command`.
bool AnyGiven(const CLI::App& command, const std::vector<std::string>& options);

// ---- Option groups shared by several commands (option_groups.cc) ----------

// The optimizer options' names (--optimizer, --lr, ...) and the quota
// options' names (--max-param-bytes, --max-keys, --max-workers).
extern const std::vector<std::string> kOptimizerOptions;
extern const std::vector<std::string> kQuotaOptions;

struct OptimizerArgs {
  std::string type, reduction;
  double lr = 0, momentum = 0, weight_decay = 0, beta1 = 0, beta2 = 0, epsilon = 0,
         initial_accumulator = 0;
};

// `create`: the optimizer is given in full, so hyperparameters without a type
// (which would be ambiguous) are refused while parsing.
void AddOptimizerOptions(CLI::App* command, OptimizerArgs* a, bool create);

// Overlays the optimizer options given to `command` on `base`.
admin::Optimizer ApplyOptimizerOptions(const CLI::App& command, const OptimizerArgs& a,
                                       admin::Optimizer base);

struct QuotaArgs {
  uint64_t max_param_bytes = 0;
  uint32_t max_keys = 0, max_workers = 0, weight = 0;
};

void AddQuotaOptions(CLI::App* command, QuotaArgs* q);
admin::Quotas ToQuotas(const CLI::App& command, const QuotaArgs& q);

// ---- Commands -------------------------------------------------------------

// tenant create|get|list|set-quotas|delete under `tenant`
// (tenant_commands.cc).
void AddTenantCommands(CLI::App* tenant, Handlers* handlers);

// key create|get|list|delete|set-optimizer under `key` (key_commands.cc).
void AddKeyCommands(CLI::App* key, Handlers* handlers);

// checkpoint create|list|delete|restore under `checkpoint`
// (checkpoint_commands.cc).
void AddCheckpointCommands(CLI::App* checkpoint, Handlers* handlers);

// top and stalls under the root `app` (monitor_commands.cc).
void AddMonitorCommands(CLI::App* app, Handlers* handlers);

}  // namespace rackhub::cli
