// The wire between the verbs emulations of several processes on one host
// (EmulationOptions::fabric), so that daemons in separate processes can run
// the RDMA transport against the emulation as they would against NICs.
//
// Each process binds the abstract unix socket
// "@gradsync-verbs-emulation/<fabric>/<node>" for the lowest free node
// number (1, 2, ...; the bind is the allocation), dials the other nodes for
// the work requests its queue pairs send, and answers each request on the
// connection it came in on. Frames are a 4-byte length and a body. Only
// processes of the same uid are served (SO_PEERCRED). A testing device: it
// stands in for a NIC and a switch, nothing in production listens on it.
//
// Thread-safety: Send and Reply may be called from any thread, also while the
// caller holds its own lock; they only queue. The handler is called from the
// link's one I/O thread with no lock of the link held.
#ifndef GRADSYNC_RDMA_VERBS_EMULATION_LINK_H_
#define GRADSYNC_RDMA_VERBS_EMULATION_LINK_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/net.h"

namespace gradsync::rdma {

class EmulationLink {
 public:
  class Handler {
   public:
    virtual ~Handler() = default;
    // A frame another node sent us; answer it with Reply(conn, ...).
    virtual void OnRequest(uint64_t conn, absl::string_view body) = 0;
    // An answer from `node` to a frame we sent it (in the order sent).
    virtual void OnReply(int node, absl::string_view body) = 0;
    // Our connection to `node` failed or could not be made: frames sent to it
    // and not answered are lost.
    virtual void OnNodeLost(int node, const std::string& why) = 0;
  };

  static constexpr int kMaxNodes = 4000;
  static constexpr size_t kMaxFrame = (size_t{1} << 30) + 4096;

  // Binds the lowest free node number of `fabric` (1..kMaxNodes). Nothing
  // is read or dialed before Start.
  static absl::StatusOr<std::unique_ptr<EmulationLink>> Open(const std::string& fabric);
  ~EmulationLink();  // stops the I/O thread, flushes queued answers (2 s at most); no handler call after it

  // Starts the I/O thread, which calls `handler` (it outlives the link).
  void Start(Handler* handler);

  int node() const { return node_; }
  const std::string& fabric() const { return fabric_; }
  void Send(int node, std::string body);
  void Reply(uint64_t conn, std::string body);

 private:
  struct Conn {
    UniqueFd fd;
    int node = 0;          // dialed: the node; accepted: 0
    std::string in;        // bytes read, not yet a whole frame
    std::deque<std::string> out;
    size_t out_offset = 0;  // of out.front(), already written
  };
  EmulationLink(std::string fabric, int node, UniqueFd listener);
  void Loop();
  // Queues a frame on `c` (mu_ held).
  static void Queue(Conn& c, std::string body);
  // Reads what is there and hands whole frames to the handler, also those
  // that came just before the end; false when the connection ended (*why).
  bool ReadFrames(uint64_t id, Conn& c, std::string* why);
  bool WriteQueued(Conn& c, std::string* why);
  // After the I/O thread stopped: writes what is still queued, until `deadline`.
  void FlushQueued(absl::Time deadline);
  void Wake();

  const std::string fabric_;
  const int node_;
  UniqueFd listener_;
  UniqueFd wake_;  // eventfd
  Handler* handler_ = nullptr;

  std::mutex mu_;
  bool stop_ = false;
  uint64_t next_id_ = 1;
  std::map<uint64_t, std::unique_ptr<Conn>> conns_;  // by id
  std::map<int, uint64_t> dialed_;                    // node -> conn id
  std::map<int, std::deque<std::string>> to_dial_;    // frames for nodes not dialed yet
  std::thread thread_;
};

// The abstract socket name of `node` on `fabric` (without the leading NUL).
std::string EmulationSocketName(absl::string_view fabric, int node);

}  // namespace gradsync::rdma

#endif  // GRADSYNC_RDMA_VERBS_EMULATION_LINK_H_
