// frame_fuzz: one data-plane frame as it arrives from an untrusted peer
// (net/frame.h). Input: a 40-byte header followed by any number of payload
// bytes (a short input is zero-padded to a header).
//
// Contract checked:
//   - DecodeHeader reads every byte pattern; EncodeHeader(DecodeHeader(b)) == b
//     (the layout is a bijection: no field is lost or overlaps another);
//   - CheckHeader accepts only known opcodes and dtypes, a version and magic
//     that match, data frames with a whole number of elements within
//     kMaxDataPayload, control frames within kMaxControlPayload;
//   - the payload is decoded the way its receiver does, per opcode: ERROR
//     bodies (DecodeErrorBody, and the ErrorFrame round trip), the protobuf
//     control payloads, the element payloads of data frames widened to
//     fp32 by the kernels the lanes and the client use, and the row requests
//     of tables (ParseRowsPayload; a parsed one re-encodes to its bytes),
//     sparse (top-k) PUSH payloads (ParseSparsePayload; an accepted one is
//     in range and ascending, and is summed and applied by a ChunkState as
//     the lanes do) and the versions suffix of PARAMS.
// Nothing here may crash, leak, read out of bounds or hit UB (ASan+UBSan).
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "rackhub/aggregation/chunk_state.h"
#include "rackhub/aggregation/kernels.h"
#include "rackhub/data/v1/control.pb.h"
#include "rackhub/net/frame.h"

namespace {

namespace net = rackhub::net;
namespace dpb = rackhub::data::v1;
namespace agg = rackhub::aggregation;
using rackhub::Result;

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "frame_fuzz: contract broken: %s\n", what);
    std::abort();
  }
}

template <typename Message>
void ParseAndReserialize(std::span<const std::byte> payload) {
  Message m;
  if (m.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    Message again;
    Check(again.ParseFromString(m.SerializeAsString()), "a parsed message re-parses");
  }
}

void DecodeElements(const net::FrameHeader& h, std::span<const std::byte> payload) {
  const uint32_t width = net::DTypeBytes(h.dtype);
  const size_t n = payload.size() / width;
  std::vector<float> out(n);
  const auto type = static_cast<agg::ElementType>(h.dtype);
  agg::CopyIn(out.data(), payload.data(), n, type);  // unaligned source on purpose
  std::vector<float> acc(n, 1.0f);
  agg::AddIn(acc.data(), payload.data(), n, type);
}

// A row request as the lane parses it, for a table of 1..64 columns (taken
// from the key field): a parsed request re-encodes to the same bytes.
void DecodeRows(const net::FrameHeader& h, std::span<const std::byte> payload) {
  const uint32_t dim = 1 + h.key % 64;
  Result<net::RowsPayload> parsed = net::ParseRowsPayload(h.opcode, payload, dim, h.dtype);
  if (!parsed.ok()) return;
  const net::RowsPayload& rows = *parsed;
  const std::string prefix = net::EncodeRowsRequest(rows.ids, rows.want);
  Check(prefix.size() + rows.row_bytes == payload.size(), "row request sizes add up");
  Check(std::memcmp(prefix.data(), payload.data(), prefix.size()) == 0,
        "row request round trip");
  Check(rows.row_bytes == rows.ids.size() * dim * net::DTypeBytes(h.dtype) ||
            h.opcode == net::Opcode::kPullRows,
        "PUSH_ROWS carries one row per id");
  if (rows.rows) DecodeElements(h, {rows.rows, rows.row_bytes});
}

