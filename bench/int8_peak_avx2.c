/* What one core can retire on AVX2 without any VNNI (Zen 1-3, Haswell to
 * Ice Lake clients): the int8 multiply-add peak (vpmaddubsw, 32 MACs into
 * int16 pairs) and the rate of the blocks-of-32 prefill's inner step under
 * quant.h's canonical order on that path (vpmaddubsw, vpmaddwd with ones,
 * vcvtdq2ps, fma per weight row, activation row and block), with the
 * variants a tile could take.
 *
 *   gcc -O2 -mavx2 -mfma bench/int8_peak_avx2.c -o /tmp/int8_peak_avx2 && /tmp/int8_peak_avx2
 *
 * Timed on the thread's CPU clock, so a shared machine's load does not enter;
 * the clock rate comes from a chain of dependent register adds (one a cycle).
 */
#include <xmmintrin.h>

#include "peak_clock.h"

#define LOOP(body) \
  do { long m = N; __asm__ volatile("1:\n" body "dec %0\n jnz 1b\n" : "+r"(m) : "r"(scale), "r"(xbuf) : \
       "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "cc"); } while (0)

/* 12 vpmaddubsw into 12 registers (no chain: each overwrites its own). */
#define PEAK \
  "vpmaddubsw %%ymm14,%%ymm15,%%ymm0\n vpmaddubsw %%ymm14,%%ymm15,%%ymm1\n vpmaddubsw %%ymm14,%%ymm15,%%ymm2\n" \
  "vpmaddubsw %%ymm14,%%ymm15,%%ymm3\n vpmaddubsw %%ymm14,%%ymm15,%%ymm4\n vpmaddubsw %%ymm14,%%ymm15,%%ymm5\n" \
  "vpmaddubsw %%ymm14,%%ymm15,%%ymm6\n vpmaddubsw %%ymm14,%%ymm15,%%ymm7\n vpmaddubsw %%ymm14,%%ymm15,%%ymm8\n" \
  "vpmaddubsw %%ymm14,%%ymm15,%%ymm9\n vpmaddubsw %%ymm14,%%ymm15,%%ymm10\n vpmaddubsw %%ymm14,%%ymm15,%%ymm11\n"

/* The 4-sums alone: vpmaddubsw then vpmaddwd with ones (ymm13). */
#define SUM4(D) "vpmaddubsw %%ymm14,%%ymm15,%%ymm" D "\n vpmaddwd %%ymm13,%%ymm" D ",%%ymm" D "\n"
#define SUMS SUM4("0") SUM4("1") SUM4("2") SUM4("3") SUM4("4") SUM4("5")

/* One canonical step into fma accumulator A through scratch D, the scale a
 * register (ymm12) or broadcast from memory as the tiles do. */
#define STEP(D, A) SUM4(D) "vcvtdq2ps %%ymm" D ",%%ymm" D "\n vfmadd231ps %%ymm12,%%ymm" D ",%%ymm" A "\n"
#define STEPM(D, A) SUM4(D) "vcvtdq2ps %%ymm" D ",%%ymm" D "\n vbroadcastss (%1),%%ymm" D "\n" \
  "vfmadd231ps %%ymm12,%%ymm" D ",%%ymm" A "\n"
/* As the tiles run it: the activations a memory operand of vpmaddubsw (L1),
 * the weights a register (ymm14), the scale broadcast from memory. */
#define STEPT(D, A, OFF) "vpmaddubsw " OFF "(%2),%%ymm14,%%ymm" D "\n vpmaddwd %%ymm13,%%ymm" D ",%%ymm" D "\n" \
  "vcvtdq2ps %%ymm" D ",%%ymm" D "\n vbroadcastss (%1),%%ymm12\n vfmadd231ps %%ymm12,%%ymm" D ",%%ymm" A "\n"
/* The 4-sums without vpmaddwd, for 4- and 5-bit weights (|4-sum| < 2^15): P + (P << 16) holds
 * lo + hi in its high half, an arithmetic shift brings it down; three ops off the multiply pipes. */
#define STEPH(D, T, A, OFF) "vpmaddubsw " OFF "(%2),%%ymm14,%%ymm" D "\n vpslld $16,%%ymm" D ",%%ymm" T "\n" \
  "vpaddd %%ymm" T ",%%ymm" D ",%%ymm" D "\n vpsrad $16,%%ymm" D ",%%ymm" D "\n vcvtdq2ps %%ymm" D ",%%ymm" D "\n" \
  "vbroadcastss (%1),%%ymm12\n vfmadd231ps %%ymm12,%%ymm" D ",%%ymm" A "\n"
#define STEPL(D, A, OFF) "vmovdqa " OFF "(%2),%%ymm" D "\n vpmaddubsw %%ymm" D ",%%ymm14,%%ymm" D "\n vpmaddwd %%ymm13,%%ymm" D ",%%ymm" D "\n" \
  "vcvtdq2ps %%ymm" D ",%%ymm" D "\n vbroadcastss (%1),%%ymm12\n vfmadd231ps %%ymm12,%%ymm" D ",%%ymm" A "\n"
#define STEPS STEP("0", "6") STEP("1", "7") STEP("2", "8") STEP("3", "9") STEP("4", "10") STEP("5", "11")

/* Two blocks' int16 pair sums added in int16 before one vpmaddwd: half the
 * vpmaddwd and cvt (not the canonical order: the int32 4-sums of two blocks
 * would share one scale; listed for what the order costs). */
#define STEP2(D, A) "vpmaddubsw %%ymm14,%%ymm15,%%ymm" D "\n vpmaddubsw %%ymm14,%%ymm15,%%ymm12\n" \
  "vpaddw %%ymm12,%%ymm" D ",%%ymm" D "\n vpmaddwd %%ymm13,%%ymm" D ",%%ymm" D "\n" \
  "vcvtdq2ps %%ymm" D ",%%ymm" D "\n vfmadd231ps %%ymm13,%%ymm" D ",%%ymm" A "\n"
#define STEPS2 STEP2("0", "6") STEP2("1", "7") STEP2("2", "8") STEP2("3", "9") STEP2("4", "10") STEP2("5", "11")

/* What the conversion costs: vpaddd (any pipe) in place of vcvtdq2ps. */
#define STEPA(D, A) SUM4(D) "vpaddd %%ymm12,%%ymm" D ",%%ymm" D "\n vfmadd231ps %%ymm12,%%ymm" D ",%%ymm" A "\n"
#define STEPSA STEPA("0", "6") STEPA("1", "7") STEPA("2", "8") STEPA("3", "9") STEPA("4", "10") STEPA("5", "11")

int main(void) {
  long x = 1;
  static float scale_mem[8] = {1.0f};
  const float* scale = scale_mem;
  static char xbuf[512] __attribute__((aligned(64)));
  _mm_setcsr(_mm_getcsr() | 0x8040); /* FTZ and DAZ */
  __asm__ volatile("vpxor %%ymm12, %%ymm12, %%ymm12\n vpxor %%ymm13, %%ymm13, %%ymm13\n"
                   "vpxor %%ymm14, %%ymm14, %%ymm14\n vpxor %%ymm15, %%ymm15, %%ymm15" ::: "xmm12", "xmm13", "xmm14", "xmm15");
  const double ghz = clock_ghz(&x);
  double t0;

  t0 = cpu_seconds();
  LOOP(PEAK);
  const double mb = rate(12, t0, ghz);
  printf("vpmaddubsw ymm: %.2f a cycle = %.0f int8 MACs a cycle (%.0f G MAC/s a core): the int8 peak\n", mb, 32 * mb,
         32 * mb * ghz);
  t0 = cpu_seconds();
  LOOP(SUMS);
  const double s4 = rate(6, t0, ghz);
  printf("4-sums (vpmaddubsw + vpmaddwd): %.2f a cycle = %.0f MACs a cycle\n", s4, 32 * s4);
  t0 = cpu_seconds();
  LOOP(STEPS);
  const double st = rate(6, t0, ghz);
  printf("canonical step (4-sums, vcvtdq2ps, fma): %.2f a cycle = %.0f MACs a cycle, %.0f%% of the peak\n", st, 32 * st,
         100 * st / mb);
  t0 = cpu_seconds();
  LOOP(STEPM("0", "6") STEPM("1", "7") STEPM("2", "8") STEPM("3", "9") STEPM("4", "10") STEPM("5", "11"));
  const double sm = rate(6, t0, ghz);
  printf("canonical step with the scale broadcast from memory: %.2f a cycle = %.0f MACs a cycle\n", sm, 32 * sm);
  t0 = cpu_seconds();
  LOOP(STEPT("0", "6", "0") STEPT("1", "7", "64") STEPT("2", "8", "128") STEPT("3", "9", "192") STEPT("4", "10", "256")
       STEPT("5", "11", "320"));
  const double stt = rate(6, t0, ghz);
  printf("the step as the tiles run it (activations from L1, scale broadcast): %.2f a cycle = %.0f MACs a cycle\n", stt,
         32 * stt);
  t0 = cpu_seconds();
  LOOP(STEPL("0", "6", "0") STEPL("1", "7", "64") STEPL("2", "8", "128") STEPL("3", "9", "192") STEPL("4", "10", "256")
       STEPL("5", "11", "320"));
  const double stl = rate(6, t0, ghz);
  printf("the same with the activations loaded first: %.2f a cycle = %.0f MACs a cycle\n", stl, 32 * stl);
  t0 = cpu_seconds();
  LOOP(STEPH("0", "4", "6", "0") STEPH("1", "5", "7", "64") STEPH("2", "10", "8", "128") STEPH("3", "11", "9", "192"));
  const double sh = rate(4, t0, ghz);
  printf("the tiles' step with shifts in place of vpmaddwd: %.2f a cycle = %.0f MACs a cycle\n", sh, 32 * sh);
  t0 = cpu_seconds();
  LOOP(STEPSA);
  const double sa = rate(6, t0, ghz);
  printf("the step with vpaddd in place of vcvtdq2ps: %.2f a cycle = %.0f MACs a cycle\n", sa, 32 * sa);
  t0 = cpu_seconds();
  LOOP(STEPS2);
  const double s2 = rate(6, t0, ghz);
  printf("two blocks summed in int16 (another order): %.2f a cycle = %.0f MACs a cycle\n", s2, 64 * s2);
  return (int)(x & 1) - 1;
}
