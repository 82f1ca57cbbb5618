// The backend registry (backends/registry.hpp): every entry is what it says.
#include "backends/registry.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "model/error.hpp"

using namespace ced;

namespace {

TEST(BackendRegistry, EveryLabEntryRunsHereWithItsScalarTypeOrSaysWhyNot) {
  const Config c = builtin_config("tiny");
  for (const BackendEntry* be : backend_table_of_family("lab")) {
    const BackendEntry& e = *be;
    SCOPED_TRACE(e.name);
    const std::string why = e.unavailable_reason();
    if (why.empty()) {
      const auto be = make_backend(e.name, c, 1);
      EXPECT_EQ(be->dtype(), e.scalar);
    } else {
      try {
        make_backend(e.name, c, 1);
        ADD_FAILURE() << "make_backend succeeded although the entry says: " << why;
      } catch (const NotSupported& x) {
        EXPECT_NE(std::string(x.what()).find(why), std::string::npos) << x.what();
      }
    }
  }
}

TEST(BackendRegistry, CudaEntriesHaveAFactoryExactlyWhenCudaIsBuilt) {
  for (const char* name : {"cuda", "cuda-bf16"}) {
    const BackendEntry& e = backend_entry(name);
#ifdef CED_TEST_CUDA_BUILT
    EXPECT_TRUE(bool(e.factory)) << name;
#else
    EXPECT_FALSE(bool(e.factory)) << name;
    EXPECT_EQ(e.unavailable_reason().rfind("not built", 0), 0u) << e.unavailable_reason();
#endif
  }
}

TEST(BackendRegistry, EveryLabEntryNamesAGoldenPolicyFileThatExists) {
  for (const BackendEntry* e : backend_table_of_family("lab"))
    EXPECT_TRUE(std::filesystem::is_regular_file(std::filesystem::path(CED_GOLDEN_POLICY_DIR) / e->golden_policy))
        << e->name << ": " << e->golden_policy;
}

TEST(BackendRegistry, TheV41ReferenceIsTheV41FamilysAndRefusesALabConfig) {
  EXPECT_EQ(backend_names_of_family("v41"), std::vector<std::string>{"v41-reference"});
  EXPECT_EQ(backend_entry("v41-reference").unavailable_reason(), "");
  try {
    make_backend("v41-reference", builtin_config("tiny"), 1);
    FAIL() << "no InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("v41 model family"), std::string::npos) << e.what();
  }
  const v41::V41Config c = v41::v41_builtin_config("v41-tiny");
  try {
    make_v41_backend("reference", c, {}, v41::V41Regime::f64);
    FAIL() << "no InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("lab model family"), std::string::npos) << e.what();
  }
}

TEST(BackendRegistry, NamesAreUniqueAndExactlyOneEntryIsJudgedBitwise) {
  std::set<std::string> names;
  int bitwise = 0;
  for (const auto& e : backend_table()) {
    EXPECT_TRUE(names.insert(e.name).second) << "duplicate " << e.name;
    if (e.family != "lab") continue;  // the golden files and their policies are the lab model's
    EXPECT_TRUE(e.scalar == "f32" || e.scalar == "f64" || e.scalar == "bf16") << e.name << ": " << e.scalar;
    EXPECT_FALSE(e.description.empty()) << e.name;
    if (!e.gate_calibrated) {
      ++bitwise;
      // The golden files are f64; only an f64 backend can match them bitwise.
      EXPECT_EQ(e.scalar, "f64") << e.name;
    }
  }
  EXPECT_EQ(bitwise, 1);
}

TEST(BackendRegistry, AnUnknownNameIsAnInputErrorListingEveryBackend) {
  try {
    backend_entry("cpu");
    FAIL() << "no InputError";
  } catch (const InputError& e) {
    for (const auto& n : backend_names()) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << n;
  }
}

TEST(BackendRegistry, HostMemoryCheckRefusesV41FlashOnTheCpuButNotOnADeviceBackend) {
  const Config flash = builtin_config("lab-flash");
  EXPECT_THROW(check_fits_in_memory(flash, 4096, "reference"), InputError);
  EXPECT_THROW(check_fits_in_memory(flash, 4096, "reference-f64"), InputError);
  EXPECT_NO_THROW(check_fits_in_memory(flash, 4096, "cuda"));
  EXPECT_NO_THROW(check_fits_in_memory(builtin_config("tiny"), 64, "reference-f64"));
}

}  // namespace
