# wsync_cc_library / wsync_cc_test / wsync_cc_binary: one small target per folder, in the spirit of
# absl_cc_library. Sources are listed explicitly; targets get the project-wide warnings and the
# repository root on the include path so headers are included as "planner/geometry.h".

# -Wno-maybe-uninitialized: GCC 12 false positives inside absl::InlinedVector moves (a GCC-only
# option; the sanitizer builds compile with clang). -Wno-array-bounds: GCC 12's -O2 false positives
# inside absl::InlinedVector's destructor (executor/copy.cc, verify.cc); GCC stays silent about them
# while Abseil is parsed as a system header, but not once it comes from the precompiled header
# (cmake/WsyncPrecompiledHeaders.cmake). AddressSanitizer checks every access at run time.
set(WSYNC_COMMON_COPTS -Wall -Wextra -Wno-unused-parameter -Wno-sign-compare)
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  list(APPEND WSYNC_COMMON_COPTS -Wno-maybe-uninitialized -Wno-array-bounds)
endif()

# wsync_cc_library(NAME name SRCS ... HDRS ... DEPS ... [PUBLIC_DEPS ...])
# Creates target wsync_<name> with alias wsync::<name>.
function(wsync_cc_library)
  cmake_parse_arguments(W "" "NAME" "SRCS;HDRS;DEPS" ${ARGN})
  set(target wsync_${W_NAME})
  if(W_SRCS)
    add_library(${target} STATIC ${W_SRCS} ${W_HDRS})
    target_compile_options(${target} PRIVATE ${WSYNC_COMMON_COPTS})
    target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
    target_link_libraries(${target} PUBLIC ${W_DEPS})
    set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON)
    wsync_use_pch(${target} library)
    wsync_unity(${target})
  else()
    add_library(${target} INTERFACE)
    target_include_directories(${target} INTERFACE ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
    target_link_libraries(${target} INTERFACE ${W_DEPS})
  endif()
  add_library(wsync::${W_NAME} ALIAS ${target})
endfunction()

# wsync_cc_test(NAME name SRCS ... DEPS ... LABELS ... [TIMEOUT seconds] [COST seconds]
#               [SANITIZERS ...] [SHARDS n])
# A gtest binary registered with ctest under the given labels (default: unit).
# COST: about how long the test runs in the slowest build that runs it (seconds). `ctest -j` starts
# the costliest tests first when the build tree has no timing history of its own (a fresh tree, as
# in CI); without it a long test that starts last decides the suite's wall time.
# SANITIZERS: the sanitizer builds (WSYNC_SANITIZE values) that build and run the test; default
# `address thread`. A test whose code runs on one thread of one process names only `address`:
# ThreadSanitizer has nothing to find there, and the TSan build neither compiles nor runs it.
# `none`: the plain build only.
# Sanitizer builds also leave out tests labelled gpu or slow, which their suites never run.
# SHARDS: n > 1 registers the binary as n ctest tests, NAME_shard0 ... NAME_shard<n-1>, each
# running every n-th test case (googletest's GTEST_TOTAL_SHARDS / GTEST_SHARD_INDEX) with
# COST / n: `ctest -j` then runs a long binary's cases side by side instead of letting it alone
# decide a suite's wall time. `ctest -R NAME` still selects every shard; set_tests_properties must
# then name each shard (the test NAME itself does not exist).
function(wsync_cc_test)
  cmake_parse_arguments(W "" "NAME;TIMEOUT;COST;SHARDS" "SRCS;DEPS;LABELS;SANITIZERS" ${ARGN})
  if(NOT W_LABELS)
    set(W_LABELS unit)
  endif()
  if(NOT W_SANITIZERS)
    set(W_SANITIZERS address thread)
  endif()
  if(WSYNC_SANITIZE)
    if(NOT WSYNC_SANITIZE IN_LIST W_SANITIZERS OR "gpu" IN_LIST W_LABELS
       OR "slow" IN_LIST W_LABELS)
      return()
    endif()
  endif()
  if(NOT W_TIMEOUT)
    set(W_TIMEOUT 300)
  endif()
  add_executable(${W_NAME} ${W_SRCS})
  target_compile_options(${W_NAME} PRIVATE ${WSYNC_COMMON_COPTS})
  target_compile_options(${W_NAME} PRIVATE "$<$<COMPILE_LANGUAGE:C,CXX>:${WSYNC_TEST_OPT_FLAGS}>")
  target_include_directories(${W_NAME} PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
  target_link_libraries(${W_NAME} PRIVATE ${W_DEPS} GTest::gtest GTest::gmock GTest::gtest_main)
  wsync_use_pch(${W_NAME} test)
  if(NOT W_SHARDS OR W_SHARDS LESS 2)
    add_test(NAME ${W_NAME} COMMAND ${W_NAME})
    set_tests_properties(${W_NAME} PROPERTIES LABELS "${W_LABELS}" TIMEOUT ${W_TIMEOUT})
    if(W_COST)
      set_tests_properties(${W_NAME} PROPERTIES COST ${W_COST})
    endif()
    return()
  endif()
  math(EXPR last "${W_SHARDS} - 1")
  foreach(shard RANGE ${last})
    set(name ${W_NAME}_shard${shard})
    add_test(NAME ${name} COMMAND ${W_NAME})
    set_tests_properties(${name} PROPERTIES LABELS "${W_LABELS}" TIMEOUT ${W_TIMEOUT}
                         ENVIRONMENT "GTEST_TOTAL_SHARDS=${W_SHARDS};GTEST_SHARD_INDEX=${shard}")
    if(W_COST)
      math(EXPR cost "(${W_COST} + ${W_SHARDS} - 1) / ${W_SHARDS}")
      set_tests_properties(${name} PROPERTIES COST ${cost})
    endif()
  endforeach()
endfunction()

# wsync_cc_binary(NAME name SRCS ... DEPS ...)
function(wsync_cc_binary)
  cmake_parse_arguments(W "" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${W_NAME} ${W_SRCS})
  target_compile_options(${W_NAME} PRIVATE ${WSYNC_COMMON_COPTS})
  target_include_directories(${W_NAME} PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
  target_link_libraries(${W_NAME} PRIVATE ${W_DEPS})
  wsync_unity(${W_NAME})
endfunction()
