/* Ring attention (context parallelism) on CPU meshes: each device keeps its own query rows (a
 * contiguous shard of the sequence) and the key/value shards travel around the ring of the
 * sequence's mesh dim, one hop per block (send to the next coordinate, receive from the
 * previous, MPI_Isend/Irecv on the runtime communicator, or a copy when both devices are this
 * client's), the next block's transfer overlapping the current block's compute. Forward: the
 * tiled kernel on each (query shard, key block) pair with its log-sum-exp, combined by an
 * online softmax. Backward: the forward again for y and the lse, D = dy . y, then a second ring
 * where the dk/dv accumulators travel with their k/v block (cp hops: the last brings them
 * home), dq stays local. Memory per device O(T / cp) rows. docs/attention.md. */
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/attention_ring.h"
#include "runtime/comm.h"
#include "runtime/error.h"

#define BQ 128
#define BK 128
/* Tags of the ring's messages: RING_TAG + 2 position (+1 for the gradients) of the receiver. */
enum { RING_TAG = 12000, RING_MAX_POSITION = 2048 };
/* Zig-zag moves: ZZ_TAG + 2 position (+ which of the two chunks) of the receiver. */
enum { ZZ_TAG = 16400 }; /* below the staged transport's 24576 and up */

static dt__ring_stats stats; /* dt__attention_ring_stats (main thread only) */

void dt__attention_ring_stats(dt__ring_stats *out, int reset)
{
    if (out)
        *out = stats;
    if (reset)
        memset(&stats, 0, sizeof stats);
}

typedef struct part {
    int64_t c, off, len;   /* coordinate along the dim, own query rows */
    int64_t b0, h0;        /* global batch row and head of the local component's first */
    int64_t pos, next_pos; /* mesh positions of this device and the next one on the ring */
    int next_client, prev_client, next_local; /* next_local: its index here, or -1 */
    float *buf[2];      /* k | v of the block (packed), then dk | dv at 2 seg */
    double *lse;        /* [B, lh, len] running log-sum-exp (forward) */
    float *ytmp, *ltmp; /* one block's output and lse */
    float *dsum;        /* [B, lh, len] dy . y (backward) */
    /* The query rows computed here: one segment (the own shard) or, zig-zag, two chunks
     * (c and 2 cp - 1 - c of 2 cp), each [B, seg_len, ld], lse and dsum by segment. */
    int nseg;
    int64_t seg_off[2], seg_len[2];
    const float *qs[2], *dys[2];
    float *ys[2], *dqs[2];
    float *zbuf; /* zig-zag: q, dy, y, dq of the two chunks, 2 B cl ld each */
} part;

typedef struct ring {
    int64_t B, T, cp, lh, lkv, hd, ld, kld, seg, stride;
    int causal, n, cur, zigzag;
    dt__attn_drop drop; /* dropout of the probabilities (p 0: none); per block, its offsets */
    float *z;           /* [BK] a row's keep factors */
    int64_t cl; /* zig-zag: rows of a chunk (T / (2 cp)) */
    part *p;
    const dt_tensor *q;
} ring;

static int64_t shard_len(const ring *r, int64_t s)
{
    int64_t off, len;
    dt_shard_range(r->T, r->cp, s, &off, &len);
    return len;
}

static int64_t shard_off(const ring *r, int64_t s)
{
    int64_t off, len;
    dt_shard_range(r->T, r->cp, s, &off, &len);
    return off;
}

static void ring_free(ring *r)
{
    for (int i = 0; r->p && i < r->n; i++) {
        free(r->p[i].buf[0]);
        free(r->p[i].buf[1]);
        free(r->p[i].lse);
        free(r->p[i].ytmp);
        free(r->p[i].ltmp);
        free(r->p[i].dsum);
        free(r->p[i].zbuf);
    }
    free(r->p);
}

