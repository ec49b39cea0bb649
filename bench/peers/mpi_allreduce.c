/* MPI_Allreduce benchmark (sum, float, in place) for comparing gradsync with
 * Open MPI on one host.
 *
 * For each message size B: --warmup untimed then --iters timed iterations of
 * MPI_Allreduce(MPI_IN_PLACE, buf, B/4, MPI_FLOAT, MPI_SUM), each one started
 * after MPI_Barrier and timed on every rank with MPI_Wtime. The reported time is
 * the mean over iterations of the slowest rank's time (MPI_MAX over ranks per
 * iteration); busbw follows nccl-tests for allreduce: algbw = B / time,
 * busbw = algbw * 2(N-1)/N. The last result is checked (every element == N).
 *
 * The transport is chosen by mpirun's MCA flags (see bench/run_peers.sh); the
 * --transport label only names it in the output:
 *   mpi,transport=tcp,ranks=4,bytes=67108864,time_us=150000.00,busbw_gbps=0.671089
 * Human-readable lines start with "# ".
 *
 * Build: mpicc -O2 -o mpi_allreduce mpi_allreduce.c
 * Flags: --min_bytes 4K --max_bytes 64M --step_factor 4 | --sizes 8,1M,64M,
 *        --latency (also 8 bytes), --iters 10, --warmup 2, --transport LABEL,
 *        --gap_us N (every rank sleeps N us before each iteration's barrier, like
 *        `gradsync bench --blocking --gap_us N`). */
#include <mpi.h>
#include <ctype.h>
#include <unistd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int ParseBytes(const char* s, uint64_t* out) {
  char* end = NULL;
  if (!isdigit((unsigned char)s[0])) return 0;
  unsigned long long v = strtoull(s, &end, 10);
  int shift = 0;
  switch (toupper((unsigned char)*end)) {
    case '\0': break;
    case 'B': break;
    case 'K': shift = 10; ++end; break;
    case 'M': shift = 20; ++end; break;
    case 'G': shift = 30; ++end; break;
    default: return 0;
  }
  if (toupper((unsigned char)*end) == 'I') ++end;
  if (toupper((unsigned char)*end) == 'B') ++end;
  if (*end != '\0') return 0;
  *out = (uint64_t)v << shift;
  return 1;
}

static int CmpU64(const void* a, const void* b) {
  uint64_t x = *(const uint64_t*)a, y = *(const uint64_t*)b;
  return x < y ? -1 : x > y;
}

static int CmpDouble(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static void FormatBytes(uint64_t b, char* out, size_t n) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  while (u < 3 && b >= 1024 && b % 1024 == 0) { b /= 1024; ++u; }
  snprintf(out, n, "%llu %s", (unsigned long long)b, kUnits[u]);
}

static void Usage(int rank, const char* msg) {
  if (rank == 0) fprintf(stderr, "mpi_allreduce: %s\n", msg);
  MPI_Abort(MPI_COMM_WORLD, 2);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);

  const char* min_s = "4K", *max_s = "64M", *sizes_s = "", *transport = "unknown";
  long step = 4, iters = 10, warmup = 2;
  int latency = 0;
  long gap_us = 0;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
#define TAKE(name) (strcmp(a, name) == 0 && v != NULL && (++i, 1))
    if (TAKE("--min_bytes")) min_s = v;
    else if (TAKE("--max_bytes")) max_s = v;
    else if (TAKE("--sizes")) sizes_s = v;
    else if (TAKE("--step_factor")) step = strtol(v, NULL, 10);
    else if (TAKE("--iters")) iters = strtol(v, NULL, 10);
    else if (TAKE("--warmup")) warmup = strtol(v, NULL, 10);
    else if (TAKE("--transport")) transport = v;
    else if (TAKE("--gap_us")) gap_us = strtol(v, NULL, 10);
    else if (strcmp(a, "--latency") == 0) latency = 1;
    else Usage(rank, "unknown or incomplete flag (see the comment at the top of mpi_allreduce.c)");
