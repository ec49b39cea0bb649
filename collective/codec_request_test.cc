#include "collective/codec_request.h"

#include "gtest/gtest.h"

namespace gradsync {
namespace {

TEST(CodecRequest, ParsesWhatUsersWrite) {
  EXPECT_TRUE(ParseCodecRequest("", false)->none());
  EXPECT_TRUE(ParseCodecRequest("none", true)->none());
  CodecRequest r = *ParseCodecRequest("int8", /*job=*/false);
  EXPECT_EQ(r.only(), CodecId::kInt8);
  EXPECT_FALSE(r.lenient);
  EXPECT_FALSE(r.automatic);
  EXPECT_EQ(r.ToString(), "int8");
  r = *ParseCodecRequest("BF16", /*job=*/true);
  EXPECT_EQ(r.only(), CodecId::kBf16);
  EXPECT_TRUE(r.lenient);
  EXPECT_EQ(r.ToString(), "bf16 (job)");
  r = *ParseCodecRequest("auto", false);
  EXPECT_TRUE(r.automatic && r.lenient);
  EXPECT_EQ(r.ToString(), "auto:bf16,fp16,int8");
  r = *ParseCodecRequest("auto:fp8, int8", false);
  EXPECT_TRUE(r.allows(CodecId::kFp8E4M3) && r.allows(CodecId::kInt8));
  EXPECT_FALSE(r.allows(CodecId::kBf16));
  EXPECT_EQ(r.ToString(), "auto:fp8e4m3,int8");
  EXPECT_EQ(ParseCodecRequest("zstd", false).status().message(),
            "unknown codec 'zstd' (codecs: none, bf16, fp16, fp8e4m3 (or fp8), fp8e5m2, int8); "
            "or 'auto', or 'auto:' and a list of codecs, or 'topk:RATIO'");
  EXPECT_EQ(ParseCodecRequest("auto:bf16,lz4", false).status().message(),
            "unknown codec 'lz4' (codecs: none, bf16, fp16, fp8e4m3 (or fp8), fp8e5m2, int8)");
}

TEST(CodecRequest, TopkCarriesItsParameters) {
  CodecRequest r = *ParseCodecRequest("topk:0.01,warmup=20", /*job=*/true);
  EXPECT_FALSE(r.none());
  EXPECT_EQ(r.allowed, 0);
  EXPECT_TRUE(r.lenient);
  EXPECT_EQ(r.topk.ratio_ppm, 10000u);
  EXPECT_EQ(r.topk.warmup, 20u);
  EXPECT_EQ(r.ToString(), "topk:0.01,warmup=20 (job)");
  const CodecRequest back = CodecRequest::FromCodes(r.Code(), r.topk.Code());
  EXPECT_EQ(back.ToString(), r.ToString());
  r = *ParseCodecRequest("TopK:0.001,momentum=0.9", /*job=*/false);
  EXPECT_FALSE(r.lenient);
  EXPECT_EQ(r.ToString(), "topk:0.001,momentum=0.9");
  EXPECT_EQ(ParseCodecRequest("auto:bf16,topk:0.01", false).status().message(),
            "codec 'topk' is named on its own ('topk:0.01'), never chosen by 'auto'");
  EXPECT_EQ(ParseCodecRequest("topk:0", false).status().message(),
            "codec 'topk:0': '0': the ratio is a number from 0.000001 to 1 "
            "(topk:RATIO[,warmup=OPS][,momentum=M], e.g. topk:0.01,warmup=50)");
}

TEST(CodecRequest, TheSignatureByteRoundTrips) {
  for (const char* text : {"none", "bf16", "fp16", "fp8e4m3", "fp8e5m2", "int8", "auto",
                           "auto:int8", "auto:bf16,fp8e5m2"}) {
    for (bool job : {false, true}) {
      const CodecRequest r = *ParseCodecRequest(text, job);
      const CodecRequest back = CodecRequest::FromCode(r.Code());
      EXPECT_EQ(back.Code(), r.Code()) << text;
      EXPECT_EQ(back.ToString(), r.ToString()) << text;
    }
  }
  EXPECT_EQ(ParseCodecRequest("none", false)->Code(), 0);
}

TEST(CodecRequest, AnOpsOwnCodecWinsOverTheJobs) {
  EXPECT_EQ(EffectiveCodecRequest("", "bf16")->ToString(), "bf16 (job)");
  EXPECT_EQ(EffectiveCodecRequest("none", "bf16")->ToString(), "none");
  EXPECT_EQ(EffectiveCodecRequest("int8", "auto")->ToString(), "int8");
}

}  // namespace
}  // namespace gradsync
