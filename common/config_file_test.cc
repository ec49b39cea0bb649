#include "common/config_file.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

ABSL_FLAG(std::string, cf_listen, "0.0.0.0:1", "test flag");
ABSL_FLAG(std::string, cf_name, "default", "test flag");
ABSL_FLAG(int64_t, cf_timeout_ms, 100, "test flag");
ABSL_FLAG(bool, cf_verbose, false, "test flag");
ABSL_FLAG(bool, cf_enabled, true, "test flag");

namespace gradsync {
namespace {

class ConfigFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::SetFlag(&FLAGS_cf_listen, "0.0.0.0:1");
    absl::SetFlag(&FLAGS_cf_name, "default");
    absl::SetFlag(&FLAGS_cf_timeout_ms, 100);
    absl::SetFlag(&FLAGS_cf_verbose, false);
    absl::SetFlag(&FLAGS_cf_enabled, true);
  }

  std::string Write(const std::string& text) {
    const char* tmp = std::getenv("TEST_TMPDIR");
    const std::string path =
        absl::StrCat(tmp ? tmp : "/tmp", "/config_file_test.", getpid(), ".", files_++, ".conf");
    std::FILE* f = std::fopen(path.c_str(), "w");
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
    return path;
  }

  static absl::Status Apply(const std::string& path, std::vector<const char*> args = {}) {
    args.insert(args.begin(), "prog");
    return ApplyConfigFile(path, static_cast<int>(args.size()), args.data());
  }

  int files_ = 0;
};

TEST_F(ConfigFileTest, SetsFlagsFromTheFile) {
  const std::string path = Write(
      "# a comment\n"
      "\n"
      "  cf_listen = 127.0.0.1:7070   \n"
      "cf_timeout_ms=2500\n"
      "   # indented comment\n"
      "cf_verbose = true\r\n"
      "cf_name = a # not a comment\n");
  ASSERT_TRUE(Apply(path).ok()) << Apply(path);
  EXPECT_EQ(absl::GetFlag(FLAGS_cf_listen), "127.0.0.1:7070");
  EXPECT_EQ(absl::GetFlag(FLAGS_cf_timeout_ms), 2500);
  EXPECT_TRUE(absl::GetFlag(FLAGS_cf_verbose));
  EXPECT_EQ(absl::GetFlag(FLAGS_cf_name), "a # not a comment");
}

TEST_F(ConfigFileTest, QuotesKeepBlanksAndAllowTheEmptyString) {
  const std::string path = Write("cf_listen = \"\"\ncf_name = \"  two words \"\n");
  ASSERT_TRUE(Apply(path).ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_cf_listen), "");
  EXPECT_EQ(absl::GetFlag(FLAGS_cf_name), "  two words ");
  ASSERT_TRUE(Apply(Write("cf_name =\n")).ok());  // bare '=': empty too
  EXPECT_EQ(absl::GetFlag(FLAGS_cf_name), "");
}

TEST_F(ConfigFileTest, CommandLineFlagsWin) {
  const std::string path = Write(
      "cf_listen = 127.0.0.1:7070\ncf_timeout_ms = 2500\ncf_name = file\n"
      "cf_verbose = true\ncf_enabled = true\n");
  // Every absl form: --x=v, -x=v, --x v, --nobool.
  ASSERT_TRUE(Apply(path, {"--cf_listen=1.2.3.4:5", "-cf_timeout_ms=7", "--cf_name", "cli",
                           "--nocf_enabled"})
                  .ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_cf_listen), "0.0.0.0:1");  // untouched by the file
  EXPECT_EQ(absl::GetFlag(FLAGS_cf_timeout_ms), 100);
  EXPECT_EQ(absl::GetFlag(FLAGS_cf_name), "default");
  EXPECT_TRUE(absl::GetFlag(FLAGS_cf_enabled));  // not set by the file (ParseCommandLine would)
  EXPECT_TRUE(absl::GetFlag(FLAGS_cf_verbose));  // only in the file
}