static dt_status ring_new(const dt_tensor *q, const dt_tensor *k, const dt_attention_opts *o,
                          int sdim, ring *r)
{
    const dt_mesh *mesh = dt_layout_mesh(dt_tensor_layout(q));
    const int64_t *s = dt_tensor_shape(q);
    memset(r, 0, sizeof *r);
    r->T = s[1];
    r->cp = dt_mesh_dim_size(mesh, sdim);
    r->hd = s[2] / o->heads;
    r->causal = o->causal;
    r->drop = (dt__attn_drop){.p = o->dropout, .seed = o->seed, .stream = o->stream,
                              .heads = o->heads, .seq = r->T};
    /* Causal work balanced (zig-zag) when the 2 cp chunks are equal; else own shards. */
    r->zigzag = r->causal && r->cp > 1 && r->T % (2 * r->cp) == 0;
    r->cl = r->T / (2 * r->cp);
    r->n = dt_tensor_num_local(q);
    r->stride = 1;
    for (int d = dt_mesh_rank(mesh) - 1; d > sdim; d--)
        r->stride *= dt_mesh_dim_size(mesh, d);
    if (dt_mesh_size(mesh) > RING_MAX_POSITION)
        return dt__error(DT_ERR_UNSUPPORTED,
                         "attention (ring): a mesh of %lld devices (at most "
                         "%d)",
                         (long long)dt_mesh_size(mesh), RING_MAX_POSITION);
    r->p = calloc((size_t)(r->n ? r->n : 1), sizeof *r->p);
    if (!r->p)
        return dt__error(DT_ERR_NO_MEMORY, "attention (ring): out of memory");
    int64_t maxlen = shard_len(r, 0); /* dt_shard_range: the first shards are the longest */
    for (int i = 0; i < r->n; i++) {
        const DLTensor *l = dt_tensor_local(q, i), *lk = dt_tensor_local(k, i);
        part *p = &r->p[i];
        r->B = l->shape[0];
        r->ld = l->shape[2];
        r->kld = lk->shape[2];
        r->lh = r->ld / r->hd;
        r->lkv = r->kld / r->hd;
        p->pos = dt_tensor_local_position(q, i);
        p->b0 = dt_tensor_local_offset(q, i)[0];
        p->h0 = dt_tensor_local_offset(q, i)[2] / r->hd;
        p->c = (p->pos / r->stride) % r->cp;
        p->off = shard_off(r, p->c);
        p->len = shard_len(r, p->c);
        if (l->shape[1] != p->len || lk->shape[1] != p->len)
            return dt__error(DT_ERR_UNSUPPORTED,
                             "attention (ring): shard of %lld rows, %lld "
                             "expected",
                             (long long)l->shape[1], (long long)p->len);
        int64_t nc = (p->c + 1) % r->cp, pc = (p->c + r->cp - 1) % r->cp;
        p->next_pos = p->pos + (nc - p->c) * r->stride;
        int64_t prev_pos = p->pos + (pc - p->c) * r->stride;
        dt_device_type ty = dt_mesh_device_type(mesh);
        p->next_client = dt_device_client(ty, dt_mesh_device_id(mesh, p->next_pos));
        p->prev_client = dt_device_client(ty, dt_mesh_device_id(mesh, prev_pos));
    }
    r->seg = r->B * maxlen * r->kld;
    if (2 * r->seg > INT_MAX)
        return dt__error(DT_ERR_UNSUPPORTED,
                         "attention (ring): blocks of %lld floats (at most "
                         "%d per message)",
                         (long long)(2 * r->seg), INT_MAX);
    size_t rows = (size_t)(r->B * maxlen), nb = (size_t)(4 * r->seg);
    for (int i = 0; i < r->n; i++) {
        part *p = &r->p[i];
        p->next_local = -1;
        for (int j = 0; j < r->n; j++)
            if (r->p[j].pos == p->next_pos)
                p->next_local = j;
        p->buf[0] = malloc((nb ? nb : 1) * sizeof(float));
        p->buf[1] = malloc((nb ? nb : 1) * sizeof(float));
        p->lse = malloc((rows * (size_t)r->lh + 1) * sizeof *p->lse);
        p->ltmp = malloc((rows * (size_t)r->lh + 1) * sizeof *p->ltmp);
        p->dsum = malloc((rows * (size_t)r->lh + 1) * sizeof *p->dsum);
        p->ytmp = malloc((rows * (size_t)r->ld + 1) * sizeof *p->ytmp);
        if (!p->buf[0] || !p->buf[1] || !p->lse || !p->ltmp || !p->dsum || !p->ytmp)
            return dt__error(DT_ERR_NO_MEMORY, "attention (ring): out of memory");
    }
    return DT_OK;
}

/* The block of source coordinate s (its k | v packed, then dk | dv) sits in p->buf[cur]. */
static int64_t src_of(const ring *r, const part *p, int h)
{
    return (p->c - h % r->cp + r->cp) % r->cp;
}

