# rackhub_add_test(NAME <name> SOURCES <files...> LIBS <targets...> [LABELS <labels...>] [TIMEOUT <s>])
# Builds one GoogleTest executable and registers it with CTest. Tests see the
# build's bin/ directory through RACKHUB_BIN_DIR so integration tests can start
# the real rackhubd and rackhubctl. Tests of the sanitizer subsets also get
# the label `asan` or `tsan` (cmake/RackhubSanitizers.cmake).
# main() is tests/support/gtest_main.cc (target rackhub_gtest_main): it prints
# every GTEST_SKIP with its reason and exits 77 only when every test that ran
# was skipped, which CTest reports as "Skipped" (SKIP_RETURN_CODE 77); any
# other exit code is the test's result.
function(rackhub_add_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest rackhub_gtest_main)
  target_compile_definitions(${T_NAME} PRIVATE
    RACKHUB_BIN_DIR="${CMAKE_RUNTIME_OUTPUT_DIRECTORY}"
    RACKHUB_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  set_target_properties(${T_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  add_test(NAME ${T_NAME} COMMAND ${T_NAME})
  rackhub_sanitizer_labels(${T_NAME} "${T_LABELS}" _san)  # asan / tsan subsets
  set(_labels ${T_LABELS} ${_san})
  set_tests_properties(${T_NAME} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${_labels}"
    SKIP_RETURN_CODE 77)
endfunction()
