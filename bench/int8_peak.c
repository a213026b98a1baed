/* What one core can retire: the int8 multiply-add peak (vpdpbusd) and the
 * rate of the blocks-of-32 prefill's inner step under quant.h's canonical
 * order (vpdpbusd, vcvtdq2ps, fma per weight row, activation row and block).
 *
 *   gcc -O2 -mavx512f -mavx512vl -mavx512vnni bench/int8_peak.c -o /tmp/int8_peak && /tmp/int8_peak
 *
 * Timed on the thread's CPU clock, so a shared machine's load does not enter;
 * the clock rate comes from a chain of dependent adds (one a cycle). The
 * peak loops keep 12 independent accumulators (vpdpbusd's latency is 5
 * cycles on Intel: 8 would cap it at 1.6 a cycle); the step loops start
 * each vpdpbusd from a copy of a start register, as the tiles do (no chain
 * through it), and keep 6 fma accumulators.
 */
#include <xmmintrin.h>

#include "peak_clock.h"

#define LOOP(body) \
  do { long m = N; __asm__ volatile("1:\n" body "dec %0\n jnz 1b\n" : "+r"(m) :: \
       "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "cc"); } while (0)

/* 12 vpdpbusd on R-registers (ymm or zmm) into 12 chains. */
#define PEAK(R) \
  "vpdpbusd %%" R "14,%%" R "15,%%" R "0\n vpdpbusd %%" R "14,%%" R "15,%%" R "1\n vpdpbusd %%" R "14,%%" R "15,%%" R "2\n" \
  "vpdpbusd %%" R "14,%%" R "15,%%" R "3\n vpdpbusd %%" R "14,%%" R "15,%%" R "4\n vpdpbusd %%" R "14,%%" R "15,%%" R "5\n" \
  "vpdpbusd %%" R "14,%%" R "15,%%" R "6\n vpdpbusd %%" R "14,%%" R "15,%%" R "7\n vpdpbusd %%" R "14,%%" R "15,%%" R "8\n" \
  "vpdpbusd %%" R "14,%%" R "15,%%" R "9\n vpdpbusd %%" R "14,%%" R "15,%%" R "10\n vpdpbusd %%" R "14,%%" R "15,%%" R "11\n"

/* One canonical step into fma accumulator A through scratch D: start copied, vpdpbusd, vcvtdq2ps, fma. */
#define STEP(R, D, A) \
  "vmovdqa64 %%" R "13,%%" R D "\n vpdpbusd %%" R "14,%%" R "15,%%" R D "\n vcvtdq2ps %%" R D ",%%" R D "\n" \
  "vfmadd231ps %%" R "12,%%" R D ",%%" R A "\n"
#define STEPS(R) STEP(R, "0", "6") STEP(R, "1", "7") STEP(R, "2", "8") STEP(R, "3", "9") STEP(R, "4", "10") STEP(R, "5", "11")
#define PAIRS(R) \
  "vpdpbusd %%" R "14,%%" R "15,%%" R "0\n vfmadd231ps %%" R "12,%%" R "13,%%" R "6\n" \
  "vpdpbusd %%" R "14,%%" R "15,%%" R "1\n vfmadd231ps %%" R "12,%%" R "13,%%" R "7\n" \
  "vpdpbusd %%" R "14,%%" R "15,%%" R "2\n vfmadd231ps %%" R "12,%%" R "13,%%" R "8\n" \
  "vpdpbusd %%" R "14,%%" R "15,%%" R "3\n vfmadd231ps %%" R "12,%%" R "13,%%" R "9\n" \
  "vpdpbusd %%" R "14,%%" R "15,%%" R "4\n vfmadd231ps %%" R "12,%%" R "13,%%" R "10\n" \
  "vpdpbusd %%" R "14,%%" R "15,%%" R "5\n vfmadd231ps %%" R "12,%%" R "13,%%" R "11\n"

int main(void) {
  long x = 1;
  _mm_setcsr(_mm_getcsr() | 0x8040); /* FTZ and DAZ: whatever the registers hold, no denormal assists */
  __asm__ volatile("vpxord %%zmm12, %%zmm12, %%zmm12\n vpxord %%zmm13, %%zmm13, %%zmm13\n"
                   "vpxord %%zmm14, %%zmm14, %%zmm14\n vpxord %%zmm15, %%zmm15, %%zmm15" ::: "xmm12", "xmm13", "xmm14", "xmm15");
  const double ghz = clock_ghz(&x);
  double t0;

  t0 = cpu_seconds();
  LOOP(PEAK("ymm"));
  const double dpy = rate(12, t0, ghz);
  t0 = cpu_seconds();
  LOOP(PEAK("zmm"));
  const double dpz = rate(12, t0, ghz);
  const double peak = 32 * dpy > 64 * dpz ? 32 * dpy : 64 * dpz;
  printf("vpdpbusd ymm: %.2f a cycle = %.0f int8 MACs a cycle; zmm: %.2f a cycle = %.0f MACs a cycle\n", dpy, 32 * dpy,
         dpz, 64 * dpz);
  printf("int8 multiply-add peak: %.0f MACs a cycle, %.0f G MAC/s a core\n", peak, peak * ghz);

  t0 = cpu_seconds();
  LOOP(STEPS("ymm"));
  const double tri = rate(6, t0, ghz);
  printf("canonical step (start, vpdpbusd, vcvtdq2ps, fma), ymm: %.2f a cycle = %.0f MACs a cycle, %.0f%% of the peak\n",
         tri, 32 * tri, 100 * 32 * tri / peak);
  t0 = cpu_seconds();
  LOOP(STEPS("zmm"));
  const double triz = rate(6, t0, ghz);
  printf("canonical step on zmm (two pairs a register): %.2f a cycle = %.0f MACs a cycle, %.0f%% of the peak\n",
         triz, 64 * triz, 100 * 64 * triz / peak);

  t0 = cpu_seconds();
  LOOP(PAIRS("ymm"));
  printf("vpdpbusd + fma alone, ymm: %.2f a cycle", rate(6, t0, ghz));
  t0 = cpu_seconds();
  LOOP(PAIRS("zmm"));
  printf("; zmm: %.2f a cycle\n", rate(6, t0, ghz));
  return (int)(x & 1) - 1;  /* x is 1 + 16N, odd: returns 0 (and keeps the chain alive) */
}
