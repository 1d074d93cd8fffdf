// One shared-memory connection between a worker and a hub on the same host
// (docs/wire-protocol.md, section 10): the layer under the hub's
// ChannelConnection<shm::Channel> and the client's shared-memory lane.
//
// Resources (owned, released by the destructor): the connected Unix socket
// the set-up went over (kept open: its EOF is how each side learns that the
// other died), one shared mapping of a sealed memfd (memfd_create(2),
// F_SEAL_SHRINK | F_SEAL_GROW: the peer cannot truncate it under us), and two
// eventfd doorbells (eventfd(2)): ours, which we sleep on, and the peer's.
//
// Region layout: a 4 KiB control page (magic, version, ring size and one
// RingControl per direction, each field on its own cache line), then the
// worker-to-hub ring, then the hub-to-worker ring, `ring_bytes` each. A ring
// carries records: a 24-byte prefix (kind, record bytes), the 40-byte frame
// header (net/frame.h) and the payload, padded to 64 bytes, so every payload
// starts 64-byte aligned. A record never wraps: when it does not fit before the
// end, the producer writes a PAD record to the end and starts at 0.
//
// Protocol. The producer writes records, then publishes `head` (bytes written,
// monotonic; release store); the consumer hands each record over in place and
// publishes `tail` (bytes consumed). A side that finds nothing to do sets its
// `sleeping` (consumer) or `waiting` (producer, ring full) flag, looks once
// more, and sleeps on its doorbell; the other side rings the doorbell only
// when it clears such a flag (sequentially consistent: one of the two always
// sees the other). So a busy connection makes no system call per frame.
// A client that wrote frames and has nothing to read spins on the ring's
// head for a short adaptive budget before it sets `sleeping` (SpinForFrames:
// at most kMaxSpin, halved after a spin that found nothing, doubled after
// one that did; never while the hub's `sleeping` flag on our ring is set,
// i.e. while the hub has read everything and is not working for us). The
// spin only reads `head` (acquire) and the flag; the sleep protocol after it
// is unchanged.
//
// Lent regions (shm/lend.h, set-up version 2). A client frame whose payload
// lies in a region the worker lent goes as a reference record (region id,
// offset): the region's descriptor goes to the hub once per connection
// (LEND on the set-up socket, the only thing sent there after the set-up),
// the hub maps it read-only and hands the payload over in place. The frame's
// release waits until the hub's tail passed the record.
//
// Trust. The peer can write anything anywhere in the region at any time.
// Every value read from it (head, tail, prefixes, headers) is copied once,
// then checked against the ring's bounds before use; a bad one is a protocol
// violation (on_violation), never an access outside the mapping. A payload is
// delivered in place: a peer that rewrites it while it is read only changes
// its own data, as it could by sending other data.
//
// Threading: driven by one thread at a time, the io_context it is attached to
// (doorbell and socket watched with posix::stream_descriptor). Detach() +
// Attach() move it (the hub's acceptor checks HELLO, then the lane takes
// over). Sending is allowed whenever the owning thread holds it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>

#include "rackhub/common/status.h"
#include "rackhub/net/asio.h"
#include "rackhub/net/frame.h"
#include "rackhub/net/frame_channel.h"
#include "rackhub/net/outgoing_frame.h"
#include "rackhub/net/shm/arena.h"
#include "rackhub/net/shm/lend.h"

