// rackhub-fuzz-corpus: writes the seed corpora of fuzz/ from the real
// encoders (frame headers, control messages, checkpoint files), so every seed
// starts valid and each fuzzer begins deep in its code.
//
//   build-fuzz/fuzz/rackhub-fuzz-corpus fuzz/corpus   # then commit fuzz/corpus
//
// Writes DIR/<target>/<name> for every target (replacing files of the same
// name, leaving others). Deterministic: the same tree writes the same bytes.
// Single-threaded; exits non-zero on an I/O error.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <string>
#include <vector>

#include "checkpoint_file.h"
#include "rackhub/data/v1/control.pb.h"
#include "rackhub/net/frame.h"

namespace {

namespace fs = std::filesystem;
namespace net = rackhub::net;
namespace srv = rackhub::server;
namespace dpb = rackhub::data::v1;
namespace pb = rackhub::admin::v1;

// The same fixtures as the targets (control_fuzz.cc, hub_lane_fuzz.cc).
constexpr char kToken[] = "fuzz-token-0123456789abcdef-0123456789";

fs::path g_root;

void Write(const std::string& target, const std::string& name, const std::string& bytes) {
  const fs::path dir = g_root / target;
  fs::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out.good()) {
    std::fprintf(stderr, "rackhub-fuzz-corpus: cannot write %s\n", (dir / name).c_str());
    std::exit(1);
  }
}

std::string Frame(net::Opcode op, const std::string& payload, net::DType dtype = net::DType::kNone,
                  uint32_t tenant = 1, uint32_t key = 1, uint32_t chunk = 0,
                  uint64_t iteration = 0, uint64_t request_id = 1) {
  net::FrameHeader h;
  h.opcode = op;
  h.dtype = dtype;
  h.tenant = tenant;
  h.key = key;
  h.chunk = chunk;
  h.iteration = iteration;
  h.request_id = request_id;
  h.payload_bytes = static_cast<uint32_t>(payload.size());
  std::string out(net::kHeaderBytes, '\0');
  net::EncodeHeader(h, std::span<std::byte, net::kHeaderBytes>(
                           reinterpret_cast<std::byte*>(out.data()), net::kHeaderBytes));
  return out + payload;
}

std::string Floats(size_t n, uint32_t width) {
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    const float f = 0.5f * static_cast<float>(i) - 3.0f;
    char b[4];
    std::memcpy(b, &f, 4);
    out.append(width == 4 ? b : b + 2, width);  // fp16/bf16: any 16-bit pattern will do
  }
  return out;
}

dpb::Hello Hello(const std::string& tenant, uint32_t rank, uint32_t rack, uint32_t lane) {
  dpb::Hello h;
  h.set_tenant(tenant);
  h.set_token(kToken);
  h.set_rank(rank);
  h.set_rack(rack);
  h.set_lane(lane);
  h.set_client_version("0.1.0");
  return h;
}

dpb::KeyDeclaration Declaration(const std::string& name, uint64_t elements, pb::DType dtype,
                                pb::OptimizerType optimizer) {
  dpb::KeyDeclaration d;
  d.set_name(name);
  d.set_elements(elements);
  d.set_dtype(dtype);
  if (optimizer != pb::OPTIMIZER_UNSPECIFIED) {
    d.mutable_optimizer()->set_type(optimizer);
    d.mutable_optimizer()->set_learning_rate(0.01);
    if (optimizer == pb::MOMENTUM) d.mutable_optimizer()->set_momentum(0.9);
  }
  return d;
}

dpb::KeyEntry Entry(uint32_t id, const std::string& name, uint64_t elements, uint64_t chunks) {
  dpb::KeyEntry e;
  e.set_id(id);
  e.set_name(name);
  e.set_elements(elements);
  e.set_dtype(pb::FP32);
  e.set_first_chunk(3);
  e.set_chunk_count(chunks);
  e.set_version(5);
  return e;
}

dpb::Welcome Welcome() {
  dpb::Welcome w;
  w.set_tenant_handle(1);
  w.set_chunk_elements(8192);
  w.set_lanes(2);
  w.set_workers(3);
  w.set_epoch(1);
  *w.add_keys() = Entry(1, "w", 10000, 2);
  *w.add_keys() = Entry(2, "b", 8192, 1);
  w.set_server_version("0.1.0");
  return w;
}

