// Client::Impl: row-sparse tables (PushPullRows, PullRows; docs/wire-protocol.md
// section 6b). The issuing thread checks the row ids and builds one request
// per chunk (row range) of the table; the I/O thread sends them and scatters
// each ROWS reply into the caller's `out`.
#include <algorithm>
#include <cstring>

#include "client_impl.h"
#include "convert.h"
#include "lane.h"
#include "rackhub/aggregation/row_shard.h"
#include "wire.h"

namespace rackhub::client {

namespace {

Error Invalid(std::string message) {
  return MakeError(ErrorCode::kInvalidArgument, std::move(message));
}

}  // namespace

void TableInitValues(uint64_t seed, float scale, uint64_t first_row, uint64_t rows, uint32_t dim,
                     float* out) {
  aggregation::TableInitValues(seed, scale, first_row, rows, dim, out);
}

Ticket Client::Impl::PushPullRows(KeyId key, std::span<const uint64_t> ids,
                                  std::span<const float> grads, std::span<const uint64_t> want,
                                  std::span<float> out, Callback done) {
  OperationPtr op = NewOperation(OpKind::kPushPullRows, key, std::move(done));
  op->out = out;
  return IssueRows(std::move(op), ids, grads, want);
}

Ticket Client::Impl::PullRows(KeyId key, std::span<const uint64_t> ids, std::span<float> out,
                              Callback done) {
  OperationPtr op = NewOperation(OpKind::kPullRows, key, std::move(done));
  op->out = out;
  return IssueRows(std::move(op), {}, {}, ids);
}

Ticket Client::Impl::IssueRows(OperationPtr op, std::span<const uint64_t> ids,
                               std::span<const float> grads, std::span<const uint64_t> want) {
  const bool push = op->kind == OpKind::kPushPullRows;
  const char* kind = push ? "PushPullRows" : "PullRows";
  KeyInfo info;
  Error e;
  {
    std::lock_guard lock(mu_);
    e = UsableLocked();
    const auto it = keys_.find(op->key);
    if (e.ok() && it == keys_.end()) {
      e = Invalid("unknown key id " + std::to_string(op->key) + " (declare it first)");
    } else if (e.ok()) {
      info = it->second.info;
    }
  }
  const uint32_t dim = info.dim;
  const auto label = [&] { return std::string(kind) + " of key '" + info.name + "': "; };
  if (e.ok() && info.rows == 0) e = Invalid(label() + "the key is dense (use PushPull / Pull)");
  if (e.ok() && grads.size() != ids.size() * dim) {
    e = Invalid(label() + std::to_string(ids.size()) + " row ids need " +
                std::to_string(ids.size() * dim) + " gradient values, got " +
                std::to_string(grads.size()));
  }
  if (e.ok() && op->out.size() != want.size() * dim) {
    e = Invalid(label() + std::to_string(want.size()) + " wanted rows need an output of " +
                std::to_string(want.size() * dim) + " values, got " +
                std::to_string(op->out.size()));
  }
  for (const auto* list : {&ids, &want}) {
    for (size_t i = 0; e.ok() && i < list->size(); ++i) {
      if ((*list)[i] >= info.rows) {
        e = Invalid(label() + (list == &ids ? "ids[" : "want[") + std::to_string(i) + "] = " +
                    std::to_string((*list)[i]) + " is out of range [0, " +
                    std::to_string(info.rows) + ")");
      }
    }
  }
  if (!e.ok()) return CompleteNow(std::move(op), std::move(e));

  // One request per chunk, every chunk (each row range must hear from every
  // rank every iteration; a PullRows resynchronizes every chunk's version).
  const uint64_t per = info.rows_per_chunk;  // checked by ToKeyInfo
  const size_t chunks = info.chunk_count;
  const uint32_t elem = net::DTypeBytes(internal::WireDType(info.dtype));
  std::vector<std::vector<uint64_t>> chunk_ids(chunks), chunk_want(chunks);
  std::vector<std::vector<uint32_t>> from(chunks);  // ids position of each pushed row
  for (size_t i = 0; i < ids.size(); ++i) {
    chunk_ids[ids[i] / per].push_back(ids[i]);
    from[ids[i] / per].push_back(static_cast<uint32_t>(i));
  }
  op->row_parts.resize(chunks);
  for (size_t i = 0; i < want.size(); ++i) {
    chunk_want[want[i] / per].push_back(want[i]);
    op->row_parts[want[i] / per].places.push_back(static_cast<uint32_t>(i));
  }
  for (size_t c = 0; c < chunks; ++c) {
    Operation::RowPart& part = op->row_parts[c];
    part.payload = push ? net::EncodeRowsRequest(chunk_ids[c], chunk_want[c])
                        : net::EncodeRowsRequest(chunk_want[c], {});
    const size_t row_bytes = size_t{dim} * elem;
    const uint64_t reply = net::kRowsPrefixBytes + uint64_t{chunk_want[c].size()} * row_bytes;
    const uint64_t request = part.payload.size() + uint64_t{chunk_ids[c].size()} * row_bytes;
    const uint64_t limit = max_frame_payload_.load();
    if (std::max(reply, request) > limit) {
      const bool shm = limit < net::kMaxDataPayload;
      return CompleteNow(
          std::move(op),
          Invalid(label() + "chunk " + std::to_string(c) + " (lane " +
                  std::to_string((info.first_chunk + c) % lane_count_) + ") would carry " +
                  std::to_string(std::max(reply, request)) + " bytes in one frame, above " +
                  std::to_string(limit) +
                  (shm ? " (the shared-memory ring's record; raise the hub's "
                         "data.shm_ring_bytes)"
                       : "") +
                  "; split the call into smaller batches of rows"));
    }
    if (!push) continue;
    const size_t head = part.payload.size();
    part.payload.resize(head + chunk_ids[c].size() * row_bytes);
    std::byte* dst = reinterpret_cast<std::byte*>(part.payload.data() + head);
    for (const uint32_t i : from[c]) {
      const float* row = grads.data() + size_t{i} * dim;
      if (info.dtype == DType::kFp32) {
        std::memcpy(dst, row, row_bytes);
      } else {
        internal::NarrowFloats(info.dtype, row, reinterpret_cast<uint16_t*>(dst), dim);
      }
      dst += row_bytes;
    }
  }
  op->dim = dim;
  op->dtype = info.dtype;
  op->first_chunk = info.first_chunk;
  return Issue(std::move(op));  // takes the key's data-op slot and iteration
}

void Client::Impl::StartRows(const OperationPtr& op, net::Opcode opcode) {
  op->remaining = op->row_parts.size();
  for (size_t c = 0; c < op->row_parts.size(); ++c) {
    const Operation::RowPart& part = op->row_parts[c];
    internal::Lane& lane = *lanes_[(op->first_chunk + c) % lanes_.size()];
    net::FrameHeader h;
    h.opcode = opcode;
    h.dtype = internal::WireDType(op->dtype);
    h.tenant = tenant_handle_;
    h.key = op->key;
    h.chunk = static_cast<uint32_t>(c);
    h.payload_bytes = static_cast<uint32_t>(part.payload.size());
    h.iteration = opcode == net::Opcode::kPushRows ? op->iteration : 0;
    h.request_id = next_request_id_++;
    lane.Expect(h.request_id,
                PendingRequest{op, net::Opcode::kRows, static_cast<uint32_t>(c), 0, 0});
    OutFrame f;
    f.header = h;
    f.op = op;
    f.payload = part.payload.data();
    f.bytes = part.payload.size();
    lane.Send(std::move(f));
  }
}

namespace internal {

Status StoreRows(const net::FrameHeader& h, std::span<const std::byte> payload,
                 const PendingRequest& request) {
  const Operation& o = *request.op;
  const auto what = [&] {
    return "ROWS for request " + std::to_string(h.request_id) + " (" + OpKindName(o.kind) +
           " of key " + std::to_string(o.key) + ")";
  };
  if (h.key != o.key || h.chunk != request.chunk || request.chunk >= o.row_parts.size()) {
    return Unavailable(what() + " names key " + std::to_string(h.key) + " chunk " +
                       std::to_string(h.chunk) + ", expected chunk " +
                       std::to_string(request.chunk));
  }
  const std::vector<uint32_t>& places = o.row_parts[request.chunk].places;
  const size_t row_bytes = size_t{o.dim} * net::DTypeBytes(WireDType(o.dtype));
  const size_t want = net::kRowsPrefixBytes + places.size() * row_bytes;
  uint32_t count = 0;
  if (payload.size() >= 4) std::memcpy(&count, payload.data(), 4);
  if (h.dtype != WireDType(o.dtype) || payload.size() != want || count != places.size()) {
    return Unavailable(what() + ": " + std::to_string(payload.size()) + " bytes of " +
                       net::DTypeName(h.dtype) + " with " + std::to_string(count) +
                       " rows, expected " + std::to_string(want) + " bytes of " +
                       std::to_string(places.size()) + " " + net::DTypeName(WireDType(o.dtype)) +
                       " rows");
  }
  if (o.failed || o.finished) return Status::Ok();  // late reply of a failed ticket: dropped
  const std::byte* src = payload.data() + net::kRowsPrefixBytes;
  for (const uint32_t place : places) {
    float* dest = o.out.data() + size_t{place} * o.dim;
    if (o.dtype == DType::kFp32) {
      std::memcpy(dest, src, row_bytes);
    } else {
      WidenToFloats(o.dtype, src, dest, o.dim);
    }
    src += row_bytes;
  }
  return Status::Ok();
}

}  // namespace internal

}  // namespace rackhub::client
