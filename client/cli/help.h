// rackhubctl's help texts around the ones CLI11 generates from the command
// tree (commands.cc): the program description, the overview footer of
// `rackhubctl --help` and the footer of each command's help. Constant data;
// any thread.
#pragma once

namespace rackhub::cli {

// One line: what rackhubctl is.
extern const char* const kDescription;
// After the generated option and command lists of `rackhubctl --help`: the
// commands at a glance, value syntax, output, exit status, examples.
extern const char* const kFooter;
// After the generated help of one command (`rackhubctl tenant create --help`).
extern const char* const kCommandFooter;

}  // namespace rackhub::cli
