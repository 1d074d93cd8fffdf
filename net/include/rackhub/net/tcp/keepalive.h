// TCP keepalive on hub links (both ends: the dialer's connectors, TCP and
// TLS, and the hub-link acceptor). A hub link can be idle in one direction
// for long (a home writes nothing but ERRORs on the link its relays come
// on), so a peer host that vanished without FIN/RST (power loss, a
// partition dropping packets) would leave the link open for ever: the probes
// close it within kHubKeepAliveIdleS + kHubKeepAliveProbes x
// kHubKeepAliveIntervalS (8 s) of silence (tcp(7)). A link with unacknowledged
// data in flight is closed by TCP's retransmission timeout instead (minutes).
// Stateless; call on the socket's thread before it is handed over.
#pragma once

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <boost/asio/ip/tcp.hpp>

namespace rackhub::net::tcp {

inline constexpr int kHubKeepAliveIdleS = 5;
inline constexpr int kHubKeepAliveIntervalS = 1;
inline constexpr int kHubKeepAliveProbes = 3;

inline void EnableHubKeepAlive(boost::asio::ip::tcp::socket& socket) {
  boost::system::error_code ignored;
  socket.set_option(boost::asio::socket_base::keep_alive(true), ignored);
  const int fd = socket.native_handle();
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &kHubKeepAliveIdleS, sizeof(int));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &kHubKeepAliveIntervalS, sizeof(int));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &kHubKeepAliveProbes, sizeof(int));
}

}  // namespace rackhub::net::tcp
