# How fast the project builds: the compiler launcher, the linker and the debug-information level.
# CI builds the project three times (plain, ASan+UBSan, TSan) on 2 cores within a 40-minute budget
# (docs/ci.md); each setting below is measured there and can be turned off.

# ccache (installed by `make deps`) as the compiler launcher when present and no launcher is set:
# a developer's builds warm the cache that later builds of any checkout on the machine reuse
# (CCACHE_BASEDIR makes paths under the checkout relative; the sloppiness lets it cache sources
# that use a precompiled header, cmake/WsyncPrecompiledHeaders.cmake). CCACHE_DISABLE=1 in the
# environment turns it off for one build; the CI budget holds without it.
set(WSYNC_CCACHE AUTO CACHE STRING "Use ccache as the compiler launcher: AUTO or OFF")
if(WSYNC_CCACHE STREQUAL "AUTO")
  find_program(WSYNC_CCACHE_PROGRAM ccache)
  if(WSYNC_CCACHE_PROGRAM)
    foreach(lang C CXX CUDA)
      if(NOT CMAKE_${lang}_COMPILER_LAUNCHER)
        set(CMAKE_${lang}_COMPILER_LAUNCHER
            ${CMAKE_COMMAND} -E env CCACHE_BASEDIR=${PROJECT_SOURCE_DIR}
            CCACHE_SLOPPINESS=pch_defines,time_macros ${WSYNC_CCACHE_PROGRAM})
      endif()
    endforeach()
  endif()
endif()

# LLVM's lld (Debian's lld-14, installed by `make deps`) links C and C++ targets when the compiler
# accepts it: about half of GNU ld's time for the test binaries and the CLI (plan_property_test
# under ASan: 1.1 s against 2.3 s; the ASan `wsync` CLI: 1.6 s against 4.1 s). nvcc links nothing
# here (the kernels are a static library).
set(WSYNC_LINKER AUTO CACHE STRING "Link with lld when available: AUTO, or OFF for the default")
if(WSYNC_LINKER STREQUAL "AUTO")
  include(CheckLinkerFlag)
  check_linker_flag(CXX -fuse-ld=lld WSYNC_HAVE_LLD)
  if(WSYNC_HAVE_LLD)
    add_link_options("$<$<LINK_LANGUAGE:C,CXX>:-fuse-ld=lld>")
  endif()
endif()

# RelWithDebInfo (the default build type) keeps -O2 but emits line tables only (-g1): backtraces,
# sanitizer reports and profilers still name file and line; gdb shows no local variables (most are
# optimized out at -O2 anyway). Full -g made the plain build ~30% slower to compile (five of the
# heaviest sources: 39 s of user CPU at -O2 -g, 29 s at -O2 -g1). WSYNC_DEBUG_INFO=full keeps -g.
set(WSYNC_DEBUG_INFO lines CACHE STRING "Debug information of RelWithDebInfo: lines or full")
if(WSYNC_DEBUG_INFO STREQUAL "lines")
  add_compile_options("$<$<AND:$<CONFIG:RelWithDebInfo>,$<COMPILE_LANGUAGE:C,CXX>>:-g1>")
endif()

# The test sources' own optimization level (wsync_cc_test targets, after the build type's and the
# sanitizer builds' flags): googletest cases and harness code around the libraries, which keep
# their level. At -O0 GCC compiled three of them (fault_test.cc, plan_property_test.cc,
# session_test.cc) in 26.7 s of CPU against 35.9 s at -O2 (2026-12-02), and clang the instrumented
# ones in under half its -O1 time (docs/ci.md). Empty: the build type's level.
set(WSYNC_TEST_OPT_FLAGS -O0 CACHE STRING "Optimization flags of the test sources (wsync_cc_test)")

# Unity builds of the product targets (wsync_cc_library, wsync_cc_binary): CMake compiles each
# target's sources in batches of WSYNC_UNITY_BATCH_SIZE, one translation unit per batch, so the
# headers they share are parsed and their inline functions compiled once per batch. Measured
# 2026-12-05 in the ASan configuration (planner and executor, from clean, -j2, no ccache): 143 s of
# CPU against 294 s one source at a time. Test targets are one source each and stay as they are.
# Sources of one target must not define the same name at file scope (anonymous namespaces
# included); WSYNC_UNITY=OFF compiles one source at a time, as a check that each source includes
# what it uses.
set(WSYNC_UNITY ON CACHE BOOL "Compile the product targets' sources in unity batches")
set(WSYNC_UNITY_BATCH_SIZE 8 CACHE STRING "Sources per unity translation unit")

# wsync_unity(target): a product target compiled in unity batches when WSYNC_UNITY is on.
function(wsync_unity target)
  if(WSYNC_UNITY)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON
                                               UNITY_BUILD_BATCH_SIZE ${WSYNC_UNITY_BATCH_SIZE})
  endif()
endfunction()
