#include "rackhub/net/rdma/channel.h"

#include "channel_internal.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace rackhub::net::rdma {

namespace asio = boost::asio;
using internal::Errno;
using internal::kSendQueueDepth;
using internal::kSpareRecvs;
using Clock = std::chrono::steady_clock;

namespace {

// rdma_resolve_addr(3) / rdma_resolve_route(3) timeouts, in ms (bounded by the
// caller's deadline too).
constexpr int kResolveTimeoutMs = 5000;
// rdma_conn_param: transport retries (3 bits, 7 = maximum) and RNR retries
// (7 = retry forever; receives are always posted ahead, see channel.h).
constexpr uint8_t kRetryCount = 7;
constexpr uint8_t kRnrRetryInfinite = 7;
// Private data magic ("RHRD") and version of RingDescriptor.
constexpr uint32_t kDescriptorMagic = 0x44524852;
constexpr uint16_t kDescriptorVersion = 1;

void FreeAligned(void* p) { std::free(p); }

bool SetNonBlocking(int fd) {
  const int flags = fcntl(fd, F_GETFL);
  return flags >= 0 && fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
}

// Waits for the next rdma_cm event on `ch` (non-blocking fd) until `deadline`.
// The caller acknowledges the event (rdma_ack_cm_event(3)).
Result<rdma_cm_event*> NextEvent(rdma_event_channel* ch, Clock::time_point deadline) {
  for (;;) {
    rdma_cm_event* ev = nullptr;
    if (rdma_get_cm_event(ch, &ev) == 0) return ev;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return Internal(Errno("rdma_get_cm_event"));
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return Unavailable("timed out");
    pollfd p{ch->fd, POLLIN, 0};
    poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
  }
}

// The rdma_connect(3) / rdma_accept(3) parameters of either side: `ring` (our
// receive ring) in the private data, encoded into `*pd`, which must outlive
// the call they are passed to.
rdma_conn_param ConnParam(const RingDescriptor& ring,
                          std::array<std::byte, kPrivateDataBytes>* pd) {
  EncodeDescriptor(ring, pd);
  rdma_conn_param param{};
  param.private_data = pd->data();
  param.private_data_len = static_cast<uint8_t>(pd->size());
  param.retry_count = kRetryCount;
  param.rnr_retry_count = kRnrRetryInfinite;
  return param;
}

}  // namespace

const char* PollModeName(PollMode mode) { return mode == PollMode::kBusy ? "busy" : "events"; }

void EncodeDescriptor(const RingDescriptor& d, std::array<std::byte, kPrivateDataBytes>* out) {
  std::byte* b = out->data();
  const uint16_t lane = static_cast<uint16_t>(d.lane);
  std::memcpy(b + 0, &kDescriptorMagic, 4);
  std::memcpy(b + 4, &kDescriptorVersion, 2);
  std::memcpy(b + 6, &lane, 2);
  std::memcpy(b + 8, &d.addr, 8);
  std::memcpy(b + 16, &d.rkey, 4);
  std::memcpy(b + 20, &d.slots, 4);
}

Result<RingDescriptor> DecodeDescriptor(const void* data, size_t bytes) {
  // The transport may pad private data (rdma_accept(3)), so only a minimum.
  if (!data || bytes < kPrivateDataBytes) {
    return InvalidArgument("private data: " + std::to_string(bytes) + " bytes, expected a " +
                           std::to_string(kPrivateDataBytes) + "-byte rackhub ring descriptor");
  }
  const auto* b = static_cast<const std::byte*>(data);
  uint32_t magic;
  uint16_t version, lane;
  std::memcpy(&magic, b + 0, 4);
  std::memcpy(&version, b + 4, 2);
  std::memcpy(&lane, b + 6, 2);
  if (magic != kDescriptorMagic || version != kDescriptorVersion) {
    return InvalidArgument("private data: not a rackhub v" + std::to_string(kDescriptorVersion) +
                           " ring descriptor");
  }
  RingDescriptor out;
  std::memcpy(&out.addr, b + 8, 8);
  std::memcpy(&out.rkey, b + 16, 4);
  std::memcpy(&out.slots, b + 20, 4);
  out.lane = lane;
  if (out.slots == 0 || out.slots > kMaxRingBytes / kSlotBytes) {
    return InvalidArgument("private data: ring of " + std::to_string(out.slots) + " slots");
  }
  return out;
}

Channel::Channel(const ChannelOptions& options)
    : FrameChannel("rdma ring"),
      options_(options),
      rx_(nullptr, FreeAligned),
      tx_(nullptr, FreeAligned) {}

