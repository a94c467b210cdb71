// The whole content of a file, for the readers that parse it in memory.
#pragma once

#include <string>
#include <vector>

namespace afterburner::data {

// Throws DataError naming `path` when it is missing or cannot be read.
std::vector<char> file_bytes(const std::string& path);
// The same into `into`, reusing its memory.
void file_bytes(const std::string& path, std::vector<char>& into);

}  // namespace afterburner::data