TEST_F(ConfigFileTest, FlagsOnCommandLineStopsAtDoubleDash) {
  std::vector<const char*> argv = {"prog",           "--cf_verbose", "pos",
                                   "--cf_name", "--cf_listen",  "--", "--cf_timeout_ms=1"};
  const std::set<std::string> names = FlagsOnCommandLine(static_cast<int>(argv.size()), argv.data());
  // "--cf_name --cf_listen": the second is cf_name's value.
  EXPECT_EQ(names, (std::set<std::string>{"cf_verbose", "cf_name"}));
}

TEST_F(ConfigFileTest, UnknownKeyIsAnErrorNamingTheLine) {
  const std::string path = Write("cf_listen = 1.2.3.4:5\n\n# c\ncf_lisen = 1.2.3.4:6\n");
  absl::Status s = Apply(path);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), absl::StrCat(path, ":4: unknown key 'cf_lisen'")))
      << s;
  EXPECT_EQ(absl::GetFlag(FLAGS_cf_listen), "0.0.0.0:1");  // nothing applied
}

TEST_F(ConfigFileTest, BadValueIsAnErrorAndChangesNothing) {
  const std::string path = Write("cf_listen = 1.2.3.4:5\ncf_timeout_ms = soon\n");
  absl::Status s = Apply(path);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), ":2: invalid value 'soon' for 'cf_timeout_ms'")) << s;
  EXPECT_EQ(absl::GetFlag(FLAGS_cf_listen), "0.0.0.0:1");  // rolled back
  EXPECT_EQ(absl::GetFlag(FLAGS_cf_timeout_ms), 100);
}

TEST_F(ConfigFileTest, SyntaxErrors) {
  struct Case {
    const char* text;
    const char* error;
  };
  for (const Case& c : std::vector<Case>{
           {"cf_listen 1.2.3.4:5\n", ":1: expected 'key = value'"},
           {"\n--cf_listen = x\n", ":2: bad key '--cf_listen'"},
           {" = x\n", ":1: bad key ''"},
           {"cf_name = \"abc\n", ":1: unterminated quote"},
           {"cf_name = a\ncf_name = b\n", ":2: 'cf_name' is already set on line 1"},
           {"config = /etc/x.conf\n", ":1: 'config' can only be given on the command line"},
           {"flagfile = /x\n", ":1: 'flagfile' can only be given on the command line"},
           {"helpfull = true\n", ":1: 'helpfull' can only be given"},
       }) {
    absl::Status s = Apply(Write(c.text));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_TRUE(absl::StrContains(s.message(), c.error)) << c.text << " -> " << s;
  }
}

TEST_F(ConfigFileTest, MissingFileIsNotFoundNamingThePath) {
  absl::Status s = Apply("/nonexistent/gradsync.conf");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(s.message(), "/nonexistent/gradsync.conf")) << s;
  const char* tmp = std::getenv("TEST_TMPDIR");
  s = Apply(tmp ? tmp : "/tmp");  // a directory
  EXPECT_FALSE(s.ok());
}

TEST_F(ConfigFileTest, ParseConfigTextReportsLines) {
  auto settings = ParseConfigText("a = 1\n# x\n\nb = \"2\"\n", "mem");
  ASSERT_TRUE(settings.ok()) << settings.status();
  ASSERT_EQ(settings->size(), 2u);
  EXPECT_EQ((*settings)[0].key, "a");
  EXPECT_EQ((*settings)[0].line, 1);
  EXPECT_EQ((*settings)[1].value, "2");
  EXPECT_EQ((*settings)[1].line, 4);
  auto applied = ApplyConfigSettings({{"cf_name", "x", 1}, {"cf_listen", "y", 2}},
                                     {"cf_listen"}, "mem");
  ASSERT_TRUE(applied.ok());
  EXPECT_EQ(*applied, 1);
}

}  // namespace
}  // namespace gradsync
