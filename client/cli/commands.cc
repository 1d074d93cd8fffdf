// rackhubctl's command tree (Commands): building it from the command files
// (tenant_commands.cc, key_commands.cc, checkpoint_commands.cc,
// monitor_commands.cc) plus stats and help, finding the selected command,
// checking it is complete, describing parse errors, and running its handler.
#include "commands.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <utility>

#include "command_tree.h"
#include "format.h"
#include "help.h"
#include "rackhub/admin/v1/admin.grpc.pb.h"

namespace rackhub::cli {

CLI::App* AddCommand(CLI::App* parent, const std::string& name, const std::string& summary,
                     const std::string& details) {
  CLI::App* command = parent->add_subcommand(name, summary);
  command->footer(details.empty() ? std::string(kCommandFooter)
                                  : details + "\n\n" + kCommandFooter);
  return command;
}

CLI::Option* AddArgument(CLI::App* command, const std::string& name, std::string* value,
                         const std::string& what) {
  return command->add_option(name, *value, what)->type_name("")->required();
}

CLI::Option* AddTenantFilter(CLI::App* command, std::string* tenant) {
  return command->add_option("TENANT", *tenant, "only this tenant (default: all)")->type_name("");
}

CLI::Option* AddSecondsOption(CLI::App* command, const std::string& name, std::string* value,
                              const std::string& what) {
  return command->add_option(name, *value, what)->type_name("SECONDS")->check(SecondsValidator());
}

bool Given(const CLI::App& command, const std::string& option) {
  return command.count(option) > 0;
}

namespace {

// ---- Stats ---------------------------------------------------------------

void AddStatsCommand(CLI::App* app, Handlers* handlers) {
  const auto c =
      DefineCommand<std::string>(app, "stats", "daemon counters and per-tenant counters");
  AddTenantFilter(c.app, c.args.get());
  Handle(handlers, c, [](const Invocation& inv, const std::string& tenant) {
    admin::GetStatsRequest request;
    if (Given(inv.command, "TENANT")) request.set_tenant(tenant);
    return CallAndShow(inv, &admin::StatsService::Stub::GetStats, request, PrintStats);
  });
}

// The named subcommands of `app`.
std::vector<const CLI::App*> Children(const CLI::App& app) {
  std::vector<const CLI::App*> out;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    if (!sub->get_name().empty()) out.push_back(sub);
  }
  return out;
}

std::string ChildNames(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : Children(app)) names.push_back(sub->get_name());
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// Whether some command of the tree under `app` has an option `name`.
bool KnownOption(const CLI::App& app, const std::string& name) {
  if (app.get_option_no_throw(name) != nullptr) return true;
  for (const CLI::App* sub : Children(app)) {
    if (KnownOption(*sub, name)) return true;
  }
  return false;
}

}  // namespace

Commands::Commands() : app_(kDescription, "rackhubctl") {
  // Inherited by every subcommand created below: options of the commands
  // above (the global ones) are accepted anywhere; leftovers are collected
  // (not thrown) so CheckComplete can name them; one subcommand per level.
  app_.fallthrough();
  app_.allow_extras();
  app_.require_subcommand(0, 1);
  app_.get_formatter()->column_width(34);

  // Global options: read from the CommandLine by ReadConnectionOptions.
  app_.add_option("--admin", "admin API address (default 127.0.0.1:7701; IPv6 as [ADDR]:PORT)")
      ->type_name("HOST:PORT")
      ->check(EndpointValidator());
  app_.add_option("--token-file",
                  "file holding the admin token (surrounding whitespace is trimmed);\n"
                  "sent as `authorization: Bearer <token>`")
      ->type_name("FILE");
  app_.add_option("--tls-ca", "use TLS, trusting this CA certificate (PEM)")->type_name("FILE");
  CLI::Option* tls_cert =
      app_.add_option("--tls-cert", "client certificate (PEM) for TLS")->type_name("FILE");
  CLI::Option* tls_key =
      app_.add_option("--tls-key", "private key (PEM) of the client certificate")
          ->type_name("FILE");
  tls_cert->needs(tls_key);
  tls_key->needs(tls_cert);
  app_.add_option("--tls-server-name",
                  "name to check in the daemon's certificate instead of HOST (any --tls-*\n"
                  "option turns TLS on; without --tls-ca the system's trusted CAs are used)")
      ->type_name("NAME");
  static const std::string kJsonHelp =
      "machine-readable output: the response message as one JSON document on\n"
      "stdout (proto field names, all fields)";
  app_.add_flag("--json", kJsonHelp);
  app_.add_option("--timeout", "deadline of each call (default 10; decimals allowed)")
      ->type_name("SECONDS")
      ->check(SecondsValidator());

  AddTenantCommands(
      AddCommand(&app_, "tenant", "tenants: create, get, list, update-quotas, delete"),
      &handlers_);
  AddKeyCommands(AddCommand(&app_, "key", "keys: create, get, list, delete, set-optimizer"),
                 &handlers_);
  AddCheckpointCommands(
      AddCommand(&app_, "checkpoint", "checkpoints of a tenant: create, list, delete, restore"),
      &handlers_);
  AddStatsCommand(&app_, &handlers_);
  AddMonitorCommands(&app_, &handlers_);
  help_ = app_.add_subcommand("help", "show this help, or a command's (e.g. help key create)");
  help_->add_option("COMMAND", help_words_, "command words")->type_name("");
  // Last: a footer set earlier would be inherited by the commands.
  app_.footer(kFooter);
}

