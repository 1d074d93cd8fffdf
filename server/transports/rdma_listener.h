// The RDMA data plane of rackhubd: an rdma_cm listener on its own thread
// (rdma_cm(7)). For each connect request it creates the connection's verbs
// resources and accepts (rdma::Channel::Accept), reads and authenticates the
// first frame over the queue pair, then hands the channel to the lane's
// thread, which wraps it in an rdma::RdmaConnection: from there on the lane
// cannot tell it from TCP.
//  - HELLO (a worker): the same checks as the TCP acceptor (hello_check.h),
//    then Lane::AdoptWorker with the lane's worker handler.
//  - HUB_HELLO (another rack's hub, hierarchical topology): hub-link version,
//    rack and lane counts (CheckHubHello), the lane must be the one the
//    connect request named; then the challenge-response (hub_handshake.h:
//    HUB_CHALLENGE sent here, HUB_PROOF checked here, within
//    data.hello_timeout_ms like a HELLO); then Lane::AdoptHubLink with the
//    hub handler and the HUB_ACCEPT the lane sends first.
//
// Addresses. Workers connect to data.rdma_listen (default: data.listen's host,
// port rdma::kDefaultRdmaPort). In a hierarchical topology the listener also
// listens on this rack's interhub address (topology.racks[rack].interhub,
// where the TCP acceptor takes TCP hub links): rdma_cm's port space is its own
// on InfiniBand and RoCE (rdma_bind_addr(3) takes no kernel TCP port), so the
// same host:port serves both transports, and a hub dials a peer's interhub
// address whichever transport it uses. (iWARP would share the TCP port
// space, but rackhub's ring needs RDMA WRITE WITH IMMEDIATE, which iWARP
// lacks.) Outgoing hub links: HubConnector() below.
//
// Locked memory: every connection registers Channel::RegisteredBytes; the
// listener keeps the total under RLIMIT_MEMLOCK (refusing a connection that
// would exceed it, with a log line naming the limit) and Listen checks that
// one worker connection per lane fits, plus, in a hierarchical topology, one
// incoming and one outgoing hub link per lane and peer rack (the outgoing
// ones are reserved up front: they are opened by HubConnector's channels).
//
// Ownership: owned by the Hub; borrows the Registry, LaneSet and (from Start)
// the DataPlane, which outlive it.
// Thread safety: ListenConfigured/Listen/Start/Stop/HubConnector from the main
// thread; everything else on the listener thread or (after hand-over) the
// lane threads.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "acceptor_thread.h"
#include "config.h"
#include "lanes.h"
#include "log_limiter.h"
#include "rackhub/common/status.h"
#include "rackhub/net/asio.h"
#include "rackhub/net/connector.h"
#include "rackhub/net/rdma/channel.h"
#include "registry.h"

struct rdma_cm_id;
struct rdma_event_channel;

namespace rackhub::server {

class DataPlane;
class Lane;

class RdmaListener {
 public:
  RdmaListener(const Config& config, Registry* registry, LaneSet* lanes);
  ~RdmaListener();
  RdmaListener(const RdmaListener&) = delete;
  RdmaListener& operator=(const RdmaListener&) = delete;

  // Sets up the RDMA data plane as config.data.transport asks (Listen),
  // logging the choice and the device/port/GID: null when not wanted or
  // ("auto") not possible; sets *fatal when "rdma" was asked for and cannot
  // run. Not started yet: Start once the DataPlane exists.
  static std::unique_ptr<RdmaListener> ListenConfigured(const Config& config, Registry* registry,
                                                        LaneSet* lanes, bool* fatal);

