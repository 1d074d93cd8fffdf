// PEM files the configuration names (TLS certificates, keys and CAs of the
// admin API and of hub links): read once, checked to be PEM, errors naming
// the config field and the file. The one place that reads them.
// Thread-safe (no shared state).
#pragma once

#include <memory>
#include <string>

#include "config.h"
#include "rackhub/common/status.h"
#include "rackhub/net/tls/context.h"

namespace rackhub::server {

// The text of the PEM file at `path`; FAILED_PRECONDITION "<field>: cannot
// read '<path>'" or "<field>: '<path>' is not a PEM file".
Result<std::string> ReadPemFile(const std::string& field, const std::string& path);

// The TLS context of hub links (topology.tls_*): the three files read and
// loaded; an error names the field and what is wrong with its file
// (unreadable, not PEM, no certificate, a key that does not match).
// Only when topology.hub_tls().
Result<std::shared_ptr<const net::tls::TlsContext>> LoadHubTlsContext(const TopologyConfig& topo);

}  // namespace rackhub::server