namespace rackhub::net::shm {

namespace internal {
struct RingControl;
struct LendMessage;
}

// Ring size per direction, bounds; always a multiple of 4 KiB.
inline constexpr uint32_t kDefaultRingBytes = 4u << 20;
inline constexpr uint32_t kMinRingBytes = 64u * 1024;
inline constexpr uint32_t kMaxRingBytes = 1u << 30;
inline constexpr size_t kControlBytes = 4096;
inline constexpr size_t kRecordAlign = 64;
inline constexpr size_t kRecordPrefixBytes = kRecordAlign - kHeaderBytes;  // 24

// Bytes of the record carrying a frame with `payload` bytes.
constexpr size_t RecordBytes(size_t payload) {
  return (kRecordPrefixBytes + kHeaderBytes + payload + kRecordAlign - 1) / kRecordAlign *
         kRecordAlign;
}
// The ring size a hub uses for frames of up to `max_frame_payload` bytes when
// configured with `configured` bytes: at least four such records.
uint32_t RingBytesFor(uint32_t configured, size_t max_frame_payload);

enum class Side { kHub, kClient };

enum class PollMode {
  kEvents,  // sleep on the doorbell as soon as there is nothing to do
  kBusy,    // keep polling for a short window after the last frame first
};

// The set-up message's payload (the hub's answer to HELLO on the Unix socket,
// in a WELCOME frame with the memfd and both doorbells attached).
struct SetupMessage {
  uint32_t magic = 0;
  uint32_t version = 0;
  uint32_t ring_bytes = 0;
  uint32_t arena_bytes = 0;  // the tenant's publish arena on this lane (0: none)
};
// Replies of at least this many bytes with a shared payload go through the
// publish arena (arena.h); smaller ones are copied into the ring.
inline constexpr size_t kPublishMinBytes = 4096;
inline constexpr uint32_t kSetupMagic = 0x4d534852;  // "RHSM"
// Version 2 adds lent regions (LEND on the set-up socket, LREF records);
// a client takes a hub of version 1 or 2 and lends only to version 2.
inline constexpr uint32_t kSetupVersion = 2;

// What a client's Connect got: a channel (the hub accepted HELLO; WELCOME
// follows through the ring), or the hub's refusal (an ERROR frame).
struct ConnectReply {
  std::shared_ptr<class Channel> channel;
  FrameHeader refusal{};
  std::string refusal_body;
};

// The abstract Unix socket name for a hub ("rackhub-shm-<pid>-<random>"), as
// offered in WELCOME; the socket is in the abstract namespace (unix(7)).
std::string NewSocketName();
// This host's boot id (/proc/sys/kernel/random/boot_id), "" if unreadable.
std::string BootId();

// Detach, Send, DropQueued, Close, open(): FrameChannel
// (net/frame_channel.h). Close shuts the socket down (the peer sees EOF and
// drains what is in its ring).
class Channel final : public FrameChannel {
 public:
  struct Callbacks : FrameChannel::Callbacks {
    // Optional (the hub's lanes set it): delivery in turns. Before each
    // frame the channel asks with the frame's record bytes and delivers
    // nothing until Grant(); without it every turn delivers up to a batch.
    std::function<void(size_t)> request_turn;
  };

  ~Channel() override;
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  // Hub side, after HELLO on `socket_fd` (connected Unix socket, taken over)
  // was accepted: creates the region and doorbells and sends the set-up
  // message with their descriptors. INTERNAL when a resource cannot be made,
  // UNAVAILABLE when the peer is gone.
  // `arena` (may be null): the publish arena of the worker's tenant on this
  // lane; the worker gets a read-only descriptor of it.
  static Result<std::shared_ptr<Channel>> Accept(int socket_fd, uint32_t ring_bytes,
                                                 std::shared_ptr<PublishArena> arena,
                                                 std::string peer, PollMode poll);
  // Client side: connects to the hub's abstract socket `socket_name`, sends
  // HELLO (`hello`, the encoded payload) and waits for the set-up message or
  // an ERROR until `deadline`. UNAVAILABLE when the socket cannot be reached
  // or times out, INVALID_ARGUMENT for a malformed set-up message.
  static Result<ConnectReply> Connect(const std::string& socket_name, const std::string& hello,
                                      PollMode poll,
                                      std::chrono::steady_clock::time_point deadline);

