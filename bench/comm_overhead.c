/* kiln-comm-bench: what the watchdog costs. Under `mpirun -np N`, times the sum of a float buffer
 * over the ranks through kiln's communicator (MPI_Iallreduce polled with MPI_Test, yielding after
 * 2 ms and sleeping after 20: src/parallel/comm_mpi.c) against a plain blocking MPI_Allreduce of
 * the same buffer, alternating the two (and the rank-order sum of --deterministic, and the
 * buffer in 256 KiB buckets started back to back as training's overlapped sum starts them; and
 * those buckets in the communicator's own memory, summed where they lie, as training's gradients
 * are on one host) so that all see the same machine load,
 * and prints the median and the 10th and 90th percentiles of each. Then a late rank: the last
 * rank arrives D ms after the others (it spins), and rank 0 prints how long past those D ms it
 * took to leave kiln's barrier and MPI_Barrier: what the wait's polling adds to a rank's
 * lateness (a training step waits so whenever one worker is slower), when the third argument is
 * `late`. Usage: mpirun -np 2 kiln-comm-bench [FLOATS [REPS [late]]] (default 1048576 floats,
 * 200 repetitions; at least 3, so that a sum of hundreds of MB, which takes a second over TCP,
 * can be timed in a few: its percentiles are then the extremes). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/parallel.h"

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void spin_ms(double ms) {
  double t = MPI_Wtime();
  while ((MPI_Wtime() - t) * 1e3 < ms) {
  }
}

/* The last rank arrives `late_ms` after the others; rank 0's time in the barrier past that. */
static void late_rank(kiln_comm *c, double late_ms, int reps, double *t_kiln, double *t_mpi) {
  bool late = kiln_comm_rank(c) == kiln_comm_size(c) - 1;
  for (int r = 0; r < reps; r++) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t = MPI_Wtime();
    if (late) spin_ms(late_ms);
    if (kiln_comm_barrier(c)) {
      fprintf(stderr, "kiln-comm-bench: %s\n", kiln_last_error());
      kiln_comm_end_job(c, 1);
    }
    t_kiln[r] = (MPI_Wtime() - t) * 1e3 - late_ms;
    MPI_Barrier(MPI_COMM_WORLD);
    t = MPI_Wtime();
    if (late) spin_ms(late_ms);
    MPI_Barrier(MPI_COMM_WORLD);
    t_mpi[r] = (MPI_Wtime() - t) * 1e3 - late_ms;
  }
}

/* The buffer in buckets of BUCKET floats, each started as soon as the one before (training
 * starts them as backward finishes each; src/solver/worker_sync.c's BUCKET_FLOATS), then
 * finished: the overlapped path's own cost with no compute in between. */
enum { BUCKET = 1 << 16 };
static int bucketed_sum(kiln_comm *c, float *buf, int64_t n) {
  for (int64_t off = 0; off < n; off += BUCKET) {
    int rc = kiln_comm_bucket_start(c, buf + off, n - off < BUCKET ? n - off : BUCKET, false);
    if (!rc) rc = kiln_comm_bucket_progress(c);
    if (rc) return rc;
  }
  return kiln_comm_bucket_finish(c);
}

/* kiln's sums, one signature for timed() */
enum { PLAIN, ORDERED, BUCKETED };
static int kiln_sum(kiln_comm *c, int how, float *buf, int64_t n) {
  return how == BUCKETED ? bucketed_sum(c, buf, n) : kiln_comm_allreduce_sum(c, buf, n, how == ORDERED);
}

/* One timed sum through kiln, in ms, the ranks lined up first (so that the timing is the
 * collective and not a rank's lateness); a failure ends the job. */
static double timed(kiln_comm *c, int how, float *buf, int64_t n) {
  MPI_Barrier(MPI_COMM_WORLD);
  double t = MPI_Wtime();
  if (kiln_sum(c, how, buf, n)) {
    fprintf(stderr, "kiln-comm-bench: %s\n", kiln_last_error());
    kiln_comm_end_job(c, 1);
  }
  return (MPI_Wtime() - t) * 1e3;
}

static void report(const char *name, double *t, int n, int64_t floats) {
  qsort(t, (size_t)n, sizeof *t, cmp_double);
  double med = t[n / 2];
  printf("%-34s median %8.3f ms  p10 %8.3f  p90 %8.3f  (%.2f GB/s of buffer)\n", name, med,
         t[n / 10], t[n - 1 - n / 10], (double)floats * 4 / (med / 1e3) / 1e9);
}

