// Unit tests for HOST:PORT endpoint parsing (rackhub_net).

#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "rackhub/net/endpoint.h"

namespace rackhub::net {
namespace {

Endpoint MustParse(const std::string& text) {
  const Result<Endpoint> ep = ParseEndpoint(text);
  EXPECT_TRUE(ep.ok()) << text << ": " << ep.status().message();
  return ep.value_or(Endpoint{});
}

// Returns the error for text that must not parse.
std::string MustFail(const std::string& text) {
  const Result<Endpoint> ep = ParseEndpoint(text);
  EXPECT_FALSE(ep.ok()) << text << " parsed as " << (ep.ok() ? ep->ToString() : "");
  EXPECT_EQ(ep.status().code(), StatusCode::kInvalidArgument) << text;
  EXPECT_FALSE(ep.status().message().empty()) << text;
  return ep.status().message();
}

TEST(ParseEndpointTest, Ipv4) {
  const Endpoint ep = MustParse("10.1.2.3:7700");
  EXPECT_EQ(ep.host, "10.1.2.3");
  EXPECT_EQ(ep.port, 7700);
}

TEST(ParseEndpointTest, BracketedIpv6) {
  Endpoint ep = MustParse("[::1]:80");
  EXPECT_EQ(ep.host, "::1");  // brackets are stripped
  EXPECT_EQ(ep.port, 80);

  ep = MustParse("[fe80::1:2]:65535");
  EXPECT_EQ(ep.host, "fe80::1:2");
  EXPECT_EQ(ep.port, 65535);
}

TEST(ParseEndpointTest, HostName) {
  Endpoint ep = MustParse("hub-01.rack_a.example:9000");
  EXPECT_EQ(ep.host, "hub-01.rack_a.example");
  EXPECT_EQ(ep.port, 9000);

  ep = MustParse("localhost:1");
  EXPECT_EQ(ep.host, "localhost");
  EXPECT_EQ(ep.port, 1);
}

TEST(ParseEndpointTest, PortZeroMeansEphemeral) {
  const Endpoint ep = MustParse("127.0.0.1:0");
  EXPECT_EQ(ep.host, "127.0.0.1");
  EXPECT_EQ(ep.port, 0);
  EXPECT_EQ(MustParse("[::1]:0").port, 0);
}

TEST(ParseEndpointTest, MissingPort) {
  MustFail("127.0.0.1");
  MustFail("localhost");
  MustFail("127.0.0.1:");  // colon but empty port
  MustFail("[::1]");
  MustFail("[::1]:");
  MustFail("");
}

TEST(ParseEndpointTest, MissingHost) {
  MustFail(":80");
  MustFail("[]:80");
}

TEST(ParseEndpointTest, PortOutOfRange) {
  const std::string e = MustFail("127.0.0.1:70000");
  EXPECT_NE(e.find("70000"), std::string::npos) << e;
  MustFail("127.0.0.1:65536");
  MustFail("[::1]:99999999999999999999");
}

TEST(ParseEndpointTest, NonNumericPort) {
  const std::string e = MustFail("localhost:http");
  EXPECT_NE(e.find("http"), std::string::npos) << e;
  MustFail("localhost:80x");
  MustFail("localhost:-1");
  MustFail("localhost:+80");
  MustFail("localhost: 80");
  MustFail("[::1]:8o");
}

TEST(ParseEndpointTest, BareIpv6NeedsBrackets) {
  const std::string e = MustFail("::1:80");
  EXPECT_NE(e.find("brackets"), std::string::npos) << e;
  MustFail("fe80::1:443");
}

TEST(ParseEndpointTest, BracketsMustHoldIpv6) {
  MustFail("[localhost]:80");
  MustFail("[1.2.3.4]:80");
  MustFail("[::1]80");   // no colon after the bracket
  MustFail("[::1:80");   // no closing bracket
}

TEST(ParseEndpointTest, InvalidHostCharacters) {
  for (const char* text : {"ho st:80", "a/b:80", "evil;rm:80", "h\xc3\xa9:80", "a@b:80",
                           "a]b:80"}) {
    const std::string e = MustFail(text);
    EXPECT_NE(e.find("invalid character"), std::string::npos) << text << ": " << e;
  }
}

TEST(EndpointTest, IsLoopback) {
  EXPECT_TRUE((Endpoint{"127.0.0.1", 1}).IsLoopback());
  EXPECT_TRUE((Endpoint{"127.255.3.4", 1}).IsLoopback());
  EXPECT_TRUE((Endpoint{"::1", 1}).IsLoopback());
  EXPECT_TRUE((Endpoint{"localhost", 1}).IsLoopback());

  EXPECT_FALSE((Endpoint{"10.0.0.1", 1}).IsLoopback());
  EXPECT_FALSE((Endpoint{"0.0.0.0", 1}).IsLoopback());
  EXPECT_FALSE((Endpoint{"128.0.0.1", 1}).IsLoopback());
  EXPECT_FALSE((Endpoint{"::", 1}).IsLoopback());
  EXPECT_FALSE((Endpoint{"hub.example", 1}).IsLoopback());
  EXPECT_FALSE((Endpoint{"127.example.com", 1}).IsLoopback());
  EXPECT_FALSE((Endpoint{"", 1}).IsLoopback());
}

TEST(EndpointTest, IsLoopbackAfterParse) {
  EXPECT_TRUE(MustParse("[::1]:7701").IsLoopback());
  EXPECT_TRUE(MustParse("127.0.0.1:7701").IsLoopback());
  EXPECT_FALSE(MustParse("0.0.0.0:7701").IsLoopback());
  EXPECT_FALSE(MustParse("[::]:7701").IsLoopback());
}

TEST(EndpointTest, ToStringFormats) {
  EXPECT_EQ((Endpoint{"10.0.0.1", 7700}).ToString(), "10.0.0.1:7700");
  EXPECT_EQ((Endpoint{"::1", 80}).ToString(), "[::1]:80");
  EXPECT_EQ((Endpoint{"hub", 0}).ToString(), "hub:0");
}

TEST(EndpointTest, ToStringRoundTrip) {
  for (const char* text :
       {"127.0.0.1:7700", "[::1]:80", "[fe80::1]:0", "hub-01.example:65535", "0.0.0.0:1"}) {
    const Endpoint ep = MustParse(text);
    EXPECT_EQ(ep.ToString(), text);
    const Endpoint again = MustParse(ep.ToString());
    EXPECT_EQ(again.host, ep.host);
    EXPECT_EQ(again.port, ep.port);
  }
}

}  // namespace
}  // namespace rackhub::net
