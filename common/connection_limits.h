// Slots for the connections a server holds open, bounded per source (a uid,
// a peer address) and in total, so that one source's idle connections cannot
// take every slot. Not thread-safe: one server loop owns it.
#ifndef GRADSYNC_COMMON_CONNECTION_LIMITS_H_
#define GRADSYNC_COMMON_CONNECTION_LIMITS_H_

#include <map>
#include <string>

namespace gradsync {

class ConnectionLimits {
 public:
  ConnectionLimits(int per_source, int total) : per_source_(per_source), total_limit_(total) {}

  // Takes a slot for `source`; false (nothing taken) when `source` or the
  // total is at its limit.
  bool Acquire(const std::string& source);
  // Gives back a slot Acquire took.
  void Release(const std::string& source);

  int held(const std::string& source) const;
  int total() const { return total_; }
  int per_source() const { return per_source_; }
  int total_limit() const { return total_limit_; }

 private:
  const int per_source_;
  const int total_limit_;
  int total_ = 0;
  std::map<std::string, int> held_;  // no entry: 0
};

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_CONNECTION_LIMITS_H_
