// The tenant and key registry of one rackhubd: names, numeric handles,
// quotas, auth token hashes, and each tenant's chunk layout.
//
// Thread safety: every public member may be called from any thread (admin
// gRPC threads, the acceptor). State is guarded by mu_ (a reader/writer lock);
// the data path never takes it per chunk: lanes receive snapshots of what they
// need when keys change.
//
// Durability (docs/durability.md): with a backend (Registry::Open), every
// mutation is first committed to the store in one transaction and only then
// applied in memory and replied; a failed write fails the call (INTERNAL, or
// UNAVAILABLE when etcd cannot be reached) and changes nothing. Refused
// requests never touch the store. Without a store (the constructor;
// state.in_memory) everything lives in memory only. MarkKeyReady is not
// stored: FROM_CLIENT keys load as not ready.
//
// A shared backend (etcd, docs/cluster.md): a write is a compare-and-swap
// against the revisions this registry last saw; when another hub wrote first
// the call waits until this hub has seen that change and tries again (for up
// to 10 s, then UNAVAILABLE). The in-memory state changes only through Reconcile, called by the
// backend's watch with the store's whole contents after every change, this
// hub's own included; a mutation returns once its change was applied here.
// Reconcile tells the observer what changed (tenants or keys deleted,
// optimizers set), whichever hub made the change.
//
// A failed call changes nothing.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

#include "config.h"
#include "key_memory.h"
#include "tenant_metrics.h"
#include "rackhub/aggregation/chunk_layout.h"
#include "rackhub/aggregation/optimizer_config.h"
#include "rackhub/common/status.h"

namespace rackhub::server {

enum class WireDType : uint8_t { kFp32 = 1, kFp16 = 2, kBf16 = 3 };
// kRandom: row-sparse tables only, aggregation::TableInitValues(init_seed,
// init_scale, ...).
enum class InitMode : uint8_t { kZeros = 1, kFromClient = 2, kRandom = 3 };

const char* WireDTypeName(WireDType dtype);  // "fp32", "fp16", "bf16"
uint32_t WireDTypeBytes(WireDType dtype);

struct Quotas {
  // Hub memory the tenant's keys may hold (TenantInfo::memory_bytes, see
  // key_memory.h), not only the fp32 parameters: with Adam about 6x those.
  uint64_t max_parameter_bytes = 0;
  uint32_t max_keys = 0;
  uint32_t max_workers = 0;
  // Share of each lane against other tenants with work waiting (the lanes'
  // fair scheduler, data.scheduler = "fair"): in [1, kMaxWeight]; 0 on
  // input: 1 (create) or unchanged (update).
  uint32_t weight = 0;
  static constexpr uint32_t kMaxWeight = 1000;  // FairScheduler::kMaxWeight
};

// How a tenant's workers wait for each other (docs/consistency.md).
//   kSync: every update sums every worker's contribution in rank order.
//   kBounded: each contribution is applied to the parameters as it arrives;
//     a worker's reply is held while it would be more than `staleness`
//     iterations ahead of the slowest live worker.
//   kAsync: applied as it arrives, never held.
enum class Consistency : uint8_t { kSync = 0, kBounded = 1, kAsync = 2 };
inline constexpr uint32_t kMaxStaleness = 1000000;
// "sync", "bounded:2", "async".
std::string ConsistencyName(Consistency c, uint32_t staleness);

struct TenantSpec {
  std::string name;
  uint32_t workers_per_rack = 0;
  uint32_t chunk_bytes = 0;  // 0: daemon default
  aggregation::OptimizerConfig default_optimizer;
  Quotas quotas;  // zero fields: daemon defaults
  std::string token;  // empty: mint one
  Consistency consistency = Consistency::kSync;
  uint32_t staleness = 0;  // kBounded: s (<= kMaxStaleness)
  // Elastic (docs/elastic.md): ranks 0..quotas.max_workers-1 join and leave;
  // workers_per_rack is the start quorum, min_workers the pause threshold.
  bool elastic = false;
  uint32_t min_workers = 0;  // elastic: 0 = 1
};

// Live data-plane counters of a tenant; updated by lanes with relaxed atomics.
struct TenantCounters {
  TenantCounters(uint32_t lanes, uint32_t members) : lanes(lanes, members) {}

