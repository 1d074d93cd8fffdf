# Sanitizer and fuzzing builds (docs/testing.md). Included by the root
# CMakeLists.txt before any target, so the flags reach every rackhub target.
#
#   RACKHUB_SANITIZE=address,undefined   ASan + UBSan (tests/run.sh: build-asan)
#   RACKHUB_SANITIZE=thread              TSan (tests/run.sh: build-tsan)
#   RACKHUB_FUZZ=ON                      the libFuzzer targets of fuzz/ (clang
#                                        only; tests/run.sh: build-fuzz)
#
# Every rackhub target is compiled with the sanitizer; the Debian libraries
# (gRPC, protobuf, TBB, spdlog, ...) are not. UBSan findings abort (no
# recovery), so a finding fails the test that hit it. The normal build sets
# neither and is unchanged. GCC or clang for RACKHUB_SANITIZE (tests/run.sh
# uses GCC, the compiler of the normal build); clang for RACKHUB_FUZZ.
set(RACKHUB_SANITIZE "" CACHE STRING
  "Sanitizers for every rackhub target: '' (none), 'address,undefined' or 'thread'")
option(RACKHUB_FUZZ "Build the libFuzzer targets of fuzz/ (clang only)" OFF)

if(RACKHUB_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "RACKHUB_FUZZ=ON needs clang (libFuzzer): configure with "
      "-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ (Debian: clang, libclang-rt-14-dev)")
  endif()
  if(RACKHUB_SANITIZE AND NOT RACKHUB_SANITIZE STREQUAL "address,undefined")
    message(FATAL_ERROR "RACKHUB_FUZZ=ON builds with address,undefined; "
      "RACKHUB_SANITIZE='${RACKHUB_SANITIZE}' cannot be combined with it")
  endif()
  # Coverage feedback for libFuzzer in every library the targets link; the
  # targets themselves link the libFuzzer driver (-fsanitize=fuzzer, fuzz/).
  set(RACKHUB_SANITIZE "address,undefined")
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()

if(RACKHUB_SANITIZE)
  if(RACKHUB_SANITIZE STREQUAL "address,undefined")
    # Every UBSan check, and none recovers (a report aborts the process),
    # but vptr under clang: vptr's check reads the process's memory map to
    # look at an object, and with every descriptor in use (EMFILE, which
    # hostile_clients_test causes on purpose) it cannot and reports any
    # virtual call as "invalid vptr" (seen: boost::system::error_category of
    # Asio's accept error, error_code.hpp:417, "<memory cannot be printed>").
    # UBSan's suppressions apply only to checks that can recover, so vptr
    # recovers, UBSAN_OPTIONS=halt_on_error=1 still aborts on its reports,
    # and tests/sanitizers/ubsan.supp drops that one header's. GCC 12's
    # runtime did not honour the suppression: there vptr stays off.
    if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
      set(_rackhub_san -fsanitize=address,undefined -fno-sanitize-recover=undefined
        -fsanitize-recover=vptr)
    else()
      set(_rackhub_san -fsanitize=address,undefined -fno-sanitize=vptr
        -fno-sanitize-recover=undefined)
    endif()
  elseif(RACKHUB_SANITIZE STREQUAL "thread")
    set(_rackhub_san -fsanitize=thread)
    # Template code both we and Debian's libraries instantiate (std::string,
    # std::map, gRPC's inline helpers) is exported by an executable and then
    # serves the libraries' calls too (ELF interposition): gRPC's own
    # threads ran our instrumented copies, and TSan reported hand-overs it
    # cannot see inside libgrpc (seen: a metadata string of an etcd
    # Authenticate call, a call's status message, copied on gRPC threads).
    # Executables export nothing here, so every library call stays in the
    # library's own uninstrumented code, which called_from_lib covers.
    # GCC only: its TSan runtime is a shared library; clang links the
    # runtime into the executable, whose interceptors must stay exported.
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
      string(APPEND CMAKE_EXE_LINKER_FLAGS
        " -Wl,--version-script=${CMAKE_CURRENT_LIST_DIR}/executable-exports.map")
    endif()
  else()
    message(FATAL_ERROR "RACKHUB_SANITIZE: '${RACKHUB_SANITIZE}' is not one of "
      "'address,undefined', 'thread'")
  endif()
  # -O1: the sanitizers' recommendation (fast to build, fast enough to run;
  # it comes after the build type's -O3 and wins); -g1: file:line in reports.
  add_compile_options(${_rackhub_san} -fno-omit-frame-pointer -O1 -g1)
  add_link_options(${_rackhub_san})
  message(STATUS "rackhub: sanitizers ${RACKHUB_SANITIZE} on every target")
