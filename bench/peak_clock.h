/* What bench/int8_peak.c and bench/int8_peak_avx2.c share: the thread's CPU
 * clock (a shared machine's load does not enter) and the core's clock rate,
 * from a chain of dependent register adds, one a cycle (Golden Cove and
 * later fold an add of an immediate at rename, so registers only). */
#include <stdio.h>
#include <time.h>

#define N 50000000L

static double cpu_seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

/* GHz, printed; *x keeps the chain alive (1 + 16N after it: odd). */
static double clock_ghz(long* x) {
  const long one = 1;
  const double t0 = cpu_seconds();
  for (long i = 0; i < 4 * N; ++i)
    __asm__ volatile("add %1, %0\n add %1, %0\n add %1, %0\n add %1, %0" : "+r"(*x) : "r"(one));
  const double ghz = 16.0 * N / (cpu_seconds() - t0) / 1e9;
  printf("clock %.2f GHz (dependent adds)\n", ghz);
  return ghz;
}

/* ops per cycle of a LOOP that ran each of its N iterations `ops` times since t0 */
static double rate(double ops, double t0, double ghz) { return ops * N / (cpu_seconds() - t0) / 1e9 / ghz; }
