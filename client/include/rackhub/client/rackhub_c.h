/* librackhub C ABI (librackhub.so): a thin, stable wrapper over
 * rackhub::client::Client (client.h) for bindings (Python, PyTorch plugin).
 *
 * Conventions:
 *  - Every function returns an int status: one of RACKHUB_* below (the values
 *    of rackhub::client::ErrorCode). RACKHUB_OK is 0.
 *  - On failure, rackhub_last_error(client) gives the message and
 *    rackhub_last_wire_error(client) the hub's error code (0 if none) of the
 *    last failing call made on that client by the calling thread's last look;
 *    the returned string stays valid until the calling thread calls
 *    rackhub_last_error again.
 *  - Threads: one rackhub_client* may be used from several threads at once,
 *    except rackhub_close, which must be the last call.
 *  - Buffers passed to the _async functions must stay alive until
 *    rackhub_wait on the ticket returned.
 *  - Sizes are element counts (floats), not bytes.
 */
#ifndef RACKHUB_CLIENT_RACKHUB_C_H_
#define RACKHUB_CLIENT_RACKHUB_C_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes. */
#define RACKHUB_OK 0
#define RACKHUB_INVALID_ARGUMENT 1
#define RACKHUB_CONNECT_FAILED 2
#define RACKHUB_UNAUTHENTICATED 3
#define RACKHUB_CONNECTION_LOST 4
#define RACKHUB_TIMEOUT 5
#define RACKHUB_SERVER 6 /* see rackhub_last_wire_error */
#define RACKHUB_CLOSED 7
#define RACKHUB_ROLLED_BACK 8 /* Pull the key; see rackhub_last_error_iteration */
#define RACKHUB_RESOURCE 9    /* a local resource (shared memory) could not be made */

/* Key wire dtypes and init modes. */
#define RACKHUB_FP32 1
#define RACKHUB_FP16 2
#define RACKHUB_BF16 3
#define RACKHUB_INIT_ZEROS 1
#define RACKHUB_INIT_FROM_CLIENT 2
#define RACKHUB_INIT_RANDOM 3 /* tables only */

typedef struct rackhub_client rackhub_client; /* opaque */

typedef struct rackhub_options {
  const char* hub;    /* "HOST:PORT"; NULL: "127.0.0.1:7700" */
  const char* tenant; /* required */
  const char* token;  /* the tenant's data-plane token */
  uint32_t rank;
  uint32_t rack;
  uint32_t connect_timeout_ms; /* 0: 10000 */
  uint32_t op_timeout_ms;      /* 0: 120000 */
} rackhub_options;

typedef struct rackhub_optimizer {
  /* "sgd", "momentum", "nesterov", "adam", "adamw", "adagrad", "sum-only";
   * NULL or "": tenant default (declare) / keep the type (set_optimizer). */
  const char* type;
  double learning_rate, momentum, weight_decay, beta1, beta2, epsilon, initial_accumulator;
  /* RACKHUB_REDUCTION_*: 0 mean of the gradients, 1 sum, 2/3/4 element-wise
   * min/max/product (type "sum-only" only). Other values: INVALID_ARGUMENT.
   * (Formerly `sum_reduction`, 0 mean, 1 sum: those values kept their meaning.) */
  int reduction;
} rackhub_optimizer;

#define RACKHUB_REDUCTION_MEAN 0
#define RACKHUB_REDUCTION_SUM 1
#define RACKHUB_REDUCTION_MIN 2
#define RACKHUB_REDUCTION_MAX 3
#define RACKHUB_REDUCTION_PRODUCT 4

/* Connects every lane. On success *out is a new client (free it with
 * rackhub_close). On failure *out is NULL and, if error_buf is not NULL, the
 * message is copied there (NUL-terminated, truncated to error_len). */
int rackhub_connect(const rackhub_options* options, rackhub_client** out, char* error_buf,
                    size_t error_len);

/* Message / hub error code of the calling thread's last failing call on
 * `client` ("" / 0 if none). */
const char* rackhub_last_error(rackhub_client* client);
uint32_t rackhub_last_wire_error(rackhub_client* client);

/* Lanes, workers and elements per chunk the hub announced. */
uint32_t rackhub_lanes(const rackhub_client* client);
uint32_t rackhub_workers(const rackhub_client* client);
uint32_t rackhub_chunk_elements(const rackhub_client* client);

/* Declares (or looks up) a key; `optimizer` may be NULL (tenant default). */
int rackhub_declare_key(rackhub_client* client, const char* name, uint64_t elements, int dtype,
                        const rackhub_optimizer* optimizer, int init, uint32_t* key_out);
/* RACKHUB_INVALID_ARGUMENT if the client does not know the name. */
int rackhub_find_key(rackhub_client* client, const char* name, uint32_t* key_out);

/* Blocking operations. n must equal the key's element count. */
int rackhub_push_pull(rackhub_client* client, uint32_t key, const float* grad, float* out,
                      uint64_t n);
int rackhub_init(rackhub_client* client, uint32_t key, const float* values, uint64_t n);
int rackhub_pull(rackhub_client* client, uint32_t key, float* out, uint64_t n);
int rackhub_set_optimizer(rackhub_client* client, uint32_t key, const rackhub_optimizer* optimizer,
                          uint64_t from_iteration);