  // What each lane recorded (pushes, bytes, errors, latencies), summed when
  // read: tenant_metrics.h.
  TenantLaneSlots lanes;
  std::atomic<uint32_t> workers_connected{0};
  // Updates of chunk 0 of every key (a key's iterations), workers lost (a
  // connection closed without BYE) and iterations aborted for a straggler.
  std::atomic<uint64_t> iterations_completed{0};
  std::atomic<uint64_t> workers_lost{0};
  std::atomic<uint64_t> stragglers{0};
  // Times a worker connection was held for running ahead of the others
  // (server/lanes/intake_pacer.h; data.intake_lead_bytes).
  std::atomic<uint64_t> intake_holds{0};
  // Hub memory of the chunks the lanes have created so far (each chunk's
  // ChunkMemoryBytes; at most TenantInfo::memory_bytes).
  std::atomic<uint64_t> memory_bytes_allocated{0};
  // Quotas::weight as the lanes' schedulers read it (set by the registry on
  // create, load and UpdateQuotas).
  std::atomic<uint32_t> weight{1};
  // Checkpoints written (Checkpointer): count, the newest one's duration
  // (microseconds) and size on disk.
  std::atomic<uint64_t> checkpoints{0};
  std::atomic<uint64_t> last_checkpoint_us{0};
  std::atomic<uint64_t> last_checkpoint_bytes{0};
  // Elastic tenants (docs/elastic.md), written by the data plane when a
  // membership is committed: its generation, member count, and whether the
  // tenant is paused (below min_workers, or before its start quorum).
  std::atomic<uint64_t> membership_generation{0};
  std::atomic<uint32_t> members{0};
  std::atomic<bool> paused{false};
};

struct TenantInfo {
  std::string name;
  uint32_t handle = 0;
  uint32_t workers_per_rack = 0;
  uint32_t chunk_bytes = 0;
  aggregation::OptimizerConfig default_optimizer;
  Quotas quotas;
  uint32_t key_count = 0;
  uint64_t parameter_bytes = 0;  // fp32 master parameters of every key
  uint64_t memory_bytes = 0;     // hub memory every key holds at most (the quota's use)
  uint64_t chunk_count = 0;
  int64_t created_unix_ms = 0;
  Consistency consistency = Consistency::kSync;
  uint32_t staleness = 0;
  bool elastic = false;
  uint32_t min_workers = 0;  // elastic: >= 1
  std::shared_ptr<TenantCounters> counters;
  // Ranks per rack a chunk sums: workers_per_rack, or for an elastic tenant
  // its rank limit quotas.max_workers (each update sums its members only).
  uint32_t rank_slots() const { return elastic ? quotas.max_workers : workers_per_rack; }
};

struct KeySpec {
  std::string tenant;
  std::string name;
  uint64_t elements = 0;
  WireDType dtype = WireDType::kFp32;
  bool use_tenant_optimizer = true;  // false: `optimizer` below
  aggregation::OptimizerConfig optimizer;
  InitMode init = InitMode::kZeros;
  // A row-sparse table (embedding table) of rows x dim when rows > 0;
  // `elements` is then 0 or rows * dim. init kZeros or kRandom.
  uint64_t rows = 0;
  uint32_t dim = 0;
  float init_scale = 0;
  uint64_t init_seed = 0;
  // Top-k sparsified pushes: (0, 1], 0 = dense. Dense keys only.
  // The ratio as given, in double: k = ceil(ratio * n) of it (the float of
  // the wire's older field would send 129 of 2560 entries for 0.05).
  double topk_ratio = 0;
  // A participant set: the ranks (strictly ascending, < workers_per_rack)
  // whose pushes each update sums, in rank order (Mean divides by their
  // count); a push of another rank is refused. Empty: every worker. Dense
  // keys of single-rack, sync, non-elastic tenants only.
  std::vector<uint32_t> participants;
};

// The optimizer of a key over time: `base` until update `from_update` - 1,
// `latest` from update `from_update` (1-based) on. from_update == 0: `latest`
// applies to every update (and equals `base`). A lane creating a chunk's
// state late uses this to get the same schedule as the chunks made earlier.
// (Two changes pending at once keep only the later one, like ChunkState.)
struct OptimizerSchedule {
  aggregation::OptimizerConfig base;
  aggregation::OptimizerConfig latest;
  uint64_t from_update = 0;
  // Records a change taking effect at update `from` (0 = the next update).
  // Idempotent: applying the same change twice changes nothing.
  void Apply(const aggregation::OptimizerConfig& config, uint64_t from);
};

struct KeyInfo {
  std::string tenant;
  std::string name;
  uint32_t id = 0;
  uint64_t elements = 0;
  WireDType dtype = WireDType::kFp32;
  aggregation::OptimizerConfig optimizer;  // the latest set (what the admin API shows)
  OptimizerSchedule schedule;
  InitMode init = InitMode::kZeros;
  bool ready = true;
  aggregation::KeyPlacement placement;
  uint32_t chunk_elements = 0;
  uint64_t memory_bytes = 0;  // hub memory its chunks hold at most (key_memory.h)
  // Row-sparse table: rows x dim (elements == rows * dim); 0 for dense keys.
  uint64_t rows = 0;
  uint32_t dim = 0;
  float init_scale = 0;
  uint64_t init_seed = 0;
  double topk_ratio = 0;  // > 0: pushes may be sparse (top-k), docs/compression.md
  std::vector<uint32_t> participants;  // KeySpec::participants (empty: every worker)
  bool table() const { return rows > 0; }
  // Rows per chunk of a table (chunk c holds rows [c * per, ...)), fixed
  // when it was created (chunk_elements = per * dim).
  uint64_t rows_per_chunk() const { return dim ? chunk_elements / dim : 0; }
  uint64_t parameter_bytes() const { return elements * aggregation::kMasterElementBytes; }
};

// Told about changes that lanes must apply. Called with the registry's lock
// held: implementations must only post work elsewhere, never call back.
class RegistryObserver {
 public:
  virtual ~RegistryObserver() = default;
  virtual void OnTenantDeleted(uint32_t handle) = 0;
  virtual void OnKeyDeleted(uint32_t handle, uint32_t key_id) = 0;
  // A key is new here (created, declared, adopted, or read from the store).
  virtual void OnKeyCreated(uint32_t handle, uint32_t key_id) {
    (void)handle;
    (void)key_id;
  }
  // `from_update`: first update (1-based) the new values apply to; 0 = next.
  virtual void OnOptimizerChanged(uint32_t handle, uint32_t key_id,
                                  const aggregation::OptimizerConfig& optimizer,
                                  uint64_t from_update) = 0;
};

class RegistryBackend;
struct RegistryContents;

class Registry {
 public:
  // An in-memory registry: nothing is stored, a restart starts empty.
  // `topology` shapes what a key's chunks hold (key_memory.h).
  Registry(uint32_t lanes, TenantDefaults defaults, const TopologyConfig& topology = {});
  // A durable registry over `store` (not null), loaded with everything the
  // store holds (a shared store then keeps it current through its watch). FAILED_PRECONDITION naming the file if the stored state is
  // unusable (e.g. a row with an invalid chunk size). Tenants whose keys hold
  // more than their quota (stored by an older version, which counted fp32
  // parameters only) load as they are: new keys are refused until the quota
  // is raised.
  static Result<std::unique_ptr<Registry>> Open(uint32_t lanes, TenantDefaults defaults,
                                                std::unique_ptr<RegistryBackend> store,
                                                const TopologyConfig& topology = {});
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  uint32_t lanes() const { return lanes_; }
  // Whether the backend is shared with other hubs (etcd): writes then take
  // network round trips (callers on a lane thread hand them off).
  bool shared() const;