// A sparse PUSH as the lane parses it, for a chunk of 1..4096 elements
// (from the chunk field) and the ratio 1/(1 + key % 8): an accepted payload
// lists in-range ascending indices and feeds a ChunkState (rank 1 parked
// behind rank 0, then applied alone).
void DecodeSparse(const net::FrameHeader& h, std::span<const std::byte> payload) {
  const uint32_t elements = 1 + h.chunk % 4096;
  const uint32_t max_count = std::max<uint32_t>(1, elements / (1 + h.key % 8));
  Result<net::SparsePayload> parsed = net::ParseSparsePayload(payload, elements, max_count, h.dtype);
  if (!parsed.ok()) return;
  const net::SparsePayload& sp = *parsed;
  Check(sp.count <= max_count, "no more entries than allowed");
  Check(payload.size() == net::SparsePayloadBytes(sp.count, h.dtype), "sparse sizes add up");
  uint32_t prev = 0;
  for (uint32_t j = 0; j < sp.count; ++j) {
    uint32_t i;
    std::memcpy(&i, sp.indices + size_t{j} * 4, 4);
    Check(i < elements && (j == 0 || i > prev), "accepted indices are in range and ascending");
    prev = i;
  }
  agg::OptimizerConfig sum;
  sum.type = agg::OptimizerType::kSumOnly;
  agg::NormalizeOptimizer(&sum);
  const auto type = static_cast<agg::ElementType>(h.dtype);
  agg::ChunkState c(elements, 2, sum, type);
  c.MarkInitialized();
  const agg::ChunkState::SparseView view{sp.count, sp.indices, sp.values};
  Check(c.ContributeSparse(1, view) == agg::ChunkState::AddResult::kAccepted, "rank 1 parked");
  Check(c.ContributeSparse(0, view) == agg::ChunkState::AddResult::kComplete, "rank 0 folds");
  c.Update();
  Check(c.ApplyAloneSparse(view), "applied alone");
}

