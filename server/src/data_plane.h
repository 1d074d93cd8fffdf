// The TCP data plane of rackhubd: the acceptor (its own thread: reads and
// authenticates HELLO, then hands the socket to its lane's io_context) and one
// LaneService per lane (DESIGN.md §4-5).
//
// Thread safety: Start/Shutdown from the main thread. WorkerLost,
// KeyRuntimeFor and ChunkInitialized may be called from any lane. The
// RegistryObserver callbacks run under the registry's lock and only post.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "config.h"
#include "lane_service.h"
#include "lanes.h"
#include "rackhub/net/asio.h"
#include "registry.h"

namespace rackhub::server {

// Key-wide facts shared by the lanes that hold the key's chunks.
struct KeyRuntime {
  // Updates applied to the key's chunk 0 (written by its lane, read by the
  // lane answering DECLARE/WELCOME).
  std::atomic<uint64_t> version{0};
  std::atomic<uint64_t> initialized_chunks{0};
};

class DataPlane : public RegistryObserver {
 public:
  DataPlane(const Config& config, Registry* registry, LaneSet* lanes);
  ~DataPlane() override;

  // Starts accepting on `acceptor` (bound and listening, on `acceptor_io`)
  // with a dedicated thread.
  void Start(boost::asio::io_context* acceptor_io, boost::asio::ip::tcp::acceptor* acceptor);
  // False when the rack exchange could not listen (Start logged why).
  bool started_ok() const { return hubs_ok_; }
  // Stops accepting, closes every connection with SHUTTING_DOWN, waits up to
  // `grace` for the close frames to go out.
  void Shutdown(std::chrono::milliseconds grace);

  void WorkerLost(uint32_t handle, uint32_t rank, const std::string& why);

  // Rack exchange: the shared hub secret (topology.secret_file), the
  // inter-hub listener (started by Start when the topology has racks), and
  // byte counters per peer rack (any thread).
  const std::string& hub_secret() const { return hub_secret_; }
  void CountRackBytes(uint32_t rack, uint64_t out, uint64_t in);
  // RACK_SUM / RACK_PARAMS frames (header + payload) queued to `rack`.
  void CountRackChunkBytes(uint32_t rack, uint64_t out);
  struct RackLinkStats {
    uint32_t rack = 0;
    uint64_t bytes_out = 0;
    uint64_t bytes_in = 0;
    uint64_t chunk_bytes_out = 0;
  };
  std::vector<RackLinkStats> RackLinks() const;
  // Binds the inter-hub listener; false (logged) if it cannot.
  bool ListenForHubs();
  std::shared_ptr<KeyRuntime> KeyRuntimeFor(uint32_t handle, uint32_t key_id);
  // Counts an initialized chunk; marks the key ready in the registry when all are.
  void ChunkInitialized(uint32_t handle, uint32_t key_id, uint64_t chunk_count);
  uint64_t NextSeq() { return seq_.fetch_add(1) + 1; }
  // The lane logic of `lane` (other transports hand connections to it, on
  // the lane's thread).
  LaneService* lane_service(uint32_t lane) { return services_[lane].get(); }

  // RegistryObserver.
  void OnTenantDeleted(uint32_t handle) override;
  void OnKeyDeleted(uint32_t handle, uint32_t key_id) override;
  void OnOptimizerChanged(uint32_t handle, uint32_t key_id,
                          const aggregation::OptimizerConfig& optimizer,
                          uint64_t from_update) override;

 private:
  class HelloSession;
  class HubHelloSession;
  void AcceptHubNext();
  void AcceptNext();
  // Called by a HelloSession on the acceptor thread once HELLO checked out.
  void HandOver(boost::asio::ip::tcp::socket socket, net::ConnectionIdentity id);
  // Moves an accepted socket to lane `lane`'s io_context and calls `adopt`
  // with it on that lane's thread.
  void MoveToLane(boost::asio::ip::tcp::socket socket, uint32_t lane,
                  std::function<void(boost::asio::ip::tcp::socket)> adopt);

  const Config config_;
  Registry* registry_;
  LaneSet* lanes_;
  std::vector<std::unique_ptr<LaneService>> services_;
  boost::asio::io_context* acceptor_io_ = nullptr;
  boost::asio::ip::tcp::acceptor* acceptor_ = nullptr;
  std::thread acceptor_thread_;
  std::atomic<uint64_t> seq_{0};
  std::atomic<bool> stopping_{false};
  std::string hub_secret_;
  bool hubs_ok_ = true;
  std::unique_ptr<boost::asio::ip::tcp::acceptor> hub_acceptor_;
  struct LinkCounters {
    std::atomic<uint64_t> bytes_out{0};
    std::atomic<uint64_t> bytes_in{0};
    std::atomic<uint64_t> chunk_bytes_out{0};
  };
  std::vector<std::unique_ptr<LinkCounters>> link_counters_;  // by rack

  std::mutex runtime_mu_;
  std::map<std::pair<uint32_t, uint32_t>, std::shared_ptr<KeyRuntime>>
      runtimes_;  // GUARDED_BY(runtime_mu_)
};

}  // namespace rackhub::server
