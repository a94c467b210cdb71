#include "afterburner/core/error.h"

#include <c10/util/Exception.h>

namespace afterburner {

std::string first_line(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  const std::string text = c10_error ? c10_error->what_without_backtrace() : e.what();
  return text.substr(0, text.find('\n'));
}

}  // namespace afterburner
