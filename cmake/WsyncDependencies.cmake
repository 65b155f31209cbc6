# Finds every third-party dependency from Debian 12's packages (see the Makefile's deps target).
find_package(absl REQUIRED CONFIG)
find_package(Protobuf REQUIRED)
find_package(GTest REQUIRED CONFIG)
find_package(benchmark REQUIRED CONFIG)
find_package(Threads REQUIRED)
# prometheus-cpp (Debian's prometheus-cpp-dev 1.0.1): core for the registry and the text
# exposition, pull for the HTTP exporter. Only metrics/ links it.
find_package(prometheus-cpp REQUIRED CONFIG)

# SimGrid (Debian's libsimgrid-dev 3.32, S4U API): only integration/simulation/simgrid and
# integration/simulation link it.
find_package(PkgConfig REQUIRED)
pkg_check_modules(SIMGRID REQUIRED IMPORTED_TARGET simgrid)

find_path(XXHASH_INCLUDE_DIR xxhash.h REQUIRED)
find_library(XXHASH_LIBRARY NAMES xxhash REQUIRED)
add_library(wsync_xxhash INTERFACE)
target_include_directories(wsync_xxhash INTERFACE ${XXHASH_INCLUDE_DIR})
target_link_libraries(wsync_xxhash INTERFACE ${XXHASH_LIBRARY})

# CUDA and NCCL: detected only; the NCCL transport target consumes WSYNC_HAVE_NCCL.
set(WSYNC_HAVE_NCCL OFF)
if(NOT WSYNC_WITH_NCCL STREQUAL "OFF")
  find_path(WSYNC_NCCL_INCLUDE_DIR nccl.h HINTS ${WSYNC_CUDA_ROOT}/include NO_DEFAULT_PATH)
  find_library(WSYNC_NCCL_LIBRARY nccl HINTS ${WSYNC_CUDA_ROOT}/lib64 ${WSYNC_CUDA_ROOT}/lib
               NO_DEFAULT_PATH)
  find_library(WSYNC_CUDART_LIBRARY cudart HINTS ${WSYNC_CUDA_ROOT}/lib64 ${WSYNC_CUDA_ROOT}/lib
               NO_DEFAULT_PATH)
  if(WSYNC_NCCL_INCLUDE_DIR AND WSYNC_NCCL_LIBRARY AND WSYNC_CUDART_LIBRARY)
    set(WSYNC_HAVE_NCCL ON)
  elseif(WSYNC_WITH_NCCL STREQUAL "ON")
    message(FATAL_ERROR "WSYNC_WITH_NCCL=ON but CUDA/NCCL were not found under ${WSYNC_CUDA_ROOT}")
  endif()
endif()
message(STATUS "wsync: NCCL backend ${WSYNC_HAVE_NCCL} (WSYNC_WITH_NCCL=${WSYNC_WITH_NCCL})")
