#include "etcd_registry_store.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "proto_convert.h"
#include "rackhub/cluster/v1/records.pb.h"

namespace rackhub::server {
namespace {

namespace pb = etcdserverpb;
namespace rec = rackhub::cluster::v1;
using aggregation::OptimizerConfig;
using aggregation::OptimizerType;
using aggregation::Reduction;

constexpr auto kRetry = std::chrono::milliseconds(500);

void ToRecord(const OptimizerConfig& o, rec::Optimizer* r) {
  r->set_type(static_cast<uint32_t>(o.type));
  HyperparametersToProto(o, r);
  r->set_reduction(static_cast<uint32_t>(o.reduction));
}

OptimizerConfig FromRecord(const rec::Optimizer& r) {
  OptimizerConfig o;
  o.type = static_cast<OptimizerType>(r.type());
  HyperparametersFromProto(r, &o);
  o.reduction = static_cast<Reduction>(r.reduction());
  return o;
}

bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

// Transaction building blocks.
void CompareMod(pb::TxnRequest* txn, const std::string& key, int64_t revision) {
  auto* c = txn->add_compare();
  c->set_result(pb::Compare::EQUAL);
  c->set_target(pb::Compare::MOD);
  c->set_key(key);
  c->set_mod_revision(revision);
}
void CompareAbsent(pb::TxnRequest* txn, const std::string& key) {
  auto* c = txn->add_compare();
  c->set_result(pb::Compare::EQUAL);
  c->set_target(pb::Compare::CREATE);
  c->set_key(key);
  c->set_create_revision(0);
}
void CompareValue(pb::TxnRequest* txn, const std::string& key, const std::string& value) {
  auto* c = txn->add_compare();
  c->set_result(pb::Compare::EQUAL);
  c->set_target(pb::Compare::VALUE);
  c->set_key(key);
  c->set_value(value);
}
void Put(pb::TxnRequest* txn, const std::string& key, const std::string& value) {
  auto* p = txn->add_success()->mutable_request_put();
  p->set_key(key);
  p->set_value(value);
}
void Delete(pb::TxnRequest* txn, const std::string& key, const std::string& range_end = "") {
  auto* d = txn->add_success()->mutable_request_delete_range();
  d->set_key(key);
  d->set_range_end(range_end);
}

}  // namespace

Result<std::unique_ptr<EtcdRegistryStore>> EtcdRegistryStore::Open(const EtcdOptions& options,
                                                                    const std::string& prefix) {
  if (prefix.empty() || prefix.back() != '/') {
    return InvalidArgument(options.field + "_prefix: '" + prefix + "' must end with '/'");
  }
  Result<std::unique_ptr<EtcdClient>> client = EtcdClient::Connect(options, prefix + "meta/");
  if (!client.ok()) return client.status();
  return std::unique_ptr<EtcdRegistryStore>(
      new EtcdRegistryStore(*std::move(client), prefix));
}

EtcdRegistryStore::~EtcdRegistryStore() {
  {
    std::lock_guard lock(stop_mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  client_->Cancel();
  if (watcher_.joinable()) watcher_.join();
}

std::string EtcdRegistryStore::where() const {
  return "registry.etcd: " + client_->endpoints() + " " + prefix_;
}

std::string EtcdRegistryStore::KeyPath(uint32_t handle, const std::string& name) const {
  return prefix_ + "keys/" + std::to_string(handle) + "/" + name;
}

std::string EtcdRegistryStore::EncodeTenant(const TenantRow& t) {
  rec::TenantRecord r;
  r.set_name(t.info.name);
  r.set_handle(t.info.handle);
  r.set_workers_per_rack(t.info.workers_per_rack);
  r.set_chunk_bytes(t.info.chunk_bytes);
  ToRecord(t.info.default_optimizer, r.mutable_default_optimizer());
  r.set_max_parameter_bytes(t.info.quotas.max_parameter_bytes);
  r.set_max_keys(t.info.quotas.max_keys);
  r.set_max_workers(t.info.quotas.max_workers);
  r.set_weight(t.info.quotas.weight);
  r.set_created_unix_ms(t.info.created_unix_ms);
  r.set_consistency(static_cast<uint32_t>(t.info.consistency));
  r.set_staleness(t.info.staleness);
  r.set_elastic(t.info.elastic);
  r.set_min_workers(t.info.min_workers);
  r.set_token_salt(t.token.salt.data(), t.token.salt.size());
  r.set_token_sha256(t.token.hash.data(), t.token.hash.size());
  r.set_next_key_id(t.next_key_id);
  r.set_next_chunk(t.next_chunk);
  return r.SerializeAsString();
}

std::string EtcdRegistryStore::EncodeKey(uint32_t tenant_handle, const KeyInfo& k) {
  rec::KeyRecord r;
  r.set_tenant_handle(tenant_handle);
  r.set_name(k.name);
  r.set_id(k.id);
  r.set_elements(k.elements);
  r.set_dtype(static_cast<uint32_t>(k.dtype));
  ToRecord(k.optimizer, r.mutable_optimizer());
  ToRecord(k.schedule.base, r.mutable_schedule_base());
  r.set_schedule_from_update(k.schedule.from_update);
  r.set_init(static_cast<uint32_t>(k.init));
  r.set_first_chunk(k.placement.first_chunk);
  r.set_chunk_count(k.placement.chunk_count);
  r.set_chunk_elements(k.chunk_elements);
  r.set_rows(k.rows);
  r.set_dim(k.dim);
  r.set_init_scale(k.init_scale);
  r.set_init_seed(k.init_seed);
  r.set_topk_ratio(static_cast<float>(k.topk_ratio));
  r.set_topk_ratio_exact(k.topk_ratio);
  for (uint32_t rank : k.participants) r.add_participants(rank);
  return r.SerializeAsString();
}

RegistryContents EtcdRegistryStore::Parse(const std::map<std::string, std::string>& kvs,
                                          int64_t revision) const {
  // `kvs` values are "<mod_revision> <bytes>" packed by the callers below.
  Contents c;
  c.revision = revision;
  for (const auto& [key, packed] : kvs) {
    const size_t space = packed.find(' ');
    const int64_t mod = std::stoll(packed.substr(0, space));
    const std::string value = packed.substr(space + 1);
    if (key == MetaPath()) {
      c.next_handle = static_cast<uint32_t>(std::strtoul(value.c_str(), nullptr, 10));
    } else if (StartsWith(key, prefix_ + "tenants/")) {
      rec::TenantRecord r;
      if (!r.ParseFromString(value) || r.token_salt().size() != 16 ||
          r.token_sha256().size() != 32) {
        spdlog::error("registry: {}: {} is not a tenant record; ignored", where(), key);
        continue;
      }
      TenantRow t;
      t.info.name = r.name();
      t.info.handle = r.handle();
      t.info.workers_per_rack = r.workers_per_rack();
      t.info.chunk_bytes = r.chunk_bytes();
      t.info.default_optimizer = FromRecord(r.default_optimizer());
      t.info.quotas.max_parameter_bytes = r.max_parameter_bytes();
      t.info.quotas.max_keys = r.max_keys();
      t.info.quotas.max_workers = r.max_workers();
      t.info.quotas.weight = r.weight();
      t.info.created_unix_ms = r.created_unix_ms();
      t.info.consistency = static_cast<Consistency>(r.consistency());
      t.info.staleness = r.staleness();
      t.info.elastic = r.elastic();
      t.info.min_workers = r.min_workers();
      std::memcpy(t.token.salt.data(), r.token_salt().data(), 16);
      std::memcpy(t.token.hash.data(), r.token_sha256().data(), 32);
      t.next_key_id = r.next_key_id();
      t.next_chunk = r.next_chunk();
      t.revision = mod;
      c.tenants.push_back(std::move(t));
    } else if (StartsWith(key, prefix_ + "keys/")) {
      rec::KeyRecord r;
      if (!r.ParseFromString(value)) {
        spdlog::error("registry: {}: {} is not a key record; ignored", where(), key);
        continue;
      }
      KeyRow k;
      k.tenant_handle = r.tenant_handle();
      k.key.name = r.name();
      k.key.id = r.id();
      k.key.elements = r.elements();
      k.key.dtype = static_cast<WireDType>(r.dtype());
      k.key.optimizer = FromRecord(r.optimizer());
      k.key.schedule.latest = k.key.optimizer;
      k.key.schedule.base = FromRecord(r.schedule_base());
      k.key.schedule.from_update = r.schedule_from_update();
      k.key.init = static_cast<InitMode>(r.init());
      k.key.placement.first_chunk = r.first_chunk();
      k.key.placement.chunk_count = r.chunk_count();
      k.key.chunk_elements = r.chunk_elements();
      k.key.rows = r.rows();
      k.key.dim = r.dim();
      k.key.init_scale = r.init_scale();
      k.key.init_seed = r.init_seed();
      k.key.topk_ratio = r.topk_ratio_exact() != 0 ? r.topk_ratio_exact()
                                                   : static_cast<double>(r.topk_ratio());
      k.key.participants.assign(r.participants().begin(), r.participants().end());
      k.revision = mod;
      c.keys.push_back(std::move(k));
    }
  }
  std::sort(c.tenants.begin(), c.tenants.end(),
            [](const TenantRow& a, const TenantRow& b) { return a.info.handle < b.info.handle; });
  std::sort(c.keys.begin(), c.keys.end(), [](const KeyRow& a, const KeyRow& b) {
    return std::tie(a.tenant_handle, a.key.id) < std::tie(b.tenant_handle, b.key.id);
  });
  return c;
}

namespace {
std::string Pack(const pb::KeyValue& kv) { return std::to_string(kv.mod_revision()) + " " + kv.value(); }
bool RegistryKey(const std::string& key, const std::string& prefix) {
  return StartsWith(key, prefix + "meta/") || StartsWith(key, prefix + "tenants/") ||
         StartsWith(key, prefix + "keys/");
}
}  // namespace

Result<RegistryContents> EtcdRegistryStore::Load() {
  Result<pb::RangeResponse> r = client_->Range(prefix_, EtcdClient::PrefixEnd(prefix_));
  if (!r.ok()) return r.status();
  std::map<std::string, std::string> kvs;
  for (const auto& kv : r->kvs()) {
    if (RegistryKey(kv.key(), prefix_)) kvs[kv.key()] = Pack(kv);
  }
  return Parse(kvs, r->header().revision());
}

Status EtcdRegistryStore::Refresh() {
  Result<Contents> c = Load();
  if (!c.ok()) return c.status();
  if (apply_) apply_(*c);
  return Status::Ok();
}

Status EtcdRegistryStore::Commit(const pb::TxnRequest& txn, const std::string& what,
                                 int64_t* revision) {
  Result<pb::TxnResponse> r = client_->Txn(txn);
  if (!r.ok()) return r.status().WithContext(what);
  *revision = r->header().revision();
  if (!r->succeeded()) {
    return Status(StatusCode::kAborted,
                  "registry.etcd: " + what + ": another hub changed the registry first");
  }
  return Status::Ok();
}

Status EtcdRegistryStore::InsertTenant(const TenantRow& t, uint32_t next_handle,
                                       int64_t* revision) {
  pb::TxnRequest txn;
  // The handle is the counter's value (or the first one, 1, before any).
  if (t.info.handle == 1) {
    CompareAbsent(&txn, MetaPath());
  } else {
    CompareValue(&txn, MetaPath(), std::to_string(t.info.handle));
  }
  CompareAbsent(&txn, TenantPath(t.info.name));
  Put(&txn, MetaPath(), std::to_string(next_handle));
  Put(&txn, TenantPath(t.info.name), EncodeTenant(t));
  return Commit(txn, "create tenant '" + t.info.name + "'", revision);
}

Status EtcdRegistryStore::UpdateQuotas(const TenantRow& t, int64_t* revision) {
  pb::TxnRequest txn;
  CompareMod(&txn, TenantPath(t.info.name), t.revision);
  Put(&txn, TenantPath(t.info.name), EncodeTenant(t));
  return Commit(txn, "update quotas of tenant '" + t.info.name + "'", revision);
}

Status EtcdRegistryStore::DeleteTenant(const TenantRow& t, int64_t* revision) {
  pb::TxnRequest txn;
  CompareMod(&txn, TenantPath(t.info.name), t.revision);
  Delete(&txn, TenantPath(t.info.name));
  const std::string keys = prefix_ + "keys/" + std::to_string(t.info.handle) + "/";
  Delete(&txn, keys, EtcdClient::PrefixEnd(keys));
  return Commit(txn, "delete tenant '" + t.info.name + "'", revision);
}

Status EtcdRegistryStore::InsertKey(const TenantRow& t, const KeyInfo& key, int64_t* revision) {
  pb::TxnRequest txn;
  CompareMod(&txn, TenantPath(t.info.name), t.revision);
  CompareAbsent(&txn, KeyPath(t.info.handle, key.name));
  Put(&txn, TenantPath(t.info.name), EncodeTenant(t));
  Put(&txn, KeyPath(t.info.handle, key.name), EncodeKey(t.info.handle, key));
  return Commit(txn, "create key '" + key.name + "'", revision);
}

Status EtcdRegistryStore::DeleteKey(const TenantRow& t, const KeyInfo& key, int64_t key_revision,
                                    int64_t* revision) {
  pb::TxnRequest txn;
  CompareMod(&txn, KeyPath(t.info.handle, key.name), key_revision);
  Delete(&txn, KeyPath(t.info.handle, key.name));
  return Commit(txn, "delete key '" + key.name + "'", revision);
}

Status EtcdRegistryStore::UpdateOptimizer(const TenantRow& t, const KeyInfo& key,
                                          int64_t key_revision, int64_t* revision) {
  pb::TxnRequest txn;
  CompareMod(&txn, KeyPath(t.info.handle, key.name), key_revision);
  Put(&txn, KeyPath(t.info.handle, key.name), EncodeKey(t.info.handle, key));
  return Commit(txn, "set optimizer of key '" + key.name + "'", revision);
}

void EtcdRegistryStore::Watch(std::function<void(const Contents&)> apply,
                              int64_t after_revision) {
  apply_ = apply;
  watcher_ = std::thread([this, apply, after_revision] { WatchLoop(apply, after_revision); });
}

void EtcdRegistryStore::WatchLoop(std::function<void(const Contents&)> apply,
                                  int64_t after_revision) {
  std::map<std::string, std::string> kvs;
  int64_t revision = after_revision;
  bool have = false;  // kvs hold the contents at `revision`
  bool down = false;  // an outage was logged
  const auto wait = [this] {
    std::unique_lock lock(stop_mu_);
    return !stop_cv_.wait_for(lock, kRetry, [this] { return stopping_; });
  };
  const std::string end = EtcdClient::PrefixEnd(prefix_);
  while (true) {
    {
      std::lock_guard lock(stop_mu_);
      if (stopping_) return;
    }
    if (!have) {
      // (Re)read everything: a change made while the watch was down is
      // applied now.
      Result<pb::RangeResponse> r = client_->Range(prefix_, end);
      if (!r.ok()) {
        if (!down) spdlog::warn("registry: {}: {}; retrying", where(), r.status().message());
        down = true;
        if (!wait()) return;
        continue;
      }
      kvs.clear();
      for (const auto& kv : r->kvs()) {
        if (RegistryKey(kv.key(), prefix_)) kvs[kv.key()] = Pack(kv);
      }
      revision = r->header().revision();
      apply(Parse(kvs, revision));
      have = true;
      if (down) spdlog::info("registry: {}: reachable again", where());
      down = false;
    }
    Status s = client_->Watch(prefix_, end, revision + 1, [&](const pb::WatchResponse& resp) {
      if (resp.compact_revision() > 0 || resp.canceled()) {
        have = false;  // history we need is gone: re-read
        return false;
      }
      if (resp.events().empty()) return true;
      for (const auto& ev : resp.events()) {
        revision = std::max(revision, ev.kv().mod_revision());
        if (!RegistryKey(ev.kv().key(), prefix_)) continue;
        if (ev.type() == pb::Event::PUT) {
          kvs[ev.kv().key()] = Pack(ev.kv());
        } else {
          kvs.erase(ev.kv().key());
        }
      }
      apply(Parse(kvs, revision));
      return true;
    });
    {
      std::lock_guard lock(stop_mu_);
      if (stopping_) return;
    }
    if (!s.ok()) {
      if (!down) spdlog::warn("registry: {}: {}; re-reading when it is back", where(), s.message());
      down = true;
    }
    have = false;
    if (!wait()) return;
  }
}

}  // namespace rackhub::server