void FrameSeeds() {
  const std::string t = "frame_fuzz";
  Write(t, "hello", Frame(net::Opcode::kHello, Hello("alpha", 1, 0, 0).SerializeAsString()));
  Write(t, "welcome", Frame(net::Opcode::kWelcome, Welcome().SerializeAsString()));
  Write(t, "declare",
        Frame(net::Opcode::kDeclare,
              Declaration("w", 1000, pb::BF16, pb::ADAM).SerializeAsString()));
  Write(t, "key-info", Frame(net::Opcode::kKeyInfo, Entry(1, "w", 10000, 2).SerializeAsString()));
  dpb::OptimizerUpdate u;
  u.mutable_optimizer()->set_learning_rate(0.5);
  Write(t, "set-optimizer", Frame(net::Opcode::kSetOptimizer, u.SerializeAsString()));
  dpb::HubHello hh;
  hh.set_rack(0);
  hh.set_lane(1);
  hh.set_racks(3);
  hh.set_lanes(2);
  hh.set_link_version(2);
  hh.set_nonce(std::string(32, 'n'));
  Write(t, "hub-hello", Frame(net::Opcode::kHubHello, hh.SerializeAsString()));
  dpb::HubChallenge hc;
  hc.set_nonce(std::string(32, 'c'));
  Write(t, "hub-challenge", Frame(net::Opcode::kHubChallenge, hc.SerializeAsString()));
  dpb::HubProof hp;
  hp.set_proof(std::string(32, 'p'));
  Write(t, "hub-proof", Frame(net::Opcode::kHubProof, hp.SerializeAsString()));
  Write(t, "hub-accept", Frame(net::Opcode::kHubAccept, hp.SerializeAsString()));
  dpb::RackVersions rv;
  rv.set_tenant("alpha");
  rv.set_round(3);
  rv.set_incarnation(0x1234);
  rv.set_cause("worker lost");
  auto* rk = rv.add_keys();
  rk->set_key_id(1);
  rk->set_newest(7);
  Write(t, "rack-versions", Frame(net::Opcode::kRackVersions, rv.SerializeAsString()));
  dpb::RackCheckpoint rc;
  rc.set_op(dpb::RackCheckpoint::PREPARE);
  rc.set_tenant("alpha");
  rc.set_request(3);
  rc.set_sequence(2);
  *rc.add_keys() = *rk;
  rc.set_timeout_ms(10000);
  Write(t, "rack-checkpoint", Frame(net::Opcode::kRackCheckpoint, rc.SerializeAsString()));
  dpb::KeyBind kb;
  kb.set_tenant("alpha");
  kb.set_key("w");
  kb.set_key_id(1);
  kb.set_elements(10000);
  kb.set_dtype(pb::FP32);
  kb.set_chunk_elements(8192);
  kb.set_workers_per_rack(3);
  Write(t, "key-bind", Frame(net::Opcode::kKeyBind, kb.SerializeAsString()));
  Write(t, "error", Frame(net::Opcode::kError,
                          net::EncodeErrorBody(net::WireError::kBadChunk, "chunk: 7 is out of range")));
  Write(t, "push-fp32", Frame(net::Opcode::kPush, Floats(16, 4), net::DType::kFp32));
  Write(t, "params-fp16", Frame(net::Opcode::kParams, Floats(16, 2), net::DType::kFp16));
  Write(t, "init-bf16", Frame(net::Opcode::kInit, Floats(16, 2), net::DType::kBf16));
  Write(t, "rack-sum", Frame(net::Opcode::kRackSum, Floats(8, 4), net::DType::kFp32));
  Write(t, "rack-params", Frame(net::Opcode::kRackParams, Floats(8, 2), net::DType::kBf16));
  Write(t, "pull", Frame(net::Opcode::kPull, ""));
  // Bounded/async tenants across racks: a relayed PUSH (prefix: kind 0,
  // opcode PUSH, rank 1, session 7) and the home's PARAMS reply to it.
  const std::string prefix = net::EncodeRelayPrefix({net::RelayKind::kFrame, net::Opcode::kPush, 1, 7});
  Write(t, "rack-relay", Frame(net::Opcode::kRackRelay, prefix + Floats(8, 4), net::DType::kFp32));
  Write(t, "rack-relay-reply",
        Frame(net::Opcode::kRackRelayReply, Frame(net::Opcode::kParams, Floats(8, 2),
                                                  net::DType::kFp32, 1, 1, 0, 1, 1)));
  // Table rows (key 1: frame_fuzz reads them as rows of 2 columns).
  const std::vector<uint64_t> ids = {3, 1, 3}, want = {2};
  Write(t, "push-rows", Frame(net::Opcode::kPushRows,
                              net::EncodeRowsRequest(ids, want) + Floats(6, 4), net::DType::kFp32));
  Write(t, "pull-rows",
        Frame(net::Opcode::kPullRows, net::EncodeRowsRequest(want, {}), net::DType::kBf16));
  Write(t, "rows", Frame(net::Opcode::kRows, std::string("\x02\0\0\0\0\0\0\0", 8) + Floats(4, 2),
                         net::DType::kFp16));
  Write(t, "heartbeat", Frame(net::Opcode::kHeartbeat, ""));
  Write(t, "bye", Frame(net::Opcode::kBye, ""));
  Write(t, "ack", Frame(net::Opcode::kAck, ""));
  // A sparse (top-k) PUSH: 3 entries of a chunk of 65 elements (chunk 64).
  {
    const uint32_t count = 3, idx[3] = {0, 7, 64};
    std::string sparse(reinterpret_cast<const char*>(&count), 4);
    sparse.append(reinterpret_cast<const char*>(idx), sizeof idx);
    std::string f = Frame(net::Opcode::kPush, sparse + Floats(3, 4), net::DType::kFp32, 1, 1, 64);
    f[6] = static_cast<char>(net::kFlagSparse);
    Write(t, "push-sparse", f);
    std::string v = Frame(net::Opcode::kParams, Floats(4, 4) + std::string(16, '\x01'),
                          net::DType::kFp32);
    v[6] = static_cast<char>(net::kFlagVersions);
    Write(t, "params-versions", v);
  }
}