  void Attach(boost::asio::io_context& io, Callbacks callbacks);
  // Backpressure: while paused, arriving frames stay in the ring (not
  // consumed: the peer stops once it is full); resuming delivers them in
  // order on a fresh stack of the attached io_context.
  void PauseDelivery(bool on);
  // The answer to Callbacks::request_turn (the scheduler calls it on a fresh
  // stack): delivers the next frame now, then asks again if more wait.
  void Grant();

  uint32_t ring_bytes() const { return ring_bytes_; }
  const std::string& peer_address() const { return peer_; }

  // Testing only (fault injection), never used by production code: plays a
  // peer that writes garbage. The raw region; and WriteRawForTesting copies
  // `bytes` to the send position as they are, publishes head = position +
  // `head_advance` and rings the peer.
  std::span<std::byte> RegionForTesting() { return {base_, map_bytes_}; }
  void WriteRawForTesting(std::span<const std::byte> bytes, uint64_t head_advance);
  // Replies received as references into the publish arena (client side).
  uint64_t references_received() const { return references_received_; }
  // Frames sent (client) / received (hub) as references into a lent region.
  uint64_t lent_sent() const { return lent_sent_; }
  uint64_t lent_received() const { return lent_received_; }
  // Regions the hub has mapped for this connection (hub side).
  size_t lent_regions() const { return mapped_.size(); }
  // Testing only: sends a raw LEND/UNLEND message with `fd` (-1: none).
  bool SendLendMessageForTesting(uint32_t op, uint32_t id, uint64_t bytes, int fd);

 private:
  using RingControl = internal::RingControl;
  Channel(Side side, int socket_fd, std::byte* base, size_t map_bytes, uint32_t ring_bytes,
          int my_bell, int peer_bell, std::string peer, PollMode poll);
  std::shared_ptr<Channel> self() { return std::static_pointer_cast<Channel>(shared_from_this()); }
  RingControl* rx_control() const;
  RingControl* tx_control() const;
  std::byte* rx_ring() const;
  std::byte* tx_ring() const;

  void WatchBell();
  void WatchSocket();
  void OnBell();
  void OnSocketReadable();
  // Client: spins on the receive ring while a reply is due (see the
  // protocol above); true if frames arrived.
  bool SpinForFrames();
  // Delivers what the ring holds (unless paused), pumps sends, then either
  // schedules a busy poll or arms the sleep flags; `closing` skips the flags.
  void Poll();
  // Posts Poll to the attached io_context unless one is pending.
  void SchedulePoll();
  // Delivers ready frames; returns how many.
  size_t DeliverReady();
  void PumpSends() override;
  // The ring is full: have the peer ring us when it consumes.
  void WaitForRoom() override;
  void OnDetach() override;
  void OnClose() override;
  bool TryWrite(OutgoingFrame& frame);
  // Whether a record of `rec` bytes (and the pad before it) fits now.
  bool HasRoom(size_t rec, uint64_t tail) const;
  // A record that does not fit before the ring's end (records never wrap)
  // and not yet at all: writes the pad to the end now, if it fits, so the
  // record starts at offset 0 once the reader drains. Without it a record
  // over half the ring could wait forever at some positions (the pad and
  // the record never fit together). Sets pad_written_.
  void PadAhead(size_t rec, uint64_t tail);
  // Writes a record (a frame with `payload`, or a reference to `offset` of
  // the arena) at the send position and publishes it.
  void Append(uint32_t kind, size_t rec, const OutgoingFrame& f,
              std::span<const std::byte> payload, uint64_t offset, uint32_t region = 0);
  // Client: writes `f` as a reference into the lent region holding its
  // payload, if there is one and the hub has (or now gets) its descriptor
  // (kWritten); kFull: it is lent but the ring has no room for the
  // reference yet (wait; a lent payload may be larger than the ring);
  // kNotLent: write it as usual.
  enum class LentWrite { kWritten, kFull, kNotLent };
  LentWrite TryWriteLent(OutgoingFrame& f, uint64_t tail);
  // Client: LEND (the region's descriptor) or UNLEND on the set-up socket;
  // false if the socket cannot take it now.
  bool SendLendMessage(uint32_t op, uint32_t id, uint64_t bytes, int fd);
  // Client: UNLEND for lent regions that no longer exist here.
  void UnlendGone();
  // Client: releases the frames whose lent payload the hub consumed.
  void ReleaseLent(uint64_t tail);
  // Hub: reads what the worker sent on the set-up socket (LEND, UNLEND);
  // false once it is at EOF (peer_gone_ set) or violated.
  bool ReadSocket();
  void OnLendMessage(const internal::LendMessage& m, int fd);
  // Sets the flags that make the peer ring us; true if there is work after
  // all (the flags are cleared again).
  bool ArmSleep();
  void RingPeer();
  // Hub: releases the arena references whose records the peer consumed
  // (its tail passed them); all of them with `all`.
  void ReleaseConsumed(uint64_t tail, bool all = false);

