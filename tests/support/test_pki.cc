#include "test_pki.h"

#include "process.h"

namespace rackhub::testing {

std::string MakeTestPki(const std::string& dir, const std::vector<std::string>& leaves) {
  const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  std::string script = "set -e; cd '" + dir +
                       "'; openssl req -x509 " + key +
                       " -keyout ca.key -out ca.pem -days 2 -subj /CN=rackhub-test-ca-$$ "
                       "2>/dev/null; printf 'subjectAltName=DNS:localhost,IP:127.0.0.1' > san.ext;";
  for (const std::string& leaf : leaves) {
    script += "openssl req " + key + " -keyout " + leaf + ".key -out " + leaf +
              ".csr -subj /CN=" + leaf + " 2>/dev/null;" + "openssl x509 -req -in " + leaf +
              ".csr -CA ca.pem -CAkey ca.key -CAcreateserial -out " + leaf +
              ".pem -days 2 -extfile san.ext 2>/dev/null;";
  }
  const CommandResult r = RunCommand({"/bin/sh", "-c", script});
  return r.exit_code == 0 ? "" : "openssl failed (exit " + std::to_string(r.exit_code) + "): " + r.err;
}

}  // namespace rackhub::testing
