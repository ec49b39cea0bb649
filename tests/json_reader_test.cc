#include "tests/json_reader.h"

#include "gtest/gtest.h"

namespace gradsync::testing {
namespace {

TEST(JsonParser, ParsesPrometheusRepliesAndRejectsGarbage) {
  auto v = JsonParser::Parse(
      R"({"status":"success","data":{"resultType":"vector","result":[{"metric":)"
      R"({"instance":"127.0.0.1:1","q":"a\"b\\c\u00e9\ud83d\ude00"},"value":[1.5e3,"NaN"]}]}})");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ((*v)["status"].str, "success");
  const Json& r = (*v)["data"]["result"][0];
  EXPECT_EQ(r["metric"]["instance"].str, "127.0.0.1:1");
  EXPECT_EQ(r["metric"]["q"].str, "a\"b\\c\xC3\xA9\xF0\x9F\x98\x80");
  EXPECT_EQ(r["value"][0].number, 1500);
  EXPECT_EQ(r["value"][1].str, "NaN");
  EXPECT_EQ((*v)["data"]["missing"].type, Json::Type::kNull);
  for (const char* bad : {"", "{", "[1,]", "{\"a\" 1}", "\"x", "01x", "-", "1.", "tru", "[1] 2",
                          "{\"a\":1,}", "\"\\q\""}) {
    EXPECT_FALSE(JsonParser::Parse(bad).ok()) << bad;
  }
  EXPECT_TRUE(JsonParser::Parse(" [ -0.5e-2 , true , false , null , {} , [] ] ").ok());
}

}  // namespace
}  // namespace gradsync::testing