void StreamSeeds() {
  const std::string t = "frame_stream_fuzz";
  // request_id % 3 is the verdict: 0 accept, 1 discard, 2 reject.
  const std::string hello = Frame(net::Opcode::kHello, Hello("alpha", 0, 0, 0).SerializeAsString(),
                                  net::DType::kNone, 0, 0, 0, 0, 3);
  const std::string push = Frame(net::Opcode::kPush, Floats(64, 4), net::DType::kFp32, 1, 1, 0, 0, 6);
  const std::string discarded = Frame(net::Opcode::kPush, Floats(32, 2), net::DType::kBf16, 1, 1, 1,
                                      0, 4);
  const std::string pull = Frame(net::Opcode::kPull, "", net::DType::kNone, 1, 1, 0, 0, 9);
  const std::string rejected = Frame(net::Opcode::kPull, "", net::DType::kNone, 1, 1, 0, 0, 5);
  std::string bad = Frame(net::Opcode::kHeartbeat, "");
  bad[0] = 'X';  // bad magic: fatal MALFORMED
  Write(t, "session", std::string(1, '\x11') + hello + push + discarded + pull + push);
  Write(t, "rejected", std::string(1, '\x22') + push + rejected + push);
  Write(t, "malformed", std::string(1, '\x33') + pull + bad + push);
  Write(t, "partial", std::string(1, '\x44') + push + push.substr(0, 100));
}

std::string Control(uint8_t kind, uint8_t setting, const std::string& payload) {
  return std::string(1, static_cast<char>(kind)) + std::string(1, static_cast<char>(setting)) +
         payload;
}

void ControlSeeds() {
  const std::string t = "control_fuzz";
  // Setting byte: bits 0-1 lanes - 1, bit 2 small chunks, (b >> 3) % 3 topology.
  Write(t, "hello", Control(0, 0x01, Hello("alpha", 2, 0, 1).SerializeAsString()));
  Write(t, "hello-rack", Control(0, 0x09, Hello("beta", 0, 1, 0).SerializeAsString()));
  Write(t, "hello-flat", Control(0, 0x13, Hello("beta", 1, 2, 3).SerializeAsString()));
  dpb::HubHello hh;
  hh.set_rack(2);
  hh.set_lane(1);
  hh.set_racks(3);
  hh.set_lanes(2);
  hh.set_link_version(2);
  hh.set_nonce(std::string(32, 'n'));
  Write(t, "hub-hello", Control(1, 0x09, hh.SerializeAsString()));
  Write(t, "declare", Control(2, 0x00, Declaration("x", 5000, pb::FP16, pb::OPTIMIZER_UNSPECIFIED)
                                           .SerializeAsString()));
  Write(t, "declare-adam",
        Control(2, 0x05, Declaration("layer.0/w", 70000, pb::BF16, pb::ADAM).SerializeAsString()));
  Write(t, "declare-existing",
        Control(2, 0x00, Declaration("w", 10000, pb::FP32, pb::OPTIMIZER_UNSPECIFIED)
                             .SerializeAsString()));
  dpb::OptimizerUpdate u;
  u.mutable_optimizer()->set_learning_rate(0.25);
  u.mutable_optimizer()->set_weight_decay(0.01);
  Write(t, "set-optimizer", Control(3, 0x00, u.SerializeAsString()));
  Write(t, "welcome", Control(4, 0x00, Welcome().SerializeAsString()));
  Write(t, "key-info", Control(5, 0x00, Entry(1, "w", 10000, 2).SerializeAsString()));
  Write(t, "key-info-small", Control(5, 0x04, Entry(1, "w", 1025, 2).SerializeAsString()));
}

