/* What one core can retire: the int8 multiply-add peak (vpdpbusd) and the
 * rate of the blocks-of-32 prefill's inner step under quant.h's canonical
 * order (vpdpbusd, vcvtdq2ps, fma per weight row, activation row and block).
 *
 *   gcc -O2 -mavx512f -mavx512vl -mavx512vnni bench/int8_peak.c -o /tmp/int8_peak && /tmp/int8_peak
 *
 * Timed on the thread's CPU clock, so a shared machine's load does not enter;
 * the clock rate comes from a chain of dependent adds (one a cycle). Each
 * loop keeps 8 independent accumulators, enough to cover the latencies.
 */
#include <stdio.h>
#include <time.h>

static double cpu_seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

#define N 50000000L
#define LOOP(body) \
  do { long m = N; __asm__ volatile("1:\n" body "dec %0\n jnz 1b\n" : "+r"(m) :: \
       "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm9", "xmm10", "xmm11", "cc"); } while (0)

int main(void) {
  long x = 1, one = 1;
  double t0 = cpu_seconds();
  /* Register operands: Golden Cove and later fold an add of an immediate at
   * rename, so a chain of those is no clock. */
  for (long i = 0; i < 4 * N; ++i)
    __asm__ volatile("add %1, %0\n add %1, %0\n add %1, %0\n add %1, %0" : "+r"(x) : "r"(one));
  const double ghz = 16.0 * N / (cpu_seconds() - t0) / 1e9;
  printf("clock %.2f GHz (dependent adds)\n", ghz);

  t0 = cpu_seconds();
  LOOP("vpdpbusd %%ymm14,%%ymm15,%%ymm0\n vpdpbusd %%ymm14,%%ymm15,%%ymm1\n vpdpbusd %%ymm14,%%ymm15,%%ymm2\n"
       "vpdpbusd %%ymm14,%%ymm15,%%ymm3\n vpdpbusd %%ymm14,%%ymm15,%%ymm4\n vpdpbusd %%ymm14,%%ymm15,%%ymm5\n"
       "vpdpbusd %%ymm14,%%ymm15,%%ymm6\n vpdpbusd %%ymm14,%%ymm15,%%ymm7\n");
  const double dp = 8.0 * N / (cpu_seconds() - t0) / 1e9 / ghz;
  printf("vpdpbusd ymm: %.2f a cycle = %.0f int8 MACs a cycle, %.0f G MAC/s a core\n", dp, 32 * dp, 32 * dp * ghz);

  t0 = cpu_seconds();
  LOOP("vpdpbusd %%zmm14,%%zmm15,%%zmm0\n vpdpbusd %%zmm14,%%zmm15,%%zmm1\n vpdpbusd %%zmm14,%%zmm15,%%zmm2\n"
       "vpdpbusd %%zmm14,%%zmm15,%%zmm3\n vpdpbusd %%zmm14,%%zmm15,%%zmm4\n vpdpbusd %%zmm14,%%zmm15,%%zmm5\n"
       "vpdpbusd %%zmm14,%%zmm15,%%zmm6\n vpdpbusd %%zmm14,%%zmm15,%%zmm7\n");
  printf("vpdpbusd zmm: %.2f a cycle\n", 8.0 * N / (cpu_seconds() - t0) / 1e9 / ghz);

  t0 = cpu_seconds();
  LOOP("vpdpbusd %%ymm14,%%ymm15,%%ymm0\n vcvtdq2ps %%ymm8,%%ymm9\n vfmadd231ps %%ymm12,%%ymm13,%%ymm1\n"
       "vpdpbusd %%ymm14,%%ymm15,%%ymm2\n vcvtdq2ps %%ymm8,%%ymm10\n vfmadd231ps %%ymm12,%%ymm13,%%ymm3\n"
       "vpdpbusd %%ymm14,%%ymm15,%%ymm4\n vcvtdq2ps %%ymm8,%%ymm11\n vfmadd231ps %%ymm12,%%ymm13,%%ymm5\n"
       "vpdpbusd %%ymm14,%%ymm15,%%ymm6\n vcvtdq2ps %%ymm8,%%ymm9\n vfmadd231ps %%ymm12,%%ymm13,%%ymm7\n");
  const double tri = 4.0 * N / (cpu_seconds() - t0) / 1e9 / ghz;
  printf("canonical step (vpdpbusd + vcvtdq2ps + fma, ymm): %.2f a cycle = %.0f MACs a cycle, %.0f%% of the peak\n",
         tri, 32 * tri, 100 * tri / dp);

  t0 = cpu_seconds();
  LOOP("vpdpbusd %%zmm14,%%zmm15,%%zmm0\n vcvtdq2ps %%zmm8,%%zmm9\n vfmadd231ps %%zmm12,%%zmm13,%%zmm1\n"
       "vpdpbusd %%zmm14,%%zmm15,%%zmm2\n vcvtdq2ps %%zmm8,%%zmm10\n vfmadd231ps %%zmm12,%%zmm13,%%zmm3\n"
       "vpdpbusd %%zmm14,%%zmm15,%%zmm4\n vcvtdq2ps %%zmm8,%%zmm11\n vfmadd231ps %%zmm12,%%zmm13,%%zmm5\n"
       "vpdpbusd %%zmm14,%%zmm15,%%zmm6\n vcvtdq2ps %%zmm8,%%zmm9\n vfmadd231ps %%zmm12,%%zmm13,%%zmm7\n");
  const double triz = 4.0 * N / (cpu_seconds() - t0) / 1e9 / ghz;
  printf("canonical step on zmm (two pairs a register): %.2f a cycle = %.0f MACs a cycle, %.0f%% of the ymm peak\n",
         triz, 64 * triz, 100 * 2 * triz / dp);

  t0 = cpu_seconds();
  LOOP("vpdpbusd %%ymm14,%%ymm15,%%ymm0\n vfmadd231ps %%ymm12,%%ymm13,%%ymm1\n"
       "vpdpbusd %%ymm14,%%ymm15,%%ymm2\n vfmadd231ps %%ymm12,%%ymm13,%%ymm3\n"
       "vpdpbusd %%ymm14,%%ymm15,%%ymm4\n vfmadd231ps %%ymm12,%%ymm13,%%ymm5\n"
       "vpdpbusd %%ymm14,%%ymm15,%%ymm6\n vfmadd231ps %%ymm12,%%ymm13,%%ymm7\n");
  printf("vpdpbusd + fma alone: %.2f a cycle\n", 4.0 * N / (cpu_seconds() - t0) / 1e9 / ghz);
  return (int)(x & 1) - 1;  /* x is 1 + 16N, odd: returns 0 (and keeps the chain alive) */
}
