// The RDMA data plane of rackhubd: an rdma_cm listener on its own thread
// (rdma_cm(7)). For each connect request it creates the connection's verbs
// resources and accepts (rdma::Channel::Accept), reads and authenticates the
// HELLO that arrives as the first frame over the queue pair (the same checks
// as DataPlane's TCP HelloSession), then hands the channel to the lane's
// thread, which wraps it in an rdma::RdmaConnection and calls
// Lane::AdoptWorker: from there on the lane cannot tell it from TCP.
//
// Locked memory: every connection registers Channel::RegisteredBytes; the
// listener keeps the total under RLIMIT_MEMLOCK (refusing a connection that
// would exceed it, with a log line naming the limit) and Start checks that at
// least one connection per lane fits.
//
// Thread safety: Listen/Start/Stop from the main thread; everything else on
// the listener thread or (after hand-over) the lane threads.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "config.h"
#include "lanes.h"
#include "rackhub/net/asio.h"
#include "rackhub/net/rdma/channel.h"
#include "registry.h"

struct rdma_cm_id;
struct rdma_event_channel;

namespace rackhub::server {

class DataPlane;

class RdmaListener {
 public:
  RdmaListener(const Config& config, Registry* registry, LaneSet* lanes, DataPlane* plane);
  ~RdmaListener();
  RdmaListener(const RdmaListener&) = delete;
  RdmaListener& operator=(const RdmaListener&) = delete;

  // Starts the RDMA data plane as config.data.transport asks, logging the
  // choice and the device/port/GID: null when not wanted or ("auto") not
  // possible; sets *fatal when "rdma" was asked for and cannot run.
  static std::unique_ptr<RdmaListener> StartConfigured(const Config& config, Registry* registry,
                                                       LaneSet* lanes, DataPlane* plane,
                                                       bool* fatal);

  // Binds and listens (rdma_bind_addr(3), rdma_listen(3)) and checks the
  // device, GID and locked-memory limit. "" on success, else why not.
  std::string Listen();
  // "host:port" actually bound, and the device description, once listening.
  const std::string& address() const { return address_; }
  const std::string& device() const { return device_; }
  // Starts the listener thread.
  void Start();
  // Stops accepting and joins the thread (lanes close their connections).
  void Stop();

 private:
  struct Pending;  // a connection between accept and HELLO
  void WatchEvents();
  void OnEvents();
  void OnConnectRequest(rdma_cm_id* id, const void* private_data, size_t bytes);
  void OnHello(uint64_t key, const net::FrameHeader& h, std::span<const std::byte> payload);
  void Refuse(uint64_t key, net::WireError code, const std::string& text);
  void Drop(uint64_t key);

  const Config config_;
  Registry* registry_;
  LaneSet* lanes_;
  DataPlane* plane_;
  net::rdma::ChannelOptions options_;
  uint64_t per_connection_bytes_ = 0;
  uint64_t memlock_limit_ = UINT64_MAX;  // UINT64_MAX: unlimited or CAP_IPC_LOCK
  // Registered by live connections (decremented by their lanes at close).
  std::shared_ptr<std::atomic<uint64_t>> registered_;

  rdma_event_channel* channel_ = nullptr;
  rdma_cm_id* listen_id_ = nullptr;
  std::string address_;
  std::string device_;
  boost::asio::io_context io_{1};
  std::unique_ptr<boost::asio::posix::stream_descriptor> events_fd_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  uint64_t next_key_ = 1;
  std::map<uint64_t, std::unique_ptr<Pending>> pending_;  // listener thread
};

}  // namespace rackhub::server
