#include "client/fake_worker.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <utility>

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/types.h"

namespace gradsync {
namespace client {
namespace testing {
namespace {

std::atomic<int> g_live_segments{0};
std::atomic<uint64_t> g_segment_counter{0};

grpc::Status Error(grpc::StatusCode code, std::string message) {
  return grpc::Status(code, std::move(message));
}

}  // namespace

// One shm segment, mapped by the fake too; unlinked and unmapped on
// destruction (which waits for ops holding it to finish).
class FakeWorker::Segment {
 public:
  static absl::StatusOr<std::shared_ptr<Segment>> Create(uint64_t size) {
    std::string name = absl::StrCat(ShmPrefix(), g_segment_counter.fetch_add(1));
    const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) return absl::InternalError(absl::StrCat("shm_open ", name, ": ", strerror(errno)));
    if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
      const int err = errno;
      close(fd);
      shm_unlink(name.c_str());
      return absl::ResourceExhaustedError(absl::StrCat("ftruncate ", name, ": ", strerror(err)));
    }
    void* data = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int err = errno;
    close(fd);
    if (data == MAP_FAILED) {
      shm_unlink(name.c_str());
      return absl::InternalError(absl::StrCat("mmap ", name, ": ", strerror(err)));
    }
    ++g_live_segments;
    return std::shared_ptr<Segment>(new Segment(std::move(name), data, size));
  }
  ~Segment() {
    munmap(data_, size_);
    shm_unlink(name_.c_str());
    --g_live_segments;
  }
  const std::string& name() const { return name_; }
  char* data() const { return static_cast<char*>(data_); }
  uint64_t size() const { return size_; }

 private:
  Segment(std::string name, void* data, uint64_t size)
      : name_(std::move(name)), data_(data), size_(size) {}
  const std::string name_;
  void* const data_;
  const uint64_t size_;
};

struct FakeWorker::Op {
  uint64_t id = 0;
  std::string session_id;
  std::shared_ptr<Segment> segment;
  uint64_t offset_bytes = 0;
  uint64_t count = 0;
  DType dtype = DType::kF32;
  bool doubles = true;  // allreduce; gather and scatter at world size 1 move nothing
  absl::Status inject;  // complete with this instead of transforming
  absl::Time submitted;
  absl::Time started;
  absl::Time finished;
  bool done = false;
  absl::Status status;
};

namespace {
// "<pid>-<random hex>", fixed for the life of the process.
const std::string& ProcessToken() {
  static const std::string* token = [] {
    std::random_device rd;
    const uint64_t nonce = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    return new std::string(absl::StrCat(getpid(), "-", absl::Hex(nonce)));
  }();
  return *token;
}
}  // namespace

std::string FakeWorker::ShmPrefix() { return absl::StrCat("/gradsync-fake.", ProcessToken(), "."); }

std::string FakeWorker::NewAddress() {
  static std::atomic<int> n{0};
  return absl::StrCat("unix-abstract:gradsync-client-test-", ProcessToken(), "-", n++);
}

absl::StatusOr<std::unique_ptr<FakeWorker>> FakeWorker::Start(const std::string& address) {
  std::unique_ptr<FakeWorker> fake(new FakeWorker(address));
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials());
  builder.RegisterService(fake.get());
  fake->server_ = builder.BuildAndStart();
  if (fake->server_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("fake worker cannot listen on ", address));
  }
  fake->executor_ = std::thread([f = fake.get()] { f->RunOps(); });
  return fake;
}

FakeWorker::FakeWorker(std::string address) : address_(std::move(address)) {}

FakeWorker::~FakeWorker() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;  // wakes Wait handlers and the executor
  }
  if (server_ != nullptr) {
    server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
    server_->Wait();
  }
  if (executor_.joinable()) executor_.join();
  absl::MutexLock lock(&mu_);
  queue_.clear();
  ops_.clear();
  sessions_.clear();
}

void FakeWorker::set_op_delay(absl::Duration delay) {
  absl::MutexLock lock(&mu_);
  op_delay_ = delay;
}

void FakeWorker::FailNextOp(absl::Status status) {
  absl::MutexLock lock(&mu_);
  fail_next_ = std::move(status);
}

int FakeWorker::live_segments() const { return g_live_segments.load(); }