Channel::~Channel() {
  if (cq_fd_) cq_fd_->release();
  if (cm_fd_) cm_fd_->release();
  // Reverse order of creation; the QP first so nothing references the MRs.
  if (id_ && id_->qp) rdma_destroy_qp(id_);
  if (rx_mr_) ibv_dereg_mr(rx_mr_);
  if (tx_mr_) ibv_dereg_mr(tx_mr_);
  if (cq_) {
    // ibv_destroy_cq(3) hangs until every event taken is acknowledged.
    if (cq_events_unacked_) ibv_ack_cq_events(cq_, cq_events_unacked_);
    ibv_destroy_cq(cq_);
  }
  if (comp_) ibv_destroy_comp_channel(comp_);
  if (pd_) ibv_dealloc_pd(pd_);
  if (id_) rdma_destroy_id(id_);
  if (cm_channel_) rdma_destroy_event_channel(cm_channel_);
  if (release_hook_) release_hook_();
}

uint64_t Channel::RegisteredBytes(const ChannelOptions& options) {
  // Receive ring + staging ring of the same size.
  return 2ull * (options.ring_bytes / kSlotBytes) * kSlotBytes;
}

Status Channel::CreateResources(rdma_cm_id* id) {
  ibv_context* verbs = id->verbs;
  ibv_device_attr attr{};
  if (ibv_query_device(verbs, &attr) != 0) return Internal(Errno("ibv_query_device"));
  slots_ = std::clamp(options_.ring_bytes, kMinRingBytes, kMaxRingBytes) / kSlotBytes;
  const uint32_t max_wr = static_cast<uint32_t>(std::max(attr.max_qp_wr, 0));
  if (2ull * slots_ + kSpareRecvs > max_wr) {
    // The device cannot queue that many receives: shrink the ring to fit.
    slots_ = max_wr > 2 * kSpareRecvs ? (max_wr - kSpareRecvs) / 2 : 1;
  }
  sq_depth_ = std::min(kSendQueueDepth, max_wr);
  rq_depth_ = 2 * slots_ + kSpareRecvs;
  const uint64_t cqe = uint64_t{sq_depth_} + rq_depth_;
  if (cqe > static_cast<uint64_t>(attr.max_cqe)) {
    return Internal("device " + std::string(ibv_get_device_name(verbs->device)) +
                    ": needs a CQ of " + std::to_string(cqe) + " entries, max_cqe is " +
                    std::to_string(attr.max_cqe) + "; lower the RDMA ring size");
  }
  if (!(pd_ = ibv_alloc_pd(verbs))) return Internal(Errno("ibv_alloc_pd"));
  if (!(comp_ = ibv_create_comp_channel(verbs)))
    return Internal(Errno("ibv_create_comp_channel"));
  if (!SetNonBlocking(comp_->fd)) return Internal(Errno("fcntl(comp channel)"));
  if (!(cq_ = ibv_create_cq(verbs, static_cast<int>(cqe), this, comp_, 0)))
    return Internal(Errno("ibv_create_cq"));
  const size_t ring = size_t{slots_} * kSlotBytes;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  rx_.reset(static_cast<std::byte*>(std::aligned_alloc(page, ring)));
  tx_.reset(static_cast<std::byte*>(std::aligned_alloc(page, ring)));
  if (!rx_ || !tx_) return ResourceExhausted("out of memory for the RDMA rings");
  std::memset(rx_.get(), 0, ring);
  std::memset(tx_.get(), 0, ring);
  // The receive ring is the only remotely writable memory of the connection,
  // in the connection's own protection domain: a peer's rkey reaches nothing
  // else (ibv_reg_mr(3), ibv_alloc_pd(3)). EFAULT/ENOMEM here usually means
  // RLIMIT_MEMLOCK.
  rx_mr_ = ibv_reg_mr(pd_, rx_.get(), ring, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!rx_mr_) return Internal(Errno("ibv_reg_mr(receive ring)") + " (locked-memory limit?)");
  tx_mr_ = ibv_reg_mr(pd_, tx_.get(), ring, 0);  // local read only: a send source
  if (!tx_mr_) return Internal(Errno("ibv_reg_mr(staging ring)") + " (locked-memory limit?)");

  ibv_qp_init_attr qa{};
  qa.send_cq = cq_;
  qa.recv_cq = cq_;
  qa.qp_type = IBV_QPT_RC;
  qa.sq_sig_all = 1;  // every send completes: the staging ring is freed in order
  qa.cap.max_send_wr = sq_depth_;
  qa.cap.max_recv_wr = rq_depth_;
  qa.cap.max_send_sge = 1;
  qa.cap.max_recv_sge = 1;
  if (rdma_create_qp(id, pd_, &qa) != 0) return Internal(Errno("rdma_create_qp"));
  if (!PostRecv(rq_depth_)) return Internal(Errno("ibv_post_recv"));
  if (ibv_req_notify_cq(cq_, 0) != 0) return Internal(Errno("ibv_req_notify_cq"));
  return Status::Ok();
}