  const Side side_;
  int socket_fd_;
  std::byte* base_;
  size_t map_bytes_;
  bool pad_written_ = false;  // PadAhead wrote a pad: the peer may need a ring
  uint32_t ring_bytes_;
  int my_bell_;
  int peer_bell_;
  std::string peer_;
  PollMode poll_;

  std::unique_ptr<boost::asio::posix::stream_descriptor> bell_fd_;
  std::unique_ptr<boost::asio::posix::stream_descriptor> socket_desc_;
  std::function<void(size_t)> request_turn_;  // Callbacks::request_turn
  bool poll_posted_ = false;
  std::chrono::steady_clock::time_point last_activity_;
  // Client: frames were written since the last delivery (a reply is due),
  // and the current spin budget (adaptive, SpinForFrames).
  bool reply_due_ = false;
  bool polling_ = false;  // inside Poll (PumpSends then needs no extra poll)
  std::chrono::nanoseconds spin_budget_{std::chrono::microseconds(16)};

  bool peer_gone_ = false;  // EOF seen: deliver what is left, then close
  uint64_t gone_head_ = 0;  // the peer's head at EOF: delivered up to there
  bool delivery_paused_ = false;
  // Turns (Callbacks::request_turn set): asked and not granted yet; granted.
  bool turn_asked_ = false;
  bool turn_granted_ = false;
  uint64_t rx_tail_ = 0;  // bytes consumed of the receive ring (ours)
  uint64_t tx_head_ = 0;  // bytes written to the send ring (ours)
  // Publish arena: the hub's (shared with the tenant's other connections on
  // this lane) and the references written and not consumed yet (ring
  // position after the record, arena offset); the client's read-only mapping.
  std::shared_ptr<PublishArena> arena_;
  std::deque<std::pair<uint64_t, uint64_t>> pending_refs_;
  const std::byte* arena_map_ = nullptr;
  size_t arena_bytes_ = 0;
  uint64_t references_received_ = 0;

  // Lent regions (lend.h). Client: whether the hub takes them (set-up
  // version 2), the regions announced to it, and the frames written as
  // references and not consumed yet (ring position after the record; the
  // region is kept alive and the frame's release waits until then).
  bool lend_ok_ = false;
  std::unordered_map<uint32_t, std::weak_ptr<LendRegion>> announced_;
  struct LentFrame {
    uint64_t end;
    std::shared_ptr<LendRegion> region;
    std::function<void()> release;
  };
  std::deque<LentFrame> pending_lent_;
  uint64_t lent_sent_ = 0;
  // Hub: the regions mapped read-only, and a partial message with the
  // descriptors that came with it.
  struct Mapped {
    const std::byte* base;
    size_t bytes;
  };
  std::unordered_map<uint32_t, Mapped> mapped_;
  std::string socket_buf_;
  std::deque<int> socket_fds_;
  uint64_t lent_received_ = 0;
};

}  // namespace rackhub::net::shm
