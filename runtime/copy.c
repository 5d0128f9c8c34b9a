/* Large host copies with streaming (non-temporal) stores. A copy much larger than the caches
 * gains nothing from keeping its destination there, and a plain store first reads each
 * destination line (read-for-ownership): three passes over memory per byte, where streaming
 * stores need two. glibc's memcpy streams only above its x86_non_temporal_threshold (about
 * 3/4 of the L3 it sees, ~180 MiB on our VMs), so a relayout's copies of 8..180 MiB went the
 * slow way. docs/transports.md, "Large copies". */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/env.h"
#include "runtime/util.h"

/* Streaming stores: -1 until asked, then 1 or 0 (atomic: copies run on several threads). */
static _Atomic int on = -1;

#if defined(__x86_64__) && defined(__SSE2__)
#include <emmintrin.h>

enum { PAGE = 4096, LINE = 64 };

/* Copies one 64-byte line with four streaming stores (dst 64-byte aligned). */
static inline void stream_line(char *dst, const char *src)
{
    __m128i a = _mm_loadu_si128((const __m128i *)src);
    __m128i b = _mm_loadu_si128((const __m128i *)(src + 16));
    __m128i c = _mm_loadu_si128((const __m128i *)(src + 32));
    __m128i d = _mm_loadu_si128((const __m128i *)(src + 48));
    _mm_stream_si128((__m128i *)dst, a);
    _mm_stream_si128((__m128i *)(dst + 16), b);
    _mm_stream_si128((__m128i *)(dst + 32), c);
    _mm_stream_si128((__m128i *)(dst + 48), d);
}

/* Streams n bytes (a multiple of 64, dst 64-byte aligned). Blocks of four pages go line by
 * line across the four pages, so four read and four write streams are open at once (as
 * glibc's own large copy does): measured 25-35% faster here than one line after the other,
 * and a software prefetch (NTA) made either slower (docs/transports.md, "Large copies"). */
static void stream_lines(char *dst, const char *src, size_t n)
{
    size_t blocks = n / (4 * PAGE) * (4 * PAGE), i = 0;
    for (size_t o = 0; o < blocks; o += 4 * PAGE)
        for (size_t l = 0; l < PAGE; l += LINE)
            for (size_t p = 0; p < 4 * PAGE; p += PAGE)
                stream_line(dst + o + p + l, src + o + p + l);
    for (i = blocks; i < n; i += LINE)
        stream_line(dst + i, src + i);
}

void dt__copy_set_streaming(int yes)
{
    on = yes != 0;
}

dt_status dt__copy_configure(void)
{
    int yes = 1;
    dt_status st = dt__env_flag("DT_COPY_STREAM", 1, "streaming stores in copies of 8 MiB and "
                                "more", &yes);
    if (st == DT_OK)
        on = yes;
    return st;
}

/* 1 unless DT_COPY_STREAM=0 (read at dt_init, or here before it) or dt__copy_set_streaming(0). */
static int streaming(void)
{
    if (on < 0) {
        const char *v = getenv("DT_COPY_STREAM");
        on = !(v && strcmp(v, "0") == 0);
    }
    return on;
}

void dt__copy_large(void *dst, const void *src, size_t bytes)
{
    if (bytes < DT__COPY_LARGE || !streaming()) {
        memcpy(dst, src, bytes);
        return;
    }
    char *d = dst;
    const char *s = src;
    /* Head: plain copy up to the destination's next 64-byte line, so stores fill lines. */
    size_t head = (64 - ((uintptr_t)d & 63)) & 63;
    memcpy(d, s, head);
    d += head;
    s += head;
    bytes -= head;
    size_t body = bytes & ~(size_t)63;
    stream_lines(d, s, body);
    /* Streaming stores are weakly ordered: fence them before the copy counts as done (a
     * peer is told through a release store that it may read). */
    _mm_sfence();
    memcpy(d + body, s + body, bytes - body);
}
void dt__zero_large(void *dst, size_t bytes)
{
    if (bytes < DT__COPY_LARGE || !streaming()) {
        memset(dst, 0, bytes);
        return;
    }
    char *d = dst;
    size_t head = (64 - ((uintptr_t)d & 63)) & 63;
    memset(d, 0, head);
    d += head;
    bytes -= head;
    size_t body = bytes & ~(size_t)63;
    __m128i z = _mm_setzero_si128();
    for (size_t i = 0; i < body; i += LINE) {
        _mm_stream_si128((__m128i *)(d + i), z);
        _mm_stream_si128((__m128i *)(d + i + 16), z);
        _mm_stream_si128((__m128i *)(d + i + 32), z);
        _mm_stream_si128((__m128i *)(d + i + 48), z);
    }
    _mm_sfence(); /* as in dt__copy_large: done before anyone is told */
    memset(d + body, 0, bytes - body);
}
#else
void dt__copy_set_streaming(int yes)
{
    on = yes != 0; /* nothing streams here either way */
}

void dt__copy_large(void *dst, const void *src, size_t bytes)
{
    memcpy(dst, src, bytes); /* no streaming stores here: the C library's choice */
}

void dt__zero_large(void *dst, size_t bytes)
{
    memset(dst, 0, bytes);
}
#endif
