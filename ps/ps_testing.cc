#include "ps/ps_testing.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cstring>
#include <random>
#include <thread>

#include "gtest/gtest.h"
#include "common/fp8.h"
#include "common/status_macros.h"
#include "kernels/cpu_reduce.h"
#include "ps/protocol.h"
#include "transport/wire.h"

namespace gradsync::ps::testing {

std::vector<char> RandomData(DType t, size_t count, int rank, uint32_t seed) {
  std::mt19937 rng(seed * 977 + rank);
  std::uniform_real_distribution<double> real(-3.0, 3.0);
  const size_t es = DTypeSize(t);
  std::vector<char> out(count * es);
  for (size_t i = 0; i < count; ++i) {
    char* p = out.data() + i * es;
    switch (t) {
      case DType::kF32: {
        float v = static_cast<float>(real(rng));
        std::memcpy(p, &v, 4);
        break;
      }
      case DType::kF64: {
        double v = real(rng);
        std::memcpy(p, &v, 8);
        break;
      }
      case DType::kF16: {
        uint16_t v = FloatToHalf(static_cast<float>(real(rng)));
        std::memcpy(p, &v, 2);
        break;
      }
      case DType::kBF16: {
        uint16_t v = FloatToBFloat16(static_cast<float>(real(rng)));
        std::memcpy(p, &v, 2);
        break;
      }
      case DType::kI32: {
        int32_t v = static_cast<int32_t>(rng());
        std::memcpy(p, &v, 4);
        break;
      }
      case DType::kI64: {
        int64_t v = (static_cast<int64_t>(rng()) << 32) | rng();
        std::memcpy(p, &v, 8);
        break;
      }
      case DType::kU8: {
        uint8_t v = static_cast<uint8_t>(rng());
        std::memcpy(p, &v, 1);
        break;
      }
      case DType::kF8E4M3: *p = static_cast<char>(FloatToFp8E4M3(static_cast<float>(real(rng)))); break;
      case DType::kF8E5M2: *p = static_cast<char>(FloatToFp8E5M2(static_cast<float>(real(rng)))); break;
    }
  }
  return out;
}

std::vector<char> RankOrderReference(const std::vector<std::vector<char>>& inputs, DType t,
                                     ReduceOp op, size_t count) {
  std::vector<char> acc = inputs[0];
  for (size_t r = 1; r < inputs.size(); ++r) ReduceInto(t, op, acc.data(), inputs[r].data(), count);
  if (op == ReduceOp::kAvg && inputs.size() > 1) {
    DivideBy(t, acc.data(), count, static_cast<int64_t>(inputs.size()));
  }
  return acc;
}

std::vector<std::unique_ptr<PsShard>> StartShards(int n, PsShardOptions options) {
  std::vector<std::unique_ptr<PsShard>> out;
  options.listen = {"127.0.0.1", 0};
  for (int i = 0; i < n; ++i) {
    auto s = PsShard::Start(options);
    EXPECT_TRUE(s.ok()) << s.status();
    if (s.ok()) out.push_back(std::move(*s));
  }
  return out;
}

std::vector<HostPort> Addresses(const std::vector<std::unique_ptr<PsShard>>& shards) {
  std::vector<HostPort> out;
  for (const auto& s : shards) out.push_back({"127.0.0.1", s->port()});
  return out;
}

std::vector<std::unique_ptr<PsWorker>> MakeWorkers(int n, const std::string& job,
                                                   const std::vector<HostPort>& shards,
                                                   int max_inflight) {
  std::vector<std::unique_ptr<PsWorker>> out;
  for (int r = 0; r < n; ++r) {
    PsWorkerOptions o;
    o.job_id = job;
    o.epoch = 1;
    o.shards = shards;
    o.max_inflight = max_inflight;
    auto w = PsWorker::Create(o);
    EXPECT_TRUE(w.ok()) << w.status();
    if (w.ok()) out.push_back(std::move(*w));
  }
  return out;
}

std::vector<absl::Status> RunRanks(const std::vector<int>& ranks,
                                   const std::function<absl::Status(int)>& fn) {
  std::vector<absl::Status> st(ranks.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ranks.size(); ++i) {
    threads.emplace_back([&, i] { st[i] = fn(ranks[i]); });
  }
  for (auto& t : threads) t.join();
  return st;
}

absl::StatusOr<UniqueFd> ConnectToShard(const HostPort& addr, const std::string& ps_job_id,
                                        uint64_t epoch, int rank, int workers, int shard,
                                        absl::Time deadline, int socket_buffer_bytes,
                                        const std::string& key) {
  ASSIGN_OR_RETURN(UniqueFd fd, TcpConnect(addr, deadline));
  transport::Hello hello{transport::kHelloMagic,
                         transport::kWireVersion,
                         static_cast<uint16_t>(ps_job_id.size()),
                         epoch,
                         rank,
                         shard,
                         workers,
                         0};
  RETURN_IF_ERROR(WriteFull(fd.get(), &hello, sizeof(hello), deadline));
  RETURN_IF_ERROR(WriteFull(fd.get(), ps_job_id.data(), ps_job_id.size(), deadline));
  const std::string nonce = transport::RandomNonce();
  RETURN_IF_ERROR(WriteFull(fd.get(), nonce.data(), nonce.size(), deadline));
  RETURN_IF_ERROR(transport::ReadHelloAck(fd.get(), deadline));
  // The shard proves the key first, then this side (transport/wire.h).
  std::string shard_nonce(transport::kNonceBytes, '\0'), proof(transport::kProofBytes, '\0');
  RETURN_IF_ERROR(ReadFull(fd.get(), shard_nonce.data(), shard_nonce.size(), deadline));
  RETURN_IF_ERROR(ReadFull(fd.get(), proof.data(), proof.size(), deadline));
  if (!transport::ProofsEqual(proof, transport::HandshakeProof(key, transport::HandshakeRole::kAcceptor,
                                                               hello, ps_job_id, nonce, shard_nonce))) {
    return absl::UnauthenticatedError("the shard did not prove the job's key");
  }
  const std::string mine = transport::HandshakeProof(key, transport::HandshakeRole::kConnector, hello,
                                                     ps_job_id, shard_nonce, nonce);
  RETURN_IF_ERROR(WriteFull(fd.get(), mine.data(), mine.size(), deadline));
  RETURN_IF_ERROR(transport::ReadHelloAck(fd.get(), deadline));  // the shard's admission
  RETURN_IF_ERROR(TuneDataSocket(fd.get(), socket_buffer_bytes));
  return fd;
}

absl::Status WriteFrame(int fd, const transport::FrameHeader& h, const void* payload, absl::Time deadline) {
  const size_t total = sizeof(h) + h.length;
  size_t done = 0;
  while (done < total) {
    struct iovec iov[2];
    int n = 0;
    if (done < sizeof(h)) {
      iov[n++] = {const_cast<char*>(reinterpret_cast<const char*>(&h)) + done, sizeof(h) - done};
      if (h.length > 0) iov[n++] = {const_cast<void*>(payload), h.length};
    } else {
      iov[n++] = {const_cast<char*>(static_cast<const char*>(payload)) + (done - sizeof(h)),
                  total - done};
    }
    struct msghdr m = {};
    m.msg_iov = iov;
    m.msg_iovlen = n;
    const ssize_t w = ::sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w >= 0) {
      done += static_cast<size_t>(w);
      continue;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return absl::UnavailableError(absl::StrCat("write: ", ErrnoString(errno)));
    }
    struct pollfd p = {fd, POLLOUT, 0};
    const int r = ::poll(&p, 1, PollTimeoutMs(deadline));
    if (r == 0) return absl::DeadlineExceededError("write timed out");
    if (r < 0 && errno != EINTR) return absl::InternalError("poll: " + ErrnoString(errno));
  }
  return absl::OkStatus();
}

}  // namespace gradsync::ps::testing
