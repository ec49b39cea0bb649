#include "cli/timeline_merge.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/json_reader.h"
#include "worker/timeline.h"

namespace gradsync {
namespace {

using testing::Json;
using testing::JsonParser;

std::string Dir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string d = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name);
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// Writes one rank's trace the way gradsyncd does (worker/timeline.h).
void WriteRank(const std::string& dir, const std::string& job, int epoch, int rank, int ops) {
  auto t = Timeline::Open(absl::StrCat(dir, "/", job, ".epoch", epoch, ".rank", rank, ".trace.json"),
                          rank, absl::StrCat("gradsyncd rank ", rank));
  ASSERT_TRUE(t.ok()) << t.status();
  const absl::Time now = absl::Now();
  for (int i = 0; i < ops; ++i) {
    (*t)->SetOp(i + 1, absl::StrCat("allreduce 'g\"", i, "'"));
    (*t)->Event("ring", "algo", now + absl::Milliseconds(i), now + absl::Milliseconds(i + 1));
    (*t)->Instant("done", now + absl::Milliseconds(i + 1));
  }
}

Json Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream all;
  all << in.rdbuf();
  absl::StatusOr<Json> j = JsonParser::Parse(all.str());
  EXPECT_TRUE(j.ok()) << j.status() << "\n" << all.str();
  return j.ok() ? *j : Json();
}

TEST(MergeTimelines, EveryRankIsItsOwnRowInOneValidTrace) {
  const std::string dir = Dir("one_job");
  for (int r : {0, 1, 2, 10}) WriteRank(dir, "lab+bench", 1, r, 3);
  const std::string out = dir + "/../merged.json";
  auto m = MergeTimelines({dir}, out);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->files, 4);
  EXPECT_EQ(m->events, 4 * 6);
  EXPECT_EQ(m->rows, (std::vector<std::string>{"rank 0", "rank 1", "rank 2", "rank 10"}));
  EXPECT_TRUE(m->warnings.empty());
  Json j = Read(out);
  const Json& events = j["traceEvents"];
  ASSERT_EQ(events.type, Json::Type::kArray);
  std::set<double> pids;
  std::vector<std::string> names(4);
  for (const Json& e : events.items) {
    pids.insert(e["pid"].number);
    if (e["name"].str == "process_name") names[static_cast<int>(e["pid"].number)] = e["args"]["name"].str;
    if (e["ph"].str == "X") {
      EXPECT_EQ(e["args"]["desc"].str.substr(0, 13), "allreduce 'g\"");
    }
  }
  EXPECT_EQ(pids, (std::set<double>{0, 1, 2, 3}));
  EXPECT_EQ(names, (std::vector<std::string>{"rank 0", "rank 1", "rank 2", "rank 10"}));
}

TEST(MergeTimelines, SeveralEpochsAreNamedAndAnOpenFileIsTakenUpToItsLastEvent) {
  const std::string dir = Dir("epochs");
  WriteRank(dir, "j", 1, 0, 1);
  WriteRank(dir, "j", 2, 0, 2);
  // A daemon still writing: no closing bracket yet, the last line cut short.
  {
    std::ofstream f(dir + "/j.epoch2.rank1.trace.json");
    f << "[\n{\"name\":\"ring\",\"ph\":\"X\",\"ts\":1,\"dur\":2,\"pid\":1,\"tid\":0},\n{\"name\":\"ri";
  }
  const std::string out = dir + "/../epochs.json";
  auto m = MergeTimelines({dir + "/j.epoch1.rank0.trace.json", dir + "/j.epoch2.rank0.trace.json",
                           dir + "/j.epoch2.rank1.trace.json"}, out);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->rows, (std::vector<std::string>{"j epoch 1 rank 0", "j epoch 2 rank 0", "j epoch 2 rank 1"}));
  EXPECT_EQ(m->events, 2 + 4 + 1);
  EXPECT_FALSE(m->warnings.empty());
  Json j = Read(out);
  EXPECT_EQ(j["traceEvents"].items.size(), 3u * 2 + 7);
}

TEST(MergeTimelines, ClearErrors) {
  const std::string dir = Dir("errors");
  auto none = MergeTimelines({dir}, dir + "/out.json");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find("no *.trace.json"), absl::string_view::npos);
  auto missing = MergeTimelines({dir + "/nope.trace.json"}, dir + "/out.json");
  EXPECT_NE(missing.status().message().find("neither a trace file nor a directory"), absl::string_view::npos);
  { std::ofstream(dir + "/bad.trace.json") << "hello"; }
  auto bad = MergeTimelines({dir + "/bad.trace.json"}, dir + "/out.json");
  EXPECT_NE(bad.status().message().find("not a Chrome trace"), absl::string_view::npos) << bad.status();
  EXPECT_FALSE(MergeTimelines({}, dir + "/out.json").ok());
}

}  // namespace
}  // namespace gradsync
