#include "rdma/verbs_table.h"

namespace gradsync::rdma {
namespace {

int QueryPort(ibv_context* c, uint8_t port, ibv_port_attr* attr) {
  return ibv_query_port(c, port, attr);  // a macro in libibverbs
}
int PollCq(ibv_cq* cq, int n, ibv_wc* wc) { return ibv_poll_cq(cq, n, wc); }
int ReqNotifyCq(ibv_cq* cq, int solicited_only) { return ibv_req_notify_cq(cq, solicited_only); }
int PostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) { return ibv_post_send(qp, wr, bad); }
int PostRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) { return ibv_post_recv(qp, wr, bad); }
int QueryGidEx(ibv_context* c, uint32_t port, uint32_t index, ibv_gid_entry* e, uint32_t flags) {
  return ibv_query_gid_ex(c, port, index, e, flags);
}
uint64_t DeviceGuid(ibv_device* d) { return ibv_get_device_guid(d); }

}  // namespace

const VerbsTable& RealVerbs() {
  static const VerbsTable table = {
      "libibverbs",
      &ibv_get_device_list,
      &ibv_free_device_list,
      &ibv_get_device_name,
      &DeviceGuid,
      &ibv_open_device,
      &ibv_close_device,
      &ibv_query_device,
      &QueryPort,
      &ibv_query_gid,
      &QueryGidEx,
      &ibv_alloc_pd,
      &ibv_dealloc_pd,
      &ibv_reg_mr,
      &ibv_reg_dmabuf_mr,
      &ibv_dereg_mr,
      &ibv_create_comp_channel,
      &ibv_destroy_comp_channel,
      &ibv_create_cq,
      &ibv_destroy_cq,
      &PollCq,
      &ReqNotifyCq,
      &ibv_get_cq_event,
      &ibv_ack_cq_events,
      &ibv_create_qp,
      &ibv_modify_qp,
      &ibv_destroy_qp,
      &PostSend,
      &PostRecv,
      &ibv_wc_status_str,
  };
  return table;
}

}  // namespace gradsync::rdma
