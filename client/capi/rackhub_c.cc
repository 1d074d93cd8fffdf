// The C ABI over rackhub::client::Client.
#include "rackhub/client/rackhub_c.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>

#include "rackhub/client/client.h"

using rackhub::client::Client;
using rackhub::client::Error;
using rackhub::client::ErrorCode;

struct rackhub_client {
  std::unique_ptr<Client> client;
  std::mutex mu;
  // Last failure per calling thread.
  std::unordered_map<std::thread::id, Error> last;  // GUARDED_BY(mu)
};

namespace {

int Record(rackhub_client* c, const Error& e) {
  if (!e.ok()) {
    std::lock_guard lock(c->mu);
    c->last[std::this_thread::get_id()] = e;
  }
  return static_cast<int>(e.code);
}

int Invalid(rackhub_client* c, std::string what) {
  Error e;
  e.code = ErrorCode::kInvalidArgument;
  e.message = std::move(what);
  return Record(c, e);
}

// The OptimizerSpec reduction of a RACKHUB_REDUCTION_* value; null for others.
const char* ReductionOf(int reduction) {
  switch (reduction) {
    case RACKHUB_REDUCTION_MEAN: return "mean";
    case RACKHUB_REDUCTION_SUM: return "sum";
    case RACKHUB_REDUCTION_MIN: return "min";
    case RACKHUB_REDUCTION_MAX: return "max";
    case RACKHUB_REDUCTION_PRODUCT: return "product";
  }
  return nullptr;
}

// The message for an optimizer whose reduction is none of RACKHUB_REDUCTION_*.
std::string BadReduction(const std::string& function, int reduction) {
  return function +
         ": optimizer->reduction must be RACKHUB_REDUCTION_MEAN, _SUM, _MIN, _MAX or _PRODUCT "
         "(0-4), got " +
         std::to_string(reduction);
}

// False when o is null or its reduction is unknown (ReductionOf).
bool ToSpec(const rackhub_optimizer* o, rackhub::client::OptimizerSpec* spec) {
  if (o == nullptr || ReductionOf(o->reduction) == nullptr) return false;
  spec->type = o->type ? o->type : "";
  spec->learning_rate = o->learning_rate;
  spec->momentum = o->momentum;
  spec->weight_decay = o->weight_decay;
  spec->beta1 = o->beta1;
  spec->beta2 = o->beta2;
  spec->epsilon = o->epsilon;
  spec->initial_accumulator = o->initial_accumulator;
  spec->reduction = ReductionOf(o->reduction);
  return true;
}

// The init mode a declare function accepts besides RACKHUB_INIT_ZEROS, and
// its name in the error message.
struct OtherInit {
  int value;
  const char* name;
};

// What rackhub_declare_key and rackhub_declare_table check and do alike:
// `decl` comes with what is their own (elements, or rows, dim and the random
// init's scale and seed); the name, dtype, init and optimizer are checked and
// added here, then the key is declared. `function` names the caller in
// messages.
int Declare(rackhub_client* c, const std::string& function, const char* name, int dtype, int init,
            OtherInit other_init, const rackhub_optimizer* optimizer, rackhub::client::KeyDecl decl,
            uint32_t* key_out) {
  if (!c) return RACKHUB_INVALID_ARGUMENT;
  if (!name) return Invalid(c, function + ": name is NULL");
  if (dtype < RACKHUB_FP32 || dtype > RACKHUB_BF16) {
    return Invalid(c, function + ": dtype must be RACKHUB_FP32, _FP16 or _BF16");
  }
  if (init != RACKHUB_INIT_ZEROS && init != other_init.value) {
    return Invalid(c, function + ": init must be RACKHUB_INIT_ZEROS or " + other_init.name);
  }
  decl.name = name;
  decl.dtype = static_cast<rackhub::client::DType>(dtype);
  decl.init = static_cast<rackhub::client::Init>(init);
  rackhub::client::OptimizerSpec spec;
  if (optimizer && !ToSpec(optimizer, &spec)) {
    return Invalid(c, BadReduction(function, optimizer->reduction));
  }
  if (optimizer) decl.optimizer = spec;
  rackhub::client::KeyId id = 0;
  const int status = Record(c, c->client->DeclareKey(decl, &id));
  if (status == RACKHUB_OK && key_out) *key_out = id;
  return status;
}

}  // namespace

