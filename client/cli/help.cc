#include "help.h"

namespace rackhub::cli {

const char* const kHelpText = R"(rackhubctl: manage a rackhubd parameter server through its admin API.

Usage:
  rackhubctl [global options] <command> [arguments] [options]

Options may be written anywhere on the line: before, between or after the
command words (`rackhubctl --json tenant list` and `rackhubctl tenant list
--json` are the same). `--opt VALUE` and `--opt=VALUE` are both accepted; `--`
ends the options.

Global options:
  --admin HOST:PORT       admin API address (default 127.0.0.1:7701; IPv6 as [ADDR]:PORT)
  --token-file FILE       file holding the admin token (surrounding whitespace is
                          trimmed); sent as `authorization: Bearer <token>`
  --tls-ca FILE           use TLS, trusting this CA certificate (PEM)
  --tls-cert FILE         client certificate (PEM) for TLS; needs --tls-key
  --tls-key FILE          private key (PEM) of the client certificate
  --tls-server-name NAME  name to check in the daemon's certificate instead of HOST
                          (any --tls-* option turns TLS on; without --tls-ca the
                          system's trusted CAs are used)
  --json                  machine-readable output: the response message as one
                          JSON document on stdout (proto field names, all fields)
  --timeout SECONDS       deadline of each call (default 10; decimals allowed)
  -h, --help              show this help and exit
  --version               show the version and exit

Tenant commands:
  tenant create NAME --workers N [--chunk-bytes SIZE] [optimizer options]
                [--max-param-bytes SIZE] [--max-keys N] [--max-workers N]
      Create a tenant with N workers per rack. Prints the tenant and its
      data-plane token; the token is shown only this once.
      --chunk-bytes defaults to 32 KiB (multiple of 64 in [1 KiB, 64 MiB]).
      --tenant-token-file FILE uses the token in FILE (32-128 of A-Z a-z 0-9 _ -)
      instead of minting one: create a tenant spanning racks on every rack's
      hub with the same token.
      Without optimizer options the default optimizer is sgd --lr 0.01.
      Quotas left out (or 0) use the daemon's defaults.
  tenant get NAME         show one tenant
  tenant list             list all tenants
  tenant update-quotas NAME [--max-param-bytes SIZE] [--max-keys N] [--max-workers N]
      Change quotas; the ones not given keep their current value.
  tenant delete NAME      delete a tenant and all its keys

Key commands:
  key create TENANT NAME --elements N [--dtype fp32|fp16|bf16] [--init zeros|client]
             [optimizer options]
      Create a key of N elements. --dtype is the wire type (default fp32).
      --init zeros (default) makes the key ready at once; --init client waits
      for rank 0 to send the initial values. Without optimizer options the
      key uses the tenant's default optimizer.
  key get TENANT NAME     show a key and its chunk layout (chunk index, lane,
                          first element, elements)
  key list TENANT         list the keys of a tenant
  key delete TENANT NAME  delete a key
  key set-optimizer TENANT NAME [optimizer options]
      Change a key's optimizer hyperparameters. Options not given keep their
      current values; the optimizer type cannot change.

Stats:
  stats [TENANT]          daemon counters and per-tenant counters (all tenants,
                          or just TENANT)

Optimizer options:
  --optimizer TYPE        sgd, momentum, nesterov, adam, adamw, adagrad or sum-only
                          (required on create when other optimizer options are given)
  --lr X                  learning rate (> 0; unused by sum-only)
  --momentum X            momentum, nesterov: in (0, 1)
  --weight-decay X        >= 0 (adamw: decoupled)
  --beta1 X               adam, adamw: in [0, 1) (default 0.9)
  --beta2 X               adam, adamw: in [0, 1) (default 0.999)
  --epsilon X             adam, adamw, adagrad (default 1e-8; adagrad 1e-10)
  --initial-accumulator X adagrad: >= 0
  --reduction mean|sum    how the workers' gradients are combined (default mean)
  Hyperparameters a type does not use must be left out (or 0).

Values:
  N      a non-negative integer
  SIZE   bytes: a plain integer, or an integer with K, KiB, M, MiB, G, GiB, T or TiB
         (binary units, case-insensitive), e.g. 32KiB, 64M, 1GiB
  X      a decimal number, e.g. 0.01 or 1e-3

Output:
  Lists are aligned tables, single objects `field: value` blocks; byte counts
  are also shown in binary units, e.g. `33554432 (32 MiB)`.

Exit status:
  0  success
  1  the daemon refused the request (INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS,
     RESOURCE_EXHAUSTED, FAILED_PRECONDITION, ...)
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
  rackhubctl stats --json
)";

}  // namespace rackhub::cli
