// Registering client memory with gradsyncd by passing its file descriptor.
//
// A training process that already holds its tensors in file-backed shared
// memory (a memfd) hands the daemon the descriptor instead of copying the
// bytes into a daemon-made buffer: both then map the same pages. gRPC cannot
// carry descriptors, so the daemon listens on a unix SOCK_SEQPACKET socket
// (its "fd socket", announced in OpenSessionResponse) where each connection
// carries one request with the descriptor attached (SCM_RIGHTS) and gets one
// response:
//
//   client -> daemon: RegisterRequestWire (40 bytes) + session id bytes, fd
//   daemon -> client: RegisterResponseWire (24 bytes) + message bytes
//
// The request proves the session with the registration token the daemon
// handed that session's client in OpenSessionResponse (16 random bytes): a
// session id alone is guessable, the token is not. The daemon also reads the
// peer's pid/uid (SO_PEERCRED) for its logs.
//
// The descriptor must be a regular file (memfd_create, or a file on tmpfs)
// opened read-write and sealed against shrinking (F_SEAL_SHRINK): a file
// that shrank under the daemon's mapping would make it fault (SIGBUS).
//
// The same socket hands out the descriptors of segments the daemon made for a
// session (sealed memfds, ipc/shared_memory.h): a FetchRequestWire names the
// session (with its token), the kind and id of the segment, and the answer
// is a RegisterResponseWire with the descriptor attached. Each segment's
// descriptor is handed out once.
//
// Everything here is stateless; both the SDK and the daemon link it.
#ifndef GRADSYNC_IPC_FD_REGISTRATION_H_
#define GRADSYNC_IPC_FD_REGISTRATION_H_

#include <sys/socket.h>
#include <sys/un.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/net.h"

namespace gradsync::ipc {

inline constexpr uint32_t kRegisterRequestMagic = 0x52444647;   // "GFDR"
inline constexpr uint32_t kRegisterResponseMagic = 0x41444647;  // "GFDA"
inline constexpr uint32_t kFetchRequestMagic = 0x46444647;      // "GFDF"
inline constexpr uint16_t kFdProtocolVersion = 1;
inline constexpr size_t kRegistrationTokenBytes = 16;
inline constexpr size_t kMaxSessionIdBytes = 256;
inline constexpr size_t kMaxResponseMessageBytes = 1024;

struct RegisterRequestWire {
  uint32_t magic;           // kRegisterRequestMagic
  uint16_t version;         // kFdProtocolVersion
  uint16_t session_id_len;  // bytes that follow this struct
  uint8_t token[kRegistrationTokenBytes];
  uint64_t offset;  // byte offset of the registered range in the file (page-aligned)
  uint64_t size;    // bytes registered
};
static_assert(sizeof(RegisterRequestWire) == 40, "RegisterRequestWire is 40 bytes on the wire");

struct RegisterResponseWire {
  uint32_t magic;        // kRegisterResponseMagic
  uint16_t code;         // absl::StatusCode; 0 = registered
  uint16_t message_len;  // bytes that follow this struct
  uint64_t buffer_id;    // the session's id of the new buffer
  uint64_t size;         // bytes registered
};
static_assert(sizeof(RegisterResponseWire) == 24, "RegisterResponseWire is 24 bytes on the wire");

// What a fetch asks for.
enum class SegmentKind : uint32_t {
  kBuffer = 1,   // a buffer of AllocateBuffer (id: the buffer id)
  kOpQueue = 2,  // the session's op queue of OpenOpQueue (id: 0)
};

struct FetchRequestWire {
  uint32_t magic;           // kFetchRequestMagic
  uint16_t version;         // kFdProtocolVersion
  uint16_t session_id_len;  // bytes that follow this struct
  uint8_t token[kRegistrationTokenBytes];
  uint32_t kind;  // SegmentKind
  uint32_t reserved;
  uint64_t id;
};
static_assert(sizeof(FetchRequestWire) == 40, "FetchRequestWire is 40 bytes on the wire");

struct RegisterRequest {
  std::string session_id;
  std::string token;  // kRegistrationTokenBytes bytes
  uint64_t offset = 0;
  uint64_t size = 0;
};

struct RegisterResponse {
  absl::Status status;  // OK: registered
  uint64_t buffer_id = 0;
  uint64_t size = 0;
};

struct FetchRequest {
  std::string session_id;
  std::string token;  // kRegistrationTokenBytes bytes
  SegmentKind kind = SegmentKind::kBuffer;
  uint64_t id = 0;
};

// The magic number a request starts with (0 for fewer than 4 bytes): tells a
// registration from a fetch.
uint32_t RequestMagic(absl::string_view bytes);
std::string EncodeRequest(const RegisterRequest& r);
// InvalidArgument naming what is wrong (magic, version, lengths).
absl::StatusOr<RegisterRequest> DecodeRequest(absl::string_view bytes);
std::string EncodeFetchRequest(const FetchRequest& r);
// InvalidArgument naming what is wrong (magic, version, lengths, kind).
absl::StatusOr<FetchRequest> DecodeFetchRequest(absl::string_view bytes);
std::string EncodeResponse(const RegisterResponse& r);
absl::StatusOr<RegisterResponse> DecodeResponse(absl::string_view bytes);

// A unix socket address: "unix:PATH" or "unix-abstract:NAME".
struct UnixAddress {
  struct sockaddr_un addr {};
  socklen_t len = 0;
  std::string text;  // as parsed
  bool abstract = false;
  std::string path;  // the file system path (empty for abstract names)
};
absl::StatusOr<UnixAddress> ParseUnixAddress(absl::string_view text);

// A listening SOCK_SEQPACKET socket (non-blocking, close-on-exec). A path
// socket replaces a stale file and gets `mode`.
absl::StatusOr<UniqueFd> ListenSeqpacket(const UnixAddress& address, mode_t mode);
// The same for any socket type (SOCK_STREAM for the gRPC client socket);
// errors name the socket as `what`.
absl::StatusOr<UniqueFd> ListenUnix(const UnixAddress& address, int type, mode_t mode,
                                    absl::string_view what);
absl::StatusOr<UniqueFd> ConnectSeqpacket(const UnixAddress& address, absl::Time deadline);

// Sends one message with `fd` attached (-1: none) by `deadline`.
absl::Status SendMessage(int sock, absl::string_view bytes, int fd, absl::Time deadline);
// Receives one message of at most `max_bytes` and at most one descriptor
// (into *fd; extra descriptors are closed and refused). InvalidArgument for a
// longer message, DeadlineExceeded, Unavailable when the peer closed.
absl::StatusOr<std::string> ReceiveMessage(int sock, size_t max_bytes, UniqueFd* fd,
                                           absl::Time deadline);

// The client's whole exchange: connects to the daemon's fd socket, sends the
// request with `fd`, returns the daemon's response (its status carries the
// daemon's code and message).
absl::StatusOr<RegisterResponse> RegisterFd(const std::string& fd_socket,
                                            const RegisterRequest& request, int fd,
                                            absl::Time deadline);

// A fetched segment: its descriptor and size.
struct FetchedSegment {
  UniqueFd fd;
  uint64_t size = 0;
};

// The client's fetch: the daemon's refusal comes back as the status (its code
// and message); an OK answer without a descriptor is DataLoss.
absl::StatusOr<FetchedSegment> FetchSegment(const std::string& fd_socket,
                                            const FetchRequest& request, absl::Time deadline);

// `n` random bytes from the kernel (getrandom).
absl::StatusOr<std::string> RandomBytes(size_t n);

}  // namespace gradsync::ipc

#endif  // GRADSYNC_IPC_FD_REGISTRATION_H_