/* Elastic tenants with hub optimizers (Client::CommitElastic /
 * RollbackElastic, docs/elastic.md "Hub optimizers"): the members' commit
 * number `commit` (the hub copies every chunk), and every chunk back to that
 * commit. Blocking; RACKHUB_SERVER naming a tenant that is not elastic or a
 * rollback to a commit the hub does not hold. */
int rackhub_commit_elastic(rackhub_client* client, uint64_t commit);
int rackhub_rollback_elastic(rackhub_client* client, uint64_t commit);

/* Asynchronous push_pull: *ticket is completed by rackhub_wait (exactly once).
 * Local errors are also reported through rackhub_wait. */
int rackhub_push_pull_async(rackhub_client* client, uint32_t key, const float* grad, float* out,
                            uint64_t n, uint64_t* ticket);
int rackhub_wait(rackhub_client* client, uint64_t ticket);

/* ---- Added in librackhub 0.2 (reconnect and resynchronization) ----
 *
 * A broken TCP connection (hub restart, reset) is reconnected automatically
 * within op_timeout_ms; pending calls are re-sent. A key whose version on the
 * hub moved meanwhile (a restarted hub reloads its newest checkpoint) is
 * marked "resync needed": push_pull on it returns RACKHUB_ROLLED_BACK until
 * rackhub_pull(). push_pull failing with RACKHUB_SERVER and wire error 9
 * (WORKER_LOST: another rank died) or 6 (BAD_ITERATION) marks the key the
 * same way. Trainer contract: on RACKHUB_ROLLED_BACK or WORKER_LOST, pull
 * the key(s), drop the step and continue with the next batch (WORKER_LOST:
 * back off and retry until the lost rank is back). docs/errors.md. */

/* Flags of rackhub_connect_ex. */
#define RACKHUB_CONNECT_NO_RECONNECT 1u /* a broken connection is RACKHUB_CONNECTION_LOST at once */

/* rackhub_connect with flags (RACKHUB_CONNECT_*); flags 0 = rackhub_connect. */
int rackhub_connect_ex(const rackhub_options* options, uint32_t flags, rackhub_client** out,
                       char* error_buf, size_t error_len);
/* Iteration of the calling thread's last failing call on `client`: for
 * RACKHUB_ROLLED_BACK the hub's version of the key (what a pull returns), for
 * RACKHUB_SERVER / BAD_ITERATION the chunk's version; 0 otherwise. */
uint64_t rackhub_last_error_iteration(rackhub_client* client);
/* Successful reconnects of `client` so far. */
uint64_t rackhub_reconnects(const rackhub_client* client);

/* ---- Row-sparse tables (added after 0.2; docs/architecture.md) ----
 *
 * A table of rows x dim (an embedding table); init RACKHUB_INIT_ZEROS or
 * RACKHUB_INIT_RANDOM (uniform in [-init_scale, init_scale), seeded). */
int rackhub_declare_table(rackhub_client* client, const char* name, uint64_t rows, uint32_t dim,
                          int dtype, const rackhub_optimizer* optimizer, int init,
                          float init_scale, uint64_t init_seed, uint32_t* key_out);
/* Blocking PushPullRows: contributes rows `ids` (n_ids, any order, duplicates
 * summed) with grads (n_ids * dim floats) to the table's next iteration and
 * receives the updated rows `want` (n_want) into out (n_want * dim). */
int rackhub_push_pull_rows(rackhub_client* client, uint32_t key, const uint64_t* ids,
                           uint64_t n_ids, const float* grads, const uint64_t* want,
                           uint64_t n_want, float* out);
/* Blocking PullRows: the current rows `ids` into out (n_ids * dim). */
int rackhub_pull_rows(rackhub_client* client, uint32_t key, const uint64_t* ids, uint64_t n_ids,
                      float* out);

/* ---- Participant sets (added after 0.2; docs/client.md) ----
 *
 * rackhub_declare_key for a key whose updates sum the pushes of `ranks`
 * only (n_ranks of them, strictly ascending, each < rackhub_workers), in
 * rank order (a mean divides by n_ranks); another rank's push fails
 * (RACKHUB_SERVER, wire error INVALID_ARGUMENT). Every rank declaring the
 * key must name the same ranks. n_ranks 0 (ranks may then be NULL) is
 * rackhub_declare_key. Single-rack, sync, non-elastic tenants. */
int rackhub_declare_key_participants(rackhub_client* client, const char* name, uint64_t elements,
                                     int dtype, const rackhub_optimizer* optimizer, int init,
                                     const uint32_t* ranks, size_t n_ranks, uint32_t* key_out);

/* ---- Elastic tenants (added after 0.2; docs/elastic.md) ----
 *
 * The membership of the update that produced key `key`'s values, as the
 * calling client's last successful push_pull/pull of it reported: the
 * membership generation (*generation), its member count (*members: what a
 * mean divided by) and whether the key's chunks named different generations
 * (*mixed, 1/0; the lowest generation is reported; a pull resolves it). All
 * 0 before the key's first update and in tenants that are not elastic. Any
 * output pointer may be NULL. RACKHUB_INVALID_ARGUMENT for an unknown key. */
int rackhub_key_membership(rackhub_client* client, uint32_t key, uint64_t* generation,
                           uint32_t* members, int* mixed);

/* Sends BYE, fails pending operations with RACKHUB_CLOSED and frees the
 * client. NULL is allowed. */
void rackhub_close(rackhub_client* client);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* RACKHUB_CLIENT_RACKHUB_C_H_ */
