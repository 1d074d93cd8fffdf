// Test support: the training worker of the client suite
// (tests/integration/client_test.cc), as functions, so that the same worker
// runs as a process (rackhub-test-worker, rackhub-test-capi-worker:
// worker_main.cc) against a real rackhubd over TCP or RDMA, and as a thread
// of the test process against an in-process hub (in-memory transport).
//
// RunWorker: connects with librackhub's C++ API, declares keys, optionally
// initializes / pulls them, runs iterations of PushPull with deterministic
// gradients and writes what it saw to --out, one line per event, flushed at
// once:
//   key NAME ID
//   init NAME HEX...            parameters after Init (rank 0) or Pull (others)
//   set_optimizer NAME          (rank 0) SetOptimizer done
//   iter K NAME HEX...          parameters after iteration K (--dump-all: every K)
//   hanging K                   (--hang-at K) the worker stops before pushing K
//   error K CODE WIRE MS MSG    iteration K failed after MS milliseconds
//   done
// HEX is the fp32 bit pattern of each element (8 hex digits).
// Arguments: --hub H --tenant T --token X --rank R [--rack K] --out FILE
//   --key NAME,ELEMENTS,DTYPE,INIT,OPT... [--key ...] --iterations N
//   [--set-optimizer NAME,FROM,OPT...] [--sleep-max-ms M] [--hang-at K]
//   [--dump-all] [--transport tcp|rdma|auto] [--rdma-hub HOST:PORT]
//   [--rdma-ring-bytes N] [--connect-timeout-ms MS] [--op-timeout-ms MS]
// OPT... = TYPE,LR,MOMENTUM,WD,BETA1,BETA2,EPS,ACC,mean|sum
// Exit codes: 0 done, 2 connect failed, 3 declare/init/set-optimizer failed,
// 4 an iteration failed, 64 usage, kKilledExitCode (hook only) "killed".
//
// RunCApiWorker: the same kind of checks through the C ABI (rackhub_c.h)
// only; needs a tenant with 1 worker. Writes `name status [detail]` lines and
// `params NAME HEX...` lines, then `done`. Arguments: --hub H --tenant T
// --token X --out FILE.
//
// Threading: each call is one worker; calls on several threads at once are
// fine (nothing global but the hooks' own state).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace rackhub::client {
class Client;
struct Options;
struct Error;
}  // namespace rackhub::client

namespace rackhub::testing {

// 128 + SIGKILL, as a killed process reports.
inline constexpr int kKilledExitCode = 137;

struct WorkerHooks {
  // Makes the client; default client::Client::Connect.
  std::function<std::unique_ptr<client::Client>(const client::Options&, client::Error*)> connect;
  // --hang-at: called after "hanging K" is written; when it returns the
  // worker is dead: it returns kKilledExitCode at once. Default: pause()
  // forever (a process is killed by a signal).
  std::function<void()> hang;
};

// `args` without the program name.
int RunWorker(const std::vector<std::string>& args, const WorkerHooks& hooks = {});
int RunCApiWorker(const std::vector<std::string>& args);

}  // namespace rackhub::testing