#undef TAKE
  }
  if (iters < 1 || warmup < 0 || step < 2 || gap_us < 0) {
    Usage(rank, "need --iters >= 1, --warmup >= 0, --step_factor >= 2, --gap_us >= 0");
  }

  uint64_t sizes[256];
  int nsizes = 0;
  if (sizes_s[0] != '\0') {
    char* copy = strdup(sizes_s);
    for (char* tok = strtok(copy, ","); tok != NULL && nsizes < 250; tok = strtok(NULL, ",")) {
      if (!ParseBytes(tok, &sizes[nsizes])) Usage(rank, "bad size in --sizes");
      ++nsizes;
    }
    free(copy);
  } else {
    uint64_t lo, hi;
    if (!ParseBytes(min_s, &lo) || !ParseBytes(max_s, &hi) || lo == 0 || lo > hi) {
      Usage(rank, "need 0 < --min_bytes <= --max_bytes");
    }
    for (uint64_t b = lo; b <= hi && nsizes < 250; b *= (uint64_t)step) {
      sizes[nsizes++] = b;
      if (b > hi / (uint64_t)step) break;
    }
    if (sizes[nsizes - 1] != hi) sizes[nsizes++] = hi;
  }
  if (latency) sizes[nsizes++] = 8;
  qsort(sizes, nsizes, sizeof(sizes[0]), CmpU64);
  int uniq = 0;
  for (int i = 0; i < nsizes; ++i) {
    if (uniq == 0 || sizes[uniq - 1] != sizes[i]) sizes[uniq++] = sizes[i];
  }
  nsizes = uniq;
  if (nsizes == 0 || sizes[0] < 4) Usage(rank, "sizes must be at least 4 bytes (one float)");

  const uint64_t max_count = sizes[nsizes - 1] / 4;
  float* buf = malloc(max_count * sizeof(float));
  double* t = malloc(iters * sizeof(double));
  double* slowest = malloc(iters * sizeof(double));
  if (buf == NULL || t == NULL || slowest == NULL) Usage(rank, "out of memory");

  if (rank == 0) {
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    char* nl = strchr(version, '\n');
    if (nl) *nl = '\0';
    char* comma = strchr(version, ',');
    if (comma) *comma = '\0';
    printf("# mpi: %s, transport=%s, %d ranks, MPI_Allreduce sum float in place, %ld iters + %ld "
           "warmup, barrier before each, busbw = bytes/time * 2(N-1)/N\n",
           version, transport, n, iters, warmup);
    fflush(stdout);
  }
  for (int si = 0; si < nsizes; ++si) {
    const uint64_t count = sizes[si] / 4, bytes = count * 4;
    for (long it = 0; it < warmup + iters; ++it) {
      for (uint64_t i = 0; i < count; ++i) buf[i] = 1.0f;
      if (gap_us > 0) usleep((useconds_t)gap_us);
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      const double t1 = MPI_Wtime();
      if (it >= warmup) t[it - warmup] = t1 - t0;
    }
    if (buf[0] != (float)n || buf[count - 1] != (float)n) {
      fprintf(stderr, "mpi_allreduce: rank %d: wrong result %g (expected %d)\n", rank, buf[0], n);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Reduce(t, slowest, (int)iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      double sum = 0, mn = slowest[0], mx = slowest[0];
      for (long i = 0; i < iters; ++i) {
        sum += slowest[i];
        if (slowest[i] < mn) mn = slowest[i];
        if (slowest[i] > mx) mx = slowest[i];
      }
      const double mean = sum / iters;
      qsort(slowest, iters, sizeof(double), CmpDouble);
      const double median = iters % 2 ? slowest[iters / 2]
                                      : (slowest[iters / 2 - 1] + slowest[iters / 2]) / 2;
      const double algbw = mean > 0 ? (double)bytes / mean / 1e9 : 0.0;
      const double busbw = algbw * 2.0 * (n - 1) / n;
      char human[32];
      FormatBytes(bytes, human, sizeof(human));
      printf("mpi,transport=%s,ranks=%d,bytes=%llu,time_us=%.2f,busbw_gbps=%.6g\n", transport, n,
             (unsigned long long)bytes, mean * 1e6, busbw);
      printf("# mpi %s %d ranks %10s: %11.2f us/iter (median %.2f, min %.2f, max %.2f)  "
             "algbw %8.3f GB/s  busbw %8.3f GB/s\n",
             transport, n, human, mean * 1e6, median * 1e6, mn * 1e6, mx * 1e6, algbw, busbw);
      fflush(stdout);
    }
  }
  free(buf);
  free(t);
  free(slowest);
  MPI_Finalize();
  return 0;
}
