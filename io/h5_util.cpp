// Checked HDF5 helpers; see h5_util.hpp.
#include "io/h5_util.hpp"

#include <fmt/format.h>

#include <fstream>

#include "model/error.hpp"

namespace ced::h5 {
namespace {

[[noreturn]] void fail(const std::string& obj, const std::string& what) {
  throw InputError(fmt::format("{}: {}", obj, what));
}

Handle own(hid_t id, Handle::Closer close, const std::string& obj, const std::string& what) {
  if (id < 0) fail(obj, what);
  return Handle(id, close);
}

void check(herr_t status, const std::string& obj, const std::string& what) {
  if (status < 0) fail(obj, what);
}

std::string attr_name(const std::string& name) { return fmt::format("attribute '{}'", name); }

// The object is held open while its attribute is used: HDF5 1.10 cannot
// write an attribute in dense storage opened by name alone.
struct Attr {
  Handle obj, attr;  // attr is closed first
};

Handle open_object(hid_t file, const std::string& obj) {
  if (!exists(file, obj)) fail(obj, "is missing");
  return own(H5Oopen(file, obj.c_str(), H5P_DEFAULT), H5Oclose, obj, "cannot open it");
}

Attr open_attr(hid_t file, const std::string& obj, const std::string& name) {
  if (!has_attr(file, obj, name)) fail(obj, attr_name(name) + " is missing");
  Attr a{open_object(file, obj), {}};
  a.attr = own(H5Aopen(a.obj.get(), name.c_str(), H5P_DEFAULT), H5Aclose, obj, "cannot open " + attr_name(name));
  return a;
}

// An opened attribute with its type, checked to hold exactly one value.
struct ScalarAttr {
  Attr attr;
  Handle type;
  H5T_class_t cls;
  hid_t id() const { return attr.attr.get(); }
};
ScalarAttr open_scalar_attr(hid_t file, const std::string& obj, const std::string& name) {
  ScalarAttr a{open_attr(file, obj, name), {}, H5T_NO_CLASS};
  a.type = own(H5Aget_type(a.id()), H5Tclose, obj, "cannot read the type of " + attr_name(name));
  Handle space = own(H5Aget_space(a.id()), H5Sclose, obj, "cannot read the shape of " + attr_name(name));
  const hssize_t n = H5Sget_simple_extent_npoints(space.get());
  if (n != 1) fail(obj, fmt::format("{} holds {} values, 1 expected", attr_name(name), n));
  a.cls = H5Tget_class(a.type.get());
  return a;
}

void write_scalar_attr(hid_t file, const std::string& obj, const std::string& name, hid_t file_type,
                       hid_t mem_type, const void* v) {
  Handle o = open_object(file, obj);
  Handle space = own(H5Screate(H5S_SCALAR), H5Sclose, obj, "cannot create a dataspace");
  Handle a = own(H5Acreate2(o.get(), name.c_str(), file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose,
                 obj, "cannot create " + attr_name(name));
  check(H5Awrite(a.get(), mem_type, v), obj, "cannot write " + attr_name(name));
}

// More elements than any harness run stores; keeps a corrupt shape from
// overflowing the element count.
constexpr uint64_t kMaxElements = uint64_t(1) << 40;

template <class T>
Array<T> read_array(hid_t file, const std::string& path, int rank, H5T_class_t cls, hid_t mem_type,
                    const char* kind) {
  if (!exists(file, path)) fail(path, "is missing");
  Handle d = own(H5Dopen2(file, path.c_str(), H5P_DEFAULT), H5Dclose, path, "is not a dataset");
  Handle type = own(H5Dget_type(d.get()), H5Tclose, path, "cannot read its type");
  if (H5Tget_class(type.get()) != cls) fail(path, fmt::format("is not {}", kind));
  Handle space = own(H5Dget_space(d.get()), H5Sclose, path, "cannot read its shape");
  const int got = H5Sget_simple_extent_ndims(space.get());
  if (got < 0) fail(path, "cannot read its shape");
  if (rank >= 0 && got != rank) fail(path, fmt::format("has rank {}, expected {}", got, rank));
  std::vector<hsize_t> dims(static_cast<size_t>(got));
  check(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr), path, "cannot read its shape");
  Array<T> out;
  uint64_t n = 1;
  for (hsize_t v : dims) {
    if (v > 0 && n > kMaxElements / v) fail(path, "has an implausible shape (corrupt file?)");
    n *= v;
    out.dims.push_back(static_cast<int64_t>(v));
  }
  // A corrupt dataspace can claim far more elements than the file stores;
  // check against the bytes actually allocated before allocating ourselves.
  // Contiguous and compact layouts (all this harness writes) store every
  // element; chunked layouts may be compressed, so they get the element cap only.
  Handle plist = own(H5Dget_create_plist(d.get()), H5Pclose, path, "cannot read its layout");
  const H5D_layout_t layout = H5Pget_layout(plist.get());
  const size_t elem = H5Tget_size(type.get());
  const hsize_t stored = H5Dget_storage_size(d.get());
  // The storage size is itself read from the file: a corrupt header can claim more bytes than the file holds.
  Handle owner = own(H5Iget_file_id(d.get()), H5Fclose, path, "cannot find its file");
  hsize_t file_size = 0;
  check(H5Fget_filesize(owner.get(), &file_size), path, "cannot read its file's size");
  if (stored > file_size)
    fail(path, fmt::format("claims to store {} bytes in a file of {} (truncated or corrupt file?)", stored, file_size));
  if (n > 0 && (layout == H5D_CONTIGUOUS || layout == H5D_COMPACT)) {
    if (elem == 0 || stored / elem < n)
      fail(path, fmt::format("claims {} elements but stores {} bytes (truncated or corrupt file?)", n, stored));
  } else if (n > 0) {
    // A chunked dataset may be compressed, but only by the filters the harness's writers and h5py's gzip use
    // (deflate, shuffle, the Fletcher checksum): deflate inflates a byte to at most 1032, so a dataset claiming
    // more than that many times its stored bytes (a chunk never written stores none) is a corrupt file, refused
    // before a fuzzer's 128 GiB allocation. Another filter (scale-offset compresses a constant without bound) is
    // refused too.
    for (int i = 0, nf = H5Pget_nfilters(plist.get()); i < nf; ++i) {
      unsigned flags = 0;
      size_t cd_n = 0;
      char name[64] = {0};
      unsigned config = 0;
      const H5Z_filter_t f = H5Pget_filter2(plist.get(), static_cast<unsigned>(i), &flags, &cd_n, nullptr, sizeof name,
                                            name, &config);
      if (f != H5Z_FILTER_DEFLATE && f != H5Z_FILTER_SHUFFLE && f != H5Z_FILTER_FLETCHER32)
        fail(path, fmt::format("is stored through HDF5 filter {} ('{}'), which no harness file uses", f, name));
    }
    constexpr uint64_t kDeflateMaxRatio = 1032;
    if (elem == 0 || n > stored / elem * kDeflateMaxRatio + kDeflateMaxRatio)
      fail(path, fmt::format("claims {} elements but stores {} bytes, more than deflate can inflate (truncated or "
                             "corrupt file?)", n, stored));
  }
  out.values.resize(static_cast<size_t>(n));
  if (n > 0)
    check(H5Dread(d.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.values.data()), path,
          "cannot read its values (truncated or corrupt file?)");
  return out;
}

}  // namespace

void quiet_errors() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

Handle create_file(const std::filesystem::path& path) {
  return own(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose, "/",
             "cannot create the file");
}

Handle open_file_read(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw InputError("no such file");
  if (std::filesystem::is_directory(path, ec)) throw InputError("is a directory, not a file");
  if (!std::ifstream(path, std::ios::binary)) throw InputError("cannot be opened for reading");
  if (H5Fis_hdf5(path.c_str()) <= 0) throw InputError("not an HDF5 file");
  const hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (id < 0) throw InputError("cannot open it as HDF5 (truncated or corrupt file)");
  return Handle(id, H5Fclose);
}

Handle open_file_write(const std::filesystem::path& path) {
  return own(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose, "/", "cannot open the file for writing");
}

void close_file(Handle& file) {
  check(H5Fflush(file.get(), H5F_SCOPE_GLOBAL), "/", "cannot flush the file (disk full?)");
  check(file.close(), "/", "cannot close the file (disk full?)");
}

bool exists(hid_t file, const std::string& path) {
  // H5Lexists fails when an intermediate link is missing, so walk the path.
  size_t pos = 0;
  while (pos < path.size()) {
    const size_t next = path.find('/', pos + 1);
    const std::string prefix = path.substr(0, next);
    if (prefix != "/" && H5Lexists(file, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
    if (next == std::string::npos) break;
    pos = next;
  }
  return true;
}

void create_group(hid_t file, const std::string& path, bool track_order) {
  Handle gcpl = own(H5Pcreate(H5P_GROUP_CREATE), H5Pclose, path, "cannot create a property list");
  if (track_order)
    check(H5Pset_link_creation_order(gcpl.get(), H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED), path,
          "cannot track creation order");
  // No modification times in the object header: the same contents give the same bytes.
  check(H5Pset_obj_track_times(gcpl.get(), false), path, "cannot turn off its times");
  Handle g = own(H5Gcreate2(file, path.c_str(), H5P_DEFAULT, gcpl.get(), H5P_DEFAULT), H5Gclose, path,
                 "cannot create the group");
}

std::vector<std::string> list(hid_t file, const std::string& group) {
  if (!exists(file, group)) fail(group, "is missing");
  Handle g = own(H5Gopen2(file, group.c_str(), H5P_DEFAULT), H5Gclose, group, "is not a group");
  H5G_info_t info;
  check(H5Gget_info(g.get(), &info), group, "cannot list its members");
  Handle gcpl = own(H5Gget_create_plist(g.get()), H5Pclose, group, "cannot read its properties");
  unsigned order = 0;
  check(H5Pget_link_creation_order(gcpl.get(), &order), group, "cannot read its properties");
  const H5_index_t index = (order & H5P_CRT_ORDER_INDEXED) ? H5_INDEX_CRT_ORDER : H5_INDEX_NAME;
  std::vector<std::string> names;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t len = H5Lget_name_by_idx(g.get(), ".", index, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    if (len < 0) fail(group, "cannot list its members");
    std::string name(static_cast<size_t>(len) + 1, '\0');
    if (H5Lget_name_by_idx(g.get(), ".", index, H5_ITER_INC, i, name.data(), name.size(), H5P_DEFAULT) < 0)
      fail(group, "cannot list its members");
    name.resize(static_cast<size_t>(len));
    names.push_back(std::move(name));
  }
  return names;
}

bool has_attr(hid_t file, const std::string& obj, const std::string& name) {
  if (!exists(file, obj)) fail(obj, "is missing");
  const htri_t r = H5Aexists_by_name(file, obj.c_str(), name.c_str(), H5P_DEFAULT);
  if (r < 0) fail(obj, "cannot read its attributes");
  return r > 0;
}

std::vector<std::string> attr_names(hid_t file, const std::string& obj) {
  Handle o = open_object(file, obj);
  std::vector<std::string> names;
  auto add = [](hid_t, const char* name, const H5A_info_t*, void* out) -> herr_t {
    static_cast<std::vector<std::string>*>(out)->push_back(name);
    return 0;
  };
  hsize_t at = 0;
  check(H5Aiterate2(o.get(), H5_INDEX_NAME, H5_ITER_INC, &at, add, &names), obj, "cannot list its attributes");
  return names;
}

void write_int_attr(hid_t file, const std::string& obj, const std::string& name, int64_t v) {
  write_scalar_attr(file, obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &v);
}

void write_uint_attr(hid_t file, const std::string& obj, const std::string& name, uint64_t v) {
  write_scalar_attr(file, obj, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &v);
}

void write_real_attr(hid_t file, const std::string& obj, const std::string& name, double v) {
  write_scalar_attr(file, obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &v);
}

void write_string_attr(hid_t file, const std::string& obj, const std::string& name, const std::string& v) {
  Handle type = own(H5Tcopy(H5T_C_S1), H5Tclose, obj, "cannot create a string type");
  check(H5Tset_size(type.get(), H5T_VARIABLE), obj, "cannot create a string type");
  check(H5Tset_cset(type.get(), H5T_CSET_UTF8), obj, "cannot create a string type");
  const char* p = v.c_str();
  write_scalar_attr(file, obj, name, type.get(), type.get(), &p);
}

int64_t read_int_attr(hid_t file, const std::string& obj, const std::string& name) {
  ScalarAttr a = open_scalar_attr(file, obj, name);
  if (a.cls != H5T_INTEGER) fail(obj, attr_name(name) + " is not an integer");
  int64_t v = 0;
  check(H5Aread(a.id(), H5T_NATIVE_INT64, &v), obj, "cannot read " + attr_name(name));
  return v;
}

uint64_t read_uint_attr(hid_t file, const std::string& obj, const std::string& name) {
  ScalarAttr a = open_scalar_attr(file, obj, name);
  if (a.cls != H5T_INTEGER) fail(obj, attr_name(name) + " is not an integer");
  uint64_t v = 0;
  const bool is_signed = H5Tget_sign(a.type.get()) != H5T_SGN_NONE;
  // Same width, so reading a signed value as int64 keeps its bits.
  check(H5Aread(a.id(), is_signed ? H5T_NATIVE_INT64 : H5T_NATIVE_UINT64, &v), obj,
        "cannot read " + attr_name(name));
  return v;
}

double read_real_attr(hid_t file, const std::string& obj, const std::string& name) {
  ScalarAttr a = open_scalar_attr(file, obj, name);
  if (a.cls != H5T_FLOAT && a.cls != H5T_INTEGER) fail(obj, attr_name(name) + " is not a number");
  double v = 0;
  check(H5Aread(a.id(), H5T_NATIVE_DOUBLE, &v), obj, "cannot read " + attr_name(name));
  return v;
}

std::string read_string_attr(hid_t file, const std::string& obj, const std::string& name) {
  ScalarAttr a = open_scalar_attr(file, obj, name);
  if (a.cls != H5T_STRING) fail(obj, attr_name(name) + " is not a string");
  const std::string what = "cannot read " + attr_name(name);
  if (H5Tis_variable_str(a.type.get()) > 0) {
    Handle mem = own(H5Tcopy(H5T_C_S1), H5Tclose, obj, what);
    check(H5Tset_size(mem.get(), H5T_VARIABLE), obj, what);
    check(H5Tset_cset(mem.get(), H5Tget_cset(a.type.get())), obj, what);
    char* p = nullptr;
    check(H5Aread(a.id(), mem.get(), &p), obj, what);
    std::string s = p ? p : "";
    H5free_memory(p);
    return s;
  }
  // Fixed length: read the raw bytes, stop at the first NUL, drop space padding.
  const size_t size = H5Tget_size(a.type.get());
  if (size == 0) fail(obj, what);
  std::string s(size, '\0');
  check(H5Aread(a.id(), a.type.get(), s.data()), obj, what);
  s.resize(s.find('\0') == std::string::npos ? s.size() : s.find('\0'));
  if (H5Tget_strpad(a.type.get()) == H5T_STR_SPACEPAD) s.erase(s.find_last_not_of(' ') + 1);
  return s;
}

void write_dataset(hid_t file, const std::string& path, hid_t file_type, hid_t mem_type, const void* data,
                   const std::vector<hsize_t>& dims) {
  Handle space = own(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose, path,
                     "cannot create a dataspace");
  // No modification times in the object header: the same contents give the same bytes.
  Handle dcpl = own(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, path, "cannot create a property list");
  check(H5Pset_obj_track_times(dcpl.get(), false), path, "cannot turn off its times");
  Handle d = own(H5Dcreate2(file, path.c_str(), file_type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
                 H5Dclose, path, "cannot create the dataset");
  hsize_t n = 1;
  for (hsize_t v : dims) n *= v;
  if (n > 0) check(H5Dwrite(d.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), path, "cannot write it");
}

void write_reals(hid_t file, const std::string& path, const double* data, const std::vector<hsize_t>& dims,
                 bool as_float) {
  if (!as_float) return write_dataset(file, path, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, data, dims);
  hsize_t n = 1;
  for (hsize_t v : dims) n *= v;
  const std::vector<float> f(data, data + n);  // rounds each value to nearest
  write_dataset(file, path, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, f.data(), dims);
}

void write_ints(hid_t file, const std::string& path, const int64_t* data, const std::vector<hsize_t>& dims) {
  write_dataset(file, path, H5T_STD_I64LE, H5T_NATIVE_INT64, data, dims);
}

Array<double> read_reals(hid_t file, const std::string& path, int rank) {
  return read_array<double>(file, path, rank, H5T_FLOAT, H5T_NATIVE_DOUBLE, "floating point");
}

Array<int64_t> read_ints(hid_t file, const std::string& path, int rank) {
  return read_array<int64_t>(file, path, rank, H5T_INTEGER, H5T_NATIVE_INT64, "integer");
}

}  // namespace ced::h5