bool Channel::PostRecv(size_t count) {
  // Zero-SGE receives: RDMA WRITE WITH IMM places its data by address and
  // only consumes a receive for the immediate (ibv_post_recv(3)).
  while (count-- > 0) {
    ibv_recv_wr wr{};
    ibv_recv_wr* bad = nullptr;
    wr.num_sge = 0;
    if (ibv_post_recv(id_->qp, &wr, &bad) != 0) return false;
  }
  return true;
}

Result<std::shared_ptr<Channel>> Channel::Connect(const Endpoint& hub, uint32_t lane,
                                                  const ChannelOptions& options,
                                                  Clock::time_point deadline) {
  std::shared_ptr<Channel> ch(new Channel(options));
  const auto fail = [&](StatusCode code, const std::string& step, const std::string& why) {
    return Status(code, "rdma " + hub.ToString() + " lane " + std::to_string(lane) + ": " + step +
                            ": " + why);
  };
  const auto fail_status = [&](const std::string& step, const Status& why) {
    return fail(why.code(), step, why.message());
  };
  if (!(ch->cm_channel_ = rdma_create_event_channel()))
    return fail(StatusCode::kInternal, "rdma_create_event_channel", std::strerror(errno));
  if (!SetNonBlocking(ch->cm_channel_->fd))
    return fail(StatusCode::kInternal, "fcntl", std::strerror(errno));
  if (rdma_create_id(ch->cm_channel_, &ch->id_, nullptr, RDMA_PS_TCP) != 0)
    return fail(StatusCode::kInternal, "rdma_create_id", std::strerror(errno));
  rdma_addrinfo hints{};
  rdma_addrinfo* ai = nullptr;
  hints.ai_port_space = RDMA_PS_TCP;
  const std::string port = std::to_string(hub.port);
  if (rdma_getaddrinfo(hub.host.c_str(), port.c_str(), &hints, &ai) != 0 || !ai) {
    return fail(StatusCode::kUnavailable, "rdma_getaddrinfo", "cannot resolve '" + hub.host + "'");
  }
  const int rc = rdma_resolve_addr(ch->id_, nullptr, ai->ai_dst_addr, kResolveTimeoutMs);
  rdma_freeaddrinfo(ai);
  if (rc != 0) return fail(StatusCode::kUnavailable, "rdma_resolve_addr", std::strerror(errno));

  // rdma_cm(7): ADDR_RESOLVED, ROUTE_RESOLVED, then ESTABLISHED (or REJECTED).
  const auto expect = [&](rdma_cm_event_type want, RingDescriptor* peer) -> Status {
    Result<rdma_cm_event*> next = NextEvent(ch->cm_channel_, deadline);
    if (!next.ok()) return next.status();
    rdma_cm_event* ev = *next;
    Status status;
    if (ev->event != want || ev->status != 0) {
      status = Unavailable(
          std::string("got ") + rdma_event_str(ev->event) + " (status " +
          std::to_string(ev->status) + ")" +
          (ev->event == RDMA_CM_EVENT_REJECTED || ev->event == RDMA_CM_EVENT_UNREACHABLE
               ? ": no RDMA listener there, or the hub refused the connection"
               : ""));
    } else if (peer) {
      Result<RingDescriptor> d =
          DecodeDescriptor(ev->param.conn.private_data, ev->param.conn.private_data_len);
      if (d.ok()) {
        *peer = *d;
      } else {
        status = d.status();
      }
    }
    rdma_ack_cm_event(ev);
    return status;
  };
  if (Status s = expect(RDMA_CM_EVENT_ADDR_RESOLVED, nullptr); !s.ok())
    return fail_status("resolving the address", s);
  const std::string device = ibv_get_device_name(ch->id_->verbs->device);
  if (!options.device.empty() && device != options.device) {
    return fail(StatusCode::kFailedPrecondition, "device",
                "the hub's address routes through device " + device + ", not " + options.device);
  }
  if (options.port != 0 && ch->id_->port_num != options.port) {
    return fail(StatusCode::kFailedPrecondition, "port",
                "the hub's address routes through port " + std::to_string(ch->id_->port_num) +
                    " of " + device + ", not port " + std::to_string(options.port));
  }
  if (rdma_resolve_route(ch->id_, kResolveTimeoutMs) != 0)
    return fail(StatusCode::kUnavailable, "rdma_resolve_route", std::strerror(errno));
  if (Status s = expect(RDMA_CM_EVENT_ROUTE_RESOLVED, nullptr); !s.ok())
    return fail_status("resolving the route", s);
  if (Status s = ch->CreateResources(ch->id_); !s.ok())
    return fail_status("creating verbs resources", s);

  std::array<std::byte, kPrivateDataBytes> pd{};
  rdma_conn_param param = ConnParam(
      {reinterpret_cast<uint64_t>(ch->rx_.get()), ch->rx_mr_->rkey, ch->slots_, lane}, &pd);
  if (rdma_connect(ch->id_, &param) != 0)
    return fail(StatusCode::kUnavailable, "rdma_connect", std::strerror(errno));
  if (Status s = expect(RDMA_CM_EVENT_ESTABLISHED, &ch->peer_); !s.ok())
    return fail_status("connecting", s);
  return ch;
}

