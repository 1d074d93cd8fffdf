// Shared by the multi-rack tests with real hubs (multi_rack_test.cc: the
// exchange; multi_rack_auth_test.cc: hub-link authentication): free hub-link
// ports, the hub secret file, tenant "t" and its key over the admin API, raw
// frames and KEY_BINDs a test plays a hub with. Test-only, one thread.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <regex>
#include <thread>
#include <vector>
#include <string>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "etcd_cluster.h"  // FreeLoopbackPort
#include "hub_link_auth.h"
#include "process.h"
#include "rackhub/admin/v1/admin.grpc.pb.h"
#include "raw_client.h"
#include "wait.h"

namespace rackhub::multi_rack_testing {

namespace pb = rackhub::admin::v1;
using testing::BinPath;
using testing::DaemonProcess;
using testing::ExpectError;
using testing::MakeTempDir;
using testing::RawClient;
using testing::RunCommand;
using testing::WriteFile;

// Hub-link ports the other hub must know beforehand: reserved, outside the
// kernel's ephemeral range (tests/support/etcd_cluster.h).
uint16_t FreePort() { return testing::FreeLoopbackPort(); }

// A fresh hub secret file (what every hub of a topology must share).
std::string SecretFile(const std::string& secret = std::string(48, 's')) {
  const std::string path = MakeTempDir() + "/hub.secret";
  WriteFile(path, secret + "\n");
  return path;
}

// Creates tenant "t" (2 workers per rack, 1024-element chunks, SGD with
// learning rate 1) with `token` and one key of `elements` on the hub at `admin`.
void CreateTenantAndKey(const std::string& admin, const std::string& token, uint64_t elements) {
  auto channel = grpc::CreateChannel(admin, grpc::InsecureChannelCredentials());
  grpc::ClientContext ctx;
  pb::CreateTenantRequest req;
  req.set_name("t");
  req.set_workers_per_rack(2);
  req.set_chunk_bytes(4096);
  req.set_token(token);
  req.mutable_default_optimizer()->set_type(pb::SGD);
  req.mutable_default_optimizer()->set_learning_rate(1.0);
  pb::CreateTenantResponse resp;
  ASSERT_TRUE(pb::TenantService::NewStub(channel)->CreateTenant(&ctx, req, &resp).ok());
  grpc::ClientContext kctx;
  pb::CreateKeyRequest key;
  key.set_tenant("t");
  key.set_name("w");
  key.set_elements(elements);
  pb::Key k;
  ASSERT_TRUE(pb::KeyService::NewStub(channel)->CreateKey(&kctx, key, &k).ok());
}


std::string Frame(net::FrameHeader h, const std::string& payload) {
  h.payload_bytes = static_cast<uint32_t>(payload.size());
  std::array<std::byte, net::kHeaderBytes> buf;
  net::EncodeHeader(h, buf);
  return std::string(reinterpret_cast<const char*>(buf.data()), buf.size()) + payload;
}

// Rack 1's hub (lane 0 of 1, 2 racks) linking to rack 0's, and back.
const testing::HubLinkRef kRack1To0{1, 0, 0, 2, 1};
const testing::HubLinkRef kRack0To1{0, 1, 0, 2, 1};

// A KEY_BIND of tenant "t" (2 workers per rack, chunks of 1024 fp32).
data::v1::KeyBind BindOfT(const std::string& key, uint32_t key_id, uint64_t elements,
                          uint64_t first_chunk, pb::InitMode init) {
  data::v1::KeyBind bind;
  bind.set_tenant("t");
  bind.set_key(key);
  bind.set_key_id(key_id);
  bind.set_elements(elements);
  bind.set_dtype(pb::FP32);
  bind.set_first_chunk(first_chunk);
  bind.set_chunk_elements(1024);
  bind.set_workers_per_rack(2);
  bind.set_init(init);
  return bind;
}

}  // namespace rackhub::multi_rack_testing
