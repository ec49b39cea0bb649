"""cc_grpc_library: protoc + grpc_cpp_plugin from Debian, no rules_proto (offline)."""

def cc_grpc_library(name, srcs, proto_deps = [], deps = [], grpc = True, **kwargs):
    outs = []
    for s in srcs:
        b = s[:-len(".proto")]
        outs += [b + ".pb.cc", b + ".pb.h"] + ([b + ".grpc.pb.cc", b + ".grpc.pb.h"] if grpc else [])
    # Imports name files from the repository's root ("proto/common.proto"),
    # which is external/<name> when another workspace uses this one as an
    # external repository: protoc reads and writes relative to that root.
    repo = native.repository_name()
    root = "." if repo == "@" else "external/" + repo[1:]
    out = "$(GENDIR)" if repo == "@" else "$(GENDIR)/" + root
    cmd = "/usr/bin/protoc -I%s --cpp_out=%s" % (root, out)
    if grpc:
        cmd += " --grpc_out=%s --plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin" % out
    native.genrule(
        name = name + "_codegen",
        srcs = srcs + proto_deps,
        outs = outs,
        cmd = cmd + " " + " ".join(["$(location %s)" % s for s in srcs]),
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        deps = deps + (["//third_party/sys:grpc++"] if grpc else ["//third_party/sys:protobuf"]),
        **kwargs
    )