void DecodePayload(const net::FrameHeader& h, std::span<const std::byte> payload) {
  switch (h.opcode) {
    case net::Opcode::kError: {
      const Result<net::ErrorBody> body = net::DecodeErrorBody(payload);
      const bool ok = body.ok();
      Check(ok == (payload.size() >= 4), "ERROR bodies of 4+ bytes decode");
      if (ok) {
        const net::WireError code = body->code;
        const std::string& text = body->text;
        Check(text.size() == payload.size() - 4, "ERROR text is the rest of the body");
        const net::ErrorFrame f = net::MakeErrorFrame(code, text, h.tenant, h.request_id, true);
        Check(f.body.size() == payload.size() &&
                  std::memcmp(f.body.data(), payload.data(), payload.size()) == 0,
              "ERROR body round trip");
        Check(f.header.payload_bytes == payload.size(), "ERROR frame length");
        (void)net::WireErrorName(code);
      }
      break;
    }
    case net::Opcode::kHello: ParseAndReserialize<dpb::Hello>(payload); break;
    case net::Opcode::kWelcome: ParseAndReserialize<dpb::Welcome>(payload); break;
    case net::Opcode::kDeclare: ParseAndReserialize<dpb::KeyDeclaration>(payload); break;
    case net::Opcode::kKeyInfo: ParseAndReserialize<dpb::KeyEntry>(payload); break;
    case net::Opcode::kSetOptimizer: ParseAndReserialize<dpb::OptimizerUpdate>(payload); break;
    case net::Opcode::kHubHello: ParseAndReserialize<dpb::HubHello>(payload); break;
    case net::Opcode::kHubChallenge: ParseAndReserialize<dpb::HubChallenge>(payload); break;
    case net::Opcode::kHubProof:
    case net::Opcode::kHubAccept: ParseAndReserialize<dpb::HubProof>(payload); break;
    case net::Opcode::kKeyBind: ParseAndReserialize<dpb::KeyBind>(payload); break;
    case net::Opcode::kRackVersions: ParseAndReserialize<dpb::RackVersions>(payload); break;
    case net::Opcode::kRackCheckpoint: ParseAndReserialize<dpb::RackCheckpoint>(payload); break;
    case net::Opcode::kPush:
      if (h.flags & net::kFlagSparse) {
        DecodeSparse(h, payload);
      } else {
        DecodeElements(h, payload);
      }
      break;
    case net::Opcode::kParams:
      if ((h.flags & net::kFlagVersions) && payload.size() >= net::kVersionsSuffixBytes) {
        DecodeElements(h, payload.first(payload.size() - net::kVersionsSuffixBytes));
        break;
      }
      DecodeElements(h, payload);
      break;
    case net::Opcode::kInit:
    case net::Opcode::kRackSum:
    case net::Opcode::kRackParams:
    case net::Opcode::kRackAlign: DecodeElements(h, payload); break;
    case net::Opcode::kPushRows:
    case net::Opcode::kPullRows: DecodeRows(h, payload); break;
    case net::Opcode::kRows:
      if (payload.size() >= net::kRowsPrefixBytes) {
        DecodeElements(h, payload.subspan(net::kRowsPrefixBytes));
      }
      break;
    case net::Opcode::kRackRelay: {
      // The 16-byte relay prefix (decoded as the home does; re-encoded, a
      // valid one gives back its bytes), then the worker's payload, read
      // as the worker's frame would be.
      const auto prefix = net::DecodeRelayPrefix(payload);
      if (!prefix.ok()) {
        Check(!prefix.status().message().empty(), "a refused relay prefix says why");
        break;
      }
      const std::string again = net::EncodeRelayPrefix(*prefix);
      Check(prefix->kind != net::RelayKind::kFrame ||
                std::memcmp(again.data(), payload.data(), net::kRelayPrefixBytes) == 0,
            "a relay prefix re-encodes to its bytes");
      net::FrameHeader inner = h;
      inner.opcode = prefix->opcode;
      inner.payload_bytes = static_cast<uint32_t>(payload.size() - net::kRelayPrefixBytes);
      if (prefix->kind == net::RelayKind::kFrame && inner.opcode != net::Opcode::kRackRelay &&
          inner.opcode != net::Opcode::kRackRelayReply && net::CheckHeader(inner).ok()) {
        DecodePayload(inner, payload.subspan(net::kRelayPrefixBytes));
      }
      break;
    }
    case net::Opcode::kRackRelayReply: {
      // A whole PARAMS or ERROR frame, checked as the relaying hub does,
      // then its payload read as a worker reads it.
      const auto inner = net::DecodeRelayReply(payload);
      if (!inner.ok()) {
        Check(!inner.status().message().empty(), "a refused relay reply says why");
        break;
      }
      Check(inner->payload_bytes == payload.size() - net::kHeaderBytes,
            "a relay reply's frame is whole");
      DecodePayload(*inner, payload.subspan(net::kHeaderBytes));
      break;
    }
    case net::Opcode::kPull:
    case net::Opcode::kCommit:
    case net::Opcode::kRollback:
    case net::Opcode::kHeartbeat:
    case net::Opcode::kBye:
    case net::Opcode::kAck: break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::array<std::byte, net::kHeaderBytes> raw{};
  std::memcpy(raw.data(), data, std::min(size, raw.size()));
  const net::FrameHeader h = net::DecodeHeader(raw);

  std::array<std::byte, net::kHeaderBytes> again{};
  net::EncodeHeader(h, again);
  Check(again == raw, "EncodeHeader(DecodeHeader(b)) == b");
  (void)net::OpcodeName(h.opcode);
  (void)net::DTypeName(h.dtype);

  const rackhub::Status valid = net::CheckHeader(h);
  if (!valid.ok()) {
    Check(!valid.message().empty(), "a refused header says why");
    return 0;
  }
  const auto op = static_cast<uint8_t>(h.opcode);
  Check(h.magic == net::kMagic && h.version == net::kVersion && op >= 1 &&
            op <= net::kMaxOpcode && static_cast<uint8_t>(h.dtype) <= 3 &&
            h.payload_bytes <= std::max(net::kMaxDataPayload, net::kMaxRelayPayload),
        "CheckHeader passes only valid headers");

  // The payload the receiver would get: at most payload_bytes of what follows.
  const size_t rest = size > net::kHeaderBytes ? size - net::kHeaderBytes : 0;
  const size_t n = std::min<size_t>(rest, h.payload_bytes);
  std::vector<std::byte> payload(n);  // own buffer: ASan sees any overread
  if (n > 0) std::memcpy(payload.data(), data + net::kHeaderBytes, n);
  if (n == h.payload_bytes) DecodePayload(h, payload);
  return 0;
}
