#include "collective/two_level.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "transport/sub_context.h"

namespace gradsync {

bool HostGroups::two_level() const {
  if (hosts() < 2 || nodes_of_host[0].size() < 2) return false;
  return std::all_of(nodes_of_host.begin(), nodes_of_host.end(),
                     [&](const std::vector<int>& n) { return n.size() == nodes_of_host[0].size(); });
}

HostGroups GroupByHost(const std::vector<std::string>& node_names) {
  HostGroups g;
  std::map<std::string, int> index;
  for (size_t node = 0; node < node_names.size(); ++node) {
    const std::string& name = node_names[node];
    const size_t colon = name.rfind(':');
    const std::string host = colon == std::string::npos ? name : name.substr(0, colon);
    auto [it, added] = index.emplace(colon == std::string::npos ? "\x01" + name : host, g.hosts());
    if (added) g.nodes_of_host.emplace_back();
    g.nodes_of_host[it->second].push_back(static_cast<int>(node));
    g.host_of_node.push_back(it->second);
  }
  return g;
}

absl::Status RunTwoLevelAllreduce(transport::Context& ctx, const HostGroups& hosts,
                                  const CollectiveCall& call, Algorithm across,
                                  transport::Scratch* scratch) {
  const int me = ctx.rank();
  const std::vector<int>& mine = hosts.nodes_of_host[hosts.host_of_node[me]];
  std::vector<int> leaders;
  for (const std::vector<int>& nodes : hosts.nodes_of_host) leaders.push_back(nodes[0]);
  transport::SubContext host(ctx, mine);
  // Each stage's messages carry an op_seq of their own (the top byte).
  auto stage = [&call](CollectiveKind kind, int n) {
    CollectiveCall c = call;
    c.kind = kind;
    c.root = 0;
    c.op = CombineOp(call.op);
    c.seq = call.seq | (static_cast<uint64_t>(n) << 56);
    // A codec or top-k saves bytes across the hosts; within one, the values
    // go as they are. Only the hosts' leaders quantize or select: their
    // residuals hold what is owed.
    if (kind != CollectiveKind::kAllreduce) {
      c.codec = CodecId::kNone;
      c.codec_feedback = nullptr;
      c.sparse = SparseStage{};
    }
    return c;
  };
  auto named = [](absl::Status s, absl::string_view what) {
    if (s.ok()) return s;
    return absl::Status(s.code(), absl::StrCat("two-level allreduce, ", what, ": ", s.message()));
  };
  RETURN_IF_ERROR(named(RunCollective(host, stage(CollectiveKind::kReduce, 1), Algorithm::kRing,
                                      scratch),
                        "reduce within the host"));
  if (me == mine[0]) {
    transport::SubContext heads(ctx, leaders);
    RETURN_IF_ERROR(named(RunCollective(heads, stage(CollectiveKind::kAllreduce, 2), across,
                                        scratch),
                          "allreduce across the hosts"));
    if (call.op == ReduceOp::kAvg) call.reduce().Divide(call.dtype, call.data(), call.count, ctx.size());
  }
  return named(RunCollective(host, stage(CollectiveKind::kBroadcast, 3), Algorithm::kRing, scratch),
               "broadcast within the host");
}

}  // namespace gradsync
