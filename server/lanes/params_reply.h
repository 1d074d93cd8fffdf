// The one place that builds a PARAMS reply: the parameters of one version of
// one chunk, in the key's wire dtype, answering one request.
//
// Reference-held, not copied. A reply is queued with a reference to the
// chunk's parameter buffer of that version (ChunkState::wire_params_ref, or
// Chunk::replies for tenants spanning racks; net::Connection::SendShared):
// the bytes stay alive and unchanged until the transport has written them
// (TCP, the in-memory transport) or staged them (RDMA), whatever happens
// meanwhile. The chunk may be deleted with its key or tenant (the queued
// reply keeps the buffer, which is freed with the last reference), and a
// chunk whose buffer a queued reply still holds never writes it again: an
// update, a recovery's skipped step (SkipTo), a checkpoint restore or INIT
// moves the chunk to fresh memory instead (SharedAlignedBuffer, copy-on-write
// without the copy, since every write overwrites the whole buffer).
//
// Why not a copy per reply: a reply is the chunk's size (32 KiB by default)
// and goes to every worker every iteration, so a copy per reply adds one
// allocation and W x chunk bytes of memcpy to each update, as much memory
// traffic as the reduction reads; the reference costs one atomic increment
// and decrement. Fresh memory is needed only when a reply is still queued
// when its buffer comes round again (version v + 2), which a worker using
// librackhub (one PushPull per key in flight) never causes, and for PULL
// replies of a chunk updated before they were written. Measured
// (rackhub-bench, 2 workers, 64 MiB, bench/results/reply-bytes-2026-11-24.md):
// references 91.2 ms per iteration, as before the fix (91.4 ms); a copy per
// reply 101.2 ms (+11 %).
//
// Threading: the lane thread that owns the chunk and the connection.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include "chunk_table.h"
#include "rackhub/net/transport.h"

namespace rackhub::server {

// Queues PARAMS of `version` (version() or version() - 1 of the chunk). An
// elastic tenant's chunk (docs/elastic.md) sends a copy with the
// MembershipSuffix of the update that produced its current version (flag
// kFlagMembership).
//
void SendParams(net::Connection& conn, const Chunk& c, uint64_t version, uint64_t request_id);

// `bytes` followed by the 16-byte membership suffix (u64 generation, u32
// members, u32 0; docs/wire-protocol.md 6d): an elastic tenant's PARAMS, and
// its RACK_SUM across racks (the cluster generation of the update).
std::string WithMembershipSuffix(std::span<const std::byte> bytes, uint64_t generation,
                                 uint32_t members);
// The generation and member count of such a suffix at the end of `payload`
// (REQUIRES: at least kMembershipSuffixBytes).
std::pair<uint64_t, uint32_t> MembershipSuffixOf(std::span<const std::byte> payload);

// Bounded/async tenants (docs/consistency.md): PARAMS of the chunk's
// current version whose header iteration is the worker's own iteration
// count `clock`, with the VersionsSuffix (updates applied, the slowest
// live worker's count) after the parameters, flag kFlagVersions. A copy,
// not a reference: the suffix follows the parameters in one payload, and
// with updates applied one contribution at a time the buffers turn over
// too fast for references to pay.
void SendVersionedParams(net::Connection& conn, const Chunk& c, uint64_t clock,
                         uint64_t request_id);

// Answers every push waiting for the chunk's update `version`. For a top-k
// key whose optimizer is sum-only (the reply is the reduced gradient, zero
// outside the entries the ranks sent), the replies are sparse when that is
// smaller: flag kFlagSparse, the payload of a sparse PUSH listing every
// entry whose bits are not +0.0 (docs/compression.md); one payload shared by
// every reply of the update.
void AnswerPushes(Chunk& c, uint64_t version);

// Answers every PULL held for the chunk's initial values with `version`,
// releasing the bytes each reserved on its connection.
void AnswerPulls(Chunk& c, uint64_t version);

}  // namespace rackhub::server
