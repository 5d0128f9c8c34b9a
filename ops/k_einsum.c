/* ops/k_einsum: einsum's equation (parsed, '...' expanded to spare letters) and its CPU
 * kernel on local blocks: one operand by a direct f64 loop, two as a batched GEMM through
 * cblas_sgemm / cblas_dgemm, each operand used in place when its local block already is a
 * [batch][m][k] / [batch][k][n] matrix (either order within the matrix), else packed first;
 * a letter of size 1 against a larger one broadcasts. */
#include <cblas.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "ops/def_reduce.h"
#include "runtime/error.h"

/* One operand's text: its letters in order and where its '...' sits (-1: none). */
typedef struct term {
    char letters[DT_MAX_RANK + 1];
    int n, ell;
} term;

static dt_status parse_term(const char *eq, const char *s, const char *end, int which, term *t)
{
    t->n = 0;
    t->ell = -1;
    for (const char *p = s; p < end; p++) {
        if (*p == '.') {
            if (t->ell >= 0 || end - p < 3 || p[1] != '.' || p[2] != '.')
                return dt__error(DT_ERR_INVALID_ARGUMENT, "einsum '%s': bad '...' at column %d", eq,
                                 (int)(p - eq) + 1);
            t->ell = t->n;
            p += 2;
            continue;
        }
        if (*p < 'a' || *p > 'z')
            return dt__error(DT_ERR_INVALID_ARGUMENT,
                             "einsum '%s': character '%c' at column %d (letters a-z only)", eq, *p,
                             (int)(p - eq) + 1);
        for (int k = 0; k < t->n; k++)
            if (t->letters[k] == *p)
                return dt__error(DT_ERR_INVALID_ARGUMENT,
                                 "einsum '%s': letter '%c' twice in %s %d (diagonals are not "
                                 "supported)",
                                 eq, *p, which < 0 ? "the output" : "operand", which);
        if (t->n >= DT_MAX_RANK)
            return dt__error(DT_ERR_INVALID_ARGUMENT, "einsum '%s': more than %d dims", eq,
                             DT_MAX_RANK);
        t->letters[t->n++] = *p;
    }
    return DT_OK;
}

dt_status dt__einsum_parse(const char *eq, int nin, const int *in_rank, dt__einsum_eq *out)
{
    const char *arrow = strstr(eq, "->");
    if (!arrow)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "einsum '%s': no '->' (explicit output needed)",
                         eq);
    if (strstr(arrow + 2, "->"))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "einsum '%s': '->' twice", eq);
    term t[3];
    const char *s = eq;
    int k = 0;
    for (;;) {
        const char *comma = memchr(s, ',', (size_t)(arrow - s));
        const char *end = comma ? comma : arrow;
        if (k >= nin)
            return dt__error(DT_ERR_INVALID_ARGUMENT, "einsum '%s': more than %d operands", eq,
                             nin);
        dt_status st = parse_term(eq, s, end, k, &t[k]);
        if (st != DT_OK)
            return st;
        k++;
        if (!comma)
            break;
        s = comma + 1;
    }
    if (k != nin)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "einsum '%s': %d operands for %d tensors", eq, k,
                         nin);
    dt_status st = parse_term(eq, arrow + 2, arrow + 2 + strlen(arrow + 2), -1, &t[nin]);
    if (st != DT_OK)
        return st;
    unsigned used = 0;
    for (int i = 0; i <= nin; i++)
        for (int d = 0; d < t[i].n; d++)
            used |= 1u << (t[i].letters[d] - 'a');
    int erank[2] = {0, 0}, emax = 0;
    for (int i = 0; i < nin; i++) {
        erank[i] = in_rank[i] - t[i].n;
        if (erank[i] < 0 || (t[i].ell < 0 && erank[i] != 0))
            return dt__error(DT_ERR_SHAPE, "einsum '%s': operand %d has rank %d, the equation %d",
                             eq, i, in_rank[i], t[i].n);
        if (erank[i] > emax)
            emax = erank[i];
    }
    /* The '...' dims get spare letters from 'z' down, right-aligned (NumPy broadcasting). */
    char spare[DT_MAX_RANK];
    int ns = 0;
    for (int c = 'z'; c >= 'a' && ns < emax; c--)
        if (!(used >> (c - 'a') & 1))
            spare[ns++] = (char)c;
    if (ns < emax)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "einsum '%s': no spare letters for '...'", eq);
    out->nin = nin;
    for (int i = 0; i <= nin; i++) {
        int e = i < nin ? erank[i] : (t[nin].ell >= 0 ? emax : 0);
        if (t[i].n + e > DT_MAX_RANK)
            return dt__error(DT_ERR_SHAPE, "einsum '%s': the output has more than %d dims", eq,
                             DT_MAX_RANK);
        int r = 0;
        for (int d = 0; d <= t[i].n; d++) {
            if (d == t[i].ell)
                for (int j = 0; j < e; j++)
                    out->letters[i][r++] = spare[emax - e + j];
            if (d < t[i].n)
                out->letters[i][r++] = t[i].letters[d];
        }
        out->rank[i] = r;
    }
    return DT_OK;
}

