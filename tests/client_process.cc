// A separate client process for tests: opens a session, fills a buffer with
// 1.0f, submits an allreduce, prints "SUBMITTED", then waits to be killed.
// With --nosubmit it prints "OPENED" once the session is open and submits
// nothing.
#include <unistd.h>

#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "client/client.h"

ABSL_FLAG(std::string, target, "", "daemon address");
ABSL_FLAG(std::string, job, "", "job id");
ABSL_FLAG(int32_t, world, 2, "world size");
ABSL_FLAG(int32_t, rank, 0, "rank");
ABSL_FLAG(int64_t, count, 1 << 20, "f32 elements");
ABSL_FLAG(bool, submit, true, "allocate and submit the allreduce");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  using namespace gradsync;
  auto c = client::Client::Connect(absl::GetFlag(FLAGS_target));
  if (!c.ok()) return 2;
  client::SessionOptions so;
  so.job_id = absl::GetFlag(FLAGS_job);
  so.world_size = absl::GetFlag(FLAGS_world);
  so.rank = absl::GetFlag(FLAGS_rank);
  auto s = (*c)->OpenSession(so);
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.status().message()).c_str());
    return 3;
  }
  if (!absl::GetFlag(FLAGS_submit)) {
    std::printf("OPENED\n");
    std::fflush(stdout);
    ::sleep(60);
    return 0;
  }
  const size_t count = static_cast<size_t>(absl::GetFlag(FLAGS_count));
  auto b = (*s)->AllocateBuffer(count * sizeof(float));
  if (!b.ok()) return 4;
  for (size_t i = 0; i < count; ++i) (*b)->as<float>()[i] = 1.0f;
  auto h = (*s)->AllreduceAsync(**b, 0, count, DType::kF32, ReduceOp::kSum, "orphan");
  if (!h.ok()) return 5;
  std::printf("SUBMITTED\n");
  std::fflush(stdout);
  ::sleep(60);
  return 0;
}
