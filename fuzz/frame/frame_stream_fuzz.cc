// frame_stream_fuzz: the receive side of a byte-stream transport
// (net/frame_reader.h) fed an untrusted stream in arbitrary pieces.
// Input: byte 0 seeds how the stream is cut into receives (and when the
// reader is paused and resumed); the rest is the stream.
//
// Contract checked (differentially): cutting the stream anywhere, with any
// receive sizes and pauses, delivers exactly the frames, discards and the
// one fatal MALFORMED error that receiving it in one piece does; every
// delivered payload is payload_bytes long and is the bytes that followed its
// header; after a reject or a fatal error nothing more is delivered; a tiny
// initial buffer grows only as far as one frame needs. The handler's verdict
// per header (accept, discard, reject) comes from the header itself.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "rackhub/net/frame_reader.h"
#include "rackhub/net/transport.h"

namespace {

namespace net = rackhub::net;

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "frame_stream_fuzz: contract broken: %s\n", what);
    std::abort();
  }
}

// Records what the reader does, as text (compared between two feeds).
class Recorder final : public net::Connection, public net::FrameHandler {
 public:
  static constexpr size_t kMaxAccepted = 256 * 1024;
  std::string log;
  bool fatal = false;
  size_t max_accepted = 0;  // largest payload accepted

  // net::FrameHandler.
  Verdict AcceptHeader(net::Connection&, const net::FrameHeader& h) override {
    Check(!fatal, "no header after a fatal error");
    Check(net::CheckHeader(h).ok(), "only checked headers reach the handler");
    // Large frames are discarded (a lane refuses a payload larger than its
    // chunk the same way), so one input does not allocate 64 MiB.
    auto v = static_cast<Verdict>(h.request_id % 3);
    if (v == Verdict::kAccept && h.payload_bytes > kMaxAccepted) v = Verdict::kDiscard;
    if (v == Verdict::kAccept) max_accepted = std::max<size_t>(max_accepted, h.payload_bytes);
    log += "H" + std::to_string(static_cast<int>(h.opcode)) + "/" +
           std::to_string(h.payload_bytes) + "/" + std::to_string(static_cast<int>(v)) + ";";
    if (v == Verdict::kReject) fatal = true;
    return v;
  }
  void HandleFrame(net::Connection&, const net::FrameHeader& h,
                   std::span<const std::byte> payload) override {
    Check(!fatal, "no payload after a fatal error");
    Check(payload.size() == h.payload_bytes, "payload is payload_bytes long");
    uint64_t sum = 1469598103934665603ull;  // FNV-1a of the payload
    for (std::byte b : payload) sum = (sum ^ static_cast<uint8_t>(b)) * 1099511628211ull;
    log += "P" + std::to_string(sum) + ";";
  }
  void OnConnectionClosed(net::Connection&, const std::string&) override {}
  void OnBytesSent(net::Connection&, size_t) override {}

  // net::Connection (only SendError is used by the reader).
  const net::ConnectionIdentity& id() const override { return id_; }
  bool open() const override { return !fatal; }
  void Start() override {}
  void SendShared(const net::FrameHeader&, std::span<const std::byte>,
                  std::shared_ptr<const void>) override {}
  void SendOwned(const net::FrameHeader&, std::string) override {}
  void SendError(net::WireError code, const std::string& text, uint64_t, bool is_fatal) override {
    Check(code == net::WireError::kMalformed && is_fatal && !text.empty(),
          "the reader's only error is a fatal MALFORMED naming the field");
    Check(!fatal, "one fatal error at most");
    fatal = true;
    log += "E" + text + ";";
  }
  void Close(const std::string&) override {}

 private:
  net::ConnectionIdentity id_;
};

struct Feed {
  std::string log;
  size_t max_capacity = 0;
  size_t max_accepted = 0;
};

// Feeds `stream` to a reader in pieces chosen by `seed` (0: all at once).
Feed Run(std::span<const uint8_t> stream, uint8_t seed, size_t initial_bytes) {
  Recorder r;
  net::FrameReader reader(initial_bytes);
  uint32_t rng = seed * 2654435761u + 1;
  auto next = [&rng] { return rng = rng * 1664525u + 1013904223u; };
  Feed out;
  size_t pos = 0;
  while (pos < stream.size() && !reader.stopped()) {
    const size_t want = seed == 0 ? stream.size() - pos : 1 + (next() >> 8) % 97;
    std::span<std::byte> room = reader.WritableSpan(std::min(want, stream.size() - pos));
    const size_t n = std::min({want, stream.size() - pos, room.size()});
    Check(n > 0, "WritableSpan gives room");
    std::memcpy(room.data(), stream.data() + pos, n);
    reader.Commit(n);
    pos += n;
    if (seed != 0 && (next() >> 12) % 5 == 0) {  // a pause on the way (backpressure)
      reader.Pause(true);
      reader.Parse(r, r);
      reader.Pause(false);
    }
    reader.Parse(r, r);
    if (r.fatal) reader.Stop();  // what a transport does after a fatal error
    out.max_capacity = std::max(out.max_capacity, reader.capacity());
  }
  out.max_accepted = r.max_accepted;
  out.log = r.log + (reader.inside_frame() && !reader.stopped() ? "PARTIAL" : "");
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::span<const uint8_t> stream(data + 1, size - 1);
  const Feed whole = Run(stream, 0, net::FrameReader::kDefaultInitialBytes);
  const Feed pieces = Run(stream, data[0] | 1, 64);
  if (whole.log != pieces.log) {
    std::fprintf(stderr, "whole:  %s\npieces: %s\n", whole.log.c_str(), pieces.log.c_str());
    Check(false, "the same frames whatever the receive sizes");
  }
  // Growth: a 64-byte buffer grows to hold the largest frame accepted (plus
  // one receive behind it), at most doubled, never further.
  Check(pieces.max_capacity <= 2 * (pieces.max_accepted + net::kHeaderBytes + 97),
        "the receive buffer grows only as far as one frame needs");
  return 0;
}
