# Precompiled headers: the standard, Abseil, protobuf (and for tests googletest) headers that nearly
# every source includes, parsed once per build tree instead of once per source. Two headers, because
# a precompiled header is used only with the flags it was made with (GCC refuses one made at
# another -O level or with -fPIC against -fPIE): one for the wsync_cc_library sources (position-
# independent, the build type's level), one for the wsync_cc_test sources (executables, at
# WSYNC_TEST_OPT_FLAGS). Where a target's flags differ from its kind's, GCC compiles the headers as
# text (-Winvalid-pch shows it) but clang stops with an error naming the difference (such as
# __OPTIMIZE__): a target that changes its optimization must stay optimized (wsync_quant's -O3).
#
# Measured 2026-12-05 (GCC 12, -O0, a test source of one case including googletest and three
# wsync headers, with the test header against without): 3.1 s of CPU against 8.8 s. With unity
# batches, CI's cold run went from 3030 s to 2165 s (docs/ci.md). The headers are force-included
# (`-include`), so a source that forgets one of them still compiles here; WSYNC_PCH=OFF builds
# without them and finds such a source.
#
# ccache caches sources that use a precompiled header only with sloppiness pch_defines and
# time_macros (its manual, "Precompiled headers"); cmake/WsyncBuildSpeed.cmake sets them in the
# launcher's environment.
set(WSYNC_PCH ON CACHE BOOL "Precompile the common third-party headers of libraries and tests")

set(WSYNC_PCH_COMMON_HEADERS
    <algorithm> <atomic> <cstdint> <cstring> <functional> <map> <memory> <optional> <string>
    <utility> <vector>
    "absl/container/flat_hash_map.h" "absl/status/status.h" "absl/status/statusor.h"
    "absl/strings/str_cat.h" "absl/strings/str_format.h" "absl/strings/string_view.h"
    "absl/synchronization/mutex.h" "absl/time/time.h" "absl/types/span.h"
    <google/protobuf/message.h>)
set(WSYNC_PCH_TEST_HEADERS <random> <thread> "gtest/gtest.h" "gmock/gmock.h")

# wsync_pch_source(out_var name): the empty source of the target that owns a precompiled header
# (the target is compiled with the flags of the targets that reuse its header).
function(wsync_pch_source out_var name)
  set(source ${PROJECT_BINARY_DIR}/pch/${name}.cc)
  file(CONFIGURE OUTPUT ${source} CONTENT "// The owner of ${name}'s precompiled header.\n")
  set(${out_var} ${source} PARENT_SCOPE)
endfunction()

if(WSYNC_PCH)
  foreach(header IN LISTS WSYNC_PCH_COMMON_HEADERS)
    list(APPEND wsync_pch_common "$<$<COMPILE_LANGUAGE:CXX>:${header}>")
  endforeach()
  foreach(header IN LISTS WSYNC_PCH_TEST_HEADERS)
    list(APPEND wsync_pch_test "$<$<COMPILE_LANGUAGE:CXX>:${header}>")
  endforeach()

  # Libraries: a static, position-independent library like every wsync_cc_library.
  wsync_pch_source(library_source wsync_pch_library)
  add_library(wsync_pch_library STATIC ${library_source})
  target_compile_options(wsync_pch_library PRIVATE ${WSYNC_COMMON_COPTS})
  target_include_directories(wsync_pch_library PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
  target_link_libraries(wsync_pch_library PRIVATE absl::status protobuf::libprotobuf)
  set_target_properties(wsync_pch_library PROPERTIES POSITION_INDEPENDENT_CODE ON)
  target_precompile_headers(wsync_pch_library PRIVATE ${wsync_pch_common})

  # Tests: an executable like every wsync_cc_test (its main is googletest's).
  wsync_pch_source(test_source wsync_pch_test)
  add_executable(wsync_pch_test ${test_source})
  target_compile_options(wsync_pch_test PRIVATE ${WSYNC_COMMON_COPTS})
  target_compile_options(wsync_pch_test
                         PRIVATE "$<$<COMPILE_LANGUAGE:C,CXX>:${WSYNC_TEST_OPT_FLAGS}>")
  target_include_directories(wsync_pch_test PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
  target_link_libraries(wsync_pch_test PRIVATE absl::status protobuf::libprotobuf GTest::gtest
                                               GTest::gmock GTest::gtest_main)
  target_precompile_headers(wsync_pch_test PRIVATE ${wsync_pch_common} ${wsync_pch_test})
endif()

# wsync_use_pch(target library|test): compiles target's C++ sources with the precompiled header of
# its kind, when WSYNC_PCH is on.
function(wsync_use_pch target kind)
  if(WSYNC_PCH)
    target_precompile_headers(${target} REUSE_FROM wsync_pch_${kind})
  endif()
endfunction()