/* Online softmax: the block's (ytmp, ltmp) for segment sg merged into its (y, lse). */
static void combine(const ring *r, part *p, int sg, int first)
{
    int64_t len = p->seg_len[sg];
    double *lse = p->lse + sg * r->B * r->lh * p->seg_len[0];
    float *y = p->ys[sg];
    for (int64_t b = 0; b < r->B; b++)
        for (int64_t h = 0; h < r->lh; h++)
            for (int64_t t = 0; t < len; t++) {
                int64_t li = (b * r->lh + h) * len + t;
                float *yr = y + (b * len + t) * r->ld + h * r->hd;
                const float *tr = p->ytmp + (b * len + t) * r->ld + h * r->hd;
                double lb = p->ltmp[li];
                if (first || lse[li] == -INFINITY) {
                    memcpy(yr, tr, (size_t)r->hd * sizeof *yr);
                    lse[li] = lb;
                    continue;
                }
                double la = lse[li], m = la > lb ? la : lb;
                double wa = exp(la - m), wb = exp(lb - m), tot = wa + wb;
                wa /= tot;
                wb /= tot;
                for (int64_t d = 0; d < r->hd; d++)
                    yr[d] = (float)(wa * yr[d] + wb * tr[d]);
                lse[li] = m + log(tot);
            }
}

