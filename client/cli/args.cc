#include "args.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>

namespace rackhub::cli {
namespace {

struct OptionSpec {
  const char* name;
  bool takes_value;
};

// Every option rackhubctl understands. Which command accepts which option is
// checked later by the command table (commands.cc).
constexpr OptionSpec kOptions[] = {
    // Global options.
    {"admin", true},
    {"token-file", true},
    {"tls-ca", true},
    {"tls-cert", true},
    {"tls-key", true},
    {"tls-server-name", true},
    {"json", false},
    {"timeout", true},
    // Tenant options.
    {"workers", true},
    {"chunk-bytes", true},
    {"tenant-token-file", true},
    {"max-param-bytes", true},
    {"max-keys", true},
    {"max-workers", true},
    // Key options.
    {"elements", true},
    {"dtype", true},
    {"init", true},
    // Optimizer options.
    {"optimizer", true},
    {"lr", true},
    {"momentum", true},
    {"weight-decay", true},
    {"beta1", true},
    {"beta2", true},
    {"epsilon", true},
    {"initial-accumulator", true},
    {"reduction", true},
};

const OptionSpec* FindOption(std::string_view name) {
  for (const auto& spec : kOptions) {
    if (name == spec.name) return &spec;
  }
  return nullptr;
}

std::string Quote(std::string_view text) { return "'" + std::string(text) + "'"; }

}  // namespace

std::optional<std::string> CommandLine::Get(const std::string& name) const {
  const auto it = options.find(name);
  if (it == options.end()) return std::nullopt;
  return it->second;
}

bool IsKnownOption(std::string_view name) { return FindOption(name) != nullptr; }

CommandLine Tokenize(int argc, const char* const* argv) {
  CommandLine cl;
  bool options_done = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (options_done || arg.size() < 2 || arg[0] != '-') {
      // Plain word (a lone "-" is a word too).
      cl.words.emplace_back(arg);
      continue;
    }
    if (arg == "--") {
      options_done = true;
      continue;
    }
    if (arg == "-h" || arg == "--help") {
      cl.help = true;
      continue;
    }
    if (arg == "--version") {
      cl.version = true;
      continue;
    }
    if (arg.substr(0, 2) != "--") {
      throw UsageError("unknown option " + Quote(arg));
    }
    std::string_view name = arg.substr(2);
    std::optional<std::string_view> inline_value;
    if (const auto eq = name.find('='); eq != std::string_view::npos) {
      inline_value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    const OptionSpec* spec = FindOption(name);
    if (spec == nullptr) throw UsageError("unknown option --" + std::string(name));
    if (cl.options.count(std::string(name)) != 0) {
      throw UsageError("option --" + std::string(name) + " given more than once");
    }
    std::string value;
    if (spec->takes_value) {
      if (inline_value) {
        value = std::string(*inline_value);
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        throw UsageError("option --" + std::string(name) + " needs a value");
      }
    } else if (inline_value) {
      throw UsageError("option --" + std::string(name) + " takes no value");
    }
    cl.options.emplace(std::string(name), std::move(value));
  }
  return cl;
}

uint64_t ParseU64(std::string_view option, std::string_view text) {
  uint64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec == std::errc::invalid_argument || ptr != end) {
    throw UsageError("--" + std::string(option) + ": " + Quote(text) +
                     " is not a non-negative integer");
  }
  if (ec == std::errc::result_out_of_range) {
    throw UsageError("--" + std::string(option) + ": " + Quote(text) + " is too large");
  }
  return value;
}

uint32_t ParseU32(std::string_view option, std::string_view text) {
  const uint64_t value = ParseU64(option, text);
  if (value > std::numeric_limits<uint32_t>::max()) {
    throw UsageError("--" + std::string(option) + ": " + Quote(text) +
                     " is too large (at most 4294967295)");
  }
  return static_cast<uint32_t>(value);
}

double ParseDouble(std::string_view option, std::string_view text) {
  double value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end || !std::isfinite(value)) {
    throw UsageError("--" + std::string(option) + ": " + Quote(text) + " is not a number");
  }
  return value;
}

uint64_t ParseSize(std::string_view option, std::string_view text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) {
    ++digits;
  }
  std::string suffix;
  for (char c : text.substr(digits)) {
    suffix += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  int shift = -1;
  if (suffix.empty() || suffix == "b") {
    shift = 0;
  } else {
    const char unit = suffix[0];
    const std::string_view rest = std::string_view(suffix).substr(1);
    const int exponent = unit == 'k' ? 1 : unit == 'm' ? 2 : unit == 'g' ? 3 : unit == 't' ? 4 : 0;
    if (exponent != 0 && (rest.empty() || rest == "b" || rest == "ib")) shift = 10 * exponent;
  }
  if (digits == 0 || shift < 0) {
    throw UsageError("--" + std::string(option) + ": " + Quote(text) +
                     " is not a size (use bytes, or a number with K, KiB, M, MiB, G, GiB, T or "
                     "TiB, e.g. 32KiB)");
  }
  uint64_t value = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + digits, value);
  (void)ptr;
  if (ec != std::errc() || (shift > 0 && value > (std::numeric_limits<uint64_t>::max() >> shift))) {
    throw UsageError("--" + std::string(option) + ": " + Quote(text) + " is too large");
  }
  return value << shift;
}

uint32_t ParseSize32(std::string_view option, std::string_view text) {
  const uint64_t value = ParseSize(option, text);
  if (value > std::numeric_limits<uint32_t>::max()) {
    throw UsageError("--" + std::string(option) + ": " + Quote(text) +
                     " is too large (at most 4294967295 bytes)");
  }
  return static_cast<uint32_t>(value);
}

double ParseSeconds(std::string_view option, std::string_view text) {
  const double value = ParseDouble(option, text);
  if (value <= 0 || value > 86400.0 * 365) {
    throw UsageError("--" + std::string(option) + ": " + Quote(text) +
                     " is not a positive number of seconds");
  }
  return value;
}

void ThrowBadChoice(std::string_view option, std::string_view text,
                    const std::vector<std::string>& names) {
  std::string list;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i != 0) list += i + 1 == names.size() ? " or " : ", ";
    list += names[i];
  }
  throw UsageError("--" + std::string(option) + ": " + Quote(text) + " is not one of " + list);
}

}  // namespace rackhub::cli
