// SPDX-License-Identifier: Apache-2.0
// Manual pages and shell completion, generated from the definitions the
// programs parse their command lines with (CLI11 apps, kvtier-bench's table,
// kvtierd's config schema), so a page cannot forget an option the program
// has. Each program prints its page with `PROGRAM --man` (kvtierd also
// `--config-man`, kvtierctl `--bash-completion`); the build writes them to
// files and installs them (tools/CMakeLists.txt).
#ifndef KVTIER_TOOLS_COMMON_MAN_PAGE_H_
#define KVTIER_TOOLS_COMMON_MAN_PAGE_H_

#include <string>
#include <string_view>
#include <vector>

namespace CLI {
class App;
}

namespace kvtier::tools {

struct ManOption {
  std::string names;  // "-s, --socket"
  std::string arg;    // "PATH", "" for a flag
  std::string doc;
};

struct ManCommand {
  std::string name;  // "blocks ls"
  std::string doc;
  std::vector<ManOption> options;
};

struct ManSection {
  std::string title;  // "FILES"
  std::string text;   // plain text; blank lines separate paragraphs, lines starting with spaces are kept as they are
};

struct ManPage {
  std::string name;  // "kvtierctl"
  int section = 1;
  std::string summary;   // one line for NAME
  std::string synopsis;  // plain text
  std::string description;
  std::vector<ManOption> options;
  std::vector<ManCommand> commands;
  std::string commands_title = "COMMANDS";  // the section the commands are listed under
  std::vector<ManSection> sections;  // after OPTIONS and COMMANDS
};

// roff source of the page (man(7) macros).
std::string RenderMan(const ManPage& page);

// A page's options and commands from a CLI11 app (its description as the
// DESCRIPTION, its footer as EXAMPLES; nested subcommands as "a b").
ManPage ManFromCli(const CLI::App& app, std::string_view name, int section, std::string_view summary);

// A bash completion script for `name`: subcommands (nested) and their options.
std::string BashCompletion(const CLI::App& app, std::string_view name);

// The source field of page headers: "kvtier 0.1.0".
std::string ManSource();

// `PROGRAM --man` prints the page (the app's, plus `extra` sections), and
// `PROGRAM --bash-completion` the completion script: true when it printed
// one (the caller exits 0). Checked before the app parses, so a program that
// requires a subcommand still answers them.
bool PrintDocsIfAsked(int argc, char** argv, const CLI::App& app, std::string_view name, int section,
                      std::string_view summary, const std::vector<ManSection>& extra = {});

}  // namespace kvtier::tools

#endif  // KVTIER_TOOLS_COMMON_MAN_PAGE_H_
