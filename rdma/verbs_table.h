// The libibverbs calls gradsync makes, as one table of function pointers (the
// shape of NCCL's ibvwrap): production uses RealVerbs(), which calls
// libibverbs; tests use rdma/verbs_emulation.h, an in-process emulation with
// RC semantics. Everything in rdma/ and the RDMA transport calls verbs only
// through a table, so the protocol logic runs the same against both.
//
// The signatures are libibverbs' own (the data-path calls ibv_post_send,
// ibv_post_recv and ibv_poll_cq are inline functions there; here they are
// entries like the rest).
#ifndef GRADSYNC_RDMA_VERBS_TABLE_H_
#define GRADSYNC_RDMA_VERBS_TABLE_H_

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>

namespace gradsync::rdma {

struct VerbsTable {
  const char* name;  // "libibverbs", "emulation": for logs and errors
  ibv_device** (*get_device_list)(int* num_devices);
  void (*free_device_list)(ibv_device** list);
  const char* (*get_device_name)(ibv_device* device);
  uint64_t (*get_device_guid)(ibv_device* device);  // network byte order, as libibverbs
  ibv_context* (*open_device)(ibv_device* device);
  int (*close_device)(ibv_context* context);
  int (*query_device)(ibv_context* context, ibv_device_attr* attr);
  int (*query_port)(ibv_context* context, uint8_t port_num, ibv_port_attr* attr);
  int (*query_gid)(ibv_context* context, uint8_t port_num, int index, ibv_gid* gid);
  // The GID and its type (RoCE v1 / v2, IB) at `index`.
  int (*query_gid_ex)(ibv_context* context, uint32_t port_num, uint32_t index,
                      ibv_gid_entry* entry, uint32_t flags);
  ibv_pd* (*alloc_pd)(ibv_context* context);
  int (*dealloc_pd)(ibv_pd* pd);
  ibv_mr* (*reg_mr)(ibv_pd* pd, void* addr, size_t length, int access);
  ibv_mr* (*reg_dmabuf_mr)(ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                           int access);
  int (*dereg_mr)(ibv_mr* mr);
  ibv_comp_channel* (*create_comp_channel)(ibv_context* context);
  int (*destroy_comp_channel)(ibv_comp_channel* channel);
  ibv_cq* (*create_cq)(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                       int comp_vector);
  int (*destroy_cq)(ibv_cq* cq);
  int (*poll_cq)(ibv_cq* cq, int num_entries, ibv_wc* wc);
  int (*req_notify_cq)(ibv_cq* cq, int solicited_only);
  int (*get_cq_event)(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context);
  void (*ack_cq_events)(ibv_cq* cq, unsigned int nevents);
  ibv_qp* (*create_qp)(ibv_pd* pd, ibv_qp_init_attr* attr);
  int (*modify_qp)(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask);
  int (*destroy_qp)(ibv_qp* qp);
  int (*post_send)(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr);
  int (*post_recv)(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr);
  const char* (*wc_status_str)(ibv_wc_status status);
};

// libibverbs itself.
const VerbsTable& RealVerbs();

}  // namespace gradsync::rdma

#endif  // GRADSYNC_RDMA_VERBS_TABLE_H_
