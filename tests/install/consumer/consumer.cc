// consumer_cxx HUB TENANT TOKEN: the C++ API of an installed librackhub
// (<rackhub/client/client.h>) end to end against a real rackhubd. As rank 0
// of a one-worker tenant it declares an sgd key (lr 0.5), pushes one gradient
// and checks the parameters that come back, then pulls them. Exit 0 on
// success, 1 with a message on stderr otherwise.
#include <rackhub/client/client.h>

#include <array>
#include <cstdio>
#include <memory>
#include <string>

namespace rc = rackhub::client;

namespace {

int Fail(const std::string& what, const rc::Error& e) {
  std::fprintf(stderr, "consumer_cxx: %s: %s (%s, wire %s)\n", what.c_str(), e.message.c_str(),
               rc::ErrorCodeName(e.code), rc::WireErrorName(e.wire));
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: consumer_cxx HUB TENANT TOKEN\n");
    return 2;
  }
  rc::Options options;
  options.hub = argv[1];
  options.tenant = argv[2];
  options.token = argv[3];
  options.op_timeout = std::chrono::milliseconds(20000);
  rc::Error error;
  std::unique_ptr<rc::Client> client = rc::Client::Connect(options, &error);
  if (!client) return Fail("connect", error);

  rc::KeyDecl decl;
  decl.name = "consumer-cxx";
  decl.elements = 4;
  decl.optimizer = rc::OptimizerSpec{.type = "sgd", .learning_rate = 0.5};
  rc::KeyId key = 0;
  error = client->DeclareKey(decl, &key);
  if (!error.ok()) return Fail("declare", error);

  const std::array<float, 4> grad = {1, 2, 3, 4};
  const std::array<float, 4> want = {-0.5f, -1, -1.5f, -2};  // 0 - 0.5 * grad
  std::array<float, 4> out{};
  error = client->Wait(client->PushPull(key, grad, out));
  if (!error.ok()) return Fail("push_pull", error);
  if (out != want) {
    std::fprintf(stderr, "consumer_cxx: push_pull returned %g %g %g %g, want -0.5 -1 -1.5 -2\n",
                 out[0], out[1], out[2], out[3]);
    return 1;
  }
  std::array<float, 4> pulled{};
  error = client->Wait(client->Pull(key, pulled));
  if (!error.ok()) return Fail("pull", error);
  if (pulled != want) {
    std::fprintf(stderr, "consumer_cxx: pull returned %g %g %g %g\n", pulled[0], pulled[1],
                 pulled[2], pulled[3]);
    return 1;
  }
  client->Close();
  std::printf("consumer_cxx: ok (%u lanes)\n", client->lanes());
  return 0;
}
