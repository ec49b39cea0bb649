// A job with the timeline switched on writes valid Chrome-trace JSON per rank
// with every op's phases: queued, negotiate, the algorithm, ring steps, reduces.
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "cli/local_cluster.h"
#include "gtest/gtest.h"
#include "tests/cluster_util.h"

namespace gradsync {
namespace {

using testing::RunCommand;

TEST(Timeline, EveryRankWritesValidChromeTraceWithEveryPhase) {
  LocalClusterOptions o;
  o.daemons = 3;
  auto cluster = LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  {
    std::vector<testing::RankHandle> ranks(3);
    testing::OnEveryRank(3, [&](int r) {
      auto c = client::Client::Connect((*cluster)->daemon_target(r));
      ASSERT_TRUE(c.ok());
      ranks[r].client = std::move(*c);
      client::SessionOptions so;
      so.job_id = "traced";
      so.world_size = 3;
      so.rank = r;
      so.timeline = true;
      auto s = ranks[r].client->OpenSession(so);
      ASSERT_TRUE(s.ok()) << s.status();
      ranks[r].session = std::move(*s);
    });
    testing::OnEveryRank(3, [&](int r) {
      auto& s = *ranks[r].session;
      auto b = s.AllocateBuffer(1 << 20);
      ASSERT_TRUE(b.ok());
      for (int i = 0; i < 2; ++i) {
        client::CollectiveSpec spec;
        spec.buffer = b->get();
        spec.count = (1 << 20) / 4;
        spec.algorithm = "ring";
        spec.name = absl::StrCat("grad", i);
        ASSERT_TRUE(s.Run(spec).ok());
      }
      ASSERT_TRUE(s.Close().ok());
    });
  }
  const std::string check = R"PY(
import json, sys
ev = json.load(open(sys.argv[1]))
rank = int(sys.argv[2])
assert all(e["pid"] == rank for e in ev), "pid != rank"
names = [e["name"] for e in ev]
for want in ("process_name", "queued", "negotiate", "ring", "reduce", "done"):
    assert want in names, want + " missing"
steps = [e for e in ev if e.get("cat") == "step"]
assert len(steps) == 2 * 4, "expected 4 ring steps per op for 3 ranks, got %d" % len(steps)
ops = sorted({e["args"]["op"] for e in ev if "args" in e and "op" in e["args"]})
assert ops == [1, 2], ops
assert all(e["dur"] >= 0 for e in ev if e["ph"] == "X")
print("OK", len(ev))
)PY";
  for (int r = 0; r < 3; ++r) {
    const std::string path = absl::StrCat((*cluster)->work_dir(), "/timeline/lab+traced.epoch1.rank", r,
                                          ".trace.json");
    const std::string out =
        RunCommand(absl::StrCat("/usr/bin/python3 -c '", check, "' ", path, " ", r, " 2>&1"));
    EXPECT_EQ(out.substr(0, 2), "OK") << "rank " << r << ": " << out;
  }
}

}  // namespace
}  // namespace gradsync
