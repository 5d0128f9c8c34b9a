/* The process's peak resident memory (Linux VmHWM), for bench_ckpt's GPU case and the GPU
 * checkpoint test (tests/ckpt/test_ckpt_gpu.c), which both measure how much host memory a
 * save or restore of GPU tensors adds. Depends on nothing but libc. */
#ifndef BENCH_PEAK_RSS_H
#define BENCH_PEAK_RSS_H

#include <stdint.h>

/* The peak resident set (VmHWM of /proc/self/status) in bytes, or -1. */
int64_t peak_rss_bytes(void);

/* Resets the peak to the current resident set (Linux >= 4.0: clear_refs 5) and returns it,
 * or -1 when the kernel cannot. */
int64_t peak_rss_reset(void);

#endif
