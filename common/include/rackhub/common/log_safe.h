// Client-supplied text made safe to put into a log line or an error message:
// tenant and key names, peer strings, anything a client or another hub sent.
// A raw name with a newline would forge log lines; a 1 MiB name would write
// megabytes of log per refused call (issue 12, hole 5).
//
// Pure functions, no state: any thread.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace rackhub {

inline constexpr size_t kLogSafeDefaultMax = 128;

// `text` with every byte that could break or disguise a line escaped as
// \xNN: ASCII control characters (0x00-0x1f, 0x7f), bytes that are not valid
// UTF-8, and the code points that move or hide text (C1 controls
// U+0080-U+009F, U+2028/U+2029 line and paragraph separators, bidi
// embeddings/overrides/isolates U+200E/F, U+202A-E, U+2066-9, and U+FEFF),
// whose bytes are escaped one by one. Printable ASCII and other valid UTF-8
// pass unchanged; backslashes and quotes are kept, so the function is
// idempotent on its own output (except the truncation note below), and a
// message may be passed through it again at a sink.
//
// Only the first `max_bytes` bytes of `text` are considered (a character cut
// by the limit is escaped byte by byte); a longer text ends in "...(N bytes)" with N its
// original length. The result is therefore at most 4 * max_bytes + 24
// bytes, whatever the input.
std::string SafeForLog(std::string_view text, size_t max_bytes = kLogSafeDefaultMax);

// "'" + SafeForLog(text, max_bytes) + "'": how messages quote a name.
std::string QuoteForLog(std::string_view text, size_t max_bytes = kLogSafeDefaultMax);

}  // namespace rackhub
