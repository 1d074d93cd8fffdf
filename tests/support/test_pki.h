// A throwaway PKI for TLS tests (the admin API's, hub links'), made at run
// time with the openssl command-line tool: a CA and leaf certificates it
// signs, ECDSA P-256 (fast to make), valid for two days, each leaf with the
// subject alternative names localhost and 127.0.0.1.
//
// MakeTestPki(dir, {"server", "client"}) writes dir/ca.pem, dir/ca.key and
// dir/server.pem, dir/server.key, dir/client.pem, dir/client.key. Another
// directory gives an unrelated CA (a "wrong CA" for refusal tests).
#pragma once

#include <string>
#include <vector>

namespace rackhub::testing {

// "" on success, else what openssl said.
std::string MakeTestPki(const std::string& dir, const std::vector<std::string>& leaves);

}  // namespace rackhub::testing