  // Binds and listens (rdma_bind_addr(3), rdma_listen(3)) on
  // data.rdma_listen; checks the device, GID and locked-memory limit (hub
  // links included). INVALID_ARGUMENT for a setting that does not match the
  // device (data.rdma_device/port/gid_index, an unresolvable host),
  // RESOURCE_EXHAUSTED for too low a locked-memory limit, UNAVAILABLE when
  // rdma_cm fails.
  Status Listen();
  // After Listen, in a hierarchical topology: listens on this rack's interhub
  // address too, for hub links. OK (then hub_links() is true), else why not
  // as Listen's (ListenConfigured: fatal with "rdma", TCP hub links with
  // "auto").
  Status ListenForHubs();
  // True when hub links go over RDMA: use HubConnector for outgoing links.
  bool hub_links() const { return hub_links_; }
  // "host:port" actually bound for workers, and the device description, once
  // listening.
  const std::string& address() const { return address_; }
  const std::string& device() const { return device_; }
  // The connector for this hub's outgoing hub links when hub_links():
  // RDMA (net::MakeRdmaConnector) with the listener's channel options, to the
  // peers' interhub addresses (see above).
  std::unique_ptr<net::Connector> HubConnector() const;
  // Starts the listener thread; connections go to `plane`'s lanes.
  void Start(DataPlane* plane);
  // Stops accepting and joins the thread (lanes close their connections).
  void Stop();

 private:
  struct Pending;  // a connection between accept and HELLO
  void WatchEvents();
  void OnEvents();
  void OnConnectRequest(rdma_cm_id* id, const void* private_data, size_t bytes);
  // The first frame of a connection (HELLO or HUB_HELLO), or a hub link's
  // HUB_PROOF.
  void OnFirstFrame(uint64_t key, const net::FrameHeader& h, std::span<const std::byte> payload);
  void OnHello(uint64_t key, const net::FrameHeader& h, std::span<const std::byte> payload);
  void OnHubHello(uint64_t key, const net::FrameHeader& h, std::span<const std::byte> payload);
  // The second frame of a hub link (after HUB_CHALLENGE went out).
  void OnHubProof(uint64_t key, const net::FrameHeader& h, std::span<const std::byte> payload);
  // An authenticated connection (pending_[key]) goes to lane id.lane: it is
  // no longer watched here, and once the completion being handled is done
  // (the channel updates its ring state when on_frame returns) `adopt` runs
  // on the lane with the channel.
  void HandOver(uint64_t key, uint32_t lane,
                std::function<void(Lane&, std::shared_ptr<net::rdma::Channel>)> adopt);
  // Binds and listens `id` on `ep`; the error names `field`.
  Status BindAndListen(rdma_cm_id* id, const net::Endpoint& ep, const std::string& field);
  void Refuse(uint64_t key, net::WireError code, const std::string& text);
  void Drop(uint64_t key);

  const Config config_;
  Registry* registry_;
  LaneSet* lanes_;
  DataPlane* plane_ = nullptr;  // from Start
  net::rdma::ChannelOptions options_;
  uint64_t per_connection_bytes_ = 0;
  uint64_t memlock_limit_ = UINT64_MAX;  // UINT64_MAX: unlimited or CAP_IPC_LOCK
  // Registered by live connections (decremented by their lanes at close).
  std::shared_ptr<std::atomic<uint64_t>> registered_;

  rdma_event_channel* channel_ = nullptr;
  rdma_cm_id* listen_id_ = nullptr;
  rdma_cm_id* hub_listen_id_ = nullptr;  // this rack's interhub address (hierarchical)
  bool hub_links_ = false;
  net::Endpoint bound_;  // the workers' address, as bound
  std::string address_;
  std::string device_;
  AcceptorThread thread_;  // "rackhub-rdma"
  std::unique_ptr<boost::asio::posix::stream_descriptor> events_fd_;
  uint64_t next_key_ = 1;
  std::map<uint64_t, std::unique_ptr<Pending>> pending_;  // listener thread
  // Refusals a remote peer can trigger at will (listener thread).
  LogLimiter warnings_{20, std::chrono::seconds(10)};
};

}  // namespace rackhub::server
