// TLS for links between hubs (docs/cluster.md, TLS for hub links): the
// OpenSSL context both ends of a link share, built once from PEM text.
//
// Mutual: each side presents its certificate chain and requires the other's,
// verified against the given CA (SSL_VERIFY_PEER | FAIL_IF_NO_PEER_CERT on
// both roles). TLS 1.2 at least; OpenSSL negotiates 1.3 when both ends have
// it. Names in the certificates are not checked: any certificate the CA
// signed is a hub of this cluster (use a CA dedicated to the hubs).
//
// The transport stays ignorant of what it carries: no tenant, no optimizer.
// Thread safety: Load on one thread; afterwards the context is read-only and
// may be shared by every thread (each link makes its own SSL from it).
#pragma once

#include <memory>
#include <string>

#include <openssl/ssl.h>

#include "rackhub/common/status.h"

namespace rackhub::net::tls {

// PEM text of one file, the name an error should give it (a config key) and
// the file's path (for the message).
struct PemInput {
  std::string pem;
  std::string field;
  std::string path;
};

class TlsContext {
 public:
  // INVALID_ARGUMENT naming the field whose PEM is unusable (not a
  // certificate, a key that does not match the certificate, ...).
  static Result<std::shared_ptr<const TlsContext>> Load(const PemInput& cert_chain,
                                                        const PemInput& private_key,
                                                        const PemInput& ca);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  SSL_CTX* native() const { return ctx_; }

 private:
  explicit TlsContext(SSL_CTX* ctx) : ctx_(ctx) {}
  SSL_CTX* ctx_;
};

// The newest OpenSSL errors of this thread as text ("" if none); clears them.
std::string TakeOpenSslErrors();

}  // namespace rackhub::net::tls
