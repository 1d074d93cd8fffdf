// Building blocks of rackhubctl's CLI11 command tree, shared by the files that
// add commands: commands.cc (stats, help, the tree), tenant_commands.cc,
// key_commands.cc, checkpoint_commands.cc and monitor_commands.cc, and the
// option groups several commands share (option_groups.cc). Each command is a
// CLI11 subcommand plus one Handler, registered in Commands' handler map:
// DefineCommand makes the subcommand and the values its options bind to,
// Handle registers what it does, Call / CallAndShow make its admin call and
// show the answer. A command file states only what is its own: options,
// request, and the human rendering of the response.
//
// Ownership: a command's values (DefineCommand's `Args`) are shared by its
// NewCommand and its handler, so they live as long as the Commands that holds
// the handler map; CLI11 holds pointers into them.
// Threads: main thread only.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <ostream>
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

// The optional positional TENANT of stats, top and stalls: "only this
// tenant (default: all)".
CLI::Option* AddTenantFilter(CLI::App* command, std::string* tenant);

// An option holding a number of seconds (SecondsValidator), kept as text.
CLI::Option* AddSecondsOption(CLI::App* command, const std::string& name, std::string* value,
                              const std::string& what);

// Whether `option` ("--lr", or a positional's name) was given to `command`.
bool Given(const CLI::App& command, const std::string& option);

// ---- Defining a command ---------------------------------------------------

// A command being defined: its CLI11 subcommand and the values its options
// and arguments bind to.
template <typename Args>
struct NewCommand {
  CLI::App* app;
  std::shared_ptr<Args> args;
};

// AddCommand, with a default-constructed `Args` for its options to bind to.
template <typename Args>
NewCommand<Args> DefineCommand(CLI::App* parent, const std::string& name,
                               const std::string& summary, const std::string& details = "") {
  return {AddCommand(parent, name, summary, details), std::make_shared<Args>()};
}

// Registers what `command` does: `run(inv, args)`, returning its Status.
template <typename Args, typename Run>
void Handle(Handlers* handlers, const NewCommand<Args>& command, Run run) {
  (*handlers)[command.app] = [args = command.args, run](const Invocation& inv) -> Status {
    return run(inv, static_cast<const Args&>(*args));
  };
}

// ---- Admin calls ------------------------------------------------------------

// A unary method of a generated admin stub, e.g. &admin::KeyService::Stub::GetKey.
template <typename Stub, typename Request, typename Response>
using Method = grpc::Status (Stub::*)(grpc::ClientContext*, const Request&, Response*);

// One admin call on the connection: a context with the call's deadline and
// token (Connection::Prepare), the deadline extended by `extra_wait` for a
// call the daemon may hold that long before it answers; a failed call as
// Check's Status (the connection remembers it for main()).
template <typename Stub, typename Request, typename Response>
Result<Response> Call(const Invocation& inv, Method<Stub, Request, Response> method,
                      const Request& request,
                      std::chrono::milliseconds extra_wait = std::chrono::milliseconds(0)) {
  Stub stub(inv.connection.channel());
  grpc::ClientContext context;
  inv.connection.Prepare(&context);
  if (extra_wait.count() > 0) context.set_deadline(context.deadline() + extra_wait);
  Response response;
  if (Status s = Check((stub.*method)(&context, request, &response), inv.connection); !s.ok()) {
    return s;
  }
  return response;
}

// Emits `message` as JSON (--json, PrintJson's Status) or through `human`.
template <typename Message, typename Human>
Status Emit(const Invocation& inv, const Message& message, Human human) {
  if (inv.connection.options().json) return PrintJson(inv.out, message);
  human();
  return Status::Ok();
}

// Call, then Emit the response: for people, `show(inv.out, response)`.
template <typename Stub, typename Request, typename Response, typename Show>
Status CallAndShow(const Invocation& inv, Method<Stub, Request, Response> method,
                   const Request& request, Show show,
                   std::chrono::milliseconds extra_wait = std::chrono::milliseconds(0)) {
  const Result<Response> response = Call(inv, method, request, extra_wait);
  if (!response.ok()) return response.status();
  return Emit(inv, *response, [&] { show(inv.out, *response); });
}

// ---- Options ----------------------------------------------------------------

// The names of `choices` (for OneOfValidator).
template <typename T>
std::vector<std::string> Names(const std::vector<std::pair<std::string, T>>& choices) {
  std::vector<std::string> names;
  for (const auto& [name, value] : choices) names.push_back(name);
  return names;
}

// An option whose value is one of the names of `table` (OneOfValidator),
// shown as `type_name`, by default the names joined by '|' ("mean|sum").
template <typename Enum>
CLI::Option* AddChoiceOption(CLI::App* command, const std::string& name, std::string* value,
                             const std::string& what, const NameTable<Enum>& table,
                             std::string type_name = "") {
  const std::vector<std::string> names = Names(table);
  if (type_name.empty()) {
    for (const std::string& n : names) type_name += (type_name.empty() ? "" : "|") + n;
  }
  return command->add_option(name, *value, what)
      ->type_name(type_name)
      ->check(OneOfValidator(names));
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