void ConfigSeeds(const fs::path& source) {
  const std::string t = "config_fuzz";
  std::ifstream in(source / "deploy/rackhubd.toml", std::ios::binary);
  std::string deploy((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!deploy.empty()) Write(t, "deploy", deploy);
  Write(t, "minimal", "[data]\nlisten = \"127.0.0.1:7700\"\n[lanes]\ncount = 4\npin = false\n");
  Write(t, "topology",
        "[topology]\nrack = 1\nmode = \"hierarchical\"\nsecret_file = \"/etc/rackhub/secret\"\n"
        "[[topology.racks]]\ndata = \"10.0.0.1:7700\"\ninterhub = \"10.0.0.1:7800\"\n"
        "[[topology.racks]]\ndata = \"10.0.0.2:7700\"\ninterhub = \"10.0.0.2:7800\"\n");
  Write(t, "sizes",
        "[tenants]\ndefault_chunk_bytes = \"64KiB\"\nmax_parameter_bytes = \"2GiB\"\n"
        "[data]\nmax_queued_bytes_per_connection = \"16MiB\"\nstraggler_timeout_ms = 5000\n"
        "[checkpoint]\nevery_seconds = 60\nkeep = 2\n[state]\ndir = \"/tmp/x\"\n");
  Write(t, "errors", "log_level = \"loud\"\n[admin]\ntoken_fiel = \"x\"\nlisten = \"[::1]:99999\"\n");
}

srv::CheckpointImage Image(uint32_t slots) {
  srv::CheckpointImage img;
  img.tenant = "alpha";
  img.sequence = 7;  // checkpoint_fuzz writes its input as ckpt-...07.rhc
  img.created_unix_ms = 1790000000000;
  uint32_t id = 1;
  for (uint64_t elements : {10, 3}) {
    srv::CheckpointKey k;
    k.id = id++;
    k.name = "k" + std::to_string(k.id);
    k.elements = elements;
    k.chunk_elements = 4;
    k.chunk_count = static_cast<uint32_t>((elements + 3) / 4);
    k.version = 9;
    k.optimizer = slots == 2 ? "adam" : slots == 1 ? "momentum" : "sgd";
    k.state_slots = slots;
    for (uint32_t c = 0; c < k.chunk_count; ++c) {
      srv::CheckpointChunk ch;
      ch.key_id = k.id;
      ch.chunk = c;
      const uint64_t n = std::min<uint64_t>(4, elements - uint64_t{c} * 4);
      for (uint64_t i = 0; i < n; ++i) ch.params.push_back(0.25f * static_cast<float>(i + c));
      ch.state.assign(slots, std::vector<float>(n, -1.5f));
      img.chunks.push_back(std::move(ch));
    }
    img.keys.push_back(std::move(k));
  }
  return img;
}

void CheckpointSeeds() {
  const std::string t = "checkpoint_fuzz";
  const fs::path tmp = fs::temp_directory_path() / ("rackhub-fuzz-corpus-" + std::to_string(getpid()));
  for (uint32_t slots : {0u, 2u}) {
    const auto info = srv::WriteCheckpoint(tmp.string(), Image(slots), 1);
    if (!info.ok()) {
      std::fprintf(stderr, "rackhub-fuzz-corpus: %s\n", info.status().message().c_str());
      std::exit(1);
    }
    std::ifstream in(info->path, std::ios::binary);
    const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // Flag byte: 0 as is, 1 fix up checksums, 3 also the file size.
    Write(t, "slots" + std::to_string(slots), std::string(1, '\0') + file);
    Write(t, "slots" + std::to_string(slots) + "-fixup", std::string(1, '\x01') + file);
  }
  srv::CheckpointImage empty = Image(0);
  empty.keys.clear();
  empty.chunks.clear();
  const auto info = srv::WriteCheckpoint(tmp.string(), empty, 1);
  std::ifstream in(info->path, std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Write(t, "no-keys", std::string(1, '\x03') + file);
  fs::remove_all(tmp);
}

// hub_lane_fuzz operations (fuzz/hub/hub_ops.h).
std::string Op(uint8_t what, uint8_t b1, uint8_t b2, uint8_t b3, uint8_t b4, uint8_t b5 = 0,
               uint8_t b6 = 0, uint8_t b7 = 0) {
  return std::string{static_cast<char>(what), static_cast<char>(b1), static_cast<char>(b2),
                     static_cast<char>(b3), static_cast<char>(b4), static_cast<char>(b5),
                     static_cast<char>(b6), static_cast<char>(b7)};
}

void HubSeeds() {
  const std::string t = "hub_lane_fuzz";
  // b1 = 2: rank 0 on the chunk's owner lane; b3 = 1: the rank's next
  // iteration; b4 = 0: the key's dtype, exact size.
  const std::string push_k0_c0 = Op(18, 2, 0x00, 1, 0);
  const std::string push_k0_c1 = Op(18, 2, 0x04, 1, 0);
  const std::string push_k0_c2 = Op(18, 2, 0x08, 1, 0);
  const std::string pull_k0_c0 = Op(22, 2, 0x00, 1, 0x08);
  const std::string init_k1_c0 = Op(23, 2, 0x01, 1, 0);
  const std::string init_k1_c1 = Op(23, 2, 0x05, 1, 0);
  const std::string sync = Op(27, 0, 0, 0, 0);
  // Shape byte 0x06: 1 worker, Adam (1 + 3).
  Write(t, "train-1-worker", std::string(1, '\x06') + push_k0_c0 + push_k0_c1 + push_k0_c2 +
                                 pull_k0_c0 + sync + push_k0_c0 + pull_k0_c0);
  // 2 workers, SGD: both ranks push every chunk of k0, then the admin deletes k0.
  const std::string rank1 = Op(18, 3, 0x00, 1, 0);
  Write(t, "train-2-workers", std::string(1, '\x01') + push_k0_c0 + rank1 + sync +
                                  Op(18, 2, 0x00, 1, 0) + Op(24, 0, 0x00, 0, 0) + rank1);
  Write(t, "init-from-client", std::string(1, '\x00') + pull_k0_c0 + Op(22, 2, 0x01, 1, 0x08) +
                                   init_k1_c0 + init_k1_c1 + Op(18, 2, 0x01, 1, 0) + sync);
  // DECLARE a new key (b6 = 2: "k2", 1 + 37 * 40 elements), then push to it.
  Write(t, "declare", std::string(1, '\x02') + Op(10, 0, 0, 0, 0, 40, 0x02) + sync +
                          Op(18, 0, 0x02, 1, 0) + Op(18, 4, 0x02, 1, 0));
  // A worker lost mid-iteration, then a replacement on the same rank.
  Write(t, "worker-lost", std::string(1, '\x01') + push_k0_c0 + Op(26, 2, 0x00, 0, 0) + rank1 +
                              push_k0_c0 + sync);
  Write(t, "set-optimizer", std::string(1, '\x04') + Op(12, 2, 0x00, 1, 0, 10, 0x40) +
                                Op(25, 0, 0x00, 0, 0, 20, 0, 3) + push_k0_c0 + sync);
  // Frames naming another tenant, a wrong dtype, a bad size, an unknown key.
  Write(t, "hostile", std::string(1, '\x00') + Op(18, 2 | 0x10, 0, 1, 0) + Op(18, 2, 0, 1, 3) +
                          Op(18, 2, 0, 1, 0x0c, 7) + Op(22, 0, 0x03, 1, 0x08, 0, 0, 200) + sync);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: rackhub-fuzz-corpus DIR (fuzz/corpus of the source tree)\n");
    return 2;
  }
  g_root = argv[1];
  FrameSeeds();
  StreamSeeds();
  ControlSeeds();
  ConfigSeeds(RACKHUB_SOURCE_DIR);
  CheckpointSeeds();
  HubSeeds();
  std::printf("rackhub-fuzz-corpus: seeds written under %s\n", g_root.c_str());
  return 0;
}
