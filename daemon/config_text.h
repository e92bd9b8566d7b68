// SPDX-License-Identifier: Apache-2.0
// Message text for kvtierd's config files (config.cc, config_validate.cc).
#ifndef KVTIER_DAEMON_CONFIG_TEXT_H_
#define KVTIER_DAEMON_CONFIG_TEXT_H_

#include <string>

#include "fmt/format.h"

namespace kvtier::config_text {

// toml++ speaks std::string_view and Debian's Abseil does not, so config
// messages are joined with fmt, which takes both.
template <typename... Args>
std::string Cat(const Args&... args) {
  std::string out;
  ((out += fmt::format("{}", args)), ...);
  return out;
}

}  // namespace kvtier::config_text

#endif  // KVTIER_DAEMON_CONFIG_TEXT_H_
