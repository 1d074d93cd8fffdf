#include "params_reply.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace rackhub::server {
namespace {

// The header of a PARAMS of `c` answering `request_id` on `conn`.
net::FrameHeader ParamsHeader(const net::Connection& conn, const Chunk& c, uint64_t iteration,
                              uint64_t request_id, uint8_t flags, size_t payload_bytes) {
  net::FrameHeader r = c.Header(net::Opcode::kParams, conn.id().tenant_handle, iteration);
  r.flags = flags;
  r.request_id = request_id;
  r.payload_bytes = static_cast<uint32_t>(payload_bytes);
  return r;
}

}  // namespace

void SendParams(net::Connection& conn, const Chunk& c, uint64_t version, uint64_t request_id) {
  const auto bytes = c.reply_bytes(version);
  if (c.elastic) {
    // The membership that produced the version follows the parameters (a
    // copy: the suffix is part of the one payload).
    std::string payload = WithMembershipSuffix(bytes, c.done_generation, c.done_members);
    conn.SendOwned(
        ParamsHeader(conn, c, version, request_id, net::kFlagMembership, payload.size()),
        std::move(payload));
    return;
  }
  conn.SendShared(ParamsHeader(conn, c, version, request_id, 0, bytes.size()), bytes,
                  c.reply_owner(version));
}

std::string WithMembershipSuffix(std::span<const std::byte> bytes, uint64_t generation,
                                 uint32_t members) {
  std::string payload(bytes.size() + net::kMembershipSuffixBytes, '\0');
  if (!bytes.empty()) std::memcpy(payload.data(), bytes.data(), bytes.size());
  std::memcpy(payload.data() + bytes.size(), &generation, 8);
  std::memcpy(payload.data() + bytes.size() + 8, &members, 4);
  return payload;
}

std::pair<uint64_t, uint32_t> MembershipSuffixOf(std::span<const std::byte> payload) {
  const std::byte* at = payload.data() + payload.size() - net::kMembershipSuffixBytes;
  uint64_t generation = 0;
  uint32_t members = 0;
  std::memcpy(&generation, at, 8);
  std::memcpy(&members, at + 8, 4);
  return {generation, members};
}

void SendVersionedParams(net::Connection& conn, const Chunk& c, uint64_t clock,
                         uint64_t request_id) {
  const uint64_t v = c.state.version();
  const auto bytes = c.state.wire_params(v);
  net::VersionsSuffix suffix;
  suffix.updates = v;
  suffix.slowest = c.unsynced ? c.unsynced->Slowest() : v;
  if (suffix.slowest == UINT64_MAX) suffix.slowest = clock;
  std::string payload(bytes.size() + net::kVersionsSuffixBytes, '\0');
  if (!bytes.empty()) std::memcpy(payload.data(), bytes.data(), bytes.size());
  std::memcpy(payload.data() + bytes.size(), &suffix.updates, 8);
  std::memcpy(payload.data() + bytes.size() + 8, &suffix.slowest, 8);
  const net::FrameHeader r =
      ParamsHeader(conn, c, clock, request_id, net::kFlagVersions, payload.size());
  conn.SendOwned(r, std::move(payload));
}

namespace {

// The sparse form of `dense` (elements of type Word: the wire dtype's
// bits), or null when it is not smaller: one pass counts the entries whose
// bits are not +0.0, a second writes them (fixed-size loads: this runs over
// every element of every update of the key).
template <typename Word>
std::shared_ptr<const std::string> SparseOf(std::span<const std::byte> dense, net::DType dtype) {
  const size_t n = dense.size() / sizeof(Word);
  const auto word = [&](size_t i) {
    Word w;
    std::memcpy(&w, dense.data() + i * sizeof(Word), sizeof(Word));
    return w;
  };
  size_t count = 0;
  for (size_t i = 0; i < n; ++i) count += word(i) != 0;
  if (net::SparsePayloadBytes(static_cast<uint32_t>(count), dtype) >= dense.size()) {
    return nullptr;
  }
  auto out = std::make_shared<std::string>(
      net::SparsePayloadBytes(static_cast<uint32_t>(count), dtype), '\0');
  char* p = out->data();
  const auto c32 = static_cast<uint32_t>(count);
  std::memcpy(p, &c32, 4);
  char* idx = p + 4;
  char* values = idx + count * 4;
  for (size_t i = 0; i < n; ++i) {
    const Word w = word(i);
    if (w == 0) continue;
    const auto i32 = static_cast<uint32_t>(i);
    std::memcpy(idx, &i32, 4);
    std::memcpy(values, &w, sizeof(Word));
    idx += 4;
    values += sizeof(Word);
  }
  return out;
}

// The sparse form of version v's reply, or null when the chunk's replies
// are dense (not a sum-only top-k chunk, or the sparse form is not smaller).
std::shared_ptr<const std::string> SparseReply(const Chunk& c, uint64_t v) {
  if (!c.sparse_replies || c.multi_rack() || c.elastic ||
      c.state.optimizer().type != aggregation::OptimizerType::kSumOnly) {
    return nullptr;
  }
  const std::span<const std::byte> dense = c.state.wire_params(v);
  return net::DTypeBytes(c.dtype) == 4 ? SparseOf<uint32_t>(dense, c.dtype)
                                       : SparseOf<uint16_t>(dense, c.dtype);
}

}  // namespace

void AnswerPushes(Chunk& c, uint64_t version) {
  const std::shared_ptr<const std::string> sparse =
      c.pushes.empty() ? nullptr : SparseReply(c, version);
  for (const Waiter& w : c.pushes) {
    auto wc = w.conn.lock();
    if (!wc || !wc->open()) continue;
    if (!sparse) {
      SendParams(*wc, c, version, w.request_id);
      continue;
    }
    wc->SendShared(ParamsHeader(*wc, c, version, w.request_id, net::kFlagSparse, sparse->size()),
                   std::as_bytes(std::span<const char>(*sparse)), sparse);
  }
  c.pushes.clear();
}

void AnswerPulls(Chunk& c, uint64_t version) {
  std::vector<Waiter> pulls;
  pulls.swap(c.pulls);
  for (const Waiter& w : pulls) {
    if (auto wc = w.conn.lock(); wc && wc->open()) {
      wc->Unreserve(w.reserved);
      SendParams(*wc, c, version, w.request_id);
    }
  }
}

}  // namespace rackhub::server
