// A minimal JSON reader (RFC 8259) for tests: enough for Prometheus' HTTP API
// replies and the Grafana dashboard. Numbers are doubles; objects keep their
// keys in order.
#ifndef GRADSYNC_TESTS_JSON_READER_H_
#define GRADSYNC_TESTS_JSON_READER_H_

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace gradsync::testing {

struct Json {
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  Type type = Type::kNull;
  bool boolean = false;
  double number = 0;
  std::string str;
  std::vector<Json> items;                            // kArray
  std::vector<std::pair<std::string, Json>> members;  // kObject

  // The member `key` of an object, or nullptr.
  const Json* Get(absl::string_view key) const {
    if (type != Type::kObject) return nullptr;
    for (const auto& [k, v] : members) {
      if (k == key) return &v;
    }
    return nullptr;
  }
  // get("a")->... without null checks: a missing key yields a null Json.
  const Json& operator[](absl::string_view key) const {
    static const Json* const kNull = new Json();
    const Json* v = Get(key);
    return v != nullptr ? *v : *kNull;
  }
  const Json& operator[](size_t i) const {
    static const Json* const kNull = new Json();
    return type == Type::kArray && i < items.size() ? items[i] : *kNull;
  }
};

class JsonParser {
 public:
  static absl::StatusOr<Json> Parse(absl::string_view text) {
    JsonParser p(text);
    Json v;
    if (!p.Value(v, 0)) return p.Error();
    p.Space();
    if (p.pos_ != text.size()) {
      p.error_ = "trailing characters";
      return p.Error();
    }
    return v;
  }

 private:
  explicit JsonParser(absl::string_view text) : s_(text) {}

  absl::Status Error() const {
    return absl::InvalidArgumentError(absl::StrCat("JSON: ", error_, " at offset ", pos_, " in '",
                                                   s_.substr(0, 300), "'"));
  }
  bool Fail(const char* what) {
    if (error_.empty()) error_ = what;
    return false;
  }
  void Space() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool Literal(absl::string_view word) {
    if (s_.substr(pos_, word.size()) != word) return Fail("bad literal");
    pos_ += word.size();
    return true;
  }
  bool Value(Json& v, int depth) {
    if (depth > 64) return Fail("nested too deeply");
    Space();
    if (pos_ >= s_.size()) return Fail("unexpected end");
    const char c = s_[pos_];
    if (c == '{') return Object(v, depth);
    if (c == '[') return Array(v, depth);
    if (c == '"') {
      v.type = Json::Type::kString;
      return String(v.str);
    }
    if (c == 't' || c == 'f') {
      v.type = Json::Type::kBool;
      v.boolean = c == 't';
      return Literal(c == 't' ? "true" : "false");
    }
    if (c == 'n') {
      v.type = Json::Type::kNull;
      return Literal("null");
    }
    return Number(v);
  }
  bool Object(Json& v, int depth) {
    v.type = Json::Type::kObject;
    ++pos_;  // '{'
    Space();
    if (pos_ < s_.size() && s_[pos_] == '}') {
      ++pos_;
      return true;
    }
    while (true) {
      Space();
      if (pos_ >= s_.size() || s_[pos_] != '"') return Fail("expected a key");
      std::string key;
      if (!String(key)) return false;
      Space();
      if (pos_ >= s_.size() || s_[pos_] != ':') return Fail("expected ':'");
      ++pos_;
      Json member;
      if (!Value(member, depth + 1)) return false;
      v.members.emplace_back(std::move(key), std::move(member));
      Space();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == '}') {
        ++pos_;
        return true;
      }
      return Fail("expected ',' or '}'");
    }
  }
  bool Array(Json& v, int depth) {
    v.type = Json::Type::kArray;
    ++pos_;  // '['
    Space();
    if (pos_ < s_.size() && s_[pos_] == ']') {
      ++pos_;
      return true;
    }
    while (true) {
      Json item;
      if (!Value(item, depth + 1)) return false;
      v.items.push_back(std::move(item));
      Space();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == ']') {
        ++pos_;
        return true;
      }
      return Fail("expected ',' or ']'");
    }
  }
  static void AppendUtf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  bool Hex4(uint32_t& out) {
    if (pos_ + 4 > s_.size()) return Fail("short \\u escape");
    out = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = s_[pos_++];
      out <<= 4;
      if (h >= '0' && h <= '9') {
        out |= h - '0';
      } else if (h >= 'a' && h <= 'f') {
        out |= h - 'a' + 10;
      } else if (h >= 'A' && h <= 'F') {
        out |= h - 'A' + 10;
      } else {
        return Fail("bad \\u escape");
      }
    }
    return true;
  }
  bool String(std::string& out) {
    ++pos_;  // '"'
    while (pos_ < s_.size()) {
      const char c = s_[pos_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return Fail("control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) break;
      const char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp;
          if (!Hex4(cp)) return false;
          if (cp >= 0xD800 && cp < 0xDC00 && s_.substr(pos_, 2) == "\\u") {
            pos_ += 2;
            uint32_t low;
            if (!Hex4(low)) return false;
            if (low < 0xDC00 || low >= 0xE000) return Fail("bad surrogate pair");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          AppendUtf8(out, cp);
          break;
        }
        default:
          return Fail("bad escape");
      }
    }
    return Fail("unterminated string");
  }
  bool Number(Json& v) {
    const size_t start = pos_;
    auto digits = [&] {
      const size_t d = pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
      return pos_ > d;
    };
    if (pos_ < s_.size() && s_[pos_] == '-') ++pos_;
    if (!digits()) return Fail("bad number");
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      if (!digits()) return Fail("bad fraction");
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (!digits()) return Fail("bad exponent");
    }
    v.type = Json::Type::kNumber;
    v.number = std::strtod(std::string(s_.substr(start, pos_ - start)).c_str(), nullptr);
    return true;
  }

  absl::string_view s_;
  size_t pos_ = 0;
  std::string error_;
};

}  // namespace gradsync::testing

#endif  // GRADSYNC_TESTS_JSON_READER_H_