int main(int argc, char **argv) {
  kiln_comm *c;
  kiln_config cfg; /* KILN_COMM_SHM=copy times the sums through copies */
  if (kiln_config_from_env(&cfg) || kiln_comm_mpi_create(&argc, &argv, &cfg, &c)) {
    fprintf(stderr, "kiln-comm-bench: %s\n", kiln_last_error());
    return 1;
  }
  int64_t n = argc > 1 ? atoll(argv[1]) : 1 << 20;
  int reps = argc > 2 ? atoi(argv[2]) : 200;
  if (n < 1 || reps < 3) {
    fprintf(stderr, "usage: mpirun -np N kiln-comm-bench [FLOATS >= 1 [REPS >= 3 [late]]]\n");
    kiln_comm_end_job(c, 2);
  }
  float *buf = malloc(sizeof(float) * (size_t)n);
  double *t_kiln = malloc(sizeof(double) * (size_t)reps), *t_mpi = malloc(sizeof(double) * (size_t)reps);
  double *t_ord = malloc(sizeof(double) * (size_t)reps);
  double *t_bkt = malloc(sizeof(double) * (size_t)reps);
  double *t_inp = malloc(sizeof(double) * (size_t)reps);
  if (!buf || !t_kiln || !t_mpi || !t_ord || !t_bkt || !t_inp) kiln_comm_end_job(c, 1);
  for (int64_t i = 0; i < n; i++) buf[i] = 1e-6f * (float)(i % 1000);
  MPI_Comm world = MPI_COMM_WORLD;
  /* NULL unless the ranks share this host and n fits; timed only when every rank has one (a
   * rank with KILN_COMM_SHM=copy claims none), so that all call the same collectives */
  float *lent = kiln_comm_claim_sum_buffer(c, n);
  int have = lent != NULL, all_have = 0;
  MPI_Allreduce(&have, &all_have, 1, MPI_INT, MPI_MIN, world);
  if (!all_have) {
    kiln_comm_release_sum_buffer(c, lent);
    lent = NULL;
  }
  if (lent) memcpy(lent, buf, sizeof(float) * (size_t)n);
  /* Warm up every path (connections, MPI's buffers, the list of buckets in flight). Past 4M
   * floats the buffer is summed in 4M chunks, each like the first, so one round is enough. */
  int warm = n > (1 << 22) ? 1 : 5;
  for (int w = 0; w < warm; w++) {
    MPI_Allreduce(MPI_IN_PLACE, buf, (int)(n < (1 << 22) ? n : (1 << 22)), MPI_FLOAT, MPI_SUM, world);
    if (kiln_comm_allreduce_sum(c, buf, n, false) || bucketed_sum(c, buf, n))
      kiln_comm_end_job(c, 1);
  }
  for (int r = 0; r < reps; r++) {
    /* Line the ranks up first, so each timing is the collective and not a rank's lateness. */
    MPI_Barrier(world);
    double t = MPI_Wtime();
    for (int64_t off = 0; off < n; off += 1 << 22) {
      int cnt = (int)(n - off < (1 << 22) ? n - off : (1 << 22));
      MPI_Allreduce(MPI_IN_PLACE, buf + off, cnt, MPI_FLOAT, MPI_SUM, world);
    }
    t_mpi[r] = (MPI_Wtime() - t) * 1e3;
    t_kiln[r] = timed(c, PLAIN, buf, n);
    t_ord[r] = timed(c, ORDERED, buf, n);
    t_bkt[r] = timed(c, BUCKETED, buf, n);
    if (lent) t_inp[r] = timed(c, BUCKETED, lent, n);
  }
  if (kiln_comm_rank(c) == 0) {
    printf("%d ranks, allreduce (sum) of %lld floats, %d repetitions\n", kiln_comm_size(c),
           (long long)n, reps);
    report("MPI_Allreduce (blocking)", t_mpi, reps, n);
    report("kiln_comm_allreduce_sum (watchdog)", t_kiln, reps, n);
    report("kiln ordered sum (--deterministic)", t_ord, reps, n);
    report("kiln 256 KiB buckets (training)", t_bkt, reps, n);
    if (lent) report("kiln buckets summed in place", t_inp, reps, n);
    else
      printf("kiln buckets summed in place: no memory to sum in (several hosts, too large, or "
             "KILN_COMM_SHM=copy)\n");
  }
  if (kiln_comm_size(c) > 1 && argc > 3 && !strcmp(argv[3], "late")) {
    static const double lates[] = {0.5, 1.5, 2.5, 4, 7, 12};
    int lr = reps / 2 < 10 ? 10 : reps / 2;
    if (kiln_comm_rank(c) == 0)
      printf("the last rank late by D ms: rank 0's time in the barrier past D, %d repetitions\n",
             lr);
    for (size_t i = 0; i < sizeof lates / sizeof *lates; i++) {
      late_rank(c, lates[i], lr, t_kiln, t_mpi);
      if (kiln_comm_rank(c) == 0) {
        qsort(t_kiln, (size_t)lr, sizeof *t_kiln, cmp_double);
        qsort(t_mpi, (size_t)lr, sizeof *t_mpi, cmp_double);
        printf("  D %5.1f ms: kiln_comm_barrier median %6.3f p90 %6.3f ms | MPI_Barrier median "
               "%6.3f p90 %6.3f ms\n",
               lates[i], t_kiln[lr / 2], t_kiln[lr - 1 - lr / 10], t_mpi[lr / 2],
               t_mpi[lr - 1 - lr / 10]);
      }
    }
  }
  free(buf);
  free(t_kiln);
  free(t_mpi);
  free(t_ord);
  free(t_bkt);
  free(t_inp);
  kiln_comm_release_sum_buffer(c, lent);
  kiln_comm_free(c);
  return 0;
}
