# Every dependency is a Debian package found with find_package.
find_package(Eigen3 3.4 REQUIRED NO_MODULE)
find_package(HDF5 REQUIRED COMPONENTS C)
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(CLI11 REQUIRED)
find_package(fmt REQUIRED)
find_package(tomlplusplus REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
if(CED_BUILD_TESTS)
  find_package(GTest REQUIRED)
  find_package(rapidcheck REQUIRED)
endif()
if(CED_ENABLE_CUDA)
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
endif()

# fmt and toml++ as every target of ours links them: ced::fmt, ced::toml. With CED_PORTABLE (the Python wheel,
# pyproject.toml) both are compiled in from their headers, so the module needs no shared library of
# theirs on the user's machine; HDF5 stays shared (Debian's static archive is not position independent) and
# auditwheel copies it into the wheel (scripts/build-wheel.sh).
add_library(ced_fmt INTERFACE)
add_library(ced::fmt ALIAS ced_fmt)
add_library(ced_toml INTERFACE)
add_library(ced::toml ALIAS ced_toml)
if(CED_PORTABLE)
  target_link_libraries(ced_fmt INTERFACE fmt::fmt-header-only)
  get_target_property(_ced_toml_include tomlplusplus::tomlplusplus INTERFACE_INCLUDE_DIRECTORIES)
  target_include_directories(ced_toml SYSTEM INTERFACE ${_ced_toml_include})
  target_compile_definitions(ced_toml INTERFACE TOML_HEADER_ONLY=1)
else()
  target_link_libraries(ced_fmt INTERFACE fmt::fmt)
  target_link_libraries(ced_toml INTERFACE tomlplusplus::tomlplusplus)
endif()
