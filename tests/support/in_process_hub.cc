#include "in_process_hub.h"

#include <filesystem>
#include <system_error>
#include <utility>

#include "data_plane.h"
#include "hello_check.h"
#include "hub.h"
#include "process.h"
#include "rackhub/net/testing/memory_connection.h"

namespace rackhub::testing {

namespace {

bool HasFlag(const std::vector<std::string>& args, const std::string& flag) {
  for (const auto& a : args) {
    if (a == flag || a.rfind(flag + "=", 0) == 0) return true;
  }
  return false;
}

}  // namespace

std::unique_ptr<InProcessHub> InProcessHub::Start(const std::vector<std::string>& args,
                                                  std::string* why) {
  std::vector<std::string> argv = {"rackhubd",        "--admin-listen",   "127.0.0.1:0",
                                   "--data-listen",   "127.0.0.1:0",      "--metrics-listen",
                                   "127.0.0.1:0",     "--no-pin-lanes"};
  std::string temp_dir;
  if (!HasFlag(args, "--state-dir") && !HasFlag(args, "--in-memory")) {
    temp_dir = MakeTempDir();
    argv.insert(argv.end(), {"--state-dir", temp_dir + "/state"});
  }
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<const char*> cargv;
  for (const auto& a : argv) cargv.push_back(a.c_str());
  const server::ParseResult parsed =
      server::ParseCommandLine(static_cast<int>(cargv.size()), cargv.data());
  if (!parsed.ok()) {
    *why = "config: " + parsed.errors.front();
    std::error_code ec;
    if (!temp_dir.empty()) std::filesystem::remove_all(temp_dir, ec);
    return nullptr;
  }
  auto hub = std::unique_ptr<InProcessHub>(new InProcessHub(
      parsed.config, parsed.config.state.in_memory ? std::string() : parsed.config.state.dir,
      std::move(temp_dir)));
  if (Status s = hub->StartHub(); !s.ok()) {
    *why = s.message();
    return nullptr;
  }
  return hub;
}

InProcessHub::InProcessHub(server::Config config, std::string state_dir, std::string temp_dir)
    : config_(std::move(config)), state_dir_(std::move(state_dir)),
      temp_dir_(std::move(temp_dir)) {}

InProcessHub::~InProcessHub() {
  // Hubs first (their ends post to the io threads, which go last).
  if (auto hub = TakeHub()) hub->Stop(std::chrono::milliseconds(0));
  {
    std::lock_guard lock(mu_);
    stopped_.clear();
    refused_.clear();
  }
  std::error_code ec;
  if (!temp_dir_.empty()) std::filesystem::remove_all(temp_dir_, ec);
}

bool InProcessHub::running() const {
  std::lock_guard lock(mu_);
  return hub_ != nullptr;
}

Status InProcessHub::StartHub() {
  auto hub = std::make_unique<server::Hub>(config_);
  Status s = hub->Start();
  if (!s.ok()) {
    hub->Stop(std::chrono::milliseconds(0));
    std::lock_guard lock(mu_);
    stopped_.push_back(std::move(hub));
    return s;
  }
  admin_address_ = hub->admin_address();
  data_address_ = hub->data_address();
  metrics_address_ = hub->metrics_address();
  std::lock_guard lock(mu_);
  hub_ = std::move(hub);
  return s;
}

std::unique_ptr<server::Hub> InProcessHub::TakeHub() {
  std::lock_guard lock(mu_);
  return std::move(hub_);
}

void InProcessHub::Kill() {
  std::unique_ptr<server::Hub> hub = TakeHub();  // from now on dials are refused
  if (!hub) return;
  hub->Crash();
  std::lock_guard lock(mu_);
  stopped_.push_back(std::move(hub));
}

void InProcessHub::Stop(std::chrono::milliseconds grace) {
  std::unique_ptr<server::Hub> hub = TakeHub();
  if (!hub) return;
  hub->Stop(grace);
  std::lock_guard lock(mu_);
  stopped_.push_back(std::move(hub));
}

Status InProcessHub::Restart() {
  if (running()) return FailedPrecondition("InProcessHub::Restart: the hub still runs");
  return StartHub();
}

ConnectionLink::Dialer InProcessHub::dialer() {
  return [this](const net::FrameHeader& h, const std::string& payload,
                boost::asio::io_context& io, net::FrameHandler* handler) {
    return Dial(h, payload, io, handler);
  };
}

// The in-memory acceptor: the same HELLO checks as TCP and RDMA, then the
// hub's end goes to the lane the HELLO names.
std::shared_ptr<net::Connection> InProcessHub::Dial(const net::FrameHeader& h,
                                                    const std::string& payload,
                                                    boost::asio::io_context& io,
                                                    net::FrameHandler* handler) {
  // Ranks connect from several threads at once; Kill and Stop take the hub
  // under this lock, so no link reaches a hub after its crash or stop began.
  std::lock_guard lock(mu_);
  if (!hub_) return nullptr;  // nothing listens: refused
  server::DataPlane& plane = hub_->data_plane();
  net::ConnectionIdentity client_id;
  client_id.peer = "hub (in-memory)";
  const auto bytes = std::as_bytes(std::span(payload.data(), payload.size()));
  server::HelloResult checked;
  if (Status s = server::CheckHelloHeader(h); !s.ok()) {
    checked.code = net::WireError::kMalformed;
    checked.text = s.message();
  } else {
    checked = server::CheckHello(bytes, plane.registry(), plane.config().topology,
                                 plane.lane_count());
  }
  if (!checked.ok) {
    auto pair =
        net::testing::MakeMemoryPair(refuser_io_.io(), &refuser_, {}, io, handler, client_id);
    boost::asio::post(refuser_io_.io(), [refusing = pair.a, checked, rid = h.request_id] {
      refusing->SendError(checked.code, checked.text, rid, true);
      refusing->Start();
    });
    refused_.push_back(pair.a);
    boost::asio::post(io, [client = pair.b] { client->Start(); });
    return pair.b;
  }
  // As the TCP and shared-memory acceptors do: the worker's session
  // (docs/durability.md, worker generations) comes from its HELLO.
  net::ConnectionIdentity id{checked.tenant.handle, checked.tenant.name, checked.hello.rank(),
                             checked.hello.lane(), "in-memory", checked.hello.rack(), false,
                             checked.hello.session()};
  const uint32_t lane_index = id.lane;
  server::Lane& lane = plane.lane(lane_index);
  auto pair = net::testing::MakeMemoryPair(lane.io(), lane.worker_handler(), id, io, handler,
                                           client_id);
  const uint64_t seq = plane.NextSeq();
  plane.OnLane(lane_index,
               [hub_end = pair.a, seq](server::Lane& l) { l.AdoptWorker(hub_end, seq); });
  boost::asio::post(io, [client = pair.b] { client->Start(); });
  return pair.b;
}

}  // namespace rackhub::testing
