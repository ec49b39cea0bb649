#include "common/tls.h"

#include <sys/stat.h>
#include <unistd.h>

#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/certs.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

std::string Dir(const char* name) {
  return absl::StrCat(::testing::TempDir(), "/", name, "-", ::getpid());
}

TEST(Tls, SubjectFieldsAreReadAsGrpcPrintsThem) {
  EXPECT_EQ(SubjectField("CN=lab-node,OU=node,O=gradsync", "OU"), "node");
  EXPECT_EQ(SubjectField("O=gradsync, OU=operator, CN=alice", "CN"), "alice");
  EXPECT_EQ(SubjectField("CN=x", "OU"), "");
}

TEST(Tls, AConfigNeedsAllThreeReadableFiles) {
  TlsConfig none;
  EXPECT_FALSE(none.enabled());
  auto insecure = MakeServerCredentials(none);
  EXPECT_TRUE(insecure.ok());
  TlsConfig partial;
  partial.cert = "/nonexistent/cert.pem";
  EXPECT_TRUE(partial.enabled());
  auto s = MakeServerCredentials(partial);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message(),
            "TLS needs --tls_cert, --tls_key and --tls_ca together; --tls_key is missing");
  partial.key = partial.ca = "/nonexistent/x.pem";
  auto c = MakeChannelCredentials(partial);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), "--tls_cert '/nonexistent/cert.pem' cannot be read");
}

// The lab certificates chain to their CA, carry the role as OU and the hosts
// as subject alternative names, and their keys are private.
TEST(LabCerts, EachRoleIsSignedByTheCaAndNamesTheHosts) {
  auto certs = MakeLabCerts(Dir("labcerts"), {"node-a.example", "10.0.0.7"});
  ASSERT_TRUE(certs.ok()) << certs.status();
  FILE* f = std::fopen(certs->ca.c_str(), "r");
  ASSERT_NE(f, nullptr);
  X509* ca = PEM_read_X509(f, nullptr, nullptr, nullptr);
  std::fclose(f);
  ASSERT_NE(ca, nullptr);
  for (const auto& [role, config] : {std::pair<std::string, TlsConfig>{"coordinator",
                                                                      certs->coordinator},
                                     {"node", certs->node},
                                     {"ps", certs->ps},
                                     {"operator", certs->operator_}}) {
    EXPECT_TRUE(config.Validate().ok()) << role;
    FILE* cf = std::fopen(config.cert.c_str(), "r");
    ASSERT_NE(cf, nullptr);
    X509* cert = PEM_read_X509(cf, nullptr, nullptr, nullptr);
    std::fclose(cf);
    ASSERT_NE(cert, nullptr);
    char ou[64] = "";
    X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_organizationalUnitName, ou,
                              sizeof(ou));
    EXPECT_EQ(std::string(ou), role);
    EXPECT_EQ(X509_verify(cert, X509_get0_pubkey(ca)), 1) << role;
    EXPECT_EQ(X509_check_host(cert, "node-a.example", 0, 0, nullptr), 1) << role;
    EXPECT_EQ(X509_check_ip_asc(cert, "10.0.0.7", 0), 1) << role;
    EXPECT_EQ(X509_check_ip_asc(cert, "127.0.0.1", 0), 1) << role;
    X509_free(cert);
    struct stat st;
    ASSERT_EQ(::stat(config.key.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u) << role;
  }
  X509_free(ca);
}

}  // namespace
}  // namespace gradsync