extern "C" {

int rackhub_connect(const rackhub_options* options, rackhub_client** out, char* error_buf,
                    size_t error_len) {
  return rackhub_connect_ex(options, 0, out, error_buf, error_len);
}

int rackhub_connect_ex(const rackhub_options* options, uint32_t flags, rackhub_client** out,
                       char* error_buf, size_t error_len) {
  const auto fail = [&](const Error& e) {
    if (error_buf && error_len > 0) {
      const size_t n = std::min(error_len - 1, e.message.size());
      std::memcpy(error_buf, e.message.data(), n);
      error_buf[n] = '\0';
    }
    return static_cast<int>(e.code);
  };
  if (out) *out = nullptr;
  if (options == nullptr || out == nullptr || options->tenant == nullptr) {
    Error e;
    e.code = ErrorCode::kInvalidArgument;
    e.message = "rackhub_connect: options, options->tenant and out are required";
    return fail(e);
  }
  rackhub::client::Options o;
  if (options->hub) o.hub = options->hub;
  o.tenant = options->tenant;
  if (options->token) o.token = options->token;
  o.rank = options->rank;
  o.rack = options->rack;
  if (options->connect_timeout_ms) o.connect_timeout = std::chrono::milliseconds(options->connect_timeout_ms);
  if (options->op_timeout_ms) o.op_timeout = std::chrono::milliseconds(options->op_timeout_ms);
  o.reconnect = (flags & RACKHUB_CONNECT_NO_RECONNECT) == 0;
  Error e;
  auto client = Client::Connect(o, &e);
  if (!client) return fail(e);
  auto* c = new rackhub_client;  // owned by the caller until rackhub_close
  c->client = std::move(client);
  *out = c;
  return RACKHUB_OK;
}

const char* rackhub_last_error(rackhub_client* client) {
  thread_local std::string message;
  message.clear();
  if (client) {
    std::lock_guard lock(client->mu);
    const auto it = client->last.find(std::this_thread::get_id());
    if (it != client->last.end()) message = it->second.message;
  }
  return message.c_str();
}

uint32_t rackhub_last_wire_error(rackhub_client* client) {
  if (!client) return 0;
  std::lock_guard lock(client->mu);
  const auto it = client->last.find(std::this_thread::get_id());
  return it == client->last.end() ? 0 : static_cast<uint32_t>(it->second.wire);
}

uint64_t rackhub_last_error_iteration(rackhub_client* client) {
  if (!client) return 0;
  std::lock_guard lock(client->mu);
  const auto it = client->last.find(std::this_thread::get_id());
  return it == client->last.end() ? 0 : it->second.iteration;
}

uint64_t rackhub_reconnects(const rackhub_client* c) { return c ? c->client->reconnects() : 0; }

uint32_t rackhub_lanes(const rackhub_client* c) { return c ? c->client->lanes() : 0; }
uint32_t rackhub_workers(const rackhub_client* c) { return c ? c->client->workers() : 0; }
uint32_t rackhub_chunk_elements(const rackhub_client* c) {
  return c ? c->client->chunk_elements() : 0;
}

int rackhub_declare_key(rackhub_client* c, const char* name, uint64_t elements, int dtype,
                        const rackhub_optimizer* optimizer, int init, uint32_t* key_out) {
  rackhub::client::KeyDecl decl;
  decl.elements = elements;
  return Declare(c, "rackhub_declare_key", name, dtype, init,
                 {RACKHUB_INIT_FROM_CLIENT, "_FROM_CLIENT"}, optimizer, std::move(decl), key_out);
}

int rackhub_declare_key_participants(rackhub_client* c, const char* name, uint64_t elements,
                                     int dtype, const rackhub_optimizer* optimizer, int init,
                                     const uint32_t* ranks, size_t n_ranks, uint32_t* key_out) {
  if (!c) return RACKHUB_INVALID_ARGUMENT;
  if (n_ranks > 0 && !ranks) {
    return Invalid(c, "rackhub_declare_key_participants: ranks is NULL with n_ranks " +
                          std::to_string(n_ranks));
  }
  rackhub::client::KeyDecl decl;
  decl.elements = elements;
  if (n_ranks > 0) decl.participants.assign(ranks, ranks + n_ranks);
  return Declare(c, "rackhub_declare_key_participants", name, dtype, init,
                 {RACKHUB_INIT_FROM_CLIENT, "_FROM_CLIENT"}, optimizer, std::move(decl), key_out);
}

int rackhub_declare_table(rackhub_client* c, const char* name, uint64_t rows, uint32_t dim,
                          int dtype, const rackhub_optimizer* optimizer, int init, float init_scale,
                          uint64_t init_seed, uint32_t* key_out) {
  rackhub::client::KeyDecl decl;
  decl.rows = rows;
  decl.dim = dim;
  decl.init_scale = init_scale;
  decl.init_seed = init_seed;
  return Declare(c, "rackhub_declare_table", name, dtype, init, {RACKHUB_INIT_RANDOM, "_RANDOM"},
                 optimizer, std::move(decl), key_out);
}

int rackhub_push_pull_rows(rackhub_client* c, uint32_t key, const uint64_t* ids, uint64_t n_ids,
                           const float* grads, const uint64_t* want, uint64_t n_want,
                           float* out) {
  if (!c) return RACKHUB_INVALID_ARGUMENT;
  if ((n_ids > 0 && (!ids || !grads)) || (n_want > 0 && (!want || !out))) {
    return Invalid(c, "rackhub_push_pull_rows: NULL buffer");
  }
  const auto info = c->client->GetKeyInfo(key);
  const uint64_t dim = info ? info->dim : 0;
  return Record(c, c->client->Wait(c->client->PushPullRows(
                       key, {ids, n_ids}, {grads, n_ids * dim}, {want, n_want},
                       {out, n_want * dim})));
}

int rackhub_pull_rows(rackhub_client* c, uint32_t key, const uint64_t* ids, uint64_t n_ids,
                      float* out) {
  if (!c) return RACKHUB_INVALID_ARGUMENT;
  if (n_ids > 0 && (!ids || !out)) return Invalid(c, "rackhub_pull_rows: NULL buffer");
  const auto info = c->client->GetKeyInfo(key);
  const uint64_t dim = info ? info->dim : 0;
  return Record(c, c->client->Wait(c->client->PullRows(key, {ids, n_ids}, {out, n_ids * dim})));
}

int rackhub_find_key(rackhub_client* c, const char* name, uint32_t* key_out) {
  if (!c) return RACKHUB_INVALID_ARGUMENT;
  if (!name) return Invalid(c, "rackhub_find_key: name is NULL");
  const auto id = c->client->FindKey(name);
  if (!id) return Invalid(c, "rackhub_find_key: unknown key name");
  if (key_out) *key_out = *id;
  return RACKHUB_OK;
}

int rackhub_key_membership(rackhub_client* c, uint32_t key, uint64_t* generation,
                           uint32_t* members, int* mixed) {
  if (!c) return RACKHUB_INVALID_ARGUMENT;
  const auto info = c->client->GetKeyInfo(key);
  if (!info) {
    return Invalid(c, "rackhub_key_membership: unknown key " + std::to_string(key));
  }
  if (generation) *generation = info->membership_generation;
  if (members) *members = info->members;
  if (mixed) *mixed = info->membership_mixed ? 1 : 0;
  return RACKHUB_OK;
}

int rackhub_push_pull_async(rackhub_client* c, uint32_t key, const float* grad, float* out,
                            uint64_t n, uint64_t* ticket) {
  if (!c) return RACKHUB_INVALID_ARGUMENT;
  if (!ticket || (n > 0 && (!grad || !out))) {
    return Invalid(c, "rackhub_push_pull_async: NULL buffer or ticket");
  }
  *ticket = c->client->PushPull(key, {grad, n}, {out, n});
  return RACKHUB_OK;
}

int rackhub_wait(rackhub_client* c, uint64_t ticket) {
  if (!c) return RACKHUB_INVALID_ARGUMENT;
  return Record(c, c->client->Wait(ticket));
}

int rackhub_push_pull(rackhub_client* c, uint32_t key, const float* grad, float* out,
                      uint64_t n) {
  uint64_t ticket = 0;
  const int status = rackhub_push_pull_async(c, key, grad, out, n, &ticket);
  return status != RACKHUB_OK ? status : rackhub_wait(c, ticket);
}

int rackhub_init(rackhub_client* c, uint32_t key, const float* values, uint64_t n) {
  if (!c) return RACKHUB_INVALID_ARGUMENT;
  if (n > 0 && !values) return Invalid(c, "rackhub_init: values is NULL");
  return Record(c, c->client->Wait(c->client->Init(key, {values, n})));
}

int rackhub_pull(rackhub_client* c, uint32_t key, float* out, uint64_t n) {
  if (!c) return RACKHUB_INVALID_ARGUMENT;
  if (n > 0 && !out) return Invalid(c, "rackhub_pull: out is NULL");
  return Record(c, c->client->Wait(c->client->Pull(key, {out, n})));
}

int rackhub_set_optimizer(rackhub_client* c, uint32_t key, const rackhub_optimizer* optimizer,
                          uint64_t from_iteration) {
  if (!c) return RACKHUB_INVALID_ARGUMENT;
  rackhub::client::OptimizerSpec spec;
  if (!optimizer) return Invalid(c, "rackhub_set_optimizer: optimizer is NULL");
  if (!ToSpec(optimizer, &spec)) {
    return Invalid(c, BadReduction("rackhub_set_optimizer", optimizer->reduction));
  }
  return Record(c, c->client->Wait(c->client->SetOptimizer(key, spec, from_iteration)));
}

int rackhub_commit_elastic(rackhub_client* c, uint64_t commit) {
  if (!c) return RACKHUB_INVALID_ARGUMENT;
  return Record(c, c->client->Wait(c->client->CommitElastic(commit)));
}

int rackhub_rollback_elastic(rackhub_client* c, uint64_t commit) {
  if (!c) return RACKHUB_INVALID_ARGUMENT;
  return Record(c, c->client->Wait(c->client->RollbackElastic(commit)));
}

void rackhub_close(rackhub_client* c) {
  if (!c) return;
  c->client->Close();
  delete c;
}

}  // extern "C"
