// rackhubctl's link to the daemon's admin API: the channel (plaintext or TLS),
// the admin token and per-call deadlines, and the mapping of gRPC errors to
// messages and exit codes.
//
// Failures: every function of rackhubctl that can fail returns a Status (or
// Result<T>); nothing below main() throws except CLI11 during parse().
// main() prints the one failure and picks the exit code:
//  - a failed call (Check below; the Connection remembers it, failed_call()):
//    DescribeRpcError's line, exit code ExitCodeFor;
//  - INVALID_ARGUMENT: a command-line mistake, printed with a hint to use
//    --help, exit 2;
//  - INTERNAL: a bug of rackhubctl ("internal error: ..."), exit 1;
//  - any other code: a local problem that is the caller's to fix (e.g. an
//    unreadable --token-file), printed as is, exit 2.
// Messages name the problem without the "rackhubctl: " prefix.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>

#include "args.h"
#include "rackhub/common/status.h"

namespace rackhub::cli {

// Exit codes of rackhubctl.
inline constexpr int kExitOk = 0;
inline constexpr int kExitRejected = 1;     // the daemon refused the request
inline constexpr int kExitUsage = 2;        // bad command line or unreadable local file
inline constexpr int kExitUnreachable = 3;  // UNAVAILABLE / DEADLINE_EXCEEDED
inline constexpr int kExitAuth = 4;         // UNAUTHENTICATED / PERMISSION_DENIED

// Settings from the global options.
struct ConnectionOptions {
  std::string admin = "127.0.0.1:7701";  // normalized HOST:PORT
  std::optional<std::string> token;      // from --token-file, trimmed
  bool tls = false;
  std::string tls_ca_pem;    // empty: the system's default roots
  std::string tls_cert_pem;  // client certificate chain (with tls_key_pem)
  std::string tls_key_pem;
  std::string tls_server_name;  // empty: the host of `admin`
  double timeout_seconds = 10;
  bool json = false;
};

// Reads the global options of `cl` (and the files they name):
// INVALID_ARGUMENT for malformed values, ReadLocalFile's errors and
// FAILED_PRECONDITION for a --token-file that does not hold one token.
Result<ConnectionOptions> ReadConnectionOptions(const CommandLine& cl);

class Connection {
 public:
  explicit Connection(ConnectionOptions options);

  const ConnectionOptions& options() const { return options_; }
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

  // Prepares `context` for one call: deadline and authorization metadata.
  void Prepare(grpc::ClientContext* context) const;

  // The call that failed (Check), so main() reports it as the daemon's
  // answer rather than as a local problem: a daemon's INVALID_ARGUMENT is a
  // refusal (exit 1), not a command-line mistake (exit 2).
  const std::optional<grpc::Status>& failed_call() const { return failed_call_; }

 private:
  friend Status Check(const grpc::Status& status, Connection& connection);

  ConnectionOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::optional<grpc::Status> failed_call_;
};

// "NOT_FOUND" etc.
const char* StatusCodeName(grpc::StatusCode code);
// The exit code for a failed call.
int ExitCodeFor(grpc::StatusCode code);
// The same, but a DEADLINE_EXCEEDED the daemon answered itself (a wait it
// gave up on, e.g. CreateCheckpoint's) is a refusal (1), not unreachability.
int ExitCodeFor(const grpc::Status& status);
// Whether `status` is a DEADLINE_EXCEEDED carrying the daemon's own message
// rather than gRPC's "Deadline Exceeded" for the call's --timeout.
bool IsDaemonDeadline(const grpc::Status& status);
// The stderr line (without trailing newline) for a call to `admin` that
// failed with `status`, e.g.
// "rackhubctl: NOT_FOUND: name: tenant 'x' does not exist".
std::string DescribeRpcError(const grpc::Status& status, const std::string& admin,
                             double timeout_seconds);

// OK when `status` is; else the same code and message as a Status, and
// `connection` remembers the call as failed (failed_call()).
Status Check(const grpc::Status& status, Connection& connection);

// Reads a file named by --<option>: NOT_FOUND, PERMISSION_DENIED or
// FAILED_PRECONDITION "cannot read --<option> file '<path>': ..." if it cannot.
Result<std::string> ReadLocalFile(const std::string& option, const std::string& path);
// `text` without surrounding whitespace.
std::string Trim(const std::string& text);

}  // namespace rackhub::cli
