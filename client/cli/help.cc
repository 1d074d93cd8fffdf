#include "help.h"

namespace rackhub::cli {

const char* const kDescription =
    "rackhubctl: manage a rackhubd parameter server through its admin API.";

const char* const kFooter =
    R"(Commands (`rackhubctl help COMMAND...` or `COMMAND... --help` for one):
  tenant create NAME --workers N [--chunk-bytes SIZE] [--tenant-token-file FILE]
                [optimizer options] [--max-param-bytes SIZE] [--max-keys N] [--max-workers N]
  tenant get NAME         show one tenant
  tenant list             list all tenants
  tenant update-quotas NAME [--max-param-bytes SIZE] [--max-keys N] [--max-workers N]
  tenant delete NAME      delete a tenant and all its keys
  key create TENANT NAME --elements N [--dtype fp32|fp16|bf16] [--init zeros|client]
  key create TENANT NAME --rows R --dim D [--init zeros|random --init-scale S --seed N]
             [optimizer options]
  key get TENANT NAME     show a key and its chunk layout
  key list TENANT         list the keys of a tenant
  key delete TENANT NAME  delete a key
  key set-optimizer TENANT NAME [optimizer options]
  checkpoint create TENANT [--timeout-ms N]
                          checkpoint now; prints the file and each key's iteration
  checkpoint list TENANT  the tenant's checkpoints, newest first; damaged files say why
  checkpoint delete TENANT SEQUENCE
  checkpoint restore TENANT [SEQUENCE]
                          put the running tenant back (default: the newest valid one)
  stats [TENANT]          daemon counters and per-tenant counters

Optimizer options: --optimizer sgd|momentum|nesterov|adam|adamw|adagrad|sum-only,
  --lr X, --momentum X, --weight-decay X, --beta1 X, --beta2 X, --epsilon X,
  --initial-accumulator X, --reduction mean|sum|min|max|product (min, max and
  product: element-wise, with --optimizer sum-only only). On create, hyperparameters
  need --optimizer; a type's unused hyperparameters must be left out (or 0).

The global options above may be written anywhere on the line (`rackhubctl --json
tenant list` and `rackhubctl tenant list --json` are the same); a command's own
options come after its command words. `--opt VALUE` and `--opt=VALUE` are both
accepted; `--` ends the options.

Values:
  N      a non-negative integer
  SIZE   bytes: a plain integer, or an integer with B, K, KiB, M, MiB, G, GiB, T or
         TiB (binary units), e.g. 32KiB, 64M, 1GiB
  X      a decimal number, e.g. 0.01 or 1e-3
  SEQUENCE
         a checkpoint's number, 1 or more, as `checkpoint list` shows it

Output:
  Lists are aligned tables, single objects `field: value` blocks; byte counts
  are also shown in binary units, e.g. `33554432 (32 MiB)`.

Exit status:
  0  success
  1  the daemon refused the request (INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS,
     RESOURCE_EXHAUSTED, FAILED_PRECONDITION, ...; also the DEADLINE_EXCEEDED of
     `checkpoint create` when the chunks did not reach one iteration in --timeout-ms)
  2  usage error (unknown command or option, missing or malformed value), or an
     unreadable --token-file / TLS file
  3  the daemon is unreachable or did not answer within --timeout
     (UNAVAILABLE, DEADLINE_EXCEEDED)
  4  authentication or permission failure (UNAUTHENTICATED, PERMISSION_DENIED)
  Errors are printed on stderr; daemon errors as `rackhubctl: CODE: message`.

Examples:
  rackhubctl tenant create vision --workers 8 --optimizer adamw --lr 3e-4 --weight-decay 0.01
  rackhubctl key create vision conv1.weight --elements 1048576 --dtype bf16
  rackhubctl --admin 10.0.0.5:7701 --token-file /etc/rackhub/admin.token key list vision
  rackhubctl checkpoint restore vision 3
  rackhubctl stats --json)";

const char* const kCommandFooter =
    R"(Global options (--admin, --token-file, --tls-*, --json, --timeout) may be given
anywhere on the line: see `rackhubctl --help`, which also lists the exit codes.
SIZE: bytes, e.g. 32768, 32KiB, 64M, 1GiB. N: a non-negative integer. X: a decimal.)";

}  // namespace rackhub::cli
