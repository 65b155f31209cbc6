# WSYNC_SANITIZE: build every wsync target (libraries, tests, tools, libwsync.so) instrumented.
#   ""        (default) no sanitizer.
#   address   AddressSanitizer + LeakSanitizer + UndefinedBehaviorSanitizer (`make test-asan`).
#   thread    ThreadSanitizer (`make test-tsan`).
# Third-party libraries stay Debian's uninstrumented builds. Reports are made fatal at run time
# through ASAN_OPTIONS/UBSAN_OPTIONS/TSAN_OPTIONS (the Makefile sets them), so that a suppression
# file can name third-party code; see tests/sanitizers/.
set(WSYNC_SANITIZE "" CACHE STRING "Instrument the build: empty, address or thread")
# The shared libraries (libwsync.so, libwsync_cuda.so) link with -z defs: every symbol resolves at
# link time. Not in clang's sanitizer builds: clang links the sanitizer runtime into executables
# only, and the library's references to it resolve from the host process when it is loaded.
set(WSYNC_LINK_NO_UNDEFINED "LINKER:-z,defs")
if(WSYNC_SANITIZE AND CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  set(WSYNC_LINK_NO_UNDEFINED "")
endif()
set_property(CACHE WSYNC_SANITIZE PROPERTY STRINGS "" address thread)

if(WSYNC_SANITIZE STREQUAL "")
  return()
elseif(WSYNC_SANITIZE STREQUAL "address")
  set(WSYNC_SANITIZER_FLAGS -fsanitize=address,undefined)
elseif(WSYNC_SANITIZE STREQUAL "thread")
  set(WSYNC_SANITIZER_FLAGS -fsanitize=thread)
else()
  message(FATAL_ERROR "WSYNC_SANITIZE must be empty, address or thread, not '${WSYNC_SANITIZE}'")
endif()
# Optimization and debug level of the instrumented code, placed after the build type's flags so
# that they win. -g1 keeps the line tables that reports are symbolized with, but no variable
# locations: GCC's variable tracking over UBSan's checks made `-O2 -g` compile 5x slower than the
# uninstrumented build (five of the heaviest sources: 193 s of user CPU against 39 s; `-O1 -g1`
# 69 s; `-Og -g1` 43 s). -O1 instead of -Og did not make the slowest instrumented test faster
# (plan_property_test ~300 s either way; it runs a quarter of its seeds in these builds).
set(WSYNC_SANITIZER_OPT_FLAGS -Og -g1 CACHE STRING
    "Optimization and debug flags of sanitizer builds (after CMAKE_<LANG>_FLAGS_<CONFIG>)")
# The test sources compile at WSYNC_TEST_OPT_FLAGS (cmake/WsyncBuildSpeed.cmake), after these.
# C and C++ only: nvcc (the NCCL backend's copy kernels) takes no -fsanitize.
add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${WSYNC_SANITIZER_FLAGS};-fno-omit-frame-pointer>")
add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${WSYNC_SANITIZER_OPT_FLAGS}>")
add_link_options("$<$<LINK_LANGUAGE:C,CXX>:${WSYNC_SANITIZER_FLAGS}>")
# For code that must know it runs instrumented (wider resource and time bounds in tests): clang 14
# defines neither of GCC's __SANITIZE_ADDRESS__ / __SANITIZE_THREAD__ in C.
add_compile_definitions(WSYNC_SANITIZED=1)
if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  # The C hosts of libwsync.so (tests/plugin/*.c) load a C++ library whose UBSan checks (vptr)
  # call into the sanitizer's C++ runtime, which clang links only into C++ programs: link it, and
  # the libstdc++ it needs, into the C programs of these builds too (the plain build keeps them
  # pure C).
  add_link_options("$<$<LINK_LANGUAGE:C>:-fsanitize-link-c++-runtime;-lstdc++>")
endif()

if(WSYNC_SANITIZE STREQUAL "thread")
  # Debian's Abseil is not built with TSan: every call our code makes to these synchronization
  # functions goes through a wrapper that tells TSan what it does (tests/sanitizers/
  # absl_tsan_annotations.cc; the symbols are Abseil 20220623's, inline namespace debian3).
  set(WSYNC_TSAN_WRAPPED_ABSL_SYMBOLS
      _ZN4absl7debian35Mutex4LockEv
      _ZN4absl7debian35Mutex10ReaderLockEv
      _ZN4absl7debian35Mutex6UnlockEv
      _ZN4absl7debian35Mutex12ReaderUnlockEv
      _ZN4absl7debian35Mutex7TryLockEv
      _ZN4absl7debian35Mutex13ReaderTryLockEv
      _ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE
      _ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE
      _ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE
      _ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE
      _ZN4absl7debian35Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE
      _ZN4absl7debian35Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE
      _ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE
      _ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE
      _ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE
      _ZN4absl7debian37CondVar4WaitEPNS0_5MutexE
      _ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE
      _ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE
      _ZN4absl7debian312Notification6NotifyEv
      _ZNK4absl7debian312Notification19WaitForNotificationEv
      _ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE
      _ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE
      _ZN4absl7debian36Status15UnrefNonInlinedEm)
  foreach(symbol ${WSYNC_TSAN_WRAPPED_ABSL_SYMBOLS})
    add_link_options("$<$<LINK_LANGUAGE:C,CXX>:LINKER:--wrap=${symbol}>")
  endforeach()
  # Shared, so that the wrappers resolve wherever the library appears on a link line.
  add_library(wsync_tsan_annotations SHARED
              ${PROJECT_SOURCE_DIR}/tests/sanitizers/absl_tsan_annotations.cc)
  target_include_directories(wsync_tsan_annotations PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_libraries(wsync_tsan_annotations PRIVATE absl::synchronization absl::time
                                                       absl::status)
  link_libraries(wsync_tsan_annotations)
endif()
message(STATUS "wsync: sanitizer build (${WSYNC_SANITIZE}): ${WSYNC_SANITIZER_FLAGS}")
