#include "afterburner/core/error.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace afterburner {

std::string first_line(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  const std::string text = c10_error ? c10_error->what_without_backtrace() : e.what();
  // The interpreter's message opens with this line and a TorchScript traceback (thousands of
  // characters for a model of a few layers), and ends with the failing op's own error
  // ("RuntimeError: mat1 and mat2 shapes cannot be multiplied ..."): that last line, without
  // the Python exception's name, says what went wrong.
  static const std::string kInterpreter = "The following operation failed in the TorchScript interpreter.";
  static const std::string kPythonName = "RuntimeError: ";
  if (text.compare(0, kInterpreter.size(), kInterpreter) == 0) {
    const size_t end = text.find_last_not_of(" \t\r\n");
    const size_t start = text.find_last_of('\n', end);
    if (start != std::string::npos) {
      const std::string cause = text.substr(start + 1, end - start);
      return cause.compare(0, kPythonName.size(), kPythonName) == 0 ? cause.substr(kPythonName.size()) : cause;
    }
  }
  // TorchScript's compiler opens its messages with a newline.
  const size_t start = std::min(text.find_first_not_of('\n'), text.size());
  return text.substr(start, text.find('\n', start) - start);
}

}  // namespace afterburner
