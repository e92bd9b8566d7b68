// SPDX-License-Identifier: Apache-2.0
// CLI11 parsing with the exit codes our tools document: 0 for --help and
// --version, 2 for any usage error (CLI11's own codes are 100+).
#ifndef KVTIER_CORE_CLI_PARSE_H_
#define KVTIER_CORE_CLI_PARSE_H_

#include "CLI/CLI.hpp"

#define KVTIER_CLI_PARSE(app, argc, argv)      \
  try {                                        \
    (app).parse((argc), (argv));               \
  } catch (const CLI::ParseError& e) {         \
    return (app).exit(e) == 0 ? 0 : 2;         \
  }

#endif  // KVTIER_CORE_CLI_PARSE_H_
