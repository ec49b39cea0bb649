// gradsyncd --socket_group: the group that may connect to the daemon's unix
// sockets (the gRPC client socket and the fd socket, both mode 0660).
//
// Only a socket file has permissions. An abstract socket (unix-abstract:)
// has none: every process of the network namespace can connect to it, and
// SO_PEERCRED names only the peer's primary group, not its supplementary
// ones, so the daemon cannot check membership on accept either. A group
// with an abstract socket is therefore refused at start-up.
#ifndef GRADSYNC_WORKER_SOCKET_GROUP_H_
#define GRADSYNC_WORKER_SOCKET_GROUP_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "ipc/fd_registration.h"

namespace gradsync {

// OK when `group` ("" = the daemon's own) can restrict `address`:
// INVALID_ARGUMENT naming `what` for a group with an abstract socket.
absl::Status CheckSocketGroup(const ipc::UnixAddress& address, const std::string& group,
                              absl::string_view what);

// Gives the bound path socket `address` the group `group` (nothing for "").
// INVALID_ARGUMENT: an unknown group, or CheckSocketGroup's refusal;
// PERMISSION_DENIED: chown failed.
absl::Status ApplySocketGroup(const ipc::UnixAddress& address, const std::string& group,
                              absl::string_view what);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_SOCKET_GROUP_H_
