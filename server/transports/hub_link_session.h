// The accepting side of a hub link before a lane owns it, on the TCP
// acceptor's thread (tcp_acceptor.h): with topology.tls_* set, the TLS
// handshake first (the peer's certificate verified against
// topology.tls_ca_file; a peer that sends plaintext instead gets a fatal
// ERROR saying this hub wants TLS); then, inside it, the hub-link handshake
// (hub_handshake.h): HUB_HELLO checked, HUB_CHALLENGE written, HUB_PROOF
// checked. The whole of it must finish within data.hello_timeout_ms. Then
// the link moves to the lane its HUB_HELLO names, as a net::tcp::TcpConnection
// or a net::tls::TlsConnection, and the lane sends HUB_ACCEPT first
// (Lane::AdoptHubLink). A refusal is a fatal ERROR naming the problem (and a
// rate-limited warning); nothing after the refused frame is read.
//
// Ownership: the session is shared by its pending handlers and counts itself
// in *hooks.waiting while it lives; `hooks` outlives every session.
// Threading: the acceptor's thread; the hand-over runs on the lane's.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "data_plane.h"
#include "rackhub/net/asio.h"
#include "rackhub/net/tls/context.h"

namespace rackhub::server {

struct HubLinkHooks {
  DataPlane* plane = nullptr;
  std::shared_ptr<const net::tls::TlsContext> tls;  // null: plaintext hub links
  size_t* waiting = nullptr;                        // sessions alive (the acceptor's limit)
  std::function<void(const std::string&)> warn;     // rate-limited warning
};

// Runs the session of an accepted socket (TCP_NODELAY set) to its end.
void StartHubLinkSession(const HubLinkHooks* hooks, boost::asio::ip::tcp::socket socket);

// "ip:port" of the remote end of an accepted TCP socket ("?" when it has
// none any more), for logs.
std::string TcpPeerName(const boost::asio::ip::tcp::socket& socket);

}  // namespace rackhub::server