const CLI::App& Commands::Selected() const {
  const CLI::App* app = &app_;
  while (!app->get_subcommands().empty()) app = app->get_subcommands().front();
  return *app;
}

std::string Commands::SelectedName() const {
  std::string name;
  for (const CLI::App* app = &app_; !app->get_subcommands().empty();) {
    app = app->get_subcommands().front();
    name += (name.empty() ? "" : " ") + app->get_name();
  }
  return name;
}

bool Commands::HelpSelected() const { return &Selected() == help_; }

Status Commands::CheckComplete() const {
  const CLI::App& selected = Selected();
  const std::string name = SelectedName();
  const bool group = !Children(selected).empty();
  std::vector<std::string> extras = app_.remaining(/*recurse=*/true);
  // CLI11 keeps the "--" that ends the options among the leftovers.
  extras.erase(std::remove(extras.begin(), extras.end(), "--"), extras.end());
  if (!extras.empty()) {
    const std::string& first = extras.front();
    if (first.size() > 1 && first[0] == '-') {
      const std::string option = first.substr(0, first.find('='));
      if (!KnownOption(app_, option)) return InvalidArgument("unknown option " + option);
      if (name.empty()) {
        return InvalidArgument(fmt::format("option {} belongs after its command's words", option));
      }
      if (selected.get_option_no_throw(option) != nullptr) {
        return InvalidArgument(
            fmt::format("option {} belongs after the command words '{}'", option, name));
      }
      return InvalidArgument(fmt::format("option {} does not apply to '{}'", option, name));
    }
    if (name.empty()) {
      return InvalidArgument(
          fmt::format("unknown command '{}' (expected one of: {})", first, ChildNames(app_)));
    }
    if (group) {
      return InvalidArgument(fmt::format("unknown command '{} {}' (expected one of: {})", name,
                                         first, ChildNames(selected)));
    }
    return InvalidArgument(fmt::format("{}: unexpected argument '{}'", name, first));
  }
  if (name.empty()) {
    return InvalidArgument(fmt::format("no command given (expected one of: {})", ChildNames(app_)));
  }
  if (group) {
    return InvalidArgument(fmt::format("'{}' needs a subcommand: {}", name, ChildNames(selected)));
  }
  return Status::Ok();
}

std::string Commands::Describe(const CLI::ParseError& error) const {
  std::string message = error.what();
  std::replace(message.begin(), message.end(), '\n', ' ');
  if (error.get_name() == "ArgumentMismatch") {
    // CLI11 says "--x: At Most 1 required but received 2" or "--x: 1 required N missing".
    const std::string option = message.substr(0, message.find(": "));
    if (message.find("At Most 1 required") != std::string::npos) {
      message = option + ": given more than once";
    } else if (message.find(" missing") != std::string::npos) {
      message = option + ": needs a value";
    }
  }
  const std::string name = SelectedName();
  if (!name.empty() && (error.get_name() == "RequiredError" || message.rfind("--", 0) != 0)) {
    message = name + ": " + message;
  }
  return message;
}

Result<std::string> Commands::HelpText() const {
  if (!HelpSelected()) return app_.help();
  const CLI::App* app = &app_;
  std::string path = app_.get_name();
  for (const std::string& word : help_words_) {
    const CLI::App* next = nullptr;
    for (const CLI::App* sub : Children(*app)) {
      if (sub->get_name() == word) next = sub;
    }
    if (next == nullptr) {
      return InvalidArgument(fmt::format("help: unknown command '{}'", word));
    }
    app = next;
    path += " " + word;
  }
  return app->get_formatter()->make_help(app, path, CLI::AppFormatMode::Normal);
}

Status Commands::Run(Connection& connection, const CommandLine& cl, std::ostream& out) const {
  const CLI::App& command = Selected();
  return handlers_.at(&command)(Invocation{command, cl, connection, out});
}

}  // namespace rackhub::cli
