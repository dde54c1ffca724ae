// Reading ACCEL_* environment variables (env.h).
#include "runtime/env.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <stdexcept>

#include "runtime/error.h"

namespace accel::rt::env {

std::string get(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

bool parse_bool(const char* variable, bool fallback) {
  const std::string v = lower(get(variable));
  if (v.empty()) return fallback;
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  ACCEL_RT_THROW(InitError, variable, "='", v, "' is not a boolean: use 1 or 0");
}

uint64_t parse_size(const std::string& text, const char* variable) {
  std::size_t pos = 0;
  unsigned long long value = 0;
  try {
    // stoull accepts a sign and leading spaces ("-1" is 2^64-1): a size starts with a digit.
    if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0]))) {
      throw std::invalid_argument(text);
    }
    value = std::stoull(text, &pos);
  } catch (const std::exception&) {
    ACCEL_RT_THROW(InitError, variable, "='", text,
                   "' is not a size: use bytes or a number with K, M, G or T (binary units), "
                   "for example 4G");
  }
  std::string unit = lower(text.substr(pos));
  if (unit.size() > 1 && unit.back() == 'b') unit.pop_back();  // "gb", "gib"
  if (unit.size() > 1 && unit.back() == 'i') unit.pop_back();  // "gi"
  int shift = 0;
  if (unit.empty()) {
    shift = 0;
  } else if (unit == "k") {
    shift = 10;
  } else if (unit == "m") {
    shift = 20;
  } else if (unit == "g") {
    shift = 30;
  } else if (unit == "t") {
    shift = 40;
  } else {
    ACCEL_RT_THROW(InitError, variable, "='", text, "': unknown unit '", text.substr(pos),
                   "' (use K, M, G or T)");
  }
  ACCEL_RT_CHECK(value <= (~uint64_t{0} >> shift), InitError, variable, "='", text,
                 "' is too large");
  return static_cast<uint64_t>(value) << shift;
}

int parse_count(const char* variable, int fallback, int low, int high) {
  const std::string text = get(variable);
  if (text.empty()) return fallback;
  std::size_t pos = 0;
  long long n = 0;
  try {
    n = std::stoll(text, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  ACCEL_RT_CHECK(pos == text.size() && pos > 0 && n >= low && n <= high, InitError, variable, "='",
                 text, "' must be a whole number from ", low, " to ", high);
  return static_cast<int>(n);
}

}  // namespace accel::rt::env
