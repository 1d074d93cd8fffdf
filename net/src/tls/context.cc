#include "rackhub/net/tls/context.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <vector>

namespace rackhub::net::tls {

namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using X509Ptr = std::unique_ptr<X509, X509Free>;

std::unique_ptr<BIO, BioFree> MemoryBio(const std::string& text) {
  return std::unique_ptr<BIO, BioFree>(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
}

// Every certificate in `pem`, in order.
std::vector<X509Ptr> Certificates(const std::string& pem) {
  std::vector<X509Ptr> out;
  auto bio = MemoryBio(pem);
  while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) out.emplace_back(x);
  ERR_clear_error();  // the end of the input reads as an error
  return out;
}

Status Bad(const PemInput& in, const std::string& what) {
  const std::string openssl = TakeOpenSslErrors();
  return InvalidArgument(in.field + ": " + (in.path.empty() ? "" : "'" + in.path + "' ") + what +
                         (openssl.empty() ? "" : " (" + openssl + ")"));
}

}  // namespace

std::string TakeOpenSslErrors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out;
}

TlsContext::~TlsContext() { SSL_CTX_free(ctx_); }

Result<std::shared_ptr<const TlsContext>> TlsContext::Load(const PemInput& cert_chain,
                                                           const PemInput& private_key,
                                                           const PemInput& ca) {
  ERR_clear_error();
  SSL_CTX* raw = SSL_CTX_new(TLS_method());
  if (raw == nullptr) return Internal("TLS: cannot create an OpenSSL context: " + TakeOpenSslErrors());
  std::shared_ptr<TlsContext> ctx(new TlsContext(raw));
  SSL_CTX_set_min_proto_version(raw, TLS1_2_VERSION);
  SSL_CTX_set_mode(raw, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  SSL_CTX_set_num_tickets(raw, 0);  // links are long-lived: no session resumption

  std::vector<X509Ptr> chain = Certificates(cert_chain.pem);
  if (chain.empty()) return Bad(cert_chain, "holds no PEM certificate");
  if (SSL_CTX_use_certificate(raw, chain[0].get()) != 1) {
    return Bad(cert_chain, "the certificate cannot be used");
  }
  for (size_t i = 1; i < chain.size(); ++i) {
    if (SSL_CTX_add1_chain_cert(raw, chain[i].get()) != 1) {
      return Bad(cert_chain, "intermediate certificate " + std::to_string(i) + " cannot be used");
    }
  }
  {
    auto bio = MemoryBio(private_key.pem);
    std::unique_ptr<EVP_PKEY, KeyFree> key(
        PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
    if (!key) return Bad(private_key, "holds no unencrypted PEM private key");
    if (SSL_CTX_use_PrivateKey(raw, key.get()) != 1 || SSL_CTX_check_private_key(raw) != 1) {
      return Bad(private_key, "does not match the certificate in " + cert_chain.field);
    }
  }
  std::vector<X509Ptr> roots = Certificates(ca.pem);
  if (roots.empty()) return Bad(ca, "holds no PEM certificate");
  X509_STORE* store = SSL_CTX_get_cert_store(raw);
  for (const X509Ptr& root : roots) {
    if (X509_STORE_add_cert(store, root.get()) != 1) {
      return Bad(ca, "a certificate cannot be added to the trusted ones");
    }
  }
  SSL_CTX_set_verify(raw, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  return std::shared_ptr<const TlsContext>(std::move(ctx));
}

}  // namespace rackhub::net::tls