v1::OpenSessionRequest FakeWorker::last_open_request() const {
  absl::MutexLock lock(&mu_);
  return last_open_;
}

v1::SubmitRequest FakeWorker::last_submit_request() const {
  absl::MutexLock lock(&mu_);
  return last_submit_;
}

void FakeWorker::RunOps() {
  while (true) {
    std::shared_ptr<Op> op;
    absl::Duration delay;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) {
        for (auto& queued : queue_) {
          queued->status = absl::UnavailableError("fake worker shutting down");
          queued->done = true;
        }
        queue_.clear();
        return;
      }
      op = queue_.front();
      queue_.pop_front();
      op->started = absl::Now();
      delay = op_delay_;
      // Interruptible "run time".
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), delay);
      if (stopping_) {
        op->status = absl::UnavailableError("fake worker shutting down");
        op->done = true;
        continue;
      }
    }
    if (op->inject.ok()) Transform(*op);  // in place, outside the lock
    absl::MutexLock lock(&mu_);
    op->status = op->inject;
    op->finished = absl::Now();
    op->done = true;
    op->segment.reset();
  }
}

void FakeWorker::Transform(const Op& op) {
  if (!op.doubles) return;
  char* p = op.segment->data() + op.offset_bytes;
  auto twice = [&](auto* elems) {
    for (uint64_t i = 0; i < op.count; ++i) elems[i] = elems[i] * 2;
  };
  switch (op.dtype) {
    case DType::kF32: twice(reinterpret_cast<float*>(p)); break;
    case DType::kF64: twice(reinterpret_cast<double*>(p)); break;
    case DType::kI32: twice(reinterpret_cast<int32_t*>(p)); break;
    case DType::kI64: twice(reinterpret_cast<int64_t*>(p)); break;
    default: break;
  }
}

grpc::Status FakeWorker::OpenSession(grpc::ServerContext*, const v1::OpenSessionRequest* req,
                                     v1::OpenSessionResponse* resp) {
  ++rpc_count_;
  if (req->job_id().empty()) return Error(grpc::INVALID_ARGUMENT, "job_id is empty");
  if (req->world_size() < 1 || req->rank() < -1 || req->rank() >= req->world_size()) {
    return Error(grpc::INVALID_ARGUMENT,
                 absl::StrCat("bad world_size ", req->world_size(), " / rank ", req->rank()));
  }
  absl::MutexLock lock(&mu_);
  last_open_ = *req;
  const std::string id = absl::StrCat("fake-session-", next_session_++);
  sessions_[id].world_size = req->world_size();
  resp->set_session_id(id);
  resp->set_rank(req->rank() < 0 ? 0 : req->rank());
  resp->set_world_size(req->world_size());
  resp->set_epoch(1);
  return grpc::Status::OK;
}

grpc::Status FakeWorker::AllocateBuffer(grpc::ServerContext*, const v1::AllocateBufferRequest* req,
                                        v1::AllocateBufferResponse* resp) {
  ++rpc_count_;
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(req->session_id());
  if (it == sessions_.end()) {
    return Error(grpc::NOT_FOUND, absl::StrCat("no session ", req->session_id()));
  }
  if (req->size_bytes() == 0) return Error(grpc::INVALID_ARGUMENT, "size_bytes is 0");
  absl::StatusOr<std::shared_ptr<Segment>> segment = Segment::Create(req->size_bytes());
  if (!segment.ok()) return ToGrpcStatus(segment.status());
  const uint64_t id = next_buffer_++;
  it->second.buffers[id] = *segment;
  resp->set_buffer_id(id);
  resp->set_shm_name((*segment)->name());
  resp->set_size_bytes((*segment)->size());
  return grpc::Status::OK;
}

grpc::Status FakeWorker::FreeBuffer(grpc::ServerContext*, const v1::FreeBufferRequest* req,
                                    v1::FreeBufferResponse*) {
  ++rpc_count_;
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(req->session_id());
  if (it == sessions_.end()) {
    return Error(grpc::NOT_FOUND, absl::StrCat("no session ", req->session_id()));
  }
  if (it->second.buffers.erase(req->buffer_id()) == 0) {
    return Error(grpc::NOT_FOUND, absl::StrCat("no buffer ", req->buffer_id()));
  }
  return grpc::Status::OK;
}