Result<std::shared_ptr<Channel>> Channel::Accept(rdma_cm_id* id, const RingDescriptor& peer,
                                                 const ChannelOptions& options) {
  std::shared_ptr<Channel> ch(new Channel(options));
  ch->peer_ = peer;
  const auto fail = [&](Status why) {
    rdma_reject(id, nullptr, 0);
    if (!ch->id_) rdma_destroy_id(id);  // not ours yet: the destructor would not free it
    return why;
  };
  if (!(ch->cm_channel_ = rdma_create_event_channel()))
    return fail(Internal(Errno("rdma_create_event_channel")));
  if (!SetNonBlocking(ch->cm_channel_->fd)) return fail(Internal(Errno("fcntl")));
  // Later events of this id (ESTABLISHED, DISCONNECTED) go to the
  // connection's own channel, watched by the thread that owns it.
  if (rdma_migrate_id(id, ch->cm_channel_) != 0) return fail(Internal(Errno("rdma_migrate_id")));
  ch->id_ = id;
  if (Status s = ch->CreateResources(id); !s.ok()) return fail(std::move(s));
  std::array<std::byte, kPrivateDataBytes> pd{};
  rdma_conn_param param = ConnParam(
      {reinterpret_cast<uint64_t>(ch->rx_.get()), ch->rx_mr_->rkey, ch->slots_, 0}, &pd);
  if (rdma_accept(id, &param) != 0) return fail(Internal(Errno("rdma_accept")));
  return ch;
}

std::string Channel::peer_address() const {
  if (!id_) return "?";
  sockaddr* sa = rdma_get_peer_addr(id_);
  char host[INET6_ADDRSTRLEN] = "?";
  if (sa->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(sa)->sin_addr, host, sizeof host);
  } else if (sa->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(sa)->sin6_addr, host, sizeof host);
  }
  return std::string(host) + ":" + std::to_string(ntohs(rdma_get_dst_port(id_)));
}

std::string DescribeCmId(rdma_cm_id* id, int* gid_index) {
  if (gid_index) *gid_index = -1;
  if (!id || !id->verbs) return "any device (wildcard address)";
  std::string out = std::string("device ") + ibv_get_device_name(id->verbs->device) + " port " +
                    std::to_string(id->port_num);
  // The source GID rdma_cm chose for the address, and its index in the
  // port's GID table (ibv_query_gid(3)).
  const ibv_gid& sgid = *reinterpret_cast<const ibv_gid*>(&id->route.addr.addr.ibaddr.sgid);
  ibv_port_attr pa{};
  if (ibv_query_port(id->verbs, id->port_num, &pa) == 0) {
    for (int i = 0; i < pa.gid_tbl_len; ++i) {
      ibv_gid g{};
      if (ibv_query_gid(id->verbs, id->port_num, i, &g) == 0 &&
          std::memcmp(&g, &sgid, sizeof g) == 0) {
        out += " gid[" + std::to_string(i) + "]";
        if (gid_index) *gid_index = i;
        break;
      }
    }
  }
  char text[INET6_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET6, sgid.raw, text, sizeof text);
  return out + " " + text;
}

std::string Channel::DescribeLocal() const {
  return DescribeCmId(id_) + " (" + std::to_string(slots_) + " x " + std::to_string(kSlotBytes) +
         " B ring, " + PollModeName(options_.poll) + " polling)";
}

}  // namespace rackhub::net::rdma
