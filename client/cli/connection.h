// rackhubctl's link to the daemon's admin API: the channel (plaintext or TLS),
// the admin token and per-call deadlines, and the mapping of gRPC errors to
// messages and exit codes.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>

#include "args.h"

namespace rackhub::cli {

// Exit codes of rackhubctl.
inline constexpr int kExitOk = 0;
inline constexpr int kExitRejected = 1;     // the daemon refused the request
inline constexpr int kExitUsage = 2;        // bad command line or unreadable local file
inline constexpr int kExitUnreachable = 3;  // UNAVAILABLE / DEADLINE_EXCEEDED
inline constexpr int kExitAuth = 4;         // UNAUTHENTICATED / PERMISSION_DENIED

// A local problem that is not a command-line mistake but is the caller's to
// fix (e.g. an unreadable --token-file). Printed as is, exit 2, no --help hint.
class LocalError : public std::runtime_error {
 public:
  explicit LocalError(const std::string& message) : std::runtime_error(message) {}
};

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

// Reads the global options of `cl` (and the files they name). Throws
// UsageError for malformed values and LocalError for unreadable files.
ConnectionOptions ReadConnectionOptions(const CommandLine& cl);

class Connection {
 public:
  explicit Connection(ConnectionOptions options);

  const ConnectionOptions& options() const { return options_; }
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

  // Prepares `context` for one call: deadline and authorization metadata.
  void Prepare(grpc::ClientContext* context) const;

 private:
  ConnectionOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
};

// Thrown by commands when a call fails; main() reports it.
class RpcError : public std::runtime_error {
 public:
  RpcError(grpc::Status status, std::string admin)
      : std::runtime_error(status.error_message()),
        status_(std::move(status)),
        admin_(std::move(admin)) {}
  const grpc::Status& status() const { return status_; }
  const std::string& admin() const { return admin_; }

 private:
  grpc::Status status_;
  std::string admin_;
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
// The stderr line (without trailing newline) for a failed call, e.g.
// "rackhubctl: NOT_FOUND: name: tenant 'x' does not exist".
std::string DescribeRpcError(const RpcError& error, double timeout_seconds);

// Throws RpcError when `status` is not OK.
void Check(const grpc::Status& status, const Connection& connection);

// Reads a file named by --<option>; LocalError (exit 2) if it cannot.
std::string ReadLocalFile(const std::string& option, const std::string& path);
// `text` without surrounding whitespace.
std::string Trim(const std::string& text);

}  // namespace rackhub::cli
