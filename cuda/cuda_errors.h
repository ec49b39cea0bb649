// Status values for failed CUDA calls, shared by the host-side CUDA sources
// (cuda_reduce.cc, cuda_memory.cc). Host C++ only; no CUDA headers.
#ifndef GRADSYNC_CUDA_CUDA_ERRORS_H_
#define GRADSYNC_CUDA_CUDA_ERRORS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace gradsync::cuda::internal {

// "CUDA driver version is insufficient for CUDA runtime version (cudaErrorInsufficientDriver)"
std::string CudaErrorText(int code);

// A failed CUDA call: clears the thread's last error (when it is not sticky) and
// returns kInternal naming the call, or kResourceExhausted for out-of-memory.
absl::Status CudaCallError(absl::string_view call, int code);

}  // namespace gradsync::cuda::internal

#endif  // GRADSYNC_CUDA_CUDA_ERRORS_H_