void dt__matmul_broadcast_eq(int ra, int rb, char *buf)
{
    if (ra == 1 && rb == 1)
        strcpy(buf, "k,k->");
    else if (rb == 1)
        strcpy(buf, "...mk,k->...m");
    else if (ra == 1)
        strcpy(buf, "k,...kn->...n");
    else
        strcpy(buf, "...mk,...kn->...mn");
}

/* ---- the kernel ------------------------------------------------------------------------ */

typedef struct plan {
    dt__einsum_eq eq;
    int64_t size[26];      /* local size of each letter */
    int64_t stride[3][26]; /* element stride of each letter per operand (0: absent, 1) */
    int has[3][26];        /* the operand has the letter at the letter's full size */
    char bat[26], m[26], n[26], k[26];
    int nb, nm, nn, nk;
    int64_t sb, sm, sn, sk;
} plan;

static int in_op(const plan *p, int i, char c)
{
    for (int d = 0; d < p->eq.rank[i]; d++)
        if (p->eq.letters[i][d] == c)
            return 1;
    return 0;
}

static int64_t prod(const plan *p, const char *ls, int n)
{
    int64_t s = 1;
    for (int j = 0; j < n; j++)
        s *= p->size[ls[j] - 'a'];
    return s;
}

/* Copies the operand into the contiguous order of letters ls (odometer; stride 0
 * broadcasts). */
static void pack(const void *src, const int64_t *stride, const plan *p, const char *ls, int n,
                 size_t es, void *dst, int scatter)
{
    int64_t idx[26] = {0}, total = prod(p, ls, n), off = 0;
    for (int64_t e = 0; e < total; e++) {
        if (scatter)
            memcpy((char *)dst + (size_t)off * es, (const char *)src + (size_t)e * es, es);
        else
            memcpy((char *)dst + (size_t)e * es, (const char *)src + (size_t)off * es, es);
        for (int d = n - 1; d >= 0; d--) {
            int c = ls[d] - 'a';
            if (++idx[d] < p->size[c]) {
                off += stride[c];
                break;
            }
            off -= stride[c] * (p->size[c] - 1);
            idx[d] = 0;
        }
    }
}

/* Whether operand i's letters, batch letters aside, read as the groups g1 then g2. */
static int reads_as(const plan *p, int i, const char *g1, int n1, const char *g2, int n2)
{
    int j = 0;
    for (int d = 0; d < p->eq.rank[i]; d++) {
        char c = p->eq.letters[i][d];
        if (memchr(p->bat, c, (size_t)p->nb)) {
            if (j > 0)
                return 0; /* a batch letter inside the matrix */
            continue;
        }
        char want = j < n1 ? g1[j] : j < n1 + n2 ? g2[j - n1] : 0;
        if (c != want || !p->has[i][c - 'a'])
            return 0;
        j++;
    }
    return j == n1 + n2;
}

static void einsum_one(const plan *p, const dt_op_kernel_args *a, double scale)
{
    /* out[o] = scale * sum over the letters only in the input. */
    char ks[26];
    int nk = 0;
    for (int d = 0; d < p->eq.rank[0]; d++)
        if (!in_op(p, 1, p->eq.letters[0][d]))
            ks[nk++] = p->eq.letters[0][d];
    int64_t total = prod(p, p->eq.letters[1], p->eq.rank[1]), inner = prod(p, ks, nk);
    int64_t oidx[DT_MAX_RANK] = {0}, base = 0;
    const dt_op_buf *x = &a->in[0];
    for (int64_t e = 0; e < total; e++) {
        int64_t kidx[26] = {0}, off = base;
        double acc = 0;
        for (int64_t r = 0; r < inner; r++) {
            acc += dt__rd_get(x->data, x->dtype, off);
            for (int d = nk - 1; d >= 0; d--) {
                int c = ks[d] - 'a';
                if (++kidx[d] < p->size[c]) {
                    off += p->stride[0][c];
                    break;
                }
                off -= p->stride[0][c] * (p->size[c] - 1);
                kidx[d] = 0;
            }
        }
        dt__rd_set(a->out.data, a->out.dtype, e, acc * scale);
        for (int d = p->eq.rank[1] - 1; d >= 0; d--) {
            int c = p->eq.letters[1][d] - 'a';
            if (++oidx[d] < p->size[c]) {
                base += p->stride[0][c];
                break;
            }
            base -= p->stride[0][c] * (p->size[c] - 1);
            oidx[d] = 0;
        }
    }
}

