// Top-k sparsification of a PushPull's gradient on the worker
// (docs/compression.md). Runs on the thread that issues the PushPull (as
// the fp16/bf16 narrowing does), before the operation reaches the I/O
// thread; the key is busy meanwhile, so its residual and packed buffer have
// one user at a time.
#pragma once

#include <cstdint>

#include "client_impl.h"
#include "rackhub/common/status.h"
#include "rackhub/net/frame.h"

namespace rackhub::client::internal {

// Fills op.packed / op.packed_chunks from op.in for a key of op.topk_ratio:
// per chunk of `chunk_elements`, with error feedback (op.residual set) the
// corrected gradient in + residual, its top ceil(ratio * n) entries sent
// (u32 count, u32 indices ascending, values in the key's dtype) and kept
// out of the residual, the rest kept in it (for fp16/bf16 the rounding of
// the sent values too). A chunk whose sparse form is not smaller than its
// dense form is sent dense (the whole corrected gradient; residual zeroed).
void PackTopK(Operation& op, uint32_t chunk_elements);

// A sparse PARAMS (flag kFlagSparse: the sum-only reply of a top-k key,
// docs/compression.md) answering `request`: checks it like the hub checks a
// sparse PUSH, then writes the chunk's part of the operation's `out` (zeros
// where nothing is listed). UNAVAILABLE when it breaks the protocol.
Status StoreSparseParams(const net::FrameHeader& h, std::span<const std::byte> payload,
                         const PendingRequest& request);

}  // namespace rackhub::client::internal
