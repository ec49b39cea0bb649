/* A C program built outside the Bazel workspace against the installed SDK
 * (pkg-config --cflags --libs gradsync): rank R of job ARGV[2] of ARGV[3]
 * ranks through the daemon at ARGV[1] allreduces 1000 f32 (rank r holds
 * r+1+i) and checks the exact sum, then does the same on a memfd it
 * registers (gs_buffer_register_fd), reading the sums through its own
 * mapping. Prints "ok <algorithm>". */
#define _GNU_SOURCE
#include <gradsync/c_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* rank r's element i is r+1+i; the sum over ranks is checked. */
static void fill(float* x, int rank) {
  for (int i = 0; i < 1000; ++i) x[i] = (float)(rank + 1 + i);
}
static int check(const float* x, int world, const char* what) {
  for (int i = 0; i < 1000; ++i) {
    const float want = (float)(world * (world + 1) / 2 + world * i);
    if (x[i] != want) {
      fprintf(stderr, "%s element %d: %g, want %g\n", what, i, x[i], want);
      return 1;
    }
  }
  return 0;
}

/* Allreduces 1000 f32 in a registered memfd, checked through this
 * program's own mapping of the file. */
static int registered_allreduce(gs_session* session, int world, int rank) {
  const size_t bytes = 1000 * sizeof(float);
  const int fd = memfd_create("ext_c", MFD_ALLOW_SEALING | MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0) return 1;
  float* mine = (float*)mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mine == MAP_FAILED) return 1;
  fill(mine, rank);
  gs_buffer* reg = NULL;
  if (gs_buffer_register_fd(session, fd, 0, bytes, &reg) != GS_OK) {
    fprintf(stderr, "gs_buffer_register_fd: %s\n", gs_last_error());
    return 1;
  }
  gs_collective_spec spec;
  gs_collective_spec_init(&spec);
  spec.buffer = reg;
  spec.count = 1000;
  gs_result result;
  if (gs_run(session, &spec, &result) != GS_OK) {
    fprintf(stderr, "allreduce of the memfd failed: %s\n", gs_last_error());
    return 1;
  }
  const int bad = check(mine, world, "memfd");
  gs_buffer_free(session, reg);
  munmap(mine, bytes);
  close(fd);
  return bad;
}

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
  fill(x, rank);
  gs_collective_spec spec;
  gs_collective_spec_init(&spec);
  spec.buffer = buffer;
  spec.count = 1000;
  gs_result result;
  if (gs_run(session, &spec, &result) != GS_OK) {
    fprintf(stderr, "allreduce failed: %s\n", gs_last_error());
    return 1;
  }
  if (check(x, world, "buffer") != 0 || registered_allreduce(session, world, rank) != 0) return 1;
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
