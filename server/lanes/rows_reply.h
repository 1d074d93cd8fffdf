// The one place that builds a ROWS reply (docs/wire-protocol.md section 6b):
// rows of a row-sparse table's chunk at the shard's current version, in the
// key's wire dtype, answering one PUSH_ROWS or PULL_ROWS. Used by the worker
// protocol (one rack) and the rack exchange (a table spanning racks, once
// the home's update reached this hub).
//
// Threading: the lane thread that owns the chunk and the connection.
#pragma once

#include <cstdint>
#include <vector>

#include "chunk_table.h"
#include "rackhub/net/transport.h"

namespace rackhub::server {

// Queues ROWS with rows `ids` (checked) of the chunk's shard for `request_id`.
void SendTableRows(net::Connection& conn, const LaneTenant& t, const Chunk& c,
                   const std::vector<uint64_t>& ids, uint64_t request_id);
// Answers every PUSH_ROWS waiting for the chunk's update (each with the rows
// it wants) and clears them.
void AnswerRowPushes(const LaneTenant& t, Chunk& c);
// Answers every PULL_ROWS held in the chunk's `pulls` (its rows came: a
// home's RACK_ALIGN, a restore) and clears them.
void AnswerRowPulls(const LaneTenant& t, Chunk& c);

}  // namespace rackhub::server
