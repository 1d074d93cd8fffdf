// rackhub-test-worker / rackhub-test-capi-worker (RACKHUB_WORKER_CAPI): the
// workers of the client suite (tests/integration/client_test.cc) as
// processes. What they do and their options: test_worker.h.
#include <string>
#include <vector>

#include "test_worker.h"

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
#ifdef RACKHUB_WORKER_CAPI
  return rackhub::testing::RunCApiWorker(args);
#else
  return rackhub::testing::RunWorker(args);
#endif
}
