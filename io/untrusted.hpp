#pragma once
// Reading a user-supplied HDF5 file without handing its bytes to the HDF5 C
// library in this process.
//
// Debian's HDF5 1.10 crashes, loops or allocates gigabytes inside itself on
// some corrupt files (fuzz/findings/hdf5/, fuzz/corpus/hdf5-crashes/): the
// damage is found only while the library walks the file, so no check of ours
// before the read can rule it out. An untrusted file is therefore read in a
// forked child under a time limit (alarm) and an address-space limit
// (RLIMIT_AS). The child reads and validates it with the ordinary reader
// (read_run_file, read_cache_file, read_v41_run_file) and writes what it read to a private
// temporary file with this harness's own writer; the parent reads only that
// copy. So the parent's HDF5 never sees the untrusted bytes (a file changed
// between a check and a second read, or a library read past a buffer that
// happened not to crash, cannot reach it), and the copy holds exactly the
// validated values (the writer stores every value exactly, hdf5_file.hpp).
// A crash, a timeout or the memory limit in the child becomes an InputError:
//   cannot read 'f.h5': corrupt or unreadable HDF5 file (the reader was killed by SIGSEGV)
// and the reader's own InputError (a well-formed file with bad contents)
// comes back with its message unchanged.
//
// Files the harness itself has just written are read in-process as before
// (read_run_file): they come from the writer, and the copy would double the
// I/O.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>


namespace ced {

struct IsolationLimits {
  double seconds = 0;        // wall time of the child (alarm), then SIGKILL from the parent
  uint64_t extra_bytes = 0;  // address space the child may add to what it inherits
};

// The limits for reading `path`: 20 s plus 1 s per 20 MB (a disk at 20 MB/s
// reads the file in its share), and 1 GiB plus 16 times the file size of
// address space (values stored as float are held as double, and the reader
// and the copy's writer hold a few copies). CED_READ_TIMEOUT_S overrides the
// seconds (tests of the limit).
IsolationLimits isolation_limits(const std::filesystem::path& path);

// The pattern of every reader of a user's file (each family's, models/lab/hdf5_files.hpp and
// models/v41/run_file.hpp): in a forked child under isolation_limits(user), `write_copy(copy)` reads and
// validates the user's file and writes what it read to `copy` (a private temporary file) with the harness's
// writer, returning any text the copy cannot carry; then, in this process, `read_back(copy)` reads the copy
// (its InputError re-thrown naming the user's file). Returns the child's text.
std::string read_through_copy(const std::filesystem::path& user,
                              const std::function<std::string(const std::filesystem::path& copy)>& write_copy,
                              const std::function<void(const std::filesystem::path& copy)>& read_back);

// The mechanism on its own (tested directly): runs `body` in a forked child
// under `limits`. Returns the text the child's body returned. Rethrows the
// body's InputError with its message unchanged, and throws "cannot read '<what>': corrupt or unreadable HDF5 file
// (<why>)" when the child was killed, timed out, ran out of memory or threw
// anything else.
std::string run_isolated(const std::string& what, const IsolationLimits& limits,
                         const std::function<std::string()>& body);

}  // namespace ced
