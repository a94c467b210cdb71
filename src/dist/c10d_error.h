// The first line of an exception c10d throws, without LibTorch's backtrace: what our one-line
// errors quote.
#pragma once

#include <c10/util/Exception.h>

#include <exception>
#include <string>

namespace afterburner::dist {

inline std::string first_line(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string reason = c10_error ? c10_error->what_without_backtrace() : e.what();
  return reason.substr(0, reason.find('\n'));
}

}  // namespace afterburner::dist
