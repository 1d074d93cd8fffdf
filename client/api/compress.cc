#include "compress.h"

#include <cstring>
#include <vector>

#include "convert.h"
#include "rackhub/aggregation/topk.h"
#include "rackhub/net/frame.h"
#include "wire.h"

namespace rackhub::client::internal {

namespace {

// Per issuing thread: selection scratch, indices and values of one chunk.
struct PackScratch {
  aggregation::TopKScratch topk;
  std::vector<uint32_t> idx;
  std::vector<float> values;
  std::vector<uint16_t> narrow;
  std::vector<float> corrected;
};

}  // namespace

void PackTopK(Operation& op, uint32_t chunk_elements) {
  thread_local PackScratch scratch;
  const net::DType wire = WireDType(op.dtype);
  const size_t vb = net::DTypeBytes(wire);
  const uint64_t elements = op.elements;
  const uint64_t chunks = (elements + chunk_elements - 1) / chunk_elements;
  const bool ef = op.residual != nullptr;
  std::vector<std::byte>& out = *op.packed;
  op.packed_chunks.assign(chunks, {});
  // Sized for the worst case once (dense everywhere), filled front to back.
  out.resize(elements * vb + chunks * net::kSparsePrefixBytes);
  size_t at = 0;
  for (uint64_t c = 0; c < chunks; ++c) {
    const uint64_t first = c * chunk_elements;
    const auto n = static_cast<uint32_t>(std::min<uint64_t>(chunk_elements, elements - first));
    const float* grad = op.in.data() + first;
    float* residual = ef ? op.residual->data() + first : nullptr;
    const uint32_t k = aggregation::TopKCount(op.topk_ratio, n);
    Operation::PackedChunk& p = op.packed_chunks[c];
    p.offset = at;
    if (net::SparsePayloadBytes(k, wire) < size_t{n} * vb) {
      scratch.idx.resize(k);
      scratch.values.resize(k);
      aggregation::CompressTopK({grad, n}, ef ? std::span<float>(residual, n) : std::span<float>(),
                                k, ef, scratch.idx.data(), scratch.values.data(), scratch.topk);
      std::byte* dst = out.data() + at;
      std::memcpy(dst, &k, 4);
      if (k > 0) std::memcpy(dst + 4, scratch.idx.data(), size_t{k} * 4);
      std::byte* vals = dst + 4 + size_t{k} * 4;
      if (wire == net::DType::kFp32) {
        if (k > 0) std::memcpy(vals, scratch.values.data(), size_t{k} * 4);
      } else {
        scratch.narrow.resize(k);
        NarrowFloats(op.dtype, scratch.values.data(), scratch.narrow.data(), k);
        if (k > 0) std::memcpy(vals, scratch.narrow.data(), size_t{k} * 2);
        if (ef) {
          // What the rounding took off a sent value stays in the residual.
          std::vector<float>& sent = scratch.corrected;
          sent.resize(k);
          WidenToFloats(op.dtype, scratch.narrow.data(), sent.data(), k);
          for (uint32_t j = 0; j < k; ++j) {
            residual[scratch.idx[j]] += scratch.values[j] - sent[j];
          }
        }
      }
      p.bytes = net::SparsePayloadBytes(k, wire);
      p.sparse = true;
    } else {
      // Dense: the whole corrected gradient; nothing but rounding is left.
      const float* send = grad;
      if (ef) {
        scratch.corrected.resize(n);
        for (uint32_t i = 0; i < n; ++i) scratch.corrected[i] = residual[i] + grad[i];
        std::memset(residual, 0, size_t{n} * sizeof(float));
        send = scratch.corrected.data();
      }
      std::byte* dst = out.data() + at;
      if (wire == net::DType::kFp32) {
        std::memcpy(dst, send, size_t{n} * 4);
      } else {
        scratch.narrow.resize(n);
        NarrowFloats(op.dtype, send, scratch.narrow.data(), n);
        std::memcpy(dst, scratch.narrow.data(), size_t{n} * 2);
        if (ef) {  // the rounding stays in the residual
          WidenToFloats(op.dtype, scratch.narrow.data(), residual, n);
          for (uint32_t i = 0; i < n; ++i) residual[i] = send[i] - residual[i];
        }
      }
      p.bytes = size_t{n} * vb;
      p.sparse = false;
    }
    at += p.bytes;
  }
}

Status StoreSparseParams(const net::FrameHeader& h, std::span<const std::byte> payload,
                         const PendingRequest& request) {
  const Operation& o = *request.op;
  Result<net::SparsePayload> parsed =
      h.dtype != WireDType(o.dtype)
          ? Result<net::SparsePayload>(InvalidArgument(
                std::string("dtype ") + net::DTypeName(h.dtype) + ", the key's is " +
                net::DTypeName(WireDType(o.dtype))))
          : net::ParseSparsePayload(payload, request.elements, request.elements, h.dtype);
  if (!parsed.ok()) {
    const std::string& bad = parsed.status().message();
    return Unavailable("sparse PARAMS for request " + std::to_string(h.request_id) + " (chunk " +
                       std::to_string(request.chunk) + " of key " + std::to_string(o.key) +
                       "): " + bad);
  }
  if (o.failed || o.finished) return Status::Ok();  // late reply of a failed ticket: dropped
  if (o.kind != OpKind::kPushPull && o.kind != OpKind::kPull) return Status::Ok();
  const net::SparsePayload& sp = *parsed;
  float* dest = o.out.data() + request.offset;
  std::memset(dest, 0, size_t{request.elements} * sizeof(float));
  const size_t vb = net::DTypeBytes(h.dtype);
  for (uint32_t j = 0; j < sp.count; ++j) {
    uint32_t i;
    std::memcpy(&i, sp.indices + size_t{j} * 4, 4);
    if (o.dtype == DType::kFp32) {
      std::memcpy(dest + i, sp.values + size_t{j} * 4, 4);
    } else {
      WidenToFloats(o.dtype, sp.values + j * vb, dest + i, 1);
    }
  }
  return Status::Ok();
}

}  // namespace rackhub::client::internal
