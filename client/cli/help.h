// rackhubctl's --help text.
#pragma once

namespace rackhub::cli {

// The full usage text printed by --help (ends with a newline).
extern const char* const kHelpText;

}  // namespace rackhub::cli
