/* Compiled as C, not C++: proves client/c_api.h is a pure C header and that
 * the C API links into a C program. Uses no daemon: only the paths that fail
 * before or at connection time. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "client/c_api.h"

static int failures = 0;

#define EXPECT(cond)                                             \
  do {                                                           \
    if (!(cond)) {                                               \
      fprintf(stderr, "%s:%d: EXPECT(%s) failed\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                \
    }                                                            \
  } while (0)

int main(void) {
  char target[128];
  gs_client* client = NULL;
  gs_session* session = NULL;
  uint64_t op_id = 0;

  snprintf(target, sizeof target, "unix-abstract:gradsync-client-c-test-missing-%d", (int)getpid());
  EXPECT(gs_client_connect(target, 200, &client) == GS_UNAVAILABLE);
  EXPECT(client == NULL);
  EXPECT(strstr(gs_last_error(), target) != NULL);

  EXPECT(gs_client_connect(NULL, 200, &client) == GS_INVALID_ARGUMENT);
  EXPECT(strstr(gs_last_error(), "target") != NULL);
  EXPECT(gs_session_open(NULL, "job", 1, 0, 1000, &session) == GS_INVALID_ARGUMENT);
  EXPECT(gs_allreduce_async(NULL, NULL, 0, 1, GS_DTYPE_F32, GS_OP_SUM, "x", 0, &op_id) ==
         GS_INVALID_ARGUMENT);
  EXPECT(gs_session_rank(NULL) == -1);
  EXPECT(gs_buffer_data(NULL) == NULL);
  EXPECT(gs_buffer_size(NULL) == 0);
  EXPECT(gs_buffer_free(NULL, NULL) == GS_OK);
  EXPECT(gs_session_close(NULL) == GS_OK);
  gs_client_free(NULL);

  {
    gs_session_options o;
    gs_collective_spec spec;
    gs_result result;
    int fd = -1;
    gs_session_options_init(&o);
    EXPECT(o.struct_size == sizeof o && o.rank == -1);
    EXPECT(gs_session_open_with(NULL, &o, &session) == GS_INVALID_ARGUMENT);
    gs_collective_spec_init(&spec);
    EXPECT(spec.struct_size == sizeof spec && spec.kind == GS_ALLREDUCE);
    spec.kind = GS_BARRIER;
    EXPECT(gs_submit(NULL, &spec, &op_id) == GS_INVALID_ARGUMENT);
    EXPECT(strstr(gs_last_error(), "gs_submit: session is NULL") != NULL);
    EXPECT(gs_run(NULL, &spec, &result) == GS_INVALID_ARGUMENT);
    EXPECT(gs_poll(NULL, 1, &result) == GS_INVALID_ARGUMENT);
    EXPECT(gs_session_event_fd(NULL, &fd) == GS_INVALID_ARGUMENT);
  }

  if (failures == 0) printf("c_api_c_test: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