grpc::Status FakeWorker::Submit(grpc::ServerContext*, const v1::SubmitRequest* req,
                                v1::SubmitResponse* resp) {
  ++rpc_count_;
  absl::MutexLock lock(&mu_);
  last_submit_ = *req;
  auto it = sessions_.find(req->session_id());
  if (it == sessions_.end()) {
    return Error(grpc::NOT_FOUND, absl::StrCat("no session ", req->session_id()));
  }
  SessionState& session = it->second;
  if (session.world_size != 1) {
    return Error(grpc::UNIMPLEMENTED, "the fake worker runs world_size 1 only");
  }
  auto buf = session.buffers.find(req->buffer_id());
  if (buf == session.buffers.end()) {
    return Error(grpc::NOT_FOUND, absl::StrCat("no buffer ", req->buffer_id()));
  }
  const bool rooted = req->collective() == v1::COLLECTIVE_TYPE_GATHER ||
                      req->collective() == v1::COLLECTIVE_TYPE_SCATTER;
  if ((req->collective() != v1::COLLECTIVE_TYPE_ALLREDUCE && !rooted) ||
      (rooted && req->root() != 0) || !IsValidDType(req->dtype()) ||
      !IsValidReduceOp(req->reduce_op()) || req->count() == 0) {
    return Error(grpc::INVALID_ARGUMENT, "bad collective, dtype, reduce op or count");
  }
  const DType dtype = static_cast<DType>(req->dtype());
  const uint64_t size = buf->second->size();
  if (req->offset_bytes() > size || req->count() > (size - req->offset_bytes()) / DTypeSize(dtype)) {
    return Error(grpc::INVALID_ARGUMENT, "range outside the buffer");
  }
  auto op = std::make_shared<Op>();
  op->id = next_op_++;
  op->session_id = req->session_id();
  op->segment = buf->second;
  op->offset_bytes = req->offset_bytes();
  op->count = req->count();
  op->dtype = dtype;
  op->doubles = !rooted;
  op->inject = std::move(fail_next_);
  fail_next_ = absl::OkStatus();
  op->submitted = absl::Now();
  ops_[op->id] = op;
  queue_.push_back(op);
  resp->set_op_id(op->id);
  resp->set_sequence(session.next_sequence++);
  return grpc::Status::OK;
}

grpc::Status FakeWorker::Wait(grpc::ServerContext*, const v1::WaitRequest* req,
                              v1::WaitResponse* resp) {
  ++rpc_count_;
  absl::MutexLock lock(&mu_);
  auto it = ops_.find(req->op_id());
  if (it == ops_.end() || it->second->session_id != req->session_id()) {
    return Error(grpc::NOT_FOUND,
                 absl::StrCat("no op ", req->op_id(), " in session ", req->session_id()));
  }
  std::shared_ptr<Op> op = it->second;
  auto finished = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return op->done || stopping_; };
  mu_.AwaitWithTimeout(absl::Condition(&finished), absl::Milliseconds(req->timeout_ms()));
  if (!op->done) {
    if (stopping_) return Error(grpc::UNAVAILABLE, "fake worker shutting down");
    resp->set_done(false);
    return grpc::Status::OK;
  }
  if (!op->status.ok()) return ToGrpcStatus(op->status);
  resp->set_done(true);
  resp->set_algorithm("fake-local");
  resp->set_queued_us(absl::ToInt64Microseconds(op->started - op->submitted));
  resp->set_run_us(absl::ToInt64Microseconds(op->finished - op->started));
  return grpc::Status::OK;
}

grpc::Status FakeWorker::CloseSession(grpc::ServerContext*, const v1::CloseSessionRequest* req,
                                      v1::CloseSessionResponse*) {
  ++rpc_count_;
  absl::MutexLock lock(&mu_);
  if (sessions_.erase(req->session_id()) == 0) {
    return Error(grpc::NOT_FOUND, absl::StrCat("no session ", req->session_id()));
  }
  return grpc::Status::OK;
}

grpc::Status FakeWorker::OpenOpQueue(grpc::ServerContext*, const v1::OpenOpQueueRequest*,
                                     v1::OpenOpQueueResponse*) {
  ++rpc_count_;
  ++open_op_queue_calls_;
  return Error(grpc::UNIMPLEMENTED, "the fake worker has no shared-memory op queue");
}

}  // namespace testing
}  // namespace client
}  // namespace gradsync
