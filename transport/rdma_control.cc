#include "transport/rdma_control.h"

#include "absl/strings/str_cat.h"

namespace gradsync::transport::rdma_control {
namespace {

void PutLe(char* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
uint64_t GetLe(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{static_cast<uint8_t>(p[i])} << (8 * i);
  return v;
}

}  // namespace

std::string Encode(const Entry& e) {
  std::string out(kEntryBytes, '\0');
  char* p = out.data();
  p[0] = static_cast<char>(e.kind);
  p[1] = e.exact ? 1 : 0;
  p[2] = static_cast<char>(e.tag.dtype);
  PutLe(p + 4, e.seq, 4);
  PutLe(p + 8, e.addr, 8);
  PutLe(p + 16, e.capacity, 8);
  PutLe(p + 24, e.rkey, 4);
  PutLe(p + 28, e.tag.slot, 4);
  PutLe(p + 32, e.tag.op_seq, 8);
  PutLe(p + 40, e.tag.offset, 8);
  return out;
}

absl::StatusOr<Entry> Decode(const char* p, size_t n) {
  if (n != kEntryBytes || (p[0] != static_cast<char>(Kind::kCts) &&
                           p[0] != static_cast<char>(Kind::kRts))) {
    return absl::DataLossError(absl::StrCat("malformed RDMA control entry (", n, " bytes, kind ",
                                            n > 0 ? static_cast<int>(p[0]) : -1, ")"));
  }
  Entry e;
  e.kind = static_cast<Kind>(p[0]);
  e.exact = p[1] != 0;
  e.tag.dtype = static_cast<uint8_t>(p[2]);
  e.seq = static_cast<uint32_t>(GetLe(p + 4, 4));
  e.addr = GetLe(p + 8, 8);
  e.capacity = GetLe(p + 16, 8);
  e.rkey = static_cast<uint32_t>(GetLe(p + 24, 4));
  e.tag.slot = static_cast<uint32_t>(GetLe(p + 28, 4));
  e.tag.op_seq = GetLe(p + 32, 8);
  e.tag.offset = GetLe(p + 40, 8);
  return e;
}

}  // namespace gradsync::transport::rdma_control
