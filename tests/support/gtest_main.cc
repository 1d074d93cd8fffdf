// main() of every rackhub GoogleTest binary (rackhub_add_test links it in
// place of GoogleTest's gtest_main), so that a CTest result says what ran:
//  - every skipped test is printed at the end with its reason, one line each:
//      [rackhub-skip] Suite.Name: reason
//    tests/run.sh collects these lines from CTest's log into its summary and,
//    with --full, fails on one that tests/allowed-skips.txt does not list;
//  - exit 77 (CTest SKIP_RETURN_CODE: the entry is reported "Skipped") only
//    when tests ran and every one of them was skipped: the whole binary had
//    nothing to run here (e.g. the RDMA instances without a verbs device);
//  - exit 1 when the filter selected no test at all (a typo in a filter must
//    not pass), or, with RACKHUB_TEST_SKIP_FAILS=1, when any test skipped
//    (tests/rdma/run.sh sets it under RACKHUB_REQUIRE_RDMA=1: in the VM every
//    selected RDMA test must run).
// Otherwise RUN_ALL_TESTS()'s own result (0 or 1).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace {

constexpr int kSkipReturnCode = 77;

std::string OneLine(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s.empty() ? "(no reason given)" : s;
}

// Records every skipped test and the reason GTEST_SKIP() gave.
class SkipRecorder : public ::testing::EmptyTestEventListener {
 public:
  void OnTestEnd(const ::testing::TestInfo& info) override {
    const ::testing::TestResult* r = info.result();
    if (!r->Skipped()) return;
    std::string why;
    for (int i = 0; i < r->total_part_count(); ++i) {
      const ::testing::TestPartResult& part = r->GetTestPartResult(i);
      if (part.skipped()) why = part.message();
    }
    if (why.empty()) why = "skipped in the suite's SetUpTestSuite or an environment";
    skips_.emplace_back(std::string(info.test_suite_name()) + "." + info.name(), OneLine(why));
  }
  const std::vector<std::pair<std::string, std::string>>& skips() const { return skips_; }

 private:
  std::vector<std::pair<std::string, std::string>> skips_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto* recorder = new SkipRecorder;  // owned by the listener list
  ::testing::UnitTest::GetInstance()->listeners().Append(recorder);
  const int result = RUN_ALL_TESTS();
  if (::testing::GTEST_FLAG(list_tests)) return result;

  const ::testing::UnitTest& u = *::testing::UnitTest::GetInstance();
  for (const auto& [name, why] : recorder->skips()) {
    std::printf("[rackhub-skip] %s: %s\n", name.c_str(), why.c_str());
  }
  std::fflush(stdout);
  if (result != 0) return result;
  if (u.test_to_run_count() == 0) {
    std::printf("[rackhub] no test selected (--gtest_filter=%s): nothing ran, which is a failure\n",
                ::testing::GTEST_FLAG(filter).c_str());
    return 1;
  }
  const int skipped = u.skipped_test_count();
  if (skipped > 0) {
    const char* fail = std::getenv("RACKHUB_TEST_SKIP_FAILS");
    if (fail && std::strcmp(fail, "1") == 0) {
      std::printf("[rackhub] RACKHUB_TEST_SKIP_FAILS=1 and %d test(s) skipped: failing\n", skipped);
      return 1;
    }
    if (u.successful_test_count() == 0) {
      std::printf("[rackhub] every test here was skipped: exit %d (CTest: Skipped)\n",
                  kSkipReturnCode);
      return kSkipReturnCode;
    }
  }
  return 0;
}
