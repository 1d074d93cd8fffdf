#include "rackhub/net/frame.h"

#include <bit>

#include <fmt/format.h>

namespace rackhub::net {

static_assert(std::endian::native == std::endian::little,
              "the wire format is little-endian; add byte swaps for big-endian hosts");

namespace {

template <typename T>
void Put(std::byte* base, size_t offset, T v) {
  std::memcpy(base + offset, &v, sizeof v);
}
template <typename T>
T Get(const std::byte* base, size_t offset) {
  T v;
  std::memcpy(&v, base + offset, sizeof v);
  return v;
}

bool IsDataOpcode(Opcode op) {
  return op == Opcode::kPush || op == Opcode::kParams || op == Opcode::kInit ||
         op == Opcode::kRackSum || op == Opcode::kRackParams || op == Opcode::kPushRows ||
         op == Opcode::kRows || op == Opcode::kPullRows || op == Opcode::kRackAlign;
}

}  // namespace

const char* DTypeName(DType d) {
  switch (d) {
    case DType::kNone: return "none";
    case DType::kFp32: return "fp32";
    case DType::kFp16: return "fp16";
    case DType::kBf16: return "bf16";
  }
  return "unknown";
}

const char* WireErrorName(WireError e) {
  switch (e) {
    case WireError::kMalformed: return "MALFORMED";
    case WireError::kUnauthenticated: return "UNAUTHENTICATED";
    case WireError::kUnknownKey: return "UNKNOWN_KEY";
    case WireError::kBadChunk: return "BAD_CHUNK";
    case WireError::kBadDType: return "BAD_DTYPE";
    case WireError::kBadIteration: return "BAD_ITERATION";
    case WireError::kDuplicatePush: return "DUPLICATE_PUSH";
    case WireError::kNotReady: return "NOT_READY";
    case WireError::kWorkerLost: return "WORKER_LOST";
    case WireError::kQuotaExceeded: return "QUOTA_EXCEEDED";
    case WireError::kInvalidArgument: return "INVALID_ARGUMENT";
    case WireError::kTenantGone: return "TENANT_GONE";
    case WireError::kShuttingDown: return "SHUTTING_DOWN";
    case WireError::kInternal: return "INTERNAL";
  }
  return "UNKNOWN";
}

const char* OpcodeName(Opcode op) {
  switch (op) {
    case Opcode::kHello: return "HELLO";
    case Opcode::kWelcome: return "WELCOME";
    case Opcode::kPush: return "PUSH";
    case Opcode::kParams: return "PARAMS";
    case Opcode::kInit: return "INIT";
    case Opcode::kPull: return "PULL";
    case Opcode::kError: return "ERROR";
    case Opcode::kHeartbeat: return "HEARTBEAT";
    case Opcode::kBye: return "BYE";
    case Opcode::kDeclare: return "DECLARE";
    case Opcode::kKeyInfo: return "KEY_INFO";
    case Opcode::kSetOptimizer: return "SET_OPTIMIZER";
    case Opcode::kAck: return "ACK";
    case Opcode::kHubHello: return "HUB_HELLO";
    case Opcode::kKeyBind: return "KEY_BIND";
    case Opcode::kRackSum: return "RACK_SUM";
    case Opcode::kRackParams: return "RACK_PARAMS";
    case Opcode::kPushRows: return "PUSH_ROWS";
    case Opcode::kRows: return "ROWS";
    case Opcode::kPullRows: return "PULL_ROWS";
    case Opcode::kHubChallenge: return "HUB_CHALLENGE";
    case Opcode::kHubProof: return "HUB_PROOF";
    case Opcode::kHubAccept: return "HUB_ACCEPT";
    case Opcode::kRackVersions: return "RACK_VERSIONS";
    case Opcode::kRackAlign: return "RACK_ALIGN";
    case Opcode::kRackCheckpoint: return "RACK_CHECKPOINT";
    case Opcode::kCommit: return "COMMIT";
    case Opcode::kRollback: return "ROLLBACK";
    case Opcode::kRackRelay: return "RACK_RELAY";
    case Opcode::kRackRelayReply: return "RACK_RELAY_REPLY";
  }
  return "UNKNOWN";
}

void EncodeHeader(const FrameHeader& h, std::span<std::byte, kHeaderBytes> out) {
  std::byte* b = out.data();
  Put<uint32_t>(b, 0, h.magic);
  Put<uint8_t>(b, 4, h.version);
  Put<uint8_t>(b, 5, static_cast<uint8_t>(h.opcode));
  Put<uint8_t>(b, 6, h.flags);
  Put<uint8_t>(b, 7, static_cast<uint8_t>(h.dtype));
  Put<uint32_t>(b, 8, h.tenant);
  Put<uint32_t>(b, 12, h.key);
  Put<uint32_t>(b, 16, h.chunk);
  Put<uint32_t>(b, 20, h.payload_bytes);
  Put<uint64_t>(b, 24, h.iteration);
  Put<uint64_t>(b, 32, h.request_id);
}

FrameHeader DecodeHeader(std::span<const std::byte, kHeaderBytes> in) {
  const std::byte* b = in.data();
  FrameHeader h;
  h.magic = Get<uint32_t>(b, 0);
  h.version = Get<uint8_t>(b, 4);
  h.opcode = static_cast<Opcode>(Get<uint8_t>(b, 5));
  h.flags = Get<uint8_t>(b, 6);
  h.dtype = static_cast<DType>(Get<uint8_t>(b, 7));
  h.tenant = Get<uint32_t>(b, 8);
  h.key = Get<uint32_t>(b, 12);
  h.chunk = Get<uint32_t>(b, 16);
  h.payload_bytes = Get<uint32_t>(b, 20);
  h.iteration = Get<uint64_t>(b, 24);
  h.request_id = Get<uint64_t>(b, 32);
  return h;
}

Status CheckHeader(const FrameHeader& h) {
  if (h.magic != kMagic) return InvalidArgument("magic: not a rackhub frame");
  if (h.version != kVersion) {
    return InvalidArgument(fmt::format("version: {} is not supported (this hub speaks {})",
                                       h.version, kVersion));
  }
  const auto op = static_cast<uint8_t>(h.opcode);
  if (op == 0 || op > kMaxOpcode) {
    return InvalidArgument(fmt::format("opcode: unknown opcode {}", op));
  }
  const auto dt = static_cast<uint8_t>(h.dtype);
  if (dt > static_cast<uint8_t>(DType::kBf16)) {
    return InvalidArgument(fmt::format("dtype: unknown dtype {}", dt));
  }
  if (IsDataOpcode(h.opcode)) {
    if (h.dtype == DType::kNone) return InvalidArgument("dtype: a data frame needs a dtype");
    if (h.payload_bytes > kMaxDataPayload) {
      return InvalidArgument(fmt::format("payload_bytes: {} exceeds the maximum {}",
                                         h.payload_bytes, kMaxDataPayload));
    }
    if (h.payload_bytes % DTypeBytes(h.dtype) != 0) {
      return InvalidArgument(fmt::format("payload_bytes: {} is not a whole number of {} elements",
                                         h.payload_bytes, DTypeName(h.dtype)));
    }
  } else if (h.opcode == Opcode::kRackRelay || h.opcode == Opcode::kRackRelayReply) {
    if (h.payload_bytes > kMaxRelayPayload) {
      return InvalidArgument(fmt::format("payload_bytes: {} exceeds the relay maximum {}",
                                         h.payload_bytes, kMaxRelayPayload));
    }
  } else if (h.payload_bytes > kMaxControlPayload) {
    return InvalidArgument(fmt::format("payload_bytes: {} exceeds the control-message maximum {}",
                                       h.payload_bytes, kMaxControlPayload));
  }
  return Status::Ok();
}

Result<RowsPayload> ParseRowsPayload(Opcode op, std::span<const std::byte> payload,
                                     uint32_t dim, DType dtype) {
  if (payload.size() < kRowsPrefixBytes) {
    return InvalidArgument(
        fmt::format("payload_bytes: {} is shorter than the 8-byte row counts", payload.size()));
  }
  uint32_t count = 0, want = 0;
  std::memcpy(&count, payload.data(), 4);
  std::memcpy(&want, payload.data() + 4, 4);
  const bool push = op == Opcode::kPushRows;
  if (!push && want != 0) {
    return InvalidArgument("want: PULL_ROWS lists its row ids in `count`; want must be 0");
  }
  const uint64_t ids = uint64_t{count} + want;
  const uint64_t row_bytes = push ? uint64_t{count} * dim * DTypeBytes(dtype) : 0;
  const uint64_t expect = kRowsPrefixBytes + ids * 8 + row_bytes;
  if (payload.size() != expect) {
    return InvalidArgument(fmt::format(
        "payload_bytes: {} row ids{} need {} bytes, got {}", ids,
        push ? fmt::format(" and {} rows of {} {} elements", count, dim, DTypeName(dtype)) : "",
        expect, payload.size()));
  }
  RowsPayload parsed;
  RowsPayload* out = &parsed;
  const std::byte* p = payload.data() + kRowsPrefixBytes;
  // (memcpy only when there is something: an empty vector's data() may be
  // null, which memcpy must not get even for 0 bytes.)
  out->ids.resize(count);
  if (count > 0) std::memcpy(out->ids.data(), p, size_t{count} * 8);
  p += size_t{count} * 8;
  out->want.resize(want);
  if (want > 0) std::memcpy(out->want.data(), p, size_t{want} * 8);
  p += size_t{want} * 8;
  out->rows = row_bytes ? p : nullptr;
  out->row_bytes = row_bytes;
  return parsed;
}

Result<SparsePayload> ParseSparsePayload(std::span<const std::byte> payload, uint32_t elements,
                                         uint32_t max_count, DType dtype) {
  if (payload.size() < kSparsePrefixBytes) {
    return InvalidArgument(fmt::format("payload_bytes: {} is shorter than the 4-byte entry count",
                                       payload.size()));
  }
  uint32_t count = 0;
  std::memcpy(&count, payload.data(), 4);
  if (count > max_count) {
    return InvalidArgument(
        fmt::format("count: {} entries, the chunk's top-k allows at most {} of its {} elements",
                    count, max_count, elements));
  }
  const uint64_t expect = SparsePayloadBytes(count, dtype);
  if (payload.size() != expect) {
    return InvalidArgument(fmt::format("payload_bytes: {} sparse entries of {} need {} bytes, got {}",
                                       count, DTypeName(dtype), expect, payload.size()));
  }
  const std::byte* idx = payload.data() + kSparsePrefixBytes;
  uint32_t prev = 0;
  for (uint32_t j = 0; j < count; ++j) {
    uint32_t i;
    std::memcpy(&i, idx + size_t{j} * 4, 4);
    if (i >= elements) {
      return InvalidArgument(
          fmt::format("indices: entry {} is index {}, out of range for a chunk of {} elements", j,
                      i, elements));
    }
    if (j > 0 && i <= prev) {
      return InvalidArgument(
          fmt::format("indices: entry {} is index {} after {}; indices must be strictly ascending",
                      j, i, prev));
    }
    prev = i;
  }
  SparsePayload out;
  out.count = count;
  out.indices = count ? idx : nullptr;
  out.values = count ? idx + size_t{count} * 4 : nullptr;
  return out;
}

std::string EncodeRowsRequest(std::span<const uint64_t> ids, std::span<const uint64_t> want) {
  std::string out(kRowsPrefixBytes + (ids.size() + want.size()) * 8, '\0');
  const uint32_t count = static_cast<uint32_t>(ids.size());
  const uint32_t w = static_cast<uint32_t>(want.size());
  std::memcpy(out.data(), &count, 4);
  std::memcpy(out.data() + 4, &w, 4);
  if (!ids.empty()) std::memcpy(out.data() + kRowsPrefixBytes, ids.data(), ids.size() * 8);
  if (!want.empty()) {
    std::memcpy(out.data() + kRowsPrefixBytes + ids.size() * 8, want.data(), want.size() * 8);
  }
  return out;
}

std::string EncodeErrorBody(WireError code, std::string_view text) {
  std::string out(4 + text.size(), '\0');
  const uint32_t c = static_cast<uint32_t>(code);
  std::memcpy(out.data(), &c, 4);
  std::memcpy(out.data() + 4, text.data(), text.size());
  return out;
}

ErrorFrame MakeErrorFrame(WireError code, std::string_view text, uint32_t tenant,
                          uint64_t request_id, bool fatal) {
  ErrorFrame f;
  f.body = EncodeErrorBody(code, text);
  f.header.opcode = Opcode::kError;
  f.header.flags = fatal ? kFlagFatal : 0;
  f.header.tenant = tenant;
  f.header.request_id = request_id;
  f.header.payload_bytes = static_cast<uint32_t>(f.body.size());
  return f;
}

Result<ErrorBody> DecodeErrorBody(std::span<const std::byte> body) {
  if (body.size() < 4) {
    return InvalidArgument(fmt::format("ERROR payload of {} bytes, shorter than its 4-byte code",
                                       body.size()));
  }
  uint32_t c;
  std::memcpy(&c, body.data(), 4);
  ErrorBody e;
  e.code = static_cast<WireError>(c);
  e.text.assign(reinterpret_cast<const char*>(body.data()) + 4, body.size() - 4);
  return e;
}

std::string EncodeRelayPrefix(const RelayPrefix& p) {
  std::string out(kRelayPrefixBytes, '\0');
  auto* b = reinterpret_cast<std::byte*>(out.data());
  Put<uint8_t>(b, 0, static_cast<uint8_t>(p.kind));
  Put<uint8_t>(b, 1, p.kind == RelayKind::kFrame ? static_cast<uint8_t>(p.opcode) : 0);
  Put<uint16_t>(b, 2, 0);
  Put<uint32_t>(b, 4, p.rank);
  Put<uint64_t>(b, 8, p.session);
  return out;
}

Result<RelayPrefix> DecodeRelayPrefix(std::span<const std::byte> payload) {
  if (payload.size() < kRelayPrefixBytes) {
    return InvalidArgument(fmt::format("RACK_RELAY: {} bytes, shorter than its {}-byte prefix",
                                       payload.size(), kRelayPrefixBytes));
  }
  const std::byte* b = payload.data();
  const auto kind = Get<uint8_t>(b, 0);
  if (kind > static_cast<uint8_t>(RelayKind::kMemberGone)) {
    return InvalidArgument(fmt::format("RACK_RELAY: kind {} is not a relay kind", kind));
  }
  if (const auto reserved = Get<uint16_t>(b, 2); reserved != 0) {
    return InvalidArgument(
        fmt::format("RACK_RELAY: the prefix's reserved field is {}, not 0", reserved));
  }
  RelayPrefix p;
  p.kind = static_cast<RelayKind>(kind);
  p.opcode = static_cast<Opcode>(Get<uint8_t>(b, 1));
  p.rank = Get<uint32_t>(b, 4);
  p.session = Get<uint64_t>(b, 8);
  return p;
}

Result<FrameHeader> DecodeRelayReply(std::span<const std::byte> payload) {
  if (payload.size() < kHeaderBytes) {
    return InvalidArgument(fmt::format(
        "RACK_RELAY_REPLY: {} bytes, shorter than a {}-byte frame header", payload.size(),
        kHeaderBytes));
  }
  const FrameHeader inner = DecodeHeader(payload.first<kHeaderBytes>());
  if (inner.opcode != Opcode::kParams && inner.opcode != Opcode::kError) {
    return InvalidArgument(
        fmt::format("RACK_RELAY_REPLY: carries {}, not a PARAMS or ERROR frame",
                    OpcodeName(inner.opcode)));
  }
  if (Status ok = CheckHeader(inner); !ok.ok()) {
    return InvalidArgument("RACK_RELAY_REPLY: the frame it carries: " + ok.message());
  }
  if (inner.payload_bytes != payload.size() - kHeaderBytes) {
    return InvalidArgument(fmt::format(
        "RACK_RELAY_REPLY: the frame it carries says {} payload bytes, {} follow",
        inner.payload_bytes, payload.size() - kHeaderBytes));
  }
  return inner;
}

}  // namespace rackhub::net
