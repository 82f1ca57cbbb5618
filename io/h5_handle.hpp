#pragma once
// RAII ownership of one HDF5 identifier (file, group, dataset, attribute,
// dataspace, datatype or property list): closed exactly once, on every path,
// exceptions included. Internal to io/.
#include <hdf5.h>

#include <utility>

namespace ced::h5 {

class Handle {
 public:
  using Closer = herr_t (*)(hid_t);

  Handle() = default;
  Handle(hid_t id, Closer close) : id_(id), close_(close) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)), close_(o.close_) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
      close_ = o.close_;
    }
    return *this;
  }
  ~Handle() { reset(); }

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }

  // Closes now and reports the status (a file's close flushes it; a writer
  // must see that fail). The destructor ignores it: it only runs on paths
  // that are already failing.
  herr_t close() {
    herr_t status = 0;
    if (id_ >= 0 && close_ != nullptr) status = close_(id_);
    id_ = H5I_INVALID_HID;
    return status;
  }

 private:
  void reset() { (void)close(); }

  hid_t id_ = H5I_INVALID_HID;
  Closer close_ = nullptr;
};

}  // namespace ced::h5