  // On success fills *out and *token (the only time the token is visible).
  Status CreateTenant(const TenantSpec& spec, TenantInfo* out, std::string* token);
  Status GetTenant(const std::string& name, TenantInfo* out) const;
  std::vector<TenantInfo> ListTenants() const;
  // Zero fields of `quotas` keep their value. Lowering a quota below the
  // tenant's current use is refused (FAILED_PRECONDITION).
  Status UpdateQuotas(const std::string& name, const Quotas& quotas, TenantInfo* out);
  Status DeleteTenant(const std::string& name);

  Status CreateKey(const KeySpec& spec, KeyInfo* out);
  // Creates the key at key id `id` with its chunks from `first_chunk`, as
  // another hub of the tenant has it (RackExchange::TryBind: a KEY_BIND of a
  // key no worker of this rack declared). FAILED_PRECONDITION naming the key
  // here that has that id or any of those chunks; ids and chunks skipped stay
  // free for the keys that have them there. Not with a shared (etcd)
  // registry, whose keys come through it.
  Status AdoptKey(const KeySpec& spec, uint32_t id, uint64_t first_chunk, KeyInfo* out);
  Status GetKey(const std::string& tenant, const std::string& name, KeyInfo* out) const;
  Status ListKeys(const std::string& tenant, std::vector<KeyInfo>* out) const;
  Status DeleteKey(const std::string& tenant, const std::string& name);
  // Replaces the hyperparameters; `keep_type` means the type of `optimizer`
  // is ignored and the key's own is kept. A different type is refused.
  // `from_update` (1-based, 0 = the next update) is passed to the observer.
  Status SetOptimizer(const std::string& tenant, const std::string& name,
                      aggregation::OptimizerConfig optimizer, bool keep_type, KeyInfo* out,
                      uint64_t from_update = 0);

