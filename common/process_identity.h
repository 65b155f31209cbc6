#ifndef WSYNC_COMMON_PROCESS_IDENTITY_H_
#define WSYNC_COMMON_PROCESS_IDENTITY_H_

// Which host and pid namespace this process runs in, for telling whether a pid another process
// reports names a process this one can see (the UCX backend's peer-exit check) or this very
// process (the CUDA IPC backend's same-process case). A pid alone is not enough: two containers
// on one host, or two hosts, reuse the same pids.

#include <cstdint>

namespace wsync {

// xxh3 of the host's boot id (/proc/sys/kernel/random/boot_id) and the inode of
// /proc/self/ns/pid (the inode identifies a namespace on one host only: the initial namespace has
// the same number on every host). 0 when either cannot be read: then nothing is known, and callers
// must not treat equal pids as one process. Computed once; thread-safe.
uint64_t OwnPidNamespace();

}  // namespace wsync

#endif  // WSYNC_COMMON_PROCESS_IDENTITY_H_
