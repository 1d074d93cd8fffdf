#include "pem_file.h"

#include <fstream>
#include <sstream>

namespace rackhub::server {

Result<std::string> ReadPemFile(const std::string& field, const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return FailedPrecondition(field + ": cannot read '" + path + "'");
  std::stringstream ss;
  ss << f.rdbuf();
  std::string text = ss.str();
  if (text.find("-----BEGIN") == std::string::npos) {
    return FailedPrecondition(field + ": '" + path + "' is not a PEM file");
  }
  return text;
}

Result<std::shared_ptr<const net::tls::TlsContext>> LoadHubTlsContext(const TopologyConfig& topo) {
  net::tls::PemInput cert{"", "topology.tls_cert_file", ""};
  net::tls::PemInput key{"", "topology.tls_key_file", ""};
  net::tls::PemInput ca{"", "topology.tls_ca_file", ""};
  for (auto [in, path] : {std::pair{&cert, &topo.tls_cert_file}, std::pair{&key, &topo.tls_key_file},
                          std::pair{&ca, &topo.tls_ca_file}}) {
    Result<std::string> text = ReadPemFile(in->field, *path);
    if (!text.ok()) return text.status();
    in->pem = *std::move(text);
    in->path = *path;
  }
  Result<std::shared_ptr<const net::tls::TlsContext>> ctx = net::tls::TlsContext::Load(cert, key, ca);
  if (!ctx.ok()) return FailedPrecondition(ctx.status().message());
  return ctx;
}

}  // namespace rackhub::server
