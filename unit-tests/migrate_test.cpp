// `ced migrate` (tools/cmd_migrate.cpp): a run file of either family in an earlier version of the one file format
// comes out in the current version with every dataset's values bit for bit and no dataset added or lost; the
// root names the format, version and family; a file that is not the harness's is one line and exit 2.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "io/file_identity.hpp"
#include "unit-tests/run_ced.hpp"

namespace fs = std::filesystem;
using namespace ced;

namespace {

// Every dataset of a file: its values as the bits of native doubles (floats) or int64s (integers), with its shape.
struct Values {
  std::vector<hsize_t> dims;
  H5T_class_t cls = H5T_NO_CLASS;
  std::vector<uint64_t> bits;
};

herr_t visit(hid_t root, const char* name, const H5O_info_t* info, void* data) {
  if (info->type != H5O_TYPE_DATASET) return 0;
  auto& out = *static_cast<std::map<std::string, Values>*>(data);
  const hid_t d = H5Dopen2(root, name, H5P_DEFAULT);
  const hid_t t = H5Dget_type(d), sp = H5Dget_space(d);
  Values v;
  v.cls = H5Tget_class(t);
  v.dims.resize(static_cast<size_t>(H5Sget_simple_extent_ndims(sp)));
  H5Sget_simple_extent_dims(sp, v.dims.data(), nullptr);
  const hssize_t n = H5Sget_simple_extent_npoints(sp);
  v.bits.resize(static_cast<size_t>(n));
  // The official writer stores an all-bf16 tensor as its 16-bit patterns (attribute encoding = "bf16"); the
  // value is the float those bits are the top half of.
  const bool bf16 = H5Aexists(d, "encoding") > 0;
  if (bf16) {
    std::vector<uint16_t> x(static_cast<size_t>(n));
    if (n) H5Dread(d, H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, x.data());
    for (size_t i = 0; i < x.size(); ++i) {
      const uint32_t u = static_cast<uint32_t>(x[i]) << 16;
      float f;
      std::memcpy(&f, &u, sizeof f);
      const double g = f;
      std::memcpy(&v.bits[i], &g, sizeof g);
    }
    v.cls = H5T_FLOAT;
  } else if (v.cls == H5T_FLOAT) {
    std::vector<double> x(static_cast<size_t>(n));
    if (n) H5Dread(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, x.data());
    std::memcpy(v.bits.data(), x.data(), x.size() * sizeof(double));
  } else if (v.cls == H5T_INTEGER) {
    std::vector<int64_t> x(static_cast<size_t>(n));
    if (n) H5Dread(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, x.data());
    std::memcpy(v.bits.data(), x.data(), x.size() * sizeof(int64_t));
  }
  H5Sclose(sp);
  H5Tclose(t);
  H5Dclose(d);
  out[name] = std::move(v);
  return 0;
}

std::map<std::string, Values> datasets(const fs::path& p) {
  std::map<std::string, Values> out;
  const hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  EXPECT_GE(f, 0) << p;
  if (f < 0) return out;
  H5Ovisit2(f, H5_INDEX_NAME, H5_ITER_NATIVE, visit, &out, H5O_INFO_BASIC);
  H5Fclose(f);
  return out;
}

FileIdentity identity(const fs::path& p) {
  const hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  FileIdentity id = read_file_identity(f);
  H5Fclose(f);
  return id;
}

class Migrate : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

TEST_P(Migrate, AnEarlierVersionComesOutCurrentWithEveryDatasetBitForBit) {
  const auto& [file, family] = GetParam();
  const fs::path in = fs::path(CED_SOURCE_DIR) / "golden" / file;
  const fs::path scratch = test::scratch_dir("ced-migrate-test");
  const fs::path out = scratch / "migrated.h5";
  const FileIdentity before = identity(in);
  ASSERT_LT(before.version, kFileFormatVersion) << file << ": the committed golden files are of earlier versions";
  const test::Result r = test::run_ced_in(scratch, "migrate " + in.string() + " " + out.string());
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const FileIdentity after = identity(out);
  EXPECT_EQ(after.format, kFileFormat);
  EXPECT_EQ(after.version, kFileFormatVersion);
  EXPECT_EQ(after.family, family);
  EXPECT_EQ(before.family, family);
  const auto a = datasets(in), b = datasets(out);
  ASSERT_FALSE(a.empty());
  for (const auto& [name, v] : a) {
    const auto it = b.find(name);
    ASSERT_NE(it, b.end()) << name << " lost";
    EXPECT_EQ(it->second.dims, v.dims) << name;
    EXPECT_EQ(it->second.cls, v.cls) << name;  // a bf16-encoded tensor is compared as the floats it holds
    EXPECT_TRUE(it->second.bits == v.bits) << name << ": a value changed";
  }
  for (const auto& [name, v] : b) EXPECT_TRUE(a.count(name)) << name << " added";
  // The migrated file migrates to itself.
  const fs::path again = scratch / "again.h5";
  ASSERT_EQ(test::run_ced_in(scratch, "migrate " + out.string() + " " + again.string()).code, 0);
  for (const auto& [name, v] : datasets(again)) EXPECT_TRUE(b.at(name).bits == v.bits) << name;
}

INSTANTIATE_TEST_SUITE_P(GoldenFiles, Migrate,
                         ::testing::Values(std::pair<std::string, std::string>{"tiny.h5", "lab"},
                                           std::pair<std::string, std::string>{"small.h5", "lab"},
                                           std::pair<std::string, std::string>{"v41/tiny-fp8-n17.h5", "v41"},
                                           std::pair<std::string, std::string>{"v41/tiny-bf16-n13-d8.h5", "v41"}),
                         [](const auto& i) {
                           std::string s = i.param.first;
                           for (char& c : s) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return s;
                         });

TEST(MigrateInput, AFileThatIsNotTheHarnesssIsOneLineAndExit2) {
  const fs::path scratch = test::scratch_dir("ced-migrate-input");
  const fs::path junk = scratch / "junk.h5";
  { std::FILE* f = std::fopen(junk.c_str(), "w"); std::fputs("not hdf5", f); std::fclose(f); }
  const test::Result r = test::run_ced_in(scratch, "migrate " + junk.string() + " " + (scratch / "o.h5").string());
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("not a file of this harness"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(scratch / "o.h5"));
}

}  // namespace
