// rackhubctl command-line values: strict parsers of option values (integers,
// decimals, seconds, SIZEs, names from a list, HOST:PORT), the same parsers
// as CLI11 validators, and CommandLine, the options a parsed command line
// gave, as text.
//
// The command tree itself (commands, positional arguments, which option
// applies where) is CLI11's: commands.h. Every mistake on the command line is
// a usage error: main() prints it as one line with a hint to use --help and
// exits 2. No I/O here; plain functions and values, used on the main thread.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "rackhub/common/status.h"

namespace rackhub::cli {

// The options a command line gave (the global ones and the selected
// command's), by name without "--", as text after CLI11's validation and
// transforms ("" for switches; sizes as a byte count).
struct CommandLine {
  std::vector<std::string> words;              // the command, e.g. {"tenant", "create"}
  std::map<std::string, std::string> options;  // name without "--" -> value

  bool Has(const std::string& name) const { return options.count(name) != 0; }
  // The value of `name`, or nullopt when it was not given.
  std::optional<std::string> Get(const std::string& name) const;
};

// Collects what `app` (the parsed root app) and its selected subcommands gave.
CommandLine CollectCommandLine(const CLI::App& app);

// Value parsers. Errors are INVALID_ARGUMENT with a message that starts with
// the quoted text; callers put the option in front ("--workers: 'many' is
// not a non-negative integer").
Result<uint64_t> ParseU64(std::string_view text);
Result<uint32_t> ParseU32(std::string_view text);
// 1 or more ("'0' is not a positive integer").
Result<uint64_t> ParsePositiveU64(std::string_view text);
// A finite decimal number (e.g. 0.01, 1e-3).
Result<double> ParseDouble(std::string_view text);
// A per-call deadline in seconds: a positive finite decimal, at most a year.
Result<double> ParseSeconds(std::string_view text);
// Bytes (rackhub/common/size.h syntax) that fit in 32 bits.
Result<uint32_t> ParseSize32(std::string_view text);

// ParseSeconds for the value of --<option>: the error starts with
// "--<option>: ".
Result<double> ParseSeconds(std::string_view option, std::string_view text);

// CLI11 validators over the parsers above. CLI11 reports a failure as
// "--option: <the parser's message>". The size validators also rewrite the
// value to its byte count when added with Option::transform, so the option
// can be bound to an integer.
CLI::Validator U64Validator();
CLI::Validator U32Validator();
CLI::Validator PositiveU64Validator();
CLI::Validator DecimalValidator();
CLI::Validator SecondsValidator();
CLI::Validator SizeValidator();    // 64-bit byte count
CLI::Validator Size32Validator();  // byte count that fits in 32 bits
CLI::Validator EndpointValidator();  // HOST:PORT with a port other than 0
// Exactly one of `names` (lowercase, as written on the command line).
CLI::Validator OneOfValidator(std::vector<std::string> names);

// "a, b or c".
std::string JoinChoices(const std::vector<std::string>& names);

// Looks `text` up in `choices`: INVALID_ARGUMENT "'x' is not one of ..."
// when absent. After OneOfValidator over the same names, *Choice(...) cannot
// fail (and would abort on a bug).
template <typename T>
Result<T> Choice(const std::string& text, const std::vector<std::pair<std::string, T>>& choices) {
  std::vector<std::string> names;
  for (const auto& [name, value] : choices) {
    if (name == text) return value;
    names.push_back(name);
  }
  return InvalidArgument("'" + text + "' is not one of " + JoinChoices(names));
}

}  // namespace rackhub::cli
