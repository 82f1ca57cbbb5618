#pragma once
// Thin checked helpers over the HDF5 C API, addressed by absolute object path
// ("/runs/full/logits"). Every failure throws ced::InputError whose message
// names the object ("/runs/full: attribute 'dtype' is missing"); the caller
// prefixes the file. Internal to io/. Not thread-safe (Debian's HDF5 is the
// serial build): call from one thread at a time.
#include <hdf5.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "io/h5_handle.hpp"

namespace ced::h5 {

// Turns off HDF5's printing of its error stack, so a bad file gives only our
// one line. Cheap; every public entry point calls it.
void quiet_errors();

Handle create_file(const std::filesystem::path& path);  // truncates
Handle open_file_read(const std::filesystem::path& path);
Handle open_file_write(const std::filesystem::path& path);  // existing file, read-write
// Flushes and closes; throws if either fails (e.g. the disk is full).
void close_file(Handle& file);

// Whether every link along `path` exists ("/" always does).
bool exists(hid_t file, const std::string& path);
// A group; `track_order` keeps its members in creation order for list().
void create_group(hid_t file, const std::string& path, bool track_order = false);
// Member names: creation order where the group tracks it, else name order.
std::vector<std::string> list(hid_t file, const std::string& group);

bool has_attr(hid_t file, const std::string& obj, const std::string& name);
// Every attribute's name of an object, in name order.
std::vector<std::string> attr_names(hid_t file, const std::string& obj);
void write_int_attr(hid_t file, const std::string& obj, const std::string& name, int64_t v);    // int64
void write_uint_attr(hid_t file, const std::string& obj, const std::string& name, uint64_t v);  // uint64
void write_real_attr(hid_t file, const std::string& obj, const std::string& name, double v);    // double
// Variable-length UTF-8 string.
void write_string_attr(hid_t file, const std::string& obj, const std::string& name, const std::string& v);
// Readers require a single value of the right class (any integer width for
// ints; float or integer for reals; fixed- or variable-length strings).
int64_t read_int_attr(hid_t file, const std::string& obj, const std::string& name);
// A signed attribute is taken bit for bit (seeds written as int64 by others).
uint64_t read_uint_attr(hid_t file, const std::string& obj, const std::string& name);
double read_real_attr(hid_t file, const std::string& obj, const std::string& name);
std::string read_string_attr(hid_t file, const std::string& obj, const std::string& name);

// A contiguous dataset of the given shape (zero-sized dimensions allowed):
// `data` is row-major in `mem_type`, stored as `file_type`.
void write_dataset(hid_t file, const std::string& path, hid_t file_type, hid_t mem_type, const void* data,
                   const std::vector<hsize_t>& dims);

// Doubles stored as float (each value rounded) or as double.
void write_reals(hid_t file, const std::string& path, const double* data, const std::vector<hsize_t>& dims,
                 bool as_float);
void write_ints(hid_t file, const std::string& path, const int64_t* data, const std::vector<hsize_t>& dims);

template <class T>
struct Array {
  std::vector<int64_t> dims;
  std::vector<T> values;  // row-major
};
// Rank-checked reads (rank < 0: any), converted to double / int64
// (class-checked: a float dataset where integers belong is an error, not a
// silent truncation).
Array<double> read_reals(hid_t file, const std::string& path, int rank);
Array<int64_t> read_ints(hid_t file, const std::string& path, int rank);

}  // namespace ced::h5
