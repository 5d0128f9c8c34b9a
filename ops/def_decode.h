/* ops/ private header of the decoding ops (ops/def_decode.c): their definitions and CPU
 * kernels (ops/k_decode.c). Attribute slots: ops/def_decode.c. Not installed. */
#ifndef DTENSOR_DEF_DECODE_H
#define DTENSOR_DEF_DECODE_H

#include "ops/opdef_impl.h"

extern const dt_op_def dt__def_rope_half, dt__def_attention_cached;

/* rope_half on x [..., T, heads, D] (f32: angles, cos and sin in f64 rounded to f32, the
 * rotation in f32; f64 throughout), attention_cached on q [B, T, KV, G, D] against k, v
 * [B, S, KV, D] (f32: two BLAS GEMMs per kv head, softmax in f32 with an f64 sum). */
dt_status dt__k_rope_half(const dt_op_kernel_args *a);
dt_status dt__k_attention_cached(const dt_op_kernel_args *a);

/* The rotary inverse frequencies of a head of `head_dim` (head_dim / 2 of them): theta^(-2i /
 * head_dim), with llama3 != 0 scaled as Llama 3.1 does (wavelengths above original_max /
 * low_ff divided by factor, below original_max / high_ff kept, interpolated between). */
void dt__rope_freqs(int64_t head_dim, double theta, int llama3, double factor, double low_ff,
                    double high_ff, double original_max, double *inv_freq);

#endif
