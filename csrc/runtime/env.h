// Reading ACCEL_* environment variables: the runtime's own settings (config.cpp) and each
// driver's (drivers/host/host_options.cpp). Malformed values throw InitError naming the variable.
#pragma once

#include <cstdint>
#include <string>

namespace accel::rt::env {

std::string get(const char* name);  // "" when unset
std::string lower(std::string s);
bool parse_bool(const char* variable, bool fallback);
// Bytes, or a number with K, M, G or T (binary units; "4G", "512MiB").
uint64_t parse_size(const std::string& text, const char* variable);
// A whole number from `low` to `high`, or `fallback` when the variable is unset.
int parse_count(const char* variable, int fallback, int low, int high);

}  // namespace accel::rt::env