static void gemm(dt_dtype t, int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha,
                 const void *a, int64_t lda, const void *b, int64_t ldb, void *c, int64_t ldc)
{
    enum CBLAS_TRANSPOSE A = ta ? CblasTrans : CblasNoTrans, B = tb ? CblasTrans : CblasNoTrans;
    if (t == DT_DTYPE_F64)
        cblas_dgemm(CblasRowMajor, A, B, (int)m, (int)n, (int)k, alpha, a, (int)lda, b, (int)ldb,
                    0.0, c, (int)ldc);
    else
        cblas_sgemm(CblasRowMajor, A, B, (int)m, (int)n, (int)k, (float)alpha, a, (int)lda, b,
                    (int)ldb, 0.0f, c, (int)ldc);
}

static dt_status einsum_two(plan *p, const dt_op_kernel_args *a, double scale)
{
    size_t es = dt_dtype_size(a->out.dtype);
    const char *O = p->eq.letters[2];
    for (int d = 0; d < p->eq.rank[2]; d++) {
        char c = O[d];
        int ia = in_op(p, 0, c), ib = in_op(p, 1, c);
        if (ia && !ib)
            p->m[p->nm++] = c;
        else if (ib && !ia)
            p->n[p->nn++] = c;
        else
            p->bat[p->nb++] = c;
    }
    for (int i = 0; i < 2; i++)
        for (int d = 0; d < p->eq.rank[i]; d++) {
            char c = p->eq.letters[i][d];
            if (!in_op(p, 2, c) && !memchr(p->k, c, (size_t)p->nk))
                p->k[p->nk++] = c;
        }
    p->sb = prod(p, p->bat, p->nb);
    p->sm = prod(p, p->m, p->nm);
    p->sn = prod(p, p->n, p->nn);
    p->sk = prod(p, p->k, p->nk);
    if (p->sm > INT_MAX || p->sn > INT_MAX || p->sk > INT_MAX)
        return dt__error(DT_ERR_UNSUPPORTED, "einsum: a matrix dim beyond the BLAS int range");
    int64_t numel = dt__op_numel(&a->out);
    if (numel == 0)
        return DT_OK;
    if (p->sk == 0) {
        memset(a->out.data, 0, (size_t)numel * es);
        return DT_OK;
    }
    /* Each operand in place, or packed into [batch][m][k] / [batch][k][n] / [batch][m][n]. */
    void *buf[3] = {NULL, NULL, NULL};
    const void *ptr[2] = {a->in[0].data, a->in[1].data};
    int64_t bstride[3][26];
    memcpy(bstride, p->stride, sizeof(bstride));
    int ta = 0, tb = 0, tc = 0;
    int64_t lda, ldb;
    if (reads_as(p, 0, p->m, p->nm, p->k, p->nk)) {
        lda = p->sk;
    } else if (reads_as(p, 0, p->k, p->nk, p->m, p->nm)) {
        ta = 1;
        lda = p->sm;
    } else {
        char ls[26];
        memcpy(ls, p->bat, (size_t)p->nb);
        memcpy(ls + p->nb, p->m, (size_t)p->nm);
        memcpy(ls + p->nb + p->nm, p->k, (size_t)p->nk);
        buf[0] = malloc((size_t)(p->sb * p->sm * p->sk) * es);
        if (!buf[0])
            goto err_nomem;
        pack(a->in[0].data, p->stride[0], p, ls, p->nb + p->nm + p->nk, es, buf[0], 0);
        ptr[0] = buf[0];
        for (int64_t j = p->nb - 1, s = p->sm * p->sk; j >= 0; j--) {
            bstride[0][p->bat[j] - 'a'] = s;
            s *= p->size[p->bat[j] - 'a'];
        }
        lda = p->sk;
    }
    if (reads_as(p, 1, p->k, p->nk, p->n, p->nn)) {
        ldb = p->sn;
    } else if (reads_as(p, 1, p->n, p->nn, p->k, p->nk)) {
        tb = 1;
        ldb = p->sk;
    } else {
        char ls[26];
        memcpy(ls, p->bat, (size_t)p->nb);
        memcpy(ls + p->nb, p->k, (size_t)p->nk);
        memcpy(ls + p->nb + p->nk, p->n, (size_t)p->nn);
        buf[1] = malloc((size_t)(p->sb * p->sk * p->sn) * es);
        if (!buf[1])
            goto err_nomem;
        pack(a->in[1].data, p->stride[1], p, ls, p->nb + p->nk + p->nn, es, buf[1], 0);
        ptr[1] = buf[1];
        for (int64_t j = p->nb - 1, s = p->sk * p->sn; j >= 0; j--) {
            bstride[1][p->bat[j] - 'a'] = s;
            s *= p->size[p->bat[j] - 'a'];
        }
        ldb = p->sn;
    }
    void *c = a->out.data;
    int64_t ldc = p->sn;
    if (reads_as(p, 2, p->m, p->nm, p->n, p->nn)) {
        /* C as it is */
    } else if (reads_as(p, 2, p->n, p->nn, p->m, p->nm)) {
        tc = 1;
        ldc = p->sm;
    } else {
        buf[2] = malloc((size_t)numel * es);
        if (!buf[2])
            goto err_nomem;
        c = buf[2];
        for (int64_t j = p->nb - 1, s = p->sm * p->sn; j >= 0; j--) {
            bstride[2][p->bat[j] - 'a'] = s;
            s *= p->size[p->bat[j] - 'a'];
        }
    }
    int64_t bidx[26] = {0}, off[3] = {0, 0, 0};
    for (int64_t e = 0; e < p->sb; e++) {
        const char *pa = (const char *)ptr[0] + (size_t)off[0] * es;
        const char *pb = (const char *)ptr[1] + (size_t)off[1] * es;
        char *pc = (char *)c + (size_t)off[2] * es;
        if (!tc)
            gemm(a->out.dtype, ta, tb, p->sm, p->sn, p->sk, scale, pa, lda, pb, ldb, pc, ldc);
        else /* C^T = B^T A^T */
            gemm(a->out.dtype, !tb, !ta, p->sn, p->sm, p->sk, scale, pb, ldb, pa, lda, pc, ldc);
        for (int d = p->nb - 1; d >= 0; d--) {
            int l = p->bat[d] - 'a';
            if (++bidx[d] < p->size[l]) {
                for (int i = 0; i < 3; i++)
                    off[i] += bstride[i][l];
                break;
            }
            for (int i = 0; i < 3; i++)
                off[i] -= bstride[i][l] * (p->size[l] - 1);
            bidx[d] = 0;
        }
    }
    if (buf[2]) {
        char ls[26];
        memcpy(ls, p->bat, (size_t)p->nb);
        memcpy(ls + p->nb, p->m, (size_t)p->nm);
        memcpy(ls + p->nb + p->nm, p->n, (size_t)p->nn);
        pack(buf[2], p->stride[2], p, ls, p->nb + p->nm + p->nn, es, a->out.data, 1);
    }
    free(buf[0]);
    free(buf[1]);
    free(buf[2]);
    return DT_OK;
err_nomem:
    free(buf[0]);
    free(buf[1]);
    return dt__error(DT_ERR_NO_MEMORY, "einsum: no memory to pack an operand");
}

