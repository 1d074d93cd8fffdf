#include "args.h"

#include <fmt/format.h>

#include <limits>

#include "rackhub/common/number.h"
#include "rackhub/common/size.h"
#include "rackhub/net/endpoint.h"

namespace rackhub::cli {
namespace {

// A CLI11 validator over `parse`: an error Result becomes the validation
// message; `rewrite` replaces the value by the parsed one as text (it only
// takes effect through Option::transform, not Option::check).
template <typename T>
CLI::Validator MakeValidator(Result<T> (*parse)(std::string_view), bool rewrite) {
  return CLI::Validator(
      [parse, rewrite](std::string& text) -> std::string {
        Result<T> value = parse(text);
        if (!value.ok()) return value.status().message();
        if (rewrite) text = fmt::format("{}", *value);
        return "";
      },
      "");
}

void AddResults(const CLI::App& app, CommandLine* cl) {
  for (const CLI::Option* opt : app.get_options()) {
    if (opt->count() == 0 || opt == app.get_help_ptr() || opt->get_lnames().empty()) continue;
    const auto& results = opt->results();
    cl->options[opt->get_lnames().front()] = results.empty() ? "" : results.back();
  }
}

}  // namespace

std::optional<std::string> CommandLine::Get(const std::string& name) const {
  const auto it = options.find(name);
  if (it == options.end()) return std::nullopt;
  return it->second;
}

CommandLine CollectCommandLine(const CLI::App& app) {
  CommandLine cl;
  AddResults(app, &cl);
  for (const CLI::App* sub = &app; !sub->get_subcommands().empty();) {
    sub = sub->get_subcommands().front();
    cl.words.push_back(sub->get_name());
    AddResults(*sub, &cl);
  }
  return cl;
}

Result<uint64_t> ParseU64(std::string_view text) { return ParseUnsigned(text); }

Result<uint32_t> ParseU32(std::string_view text) {
  const Result<uint64_t> value = ParseUnsigned(text, std::numeric_limits<uint32_t>::max());
  if (!value.ok()) return value.status();
  return static_cast<uint32_t>(*value);
}

Result<uint64_t> ParsePositiveU64(std::string_view text) {
  const Result<uint64_t> value = ParseUnsigned(text);
  if (!value.ok() || *value == 0) {
    return InvalidArgument(fmt::format("'{}' is not a positive integer", text));
  }
  return value;
}

Result<double> ParseDouble(std::string_view text) { return ParseDecimal(text); }

Result<double> ParseSeconds(std::string_view text) {
  const Result<double> value = ParseDouble(text);
  if (!value.ok() || *value <= 0 || *value > 86400.0 * 365) {
    return InvalidArgument(fmt::format("'{}' is not a positive number of seconds", text));
  }
  return value;
}

Result<uint32_t> ParseSize32(std::string_view text) {
  const Result<uint64_t> value = ParseSize(text);
  if (!value.ok()) return value.status();
  if (*value > std::numeric_limits<uint32_t>::max()) {
    return InvalidArgument(fmt::format("'{}' is too large (at most 4294967295 bytes)", text));
  }
  return static_cast<uint32_t>(*value);
}

Result<double> ParseSeconds(std::string_view option, std::string_view text) {
  Result<double> value = ParseSeconds(text);
  if (!value.ok()) return value.status().WithContext(fmt::format("--{}", option));
  return value;
}

CLI::Validator U64Validator() { return MakeValidator<uint64_t>(&ParseU64, false); }
CLI::Validator U32Validator() { return MakeValidator<uint32_t>(&ParseU32, false); }
CLI::Validator PositiveU64Validator() { return MakeValidator<uint64_t>(&ParsePositiveU64, false); }
CLI::Validator DecimalValidator() { return MakeValidator<double>(&ParseDouble, false); }
CLI::Validator SecondsValidator() { return MakeValidator<double>(&ParseSeconds, false); }
CLI::Validator SizeValidator() { return MakeValidator<uint64_t>(&ParseSize, true); }
CLI::Validator Size32Validator() { return MakeValidator<uint32_t>(&ParseSize32, true); }

CLI::Validator EndpointValidator() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const Result<net::Endpoint> endpoint = net::ParseEndpoint(text);
        if (!endpoint.ok()) return endpoint.status().message();
        if (endpoint->port == 0) return "port 0 is not a daemon's address";
        return "";
      },
      "");
}

CLI::Validator OneOfValidator(std::vector<std::string> names) {
  return CLI::Validator(
      [names](std::string& text) -> std::string {
        for (const auto& name : names) {
          if (name == text) return "";
        }
        return fmt::format("'{}' is not one of {}", text, JoinChoices(names));
      },
      "");
}

std::string JoinChoices(const std::vector<std::string>& names) {
  std::string list;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i != 0) list += i + 1 == names.size() ? " or " : ", ";
    list += names[i];
  }
  return list;
}

}  // namespace rackhub::cli
