/* A C program built outside the Bazel workspace against the installed SDK
 * (pkg-config --cflags --libs gradsync): rank R of job ARGV[2] of ARGV[3]
 * ranks through the daemon at ARGV[1] allreduces 1000 f32 (rank r holds
 * r+1+i) and checks the exact sum. Prints "ok <algorithm>". */
#include <gradsync/c_api.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char** argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s TARGET JOB WORLD RANK\n", argv[0]);
    return 2;
  }
  const int world = atoi(argv[3]), rank = atoi(argv[4]);
  gs_client* client = NULL;
  gs_session* session = NULL;
  gs_buffer* buffer = NULL;
  if (gs_client_connect(argv[1], 10000, &client) != GS_OK ||
      gs_session_open(client, argv[2], world, rank, 30000, &session) != GS_OK ||
      gs_buffer_alloc(session, 1000 * sizeof(float), &buffer) != GS_OK) {
    fprintf(stderr, "set-up failed: %s\n", gs_last_error());
    return 1;
  }
  float* x = (float*)gs_buffer_data(buffer);
  for (int i = 0; i < 1000; ++i) x[i] = (float)(rank + 1 + i);
  gs_collective_spec spec;
  gs_collective_spec_init(&spec);
  spec.buffer = buffer;
  spec.count = 1000;
  gs_result result;
  if (gs_run(session, &spec, &result) != GS_OK) {
    fprintf(stderr, "allreduce failed: %s\n", gs_last_error());
    return 1;
  }
  for (int i = 0; i < 1000; ++i) {
    const float want = (float)(world * (world + 1) / 2 + world * i);
    if (x[i] != want) {
      fprintf(stderr, "element %d: %g, want %g\n", i, x[i], want);
      return 1;
    }
  }
  /* A bad argument comes back as a code and a message naming it. */
  spec.dtype = 99;
  uint64_t id = 0;
  if (gs_submit(session, &spec, &id) != GS_INVALID_ARGUMENT) return 1;
  fprintf(stderr, "rank %d: bad dtype refused: %s\n", rank, gs_last_error());
  gs_buffer_free(session, buffer);
  gs_session_close(session);
  gs_client_free(client);
  printf("ok %s\n", result.algorithm);
  return 0;
}
