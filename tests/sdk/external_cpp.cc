// A C++ program built outside the Bazel workspace against the installed SDK:
// the C++ API (gradsync/client.h) allgathers one i64 block per rank and
// checks every block. Prints "ok".
#include <gradsync/client.h>

#include <cstdio>
#include <cstdlib>
#include <string>

using gradsync::client::Client;
using gradsync::client::CollectiveSpec;
using gradsync::client::SessionOptions;

int main(int argc, char** argv) {
  if (argc != 5) return 2;
  SessionOptions o;
  o.job_id = argv[2];
  o.world_size = std::atoi(argv[3]);
  o.rank = std::atoi(argv[4]);
  auto client = Client::Connect(argv[1]);
  if (!client.ok()) return std::fprintf(stderr, "%s\n", client.status().ToString().c_str()), 1;
  auto session = (*client)->OpenSession(o);
  if (!session.ok()) return std::fprintf(stderr, "%s\n", session.status().ToString().c_str()), 1;
  const size_t block = 64;
  auto buf = (*session)->AllocateBuffer(o.world_size * block * sizeof(int64_t));
  if (!buf.ok()) return 1;
  int64_t* v = (*buf)->as<int64_t>();
  for (size_t i = 0; i < block; ++i) v[o.rank * block + i] = 1000 * o.rank + static_cast<int64_t>(i);
  CollectiveSpec spec;
  spec.kind = gradsync::CollectiveKind::kAllgather;
  spec.buffer = buf->get();
  spec.count = block;
  spec.dtype = gradsync::DType::kI64;
  auto r = (*session)->Run(spec);
  if (!r.ok()) return std::fprintf(stderr, "%s\n", r.status().ToString().c_str()), 1;
  for (int b = 0; b < o.world_size; ++b) {
    for (size_t i = 0; i < block; ++i) {
      if (v[b * block + i] != 1000 * b + static_cast<int64_t>(i)) {
        std::fprintf(stderr, "block %d element %zu wrong\n", b, i);
        return 1;
      }
    }
  }
  std::printf("ok %s\n", gradsync::DTypeName(gradsync::DType::kI64));
  return 0;
}