dt_status dt__k_einsum(const dt_op_kernel_args *a)
{
    plan p;
    memset(&p, 0, sizeof(p));
    char mm[32];
    const char *eq = a->attrs.s;
    int nin = a->nin, rank[2] = {a->in[0].rank, nin > 1 ? a->in[1].rank : 0};
    if (!eq[0]) {
        dt__matmul_broadcast_eq(rank[0], rank[1], mm);
        eq = mm;
    }
    dt_status st = dt__einsum_parse(eq, nin, rank, &p.eq);
    if (st != DT_OK)
        return st;
    const dt_op_buf *ops[3] = {&a->in[0], nin > 1 ? &a->in[1] : &a->out, &a->out};
    if (nin == 1)
        ops[2] = NULL;
    for (int i = 0; i <= nin; i++)
        for (int d = 0; d < p.eq.rank[i]; d++) {
            int c = p.eq.letters[i][d] - 'a';
            if (ops[i]->shape[d] > p.size[c])
                p.size[c] = ops[i]->shape[d];
        }
    for (int i = 0; i <= nin; i++) {
        int64_t s = 1;
        for (int d = p.eq.rank[i] - 1; d >= 0; d--) {
            int c = p.eq.letters[i][d] - 'a';
            int full = ops[i]->shape[d] == p.size[c];
            p.stride[i][c] = full && ops[i]->shape[d] > 1 ? s : 0;
            p.has[i][c] = full;
            s *= ops[i]->shape[d];
        }
    }
    double scale = a->attrs.f[0] != 0 ? a->attrs.f[0] : 1.0;
    if (nin == 1) {
        einsum_one(&p, a, scale);
        return DT_OK;
    }
    return einsum_two(&p, a, scale);
}
