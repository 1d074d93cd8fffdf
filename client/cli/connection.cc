#include "connection.h"

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>

#include "format.h"
#include "rackhub/net/endpoint.h"

namespace rackhub::cli {

Result<std::string> ReadLocalFile(const std::string& option, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int error = errno;
    std::string message =
        "cannot read --" + option + " file '" + path + "': " + std::strerror(error);
    if (error == ENOENT) return NotFound(std::move(message));
    if (error == EACCES || error == EPERM) return PermissionDenied(std::move(message));
    return FailedPrecondition(std::move(message));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) {
    return FailedPrecondition("cannot read --" + option + " file '" + path + "': read error");
  }
  return ss.str();
}

std::string Trim(const std::string& text) {
  const char* ws = " \t\r\n\v\f";
  const auto first = text.find_first_not_of(ws);
  if (first == std::string::npos) return "";
  const auto last = text.find_last_not_of(ws);
  return text.substr(first, last - first + 1);
}

Result<ConnectionOptions> ReadConnectionOptions(const CommandLine& cl) {
  ConnectionOptions o;
  if (auto admin = cl.Get("admin")) {
    const Result<net::Endpoint> endpoint = net::ParseEndpoint(*admin);
    if (!endpoint.ok()) return InvalidArgument("--admin: " + endpoint.status().message());
    if (endpoint->port == 0) return InvalidArgument("--admin: port 0 is not a daemon's address");
    o.admin = endpoint->ToString();
  }
  if (auto timeout = cl.Get("timeout")) {
    const Result<double> seconds = ParseSeconds("timeout", *timeout);
    if (!seconds.ok()) return seconds.status();
    o.timeout_seconds = *seconds;
  }
  o.json = cl.Has("json");

  // Check the combination of TLS options before touching any file.
  if (cl.Has("tls-cert") != cl.Has("tls-key")) {
    return InvalidArgument("--tls-cert and --tls-key must be given together");
  }
  o.tls = cl.Has("tls-ca") || cl.Has("tls-cert") || cl.Has("tls-server-name");
  if (auto path = cl.Get("token-file")) {
    const Result<std::string> file = ReadLocalFile("token-file", *path);
    if (!file.ok()) return file.status();
    const std::string token = Trim(*file);
    // The file's content, not the command line, is wrong: no --help hint.
    if (token.empty()) return FailedPrecondition("--token-file file '" + *path + "' is empty");
    if (token.find_first_of("\r\n") != std::string::npos) {
      return FailedPrecondition("--token-file file '" + *path + "' holds more than one line");
    }
    o.token = token;
  }
  const std::pair<const char*, std::string*> pem_files[] = {
      {"tls-ca", &o.tls_ca_pem}, {"tls-cert", &o.tls_cert_pem}, {"tls-key", &o.tls_key_pem}};
  for (const auto& [option, pem] : pem_files) {
    const auto path = cl.Get(option);
    if (!path) continue;
    Result<std::string> file = ReadLocalFile(option, *path);
    if (!file.ok()) return file.status();
    *pem = *std::move(file);
  }
  if (auto name = cl.Get("tls-server-name")) {
    if (name->empty()) return InvalidArgument("--tls-server-name: empty name");
    o.tls_server_name = *name;
  }
  return o;
}

Connection::Connection(ConnectionOptions options) : options_(std::move(options)) {
  grpc::ChannelArguments args;
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (options_.tls) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options_.tls_ca_pem;
    ssl.pem_cert_chain = options_.tls_cert_pem;
    ssl.pem_private_key = options_.tls_key_pem;
    credentials = grpc::SslCredentials(ssl);
    if (!options_.tls_server_name.empty()) {
      args.SetSslTargetNameOverride(options_.tls_server_name);
    }
  } else {
    credentials = grpc::InsecureChannelCredentials();
  }
  // A CLI makes a handful of calls: fail fast rather than retry.
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  channel_ = grpc::CreateCustomChannel(options_.admin, credentials, args);
}

void Connection::Prepare(grpc::ClientContext* context) const {
  const auto timeout = std::chrono::duration_cast<std::chrono::system_clock::duration>(
      std::chrono::duration<double>(options_.timeout_seconds));
  context->set_deadline(std::chrono::system_clock::now() + timeout);
  if (options_.token) context->AddMetadata("authorization", "Bearer " + *options_.token);
}

const char* StatusCodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::UNKNOWN: return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED: return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS: return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    default: return "UNKNOWN";
  }
}

int ExitCodeFor(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return kExitOk;
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED: return kExitUnreachable;
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED: return kExitAuth;
    default: return kExitRejected;
  }
}

bool IsDaemonDeadline(const grpc::Status& status) {
  if (status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) return false;
  std::string message = status.error_message();
  for (char& c : message) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return !message.empty() && message.rfind("deadline exceeded", 0) != 0;
}

int ExitCodeFor(const grpc::Status& status) {
  return IsDaemonDeadline(status) ? kExitRejected : ExitCodeFor(status.error_code());
}

std::string DescribeRpcError(const grpc::Status& status, const std::string& admin,
                             double timeout_seconds) {
  const grpc::StatusCode code = status.error_code();
  std::string message = status.error_message();
  // "rackhubd: ...": the daemon answered and something behind it (etcd) is
  // unavailable; anything else: the daemon itself could not be reached.
  if (code == grpc::StatusCode::UNAVAILABLE && message.rfind("rackhubd: ", 0) != 0) {
    message = "cannot reach rackhubd admin API at " + admin +
              (message.empty() ? "" : " (" + message + ")");
  } else if (code == grpc::StatusCode::DEADLINE_EXCEEDED && !IsDaemonDeadline(status)) {
    message = "no answer from rackhubd admin API at " + admin + " within " +
              FormatNumber(timeout_seconds) + " s (--timeout)" +
              (message.empty() ? "" : " (" + message + ")");
  } else if (message.empty()) {
    message = "(no message from the daemon)";
  }
  return std::string("rackhubctl: ") + StatusCodeName(code) + ": " + message;
}

Status Check(const grpc::Status& status, Connection& connection) {
  if (status.ok()) return Status::Ok();
  connection.failed_call_ = status;
  // StatusCode values equal gRPC's (status.h), also the ones it does not name.
  return Status(static_cast<StatusCode>(status.error_code()), status.error_message());
}

}  // namespace rackhub::cli
