// main() of the GPU test binaries: GoogleTest's, except that a run in which every test skipped
// (no GPU) and none failed exits with 77, which ctest reports as Skipped (SKIP_RETURN_CODE in
// tests/CMakeLists.txt) rather than Passed.

#include <gtest/gtest.h>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  int rc = RUN_ALL_TESTS();
  const ::testing::UnitTest& u = *::testing::UnitTest::GetInstance();
  if (rc == 0 && u.successful_test_count() == 0 && u.skipped_test_count() > 0) return 77;
  return rc;
}
