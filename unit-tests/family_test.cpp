// The model families (models/family.hpp): every built-in name belongs to exactly one family and is made by
// that family's table; a file or folder goes to the family its form names; every backend of the registry
// computes a known family.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "backends/registry.hpp"
#include "models/lab/config.hpp"
#include "model/error.hpp"
#include "models/family.hpp"
#include "models/v41/config.hpp"

using namespace ced;

TEST(ModelFamilies, BuiltinNamesAreUniqueAcrossFamilies) {
  std::map<std::string, std::string> owner;
  for (const auto& f : model_families())
    for (const auto& b : f.builtins) {
      const auto [it, fresh] = owner.emplace(b, f.name);
      EXPECT_TRUE(fresh) << "'" << b << "' is a built-in of both " << it->second << " and " << f.name;
    }
  EXPECT_GE(owner.size(), 9u);  // five lab built-ins, four v41 ones
}

TEST(ModelFamilies, EveryBuiltinIsNamedToTheFamilyWhoseTableMakesIt) {
  for (const auto& b : model_family("lab").builtins) {
    EXPECT_EQ(family_of_config(b).name, "lab") << b;
    EXPECT_EQ(builtin_config(b).name, b);
    EXPECT_FALSE(v41::is_v41_builtin(b)) << b;
  }
  for (const auto& b : model_family("v41").builtins) {
    EXPECT_EQ(family_of_config(b).name, "v41") << b;
    EXPECT_EQ(v41::v41_builtin_config(b).name, b);
    EXPECT_FALSE(is_builtin(b)) << b;
  }
  EXPECT_EQ(family_of_config("v41-flash").name, "v41");  // the released sizes; the lab's own is lab-flash
  EXPECT_EQ(family_of_config("lab-flash").name, "lab");
}

TEST(ModelFamilies, AFolderOrAJsonFileIsV41AndAnythingElseLab) {
  const auto dir = std::filesystem::temp_directory_path();
  EXPECT_EQ(family_of_config(dir.string()).name, "v41");
  EXPECT_EQ(family_of_config("some/where/config.json").name, "v41");
  EXPECT_EQ(family_of_config("some/where/model.toml").name, "lab");
  EXPECT_EQ(family_of_config("no-such-name").name, "lab");  // the TOML reader then names the missing file
}

TEST(ModelFamilies, UnknownFamilyIsAnInputErrorNamingTheFamilies) {
  try {
    model_family("v3");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "model family: unknown 'v3' (families: lab, v41)");
  }
}

TEST(ModelFamilies, EveryBackendComputesAKnownFamilyAndTheListsPartitionTheRegistry) {
  size_t listed = 0;
  for (const auto& f : model_families()) listed += backend_names_of_family(f.name).size();
  EXPECT_EQ(listed, backend_names().size());
  for (const auto& e : backend_table()) EXPECT_NO_THROW(model_family(e.family)) << e.name;
  EXPECT_EQ(backend_names_of_family("lab"), (std::vector<std::string>{"reference", "reference-f64", "cuda", "cuda-bf16"}));
  EXPECT_EQ(backend_names_of_family("v41"), std::vector<std::string>{"v41-reference"});
}
