// Helpers shared by the data tests.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

namespace afterburner::data {

inline ::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

// The message of the ErrorType that `action` throws; a test failure if it throws none.
template <typename ErrorType>
std::string error_message(const std::function<void()>& action) {
  try {
    action();
  } catch (const ErrorType& e) {
    return e.what();
  }
  ADD_FAILURE() << "nothing thrown";
  return "";
}

}  // namespace afterburner::data
