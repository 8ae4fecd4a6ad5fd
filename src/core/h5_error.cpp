#include <hdf5.h>

#include <string>

#include "core/error.h"

namespace zp {

std::string h5_error_string() {
  std::string out;
  auto walk = [](unsigned n, const H5E_error2_t* e, void* data) -> herr_t {
    auto* s = static_cast<std::string*>(data);
    if (!s->empty()) *s += " <- ";
    *s += e->desc ? e->desc : "?";
    if (e->func_name) { *s += " in "; *s += e->func_name; }
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, walk, &out);
  return out.empty() ? "HDF5 call failed (no error stack)" : out;
}

}  // namespace zp
