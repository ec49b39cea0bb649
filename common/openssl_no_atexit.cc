// Linked into test binaries that make TLS connections in their own process
// (alwayslink): keeps OpenSSL from cleaning up at exit, as InitProcess does
// for every gradsync binary (common/process.cc says why). At static
// initialization, before gRPC initializes OpenSSL.
#include "common/process.h"

namespace gradsync {
namespace {

const bool kOpenSslKeptAtExit = [] {
  KeepOpenSslAtExit();
  return true;
}();

}  // namespace
}  // namespace gradsync
