// The wire vocabulary under the short names the lane's frame-handling files
// (worker_*.cc, table_protocol.cc, unsynced_protocol.cc, rack_exchange*.cc)
// use on nearly every line: FrameHeader, Opcode, WireError (net/frame.h) and
// a FrameHandler's Verdict (net/transport.h). One list instead of a copy at
// the top of each file.
//
// Include it from .cc files only: a header including it would hand these
// names to every file that includes that header.
// Ownership and threading: names only, no state.
#pragma once

#include "rackhub/net/frame.h"
#include "rackhub/net/transport.h"

namespace rackhub::server {

using net::FrameHeader;
using net::Opcode;
using net::WireError;
using Verdict = net::FrameHandler::Verdict;

}  // namespace rackhub::server
