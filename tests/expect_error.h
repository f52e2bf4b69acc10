#pragma once
// EXPECT_BAD(E, needle, expr): expr throws exactly exception type E (not a subclass), with
// `needle` in its message.

#include <gtest/gtest.h>

#include <exception>
#include <functional>
#include <string>
#include <typeinfo>

namespace wick::testing {

// Runs `stmt`, expecting exactly exception type E with `needle` in its message.
template <class E>
void expect_error(const std::function<void()>& stmt, const std::string& needle, const char* where) {
  try {
    stmt();
  } catch (const std::exception& e) {
    EXPECT_EQ(typeid(e), typeid(E)) << where << ": wrong exception type, message: " << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << where << ": message \"" << e.what() << "\" lacks \"" << needle << "\"";
    return;
  }
  ADD_FAILURE() << where << ": nothing thrown";
}

}  // namespace wick::testing

#define EXPECT_BAD(E, needle, ...) \
  ::wick::testing::expect_error<E>([&] { (void)(__VA_ARGS__); }, needle, #__VA_ARGS__)
