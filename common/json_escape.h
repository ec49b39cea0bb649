// Escaping for JSON string contents (the timeline writer and its merger).
#ifndef GRADSYNC_COMMON_JSON_ESCAPE_H_
#define GRADSYNC_COMMON_JSON_ESCAPE_H_

#include <string>

namespace gradsync {

// `s` with '"', '\\' and control characters escaped, without the quotes.
std::string JsonEscape(const std::string& s);

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_JSON_ESCAPE_H_
