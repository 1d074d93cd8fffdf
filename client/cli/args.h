// rackhubctl command-line parsing: splitting argv into command words and
// options, and strict parsing of option values (integers, decimals, SIZEs,
// enum names).
//
// Every problem is reported by throwing UsageError; main() prints it as one
// line with a hint to use --help and exits 2. No I/O here.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace rackhub::cli {

// A mistake in the command line (unknown command or option, missing or
// malformed value). The message names the problem, without a "rackhubctl:"
// prefix and without the --help hint.
class UsageError : public std::runtime_error {
 public:
  explicit UsageError(const std::string& message) : std::runtime_error(message) {}
};

// argv split into positional words and options. Options may appear anywhere
// (before, between or after the command words); `--name VALUE` and
// `--name=VALUE` are both accepted; `--` ends option parsing.
struct CommandLine {
  std::vector<std::string> words;
  std::map<std::string, std::string> options;  // name without "--" -> value ("" for switches)
  bool help = false;                           // --help / -h seen
  bool version = false;                        // --version seen

  bool Has(const std::string& name) const { return options.count(name) != 0; }
  // The value of `name`, or nullopt when it was not given.
  std::optional<std::string> Get(const std::string& name) const;
};

// Splits argv[1..argc). Throws UsageError for an unknown option, an option
// given twice, a missing value or a value given to a switch.
CommandLine Tokenize(int argc, const char* const* argv);

// Whether `name` (without "--") is an option rackhubctl knows.
bool IsKnownOption(std::string_view name);

// Value parsers. `option` is the option name without "--", used in messages.
uint64_t ParseU64(std::string_view option, std::string_view text);
uint32_t ParseU32(std::string_view option, std::string_view text);
// A finite decimal number (e.g. 0.01, 1e-3).
double ParseDouble(std::string_view option, std::string_view text);
// Bytes: a plain integer or an integer with a binary suffix K/KiB, M/MiB,
// G/GiB, T/TiB (case-insensitive, an optional trailing "B" on the bare letter
// forms, e.g. "32K", "32KiB", "32kb").
uint64_t ParseSize(std::string_view option, std::string_view text);
// A size that must fit in 32 bits.
uint32_t ParseSize32(std::string_view option, std::string_view text);
// A per-call deadline in seconds: a positive finite decimal.
double ParseSeconds(std::string_view option, std::string_view text);

// Looks `text` up in `choices` (exact, lowercase names); throws UsageError
// listing the accepted names otherwise.
template <typename T>
T ParseChoice(std::string_view option, std::string_view text,
              const std::vector<std::pair<std::string, T>>& choices);

// Out-of-line helper for ParseChoice's error message.
[[noreturn]] void ThrowBadChoice(std::string_view option, std::string_view text,
                                 const std::vector<std::string>& names);

template <typename T>
T ParseChoice(std::string_view option, std::string_view text,
              const std::vector<std::pair<std::string, T>>& choices) {
  std::vector<std::string> names;
  for (const auto& [name, value] : choices) {
    if (name == text) return value;
    names.push_back(name);
  }
  ThrowBadChoice(option, text, names);
}

}  // namespace rackhub::cli
