// The one place that builds a PARAMS reply: the parameters of one version of
// one chunk, in the key's wire dtype, answering one request.
//
// Borrowed vs copied: a PUSH's reply is sent without a copy. The bytes of
// version v stay unchanged until version v + 2 is computed, which needs this
// worker's next push, which it sends only after receiving this reply
// (ChunkState's double buffering; for tenants spanning racks, Chunk::replies
// has the same two-slot rule). PULL and INIT replies are not part of that
// discipline, so they own a copy.
//
// Threading: the lane thread that owns the chunk and the connection.
#pragma once

#include <cstdint>

#include "chunk_table.h"
#include "rackhub/net/transport.h"

namespace rackhub::server {

enum class ReplyBytes { kBorrowed, kCopied };

void SendParams(net::Connection& conn, const Chunk& c, uint64_t version, uint64_t request_id,
                ReplyBytes mode);

// Answers every push waiting for the chunk's update `version` (borrowed).
void AnswerPushes(Chunk& c, uint64_t version);

}  // namespace rackhub::server