  // Data-plane lookups by numeric ids.
  Status GetTenantByHandle(uint32_t handle, TenantInfo* out) const;
  Status GetKeyById(uint32_t handle, uint32_t key_id, KeyInfo* out) const;
  // A client's DECLARE: creates the key, or returns the existing key of that
  // name when elements and dtype agree (several ranks declare the same key).
  Status DeclareKey(const KeySpec& spec, KeyInfo* out, bool* created);
  // Marks a FROM_CLIENT key ready once its values arrived (no-op if gone).
  void MarkKeyReady(uint32_t handle, uint32_t key_id);
  // At most one observer; set before serving, never changed afterwards.
  // Under the lock: an etcd watch may already apply changes (and call it).
  void SetObserver(RegistryObserver* observer) {
    std::unique_lock lock(mu_);
    observer_ = observer;
  }

  // Data-plane authentication: checks `token` against the tenant's stored
  // hash in constant time. UNAUTHENTICATED for an unknown tenant or wrong
  // token (the message does not tell which, to not leak tenant names).
  Status Authenticate(const std::string& tenant, const std::string& token, TenantInfo* out) const;

  // The chunks of a key (layout of its tenant): all of them, or `count`
  // from the key's chunk `from` (clipped to the key).
  std::vector<aggregation::ChunkSpan> ChunksOf(const KeyInfo& key, uint64_t from = 0,
                                               uint64_t count = UINT64_MAX) const;
  // How many of a key's chunks, and elements, each lane holds (index =
  // lane; every lane), without listing the chunks.
  struct LaneShare {
    uint64_t chunks = 0, elements = 0;
  };
  std::vector<LaneShare> LanesOf(const KeyInfo& key) const;

  struct Totals {
    uint32_t tenants = 0;
    uint32_t keys = 0;
    uint64_t parameter_bytes = 0;
    uint64_t memory_bytes = 0;
  };
  Totals GetTotals() const;