static void sgemm(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                  int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (int)m, (int)n, (int)k, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

/* The gradient of one head's nq query rows against nk keys (query row t sees key j when
 * j <= t + rel under the causal mask) from the rows' final lse and D = dy . y: dq, dk, dv
 * added to. s, dp: BQ x BK scratch. */
static void block_grad(const ring *r, int64_t nq, int64_t nk, int64_t rel, float scale,
                       const dt__attn_drop *drop, const float *q, const float *k, const float *v,
                       const float *dy, const double *lse, const float *dsum, float *dq,
                       float *dk, float *dv, float *s, float *dp)
{
    int64_t hd = r->hd, ld = r->ld, kld = r->kld;
    for (int64_t i0 = 0; i0 < nq; i0 += BQ) {
        int64_t mq = nq - i0 < BQ ? nq - i0 : BQ;
        for (int64_t j0 = 0; j0 < nk; j0 += BK) {
            int64_t mk = nk - j0 < BK ? nk - j0 : BK;
            if (r->causal && j0 > i0 + mq - 1 + rel)
                break;
            sgemm(0, 1, mq, mk, hd, scale, q + i0 * ld, ld, k + j0 * kld, kld, 0.0f, s, BK);
            sgemm(0, 1, mq, mk, hd, 1.0f, dy + i0 * ld, ld, v + j0 * kld, kld, 0.0f, dp, BK);
            for (int64_t t = 0; t < mq; t++) {
                int64_t lim = r->causal ? i0 + t + rel - j0 + 1 : mk; /* keys seen */
                float *sr = s + t * BK, *dr = dp + t * BK;
                int64_t nz = lim < mk ? (lim > 0 ? lim : 0) : mk;
                if (drop && nz > 0) /* dL/dp = z (dy . v); dv takes p z */
                    dt__attn_drop_row(drop, 0, 0, i0 + t, j0, nz, r->z);
                for (int64_t j = 0; j < mk; j++) {
                    float pr = j < lim ? expf((float)(sr[j] - lse[i0 + t])) : 0.0f;
                    float zj = drop && j < nz ? r->z[j] : 1.0f;
                    dr[j] = pr * (zj * dr[j] - dsum[i0 + t]) * scale;
                    sr[j] = pr * zj;
                }
            }
            sgemm(0, 0, mq, hd, mk, 1.0f, dp, BK, k + j0 * kld, kld, 1.0f, dq + i0 * ld, ld);
            sgemm(1, 0, mk, hd, mq, 1.0f, dp, BK, q + i0 * ld, ld, 1.0f, dk + j0 * kld, kld);
            sgemm(1, 0, mk, hd, mq, 1.0f, s, BK, dy + i0 * ld, ld, 1.0f, dv + j0 * kld, kld);
        }
    }
}

/* One device's work on the block of hop h, segment sg of its query rows: forward (grad 0)
 * or backward. */
static dt_status compute_seg(ring *r, int i, int sg, int h, int grad, float *s, float *dp)
{
    part *p = &r->p[i];
    int64_t src = src_of(r, p, h), koff = shard_off(r, src), klen = shard_len(r, src);
    int64_t off = p->seg_off[sg], len = p->seg_len[sg];
    int64_t lbase = sg * r->B * r->lh * p->seg_len[0];
    if (len == 0 || r->lh == 0)
        return DT_OK;
    if (klen == 0 || (r->causal && koff >= off + len)) { /* all masked */
        if (!grad && h == 0)
            for (int64_t j = 0; j < r->B * r->lh * len; j++)
                p->lse[lbase + j] = -INFINITY;
        return DT_OK;
    }
    const float *qd = p->qs[sg], *kb = p->buf[r->cur], *vb = kb + r->B * klen * r->kld;
    int64_t rel = off - koff;
    dt__attn_drop d = r->drop; /* this block's rows and keys in the global probabilities */
    d.b0 = p->b0;
    d.h0 = p->h0;
    d.q0 = off;
    d.k0 = koff;
    const dt__attn_drop *drop = d.p > 0.0f ? &d : NULL;
    if (!grad) {
        dt_status st = dt__attention_tiled_part(r->B, len, r->causal ? rel : 0, klen, r->lh, r->lkv,
                                                r->hd, r->causal, drop, qd, kb, vb, p->ytmp,
                                                p->ltmp);
        if (st == DT_OK)
            combine(r, p, sg, h == 0);
        return st;
    }
    const float *dyd = p->dys[sg];
    float *dqd = p->dqs[sg], *dkb = p->buf[r->cur] + 2 * r->seg, *dvb = dkb + r->B * klen * r->kld;
    int64_t group = r->lh / r->lkv;
    float scale = 1.0f / sqrtf((float)r->hd);
    for (int64_t b = 0; b < r->B; b++)
        for (int64_t hh = 0; hh < r->lh; hh++) {
            int64_t qo = b * len * r->ld + hh * r->hd;
            int64_t ko = b * klen * r->kld + (hh / group) * r->hd;
            int64_t li = lbase + (b * r->lh + hh) * len;
            dt__attn_drop dh = d; /* the head's rows: b and hh in the offsets */
            dh.b0 += b;
            dh.h0 += hh;
            block_grad(r, len, klen, rel, scale, drop ? &dh : NULL, qd + qo, kb + ko, vb + ko,
                       dyd + qo, p->lse + li, p->dsum + li, dqd + qo, dkb + ko, dvb + ko, s, dp);
        }
    return DT_OK;
}

static dt_status compute(ring *r, int i, int h, int grad, float *s, float *dp)
{
    dt_status st = DT_OK;
    for (int sg = 0; sg < r->p[i].nseg && st == DT_OK; sg++)
        st = compute_seg(r, i, sg, h, grad, s, dp);
    return st;
}

/* Posts what hop h sends or receives: kv (the k | v block) or the gradients. */
static dt_status post(ring *r, int h, int grads, MPI_Request *reqs, int *peers, int *nreq)
{
    int nxt = 1 - r->cur, off = grads ? (int)(2 * r->seg) : 0;
    for (int i = 0; i < r->n; i++) { /* receives (from the previous coordinate) */
        part *p = &r->p[i];
        if (p->prev_client == dt_client_id())
            continue;
        int64_t cnt = 2 * r->B * shard_len(r, src_of(r, p, h + 1)) * r->kld;
        int rc = MPI_Irecv(p->buf[nxt] + off, (int)cnt, MPI_FLOAT, p->prev_client,
                           RING_TAG + 2 * (int)p->pos + grads, dt__comm(), &reqs[*nreq]);
        if (rc != MPI_SUCCESS)
            return dt__mpi_error(rc, "attention (ring): MPI_Irecv");
        peers[(*nreq)++] = p->prev_client;
    }
    for (int i = 0; i < r->n; i++) { /* sends (to the next) */
        part *p = &r->p[i];
        int64_t cnt = 2 * r->B * shard_len(r, src_of(r, p, h)) * r->kld;
        const float *from = p->buf[r->cur] + off;
        if (p->next_local >= 0) {
            memcpy(r->p[p->next_local].buf[nxt] + off, from, (size_t)cnt * sizeof(float));
            continue;
        }
        int rc = MPI_Isend(from, (int)cnt, MPI_FLOAT, p->next_client,
                           RING_TAG + 2 * (int)p->next_pos + grads, dt__comm(), &reqs[*nreq]);
        if (rc != MPI_SUCCESS)
            return dt__mpi_error(rc, "attention (ring): MPI_Isend");
        peers[(*nreq)++] = p->next_client;
        stats.bytes += (double)cnt * sizeof(float);
        stats.messages++;
    }
    return DT_OK;
}

/* The cp hops of one pass (forward, or backward with the gradients travelling). */
static dt_status pass(ring *r, int grad, float *s, float *dp)
{
    MPI_Request *reqs = malloc((size_t)(4 * r->n + 1) * sizeof *reqs);
    int *peers = malloc((size_t)(4 * r->n + 1) * sizeof *peers);
    if (!reqs || !peers) {
        free(reqs);
        free(peers);
        return dt__error(DT_ERR_NO_MEMORY, "attention (ring): out of memory");
    }
    dt_status st = DT_OK;
    for (int h = 0; h < r->cp && st == DT_OK; h++) {
        int nreq = 0, kv = h < r->cp - 1;
        if (kv) /* the next block travels while this one is computed */
            st = post(r, h, 0, reqs, peers, &nreq);
        for (int i = 0; i < r->n && st == DT_OK; i++)
            st = compute(r, i, h, grad, s, dp);
        if (st == DT_OK && grad) /* the gradients once their block is done */
            st = post(r, h, 1, reqs, peers, &nreq);
        if (st == DT_OK && nreq > 0) {
            double t0 = dt__now_seconds();
            st = dt__wait_watched(reqs, peers, nreq, 0, "attention (ring)");
            stats.wait_s += dt__now_seconds() - t0;
        }
        if (st == DT_OK && (kv || grad))
            r->cur = 1 - r->cur;
    }
    free(reqs);
    free(peers);
    return st;
}

/* Position of the device at coordinate x of p's line, and its index here (-1: elsewhere). */
static int64_t line_pos(const ring *r, const part *p, int64_t x)
{
    return p->pos + (x - p->c) * r->stride;
}

static int local_of(const ring *r, int64_t pos)
{
    for (int j = 0; j < r->n; j++)
        if (r->p[j].pos == pos)
            return j;
    return -1;
}

/* Zig-zag: chunk j of 2 cp lies in half j % 2 of device j / 2's shard and is computed on
 * device holder(j), as its segment slot(j). */
static int64_t holder(const ring *r, int64_t j)
{
    return j < r->cp ? j : 2 * r->cp - 1 - j;
}

static int slot(const ring *r, int64_t j)
{
    return j < r->cp ? 0 : 1;
}

/* zbuf: units 0-1 q, 2-3 dy, 4-5 y then dq (never live together), 6-7 packing. */
static int64_t zslot(int which, int k)
{
    return (which >= 2 ? 4 : 2 * which) + k;
}

/* Moves one of the zig-zag arrays (which: 0 q, 1 dy, 2 y, 3 dq in zbuf): back 0, from the
 * own shards (t's local data) to the chunks' holders; back 1, from the holders to the owners'
 * shards. Point to point, waited under the watchdog. */
static dt_status zz_move(ring *r, const dt_tensor *t, int which, int back)
{
    int64_t unit = r->B * r->cl * r->ld;
    MPI_Request *reqs = malloc((size_t)(4 * r->n + 1) * sizeof *reqs);
    int *peers = malloc((size_t)(4 * r->n + 1) * sizeof *peers);
    if (!reqs || !peers) {
        free(reqs);
        free(peers);
        return dt__error(DT_ERR_NO_MEMORY, "attention (ring): out of memory");
    }
    dt_status st = DT_OK;
    int nreq = 0, me = dt_client_id();
    dt_device_type ty = DT_DEVICE_CPU;
    const dt_mesh *mesh = dt_layout_mesh(dt_tensor_layout(t));
    for (int i = 0; i < r->n && st == DT_OK; i++) { /* receives */
        part *p = &r->p[i];
        for (int k = 0; k < 2 && st == DT_OK; k++) {
            /* back 0: my chunk k (c, then 2 cp - 1 - c) from its owner; back 1: my half k
             * from its holder */
            int64_t j = back ? 2 * p->c + k : (k ? 2 * r->cp - 1 - p->c : p->c);
            int64_t from = line_pos(r, p, back ? holder(r, j) : j / 2);
            int cl = dt_device_client(ty, dt_mesh_device_id(mesh, from));
            if (cl == me)
                continue;
            float *into = back ? p->zbuf + (6 + k) * unit : p->zbuf + zslot(which, k) * unit;
            int rc = MPI_Irecv(into, (int)unit, MPI_FLOAT, cl, ZZ_TAG + 2 * (int)p->pos + k,
                               dt__comm(), &reqs[nreq]);
            if (rc != MPI_SUCCESS)
                st = dt__mpi_error(rc, "attention (ring): MPI_Irecv");
            else
                peers[nreq++] = cl;
        }
    }
    for (int i = 0; i < r->n && st == DT_OK; i++) { /* sends */
        part *p = &r->p[i];
        const float *own = dt__local_data(t, i);
        for (int k = 0; k < 2 && st == DT_OK; k++) {
            int64_t j = back ? (k ? 2 * r->cp - 1 - p->c : p->c) : 2 * p->c + k;
            int64_t to = line_pos(r, p, back ? j / 2 : holder(r, j));
            int tk = back ? (int)(j % 2) : slot(r, j);
            const float *from = p->zbuf + zslot(which, k) * unit;
            if (!back) { /* half k of the own shard, packed */
                float *pk = p->zbuf + (6 + k) * unit;
                for (int64_t b = 0; b < r->B; b++)
                    memcpy(pk + b * r->cl * r->ld, own + (b * 2 * r->cl + k * r->cl) * r->ld,
                           (size_t)(r->cl * r->ld) * sizeof *pk);
                from = pk;
            }
            int li = local_of(r, to);
            if (li >= 0) {
                float *into = back ? r->p[li].zbuf + (6 + tk) * unit
                                   : r->p[li].zbuf + zslot(which, tk) * unit;
                memcpy(into, from, (size_t)unit * sizeof *into);
                continue;
            }
            int cl = dt_device_client(ty, dt_mesh_device_id(mesh, to));
            int rc = MPI_Isend(from, (int)unit, MPI_FLOAT, cl, ZZ_TAG + 2 * (int)to + tk,
                               dt__comm(), &reqs[nreq]);
            if (rc != MPI_SUCCESS)
                st = dt__mpi_error(rc, "attention (ring): MPI_Isend");
            else {
                peers[nreq++] = cl;
                stats.bytes += (double)unit * sizeof(float);
                stats.messages++;
            }
        }
    }
    if (st == DT_OK && nreq > 0) {
        double t0 = dt__now_seconds();
        st = dt__wait_watched(reqs, peers, nreq, 0, "attention (ring, zig-zag)");
        stats.wait_s += dt__now_seconds() - t0;
    }
    for (int i = 0; back && st == DT_OK && i < r->n; i++) { /* unpack into the own shards */
        part *p = &r->p[i];
        float *own = dt__local_data(t, i);
        for (int k = 0; k < 2; k++)
            for (int64_t b = 0; b < r->B; b++)
                memcpy(own + (b * 2 * r->cl + k * r->cl) * r->ld,
                       p->zbuf + (6 + k) * unit + b * r->cl * r->ld,
                       (size_t)(r->cl * r->ld) * sizeof *own);
    }
    free(reqs);
    free(peers);
    return st;
}

/* The query segments of every part: its own shard, or (zig-zag) its two chunks in zbuf. */
static dt_status segments(ring *r, const dt_tensor *dy, dt_tensor *y, dt_tensor *dq)
{
    int64_t unit = r->B * r->cl * r->ld;
    for (int i = 0; i < r->n; i++) {
        part *p = &r->p[i];
        if (!r->zigzag) {
            p->nseg = 1;
            p->seg_off[0] = p->off;
            p->seg_len[0] = p->len;
            p->qs[0] = dt__local_data(r->q, i);
            p->dys[0] = dy ? dt__local_data(dy, i) : NULL;
            p->ys[0] = dt__local_data(y ? y : dq, i);
            p->dqs[0] = dq ? dt__local_data(dq, i) : NULL;
            continue;
        }
        p->zbuf = malloc((size_t)(8 * unit + 1) * sizeof *p->zbuf);
        if (!p->zbuf)
            return dt__error(DT_ERR_NO_MEMORY, "attention (ring): out of memory");
        p->nseg = 2;
        for (int k = 0; k < 2; k++) {
            p->seg_off[k] = (k ? 2 * r->cp - 1 - p->c : p->c) * r->cl;
            p->seg_len[k] = r->cl;
            p->qs[k] = p->zbuf + k * unit;
            p->dys[k] = p->zbuf + (2 + k) * unit;
            p->ys[k] = p->zbuf + (4 + k) * unit; /* y, then dq: the two never live together */
            p->dqs[k] = p->zbuf + (4 + k) * unit;
        }
    }
    return DT_OK;
}

/* Each device's own k | v block into its current buffer (and the gradients zeroed). */
static void load(ring *r, const dt_tensor *k, const dt_tensor *v)
{
    for (int i = 0; i < r->n; i++) {
        part *p = &r->p[i];
        size_t n = (size_t)(r->B * p->len * r->kld);
        float *b = p->buf[r->cur];
        if (n) {
            memcpy(b, dt__local_data(k, i), n * sizeof *b);
            memcpy(b + n, dt__local_data(v, i), n * sizeof *b);
        }
        memset(b + 2 * r->seg, 0, 2 * (size_t)r->seg * sizeof *b);
    }
}

dt_status dt__attention_ring(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                             const dt_tensor *dy, const dt_attention_opts *o, int sdim,
                             dt_tensor *y, dt_tensor *dq, dt_tensor *dk, dt_tensor *dv)
{
    ring r;
    dt_status st = ring_new(q, k, o, sdim, &r);
    float *s = malloc((2 * BQ * BK + BK) * sizeof *s);
    if (st == DT_OK && !s)
        st = dt__error(DT_ERR_NO_MEMORY, "attention (ring): out of memory");
    r.z = s ? s + 2 * BQ * BK : NULL;
    r.q = q;
    if (st == DT_OK)
        st = segments(&r, dy, y, dq);
    if (st == DT_OK && r.zigzag) /* the query rows (and dy) to their chunks' devices */
        st = zz_move(&r, q, 0, 0);
    if (st == DT_OK && r.zigzag && dy)
        st = zz_move(&r, dy, 1, 0);
    if (st == DT_OK) {
        dt__blas_threads_once();
        load(&r, k, v);
        st = pass(&r, 0, s, s + BQ * BK); /* the forward (again, for the backward) */
    }
    if (st == DT_OK && !dy && r.zigzag)
        st = zz_move(&r, y, 2, 1); /* the output rows to their owners */
    if (st == DT_OK && dy) {
        for (int i = 0; i < r.n; i++) { /* D = dy . y by row, then dq zeroed */
            part *p = &r.p[i];
            for (int sg = 0; sg < p->nseg; sg++) {
                int64_t len = p->seg_len[sg], lbase = sg * r.B * r.lh * p->seg_len[0];
                for (int64_t b = 0; b < r.B; b++)
                    for (int64_t h = 0; h < r.lh; h++)
                        for (int64_t t = 0; t < len; t++) {
                            const float *a = p->ys[sg] + (b * len + t) * r.ld + h * r.hd,
                                        *g = p->dys[sg] + (b * len + t) * r.ld + h * r.hd;
                            double acc = 0;
                            for (int64_t d = 0; d < r.hd; d++)
                                acc += (double)a[d] * g[d];
                            p->dsum[lbase + (b * r.lh + h) * len + t] = (float)acc;
                        }
                if (len && r.ld)
                    memset(p->dqs[sg], 0, (size_t)(r.B * len * r.ld) * sizeof(float));
            }
        }
        r.cur = 0;
        load(&r, k, v);
        st = pass(&r, 1, s, s + BQ * BK);
        for (int i = 0; st == DT_OK && i < r.n; i++) { /* the gradients are home */
            part *p = &r.p[i];
            size_t n = (size_t)(r.B * p->len * r.kld);
            const float *g = r.p[i].buf[r.cur] + 2 * r.seg;
            if (n) {
                memcpy(dt__local_data(dk, i), g, n * sizeof(float));
                memcpy(dt__local_data(dv, i), g + n, n * sizeof(float));
            }
        }
        if (st == DT_OK && r.zigzag) /* dq back to the rows' owners */
            st = zz_move(&r, dq, 3, 1);
    }
    free(s);
    ring_free(&r);
    return st;
}