endif()

# The tests each sanitizer build runs (CTest labels `asan` and `tsan`, added
# by rackhub_add_test) and builds (targets `asan_tests` and `tsan_tests`):
# a subset that fits the CI time budget (docs/testing.md says why these).
# ASan+UBSan: every `unit` test, plus:
set(RACKHUB_ASAN_TESTS
  data_plane_protocol_test  # every request and refusal of the lanes (in-process hub and rackhubd)
  lane_fault_test           # transport faults: closes, resets, stalls at exact bytes
  client_test               # librackhub, its C ABI and worker processes against both hubs
  reply_queue_test          # queued replies outliving key/tenant deletion, bounded queues
  hostile_clients_test      # pre-HELLO floods, descriptor exhaustion, foreign ids
  durability_test           # checkpoints written, damaged, skipped, restored; restarts
  metrics_test              # /metrics scrapes, ListStalls across lanes, rackhubctl top/stalls
  admin_api_test            # the admin gRPC API (rackhubd) and its refusals
  table_test                # row-sparse tables: every request, refusal and optimizer
  compression_consistency_test  # sparse pushes (and refusals), bounded/async holds
  cluster_test              # the etcd client, registry watch and membership against a real etcd
  cluster_training_test)    # hub links of a cluster: initial values, cuts, lost leases
# TSan: the tests where lanes, admin calls and transports run concurrently.
set(RACKHUB_TSAN_TESTS
  lane_fault_test           # in-process hub: lane threads, admin gRPC threads, in-memory links
  data_plane_protocol_test  # in-process hub and rackhubd: key/tenant deletion while workers run
  admin_api_test            # admin mutations against rackhubd while its lanes serve
  metrics_test              # scrapes and ListStalls reading the lanes while they train
  cluster_test              # etcd watch, lease and admin threads of hubs sharing a registry
  cluster_training_test     # the same hubs training: lanes, hub links, membership watch
  client_test               # the client library: its lane threads over TCP, shm and memory
  client_reconnect_test)    # the client's reconnects racing its lanes and the caller

# Called by rackhub_add_test: the extra labels of test `name` with `labels`.
function(rackhub_sanitizer_labels name labels out)
  set(extra)
  if("unit" IN_LIST labels OR name IN_LIST RACKHUB_ASAN_TESTS)
    list(APPEND extra asan)
    set_property(GLOBAL APPEND PROPERTY RACKHUB_ASAN_TARGETS ${name})
  endif()
  if(name IN_LIST RACKHUB_TSAN_TESTS)
    list(APPEND extra tsan)
    set_property(GLOBAL APPEND PROPERTY RACKHUB_TSAN_TARGETS ${name})
  endif()
  set(${out} ${extra} PARENT_SCOPE)
endfunction()

# After every test is defined: `asan_tests` and `tsan_tests` build the test
# executables of each subset (and, through their dependencies, rackhubd and
# the worker executables they start).
function(rackhub_add_sanitizer_targets)
  get_property(asan GLOBAL PROPERTY RACKHUB_ASAN_TARGETS)
  get_property(tsan GLOBAL PROPERTY RACKHUB_TSAN_TARGETS)
  add_custom_target(asan_tests DEPENDS ${asan})
  add_custom_target(tsan_tests DEPENDS ${tsan})
endfunction()