 private:
  struct Tenant;
  struct KeyAt {
    uint32_t id;
    uint64_t first_chunk;
  };
  // CreateKey, at `at` when given (AdoptKey).
  Status CreateKeyAt(const KeySpec& spec, std::optional<KeyAt> at, KeyInfo* out);
  // FAILED_PRECONDITION naming the key whose id or chunks `at` would take
  // (a key of `elements`, or spec's table). REQUIRES: mu_ held.
  Status CheckKeyAt(const Tenant& t, const KeySpec& spec, const KeyAt& at,
                    uint64_t elements) const;
  Tenant* FindTenant(const std::string& name) const;  // REQUIRES: mu_ held
  // Tenant `tenant` (*t) and its key `name` (*key), or NOT_FOUND naming the
  // one missing. REQUIRES: mu_ held.
  Status FindKey(const std::string& tenant, const std::string& name, Tenant** t,
                 KeyInfo** key) const;
  // A tenant's counters, one metrics block slot per lane and worker.
  std::shared_ptr<TenantCounters> NewCounters(const TenantInfo& info) const;

  // The hub memory of a key of tenant `t` (key_memory.h).
  uint64_t KeyMemory(const TenantInfo& t, uint64_t elements, WireDType dtype,
                     aggregation::OptimizerType optimizer, uint32_t chunk_elements) const;
  // The same for a key (dense or table).
  uint64_t KeyMemory(const TenantInfo& t, const KeyInfo& key) const;
  // Checks a table's shape and init (spec.rows > 0); fills *elements.
  Status CheckTableSpec(const KeySpec& spec, uint64_t* elements) const;

  const uint32_t lanes_;
  const uint32_t racks_;  // the topology's (workers are rack * workers_per_rack + rank)
  const bool exchange_;   // a hub per rack (hierarchical), not one for every rack
  const TenantDefaults defaults_;
  const MemoryModel memory_model_;
  mutable std::shared_mutex mu_;
  Tenant* FindTenantByHandle(uint32_t handle) const;  // REQUIRES: mu_ held
  // Makes the in-memory state equal to `contents` (registry_reconcile.cc),
  // telling the observer what was deleted or changed. `strict` (loading at
  // start-up): an unusable row fails with FAILED_PRECONDITION naming
  // `where`; otherwise it is logged and skipped. REQUIRES: mu_ held exclusively.
  Status Apply(const RegistryContents& contents, bool strict,
               const std::string& where);
  // Reconcile with the lock taken; the backend's watch callback.
  void Reconcile(const RegistryContents& contents);
  // A shared store: waits until Reconcile applied `revision`, re-reading
  // the store if the watch does not bring it soon. REQUIRES: mu_ not held.
  Status AwaitRevision(int64_t revision);
  // Runs `attempt` until it is not refused for a conflict (shared stores;
  // registry_reconcile.cc).
  Status Retrying(const std::function<Status(int64_t* revision)>& attempt);

  RegistryObserver* observer_ = nullptr;
  // Null: in-memory. Written with mu_ held exclusively, before the maps change.
  std::unique_ptr<RegistryBackend> store_;                  // GUARDED_BY(mu_)
  std::map<std::string, std::unique_ptr<Tenant>> tenants_;  // GUARDED_BY(mu_)
  std::map<uint32_t, Tenant*> by_handle_;                   // GUARDED_BY(mu_)
  uint32_t next_handle_ = 1;                                // GUARDED_BY(mu_)
  // The newest store revision Reconcile applied (shared stores).
  mutable std::mutex revision_mu_;
  mutable std::condition_variable revision_cv_;
  int64_t applied_revision_ = 0;  // GUARDED_BY(revision_mu_)
};

// Name rules, shared with the data plane's HELLO validation.
bool IsValidTenantName(const std::string& name);
bool IsValidKeyName(const std::string& name);

}  // namespace rackhub::server
