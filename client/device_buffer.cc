// Session::AllocateDeviceBuffer and RegisterDeviceBuffer: CUDA memory shared
// with the daemon by IPC handle, the GPU named by UUID.
#include <unistd.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/op_channel.h"
#include "common/status_macros.h"
#include "cuda/cuda_memory.h"
#include "cuda/cuda_reduce.h"

namespace gradsync {
namespace client {
namespace {

absl::Status Prefixed(absl::string_view what, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

// OK when this process can use CUDA; the reason otherwise.
absl::Status LocalCuda(absl::string_view what) {
  absl::Status s = cuda::CudaUsable();
  if (s.ok()) return s;
  return absl::FailedPreconditionError(
      absl::StrCat(what, ": device buffers need CUDA in this process: ", s.message()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Buffer>> Session::AllocateDeviceBuffer(size_t bytes, int cuda_device) {
  constexpr absl::string_view kWhat = "AllocateDeviceBuffer";
  RETURN_IF_ERROR(CheckOpen());
  if (bytes == 0) return absl::InvalidArgumentError("AllocateDeviceBuffer: bytes must be > 0, got 0");
  RETURN_IF_ERROR(LocalCuda(kWhat));
  absl::StatusOr<std::string> uuid = cuda::DeviceUuid(cuda_device);
  if (!uuid.ok()) return Prefixed(absl::StrCat(kWhat, " on CUDA device ", cuda_device), uuid.status());

  v1::AllocateBufferRequest req;
  req.set_session_id(id_);
  req.set_size_bytes(bytes);
  req.set_gpu_uuid(*uuid);
  v1::AllocateBufferResponse resp;
  RETURN_IF_ERROR(CallWhileAlive(*ops_, *conn_, "AllocateBuffer", [&](auto* ctx, auto done) {
    conn_->stub->async()->AllocateBuffer(ctx, &req, &resp, std::move(done));
  }));
  absl::Status error;
  std::shared_ptr<cuda::IpcMapping> mapping;
  if (resp.gpu_uuid() != *uuid || resp.size_bytes() < bytes) {
    error = absl::InternalError(absl::StrCat("gradsyncd at ", conn_->target, " returned a ",
                                             resp.size_bytes(), "-byte buffer on '", resp.gpu_uuid(),
                                             "' for ", bytes, " bytes on ", *uuid));
  } else {
    absl::StatusOr<cuda::IpcMapping> opened = cuda::IpcMapping::Open(cuda_device, resp.cuda_ipc_handle());
    if (opened.ok()) {
      mapping = std::make_shared<cuda::IpcMapping>(*std::move(opened));
    } else {
      error = Prefixed(kWhat, opened.status());
    }
  }
  if (!error.ok()) {
    v1::FreeBufferRequest free_req;
    free_req.set_session_id(id_);
    free_req.set_buffer_id(resp.buffer_id());
    v1::FreeBufferResponse free_resp;
    (void)CallWhileAlive(*ops_, *conn_, "FreeBuffer", [&](auto* ctx, auto done) {
      conn_->stub->async()->FreeBuffer(ctx, &free_req, &free_resp, std::move(done));
    });
    return error;
  }
  void* data = mapping->base();
  return std::unique_ptr<Buffer>(new Buffer(id_, resp.buffer_id(),
                                            absl::StrCat("device buffer ", resp.buffer_id(), " on ", *uuid),
                                            data, resp.size_bytes(), cuda_device, *uuid,
                                            std::move(mapping)));
}

absl::StatusOr<std::unique_ptr<Buffer>> Session::RegisterDeviceBuffer(void* device_ptr, size_t bytes) {
  constexpr absl::string_view kWhat = "RegisterDeviceBuffer";
  RETURN_IF_ERROR(CheckOpen());
  if (bytes == 0) return absl::InvalidArgumentError("RegisterDeviceBuffer: bytes must be > 0, got 0");
  if (device_ptr == nullptr) return absl::InvalidArgumentError("RegisterDeviceBuffer: device_ptr is null");
  RETURN_IF_ERROR(LocalCuda(kWhat));
  absl::StatusOr<int> device = cuda::DeviceOfPointer(device_ptr);
  if (!device.ok()) return Prefixed(kWhat, device.status());
  RETURN_IF_ERROR(cuda::SetDevice(*device));
  absl::StatusOr<cuda::IpcExport> exported = cuda::ExportIpc(device_ptr);
  if (!exported.ok()) return Prefixed(kWhat, exported.status());
  if (exported->offset > exported->allocation_bytes ||
      bytes > exported->allocation_bytes - exported->offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RegisterDeviceBuffer: [ptr, ptr+", bytes, ") runs past the end of its ",
        exported->allocation_bytes, "-byte allocation (ptr is at offset ", exported->offset, ")"));
  }
  ASSIGN_OR_RETURN(std::string uuid, cuda::DeviceUuid(*device));

  v1::RegisterDeviceBufferRequest req;
  req.set_session_id(id_);
  req.set_gpu_uuid(uuid);
  req.set_cuda_ipc_handle(exported->handle);
  req.set_offset_bytes(exported->offset);
  req.set_size_bytes(bytes);
  req.set_client_pid(::getpid());
  v1::RegisterDeviceBufferResponse resp;
  RETURN_IF_ERROR(CallWhileAlive(*ops_, *conn_, "RegisterDeviceBuffer", [&](auto* ctx, auto done) {
    conn_->stub->async()->RegisterDeviceBuffer(ctx, &req, &resp, std::move(done));
  }));
  return std::unique_ptr<Buffer>(new Buffer(
      id_, resp.buffer_id(), absl::StrCat("registered device memory on ", uuid), device_ptr, bytes,
      *device, uuid, nullptr));
}

}  // namespace client
}  // namespace gradsync
