#include "collective/trace.h"

namespace gradsync {
namespace {
thread_local OpTracer* g_tracer = nullptr;
}  // namespace

OpTracer* CurrentTracer() { return g_tracer; }

ScopedTracer::ScopedTracer(OpTracer* tracer) : previous_(g_tracer) { g_tracer = tracer; }
ScopedTracer::~ScopedTracer() { g_tracer = previous_; }

}  // namespace gradsync
