/* consumer_c HUB TENANT TOKEN: the C ABI of an installed librackhub
 * (<rackhub/client/rackhub_c.h>), built with `pkg-config --cflags --libs
 * rackhub` and the compiler alone (tests/install/). As rank 0 of a one-worker
 * tenant it declares an sgd key (lr 0.25), pushes one gradient, checks the
 * parameters that come back, then pulls them. Exit 0 on success. */
#include <rackhub/client/rackhub_c.h>

#include <stdio.h>
#include <string.h>

static int fail(rackhub_client* client, const char* what, int status) {
  fprintf(stderr, "consumer_c: %s: status %d: %s (wire %u)\n", what, status,
          rackhub_last_error(client), rackhub_last_wire_error(client));
  rackhub_close(client);
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: consumer_c HUB TENANT TOKEN\n");
    return 2;
  }
  rackhub_options options;
  memset(&options, 0, sizeof options);
  options.hub = argv[1];
  options.tenant = argv[2];
  options.token = argv[3];
  options.op_timeout_ms = 20000;
  rackhub_client* client = NULL;
  char error[512];
  int status = rackhub_connect(&options, &client, error, sizeof error);
  if (status != RACKHUB_OK) {
    fprintf(stderr, "consumer_c: connect: status %d: %s\n", status, error);
    return 1;
  }
  rackhub_optimizer sgd;
  memset(&sgd, 0, sizeof sgd);
  sgd.type = "sgd";
  sgd.learning_rate = 0.25;
  uint32_t key = 0;
  status = rackhub_declare_key(client, "consumer-c", 4, RACKHUB_FP32, &sgd, RACKHUB_INIT_ZEROS,
                               &key);
  if (status != RACKHUB_OK) return fail(client, "declare", status);

  const float grad[4] = {4, 8, -4, 2};
  const float want[4] = {-1, -2, 1, -0.5f}; /* 0 - 0.25 * grad */
  float out[4] = {0};
  status = rackhub_push_pull(client, key, grad, out, 4);
  if (status != RACKHUB_OK) return fail(client, "push_pull", status);
  float pulled[4] = {0};
  status = rackhub_pull(client, key, pulled, 4);
  if (status != RACKHUB_OK) return fail(client, "pull", status);
  for (int i = 0; i < 4; ++i) {
    if (out[i] != want[i] || pulled[i] != want[i]) {
      fprintf(stderr, "consumer_c: element %d: push_pull %g, pull %g, want %g\n", i, out[i],
              pulled[i], want[i]);
      rackhub_close(client);
      return 1;
    }
  }
  printf("consumer_c: ok (%u lanes)\n", rackhub_lanes(client));
  rackhub_close(client);
  return 0;
}
