/* ops/def_reduce_linalg: definitions and public functions of einsum (its factor rule is the
 * equation itself) and matmul_broadcast (torch.matmul as an einsum with '...'); the backward
 * of both is two einsums with permuted equations. */
#include <string.h>

#include "ops/def_reduce.h"
#include "runtime/error.h"

/* The equation of a call: attrs s, or the matmul_broadcast one from the ranks. */
static const char *equation(const dt_op_attrs *at, int nin, const int *rank, char *buf)
{
    if (at->s[0])
        return at->s;
    dt__matmul_broadcast_eq(rank[0], nin > 1 ? rank[1] : 1, buf);
    return buf;
}

static dt_status parse_sig(const dt_op_sig *sig, const char **eq_out, char *buf, dt__einsum_eq *e)
{
    int rank[2] = {sig->in[0].rank, sig->nin > 1 ? sig->in[1].rank : 0};
    if (!sig->attrs->s[0]) {
        if (sig->nin != 2 || rank[0] < 1 || rank[1] < 1)
            return dt__error(DT_ERR_SHAPE, "matmul_broadcast: ranks %d and %d (>= 1 needed)",
                             rank[0], rank[1]);
    } else if (sig->nin > 2) {
        return dt__error(DT_ERR_INVALID_ARGUMENT, "einsum: %d operands (1 or 2)", sig->nin);
    }
    *eq_out = equation(sig->attrs, sig->nin, rank, buf);
    return dt__einsum_parse(*eq_out, sig->nin, rank, e);
}

static dt_status einsum_rule(const dt_op_sig *sig, char *buf, size_t len)
{
    dt__einsum_eq e;
    char mm[32];
    const char *eq;
    dt_status st = parse_sig(sig, &eq, mm, &e);
    if (st != DT_OK)
        return st;
    if (strlen(eq) >= len)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "einsum '%s': rule buffer too small", eq);
    strcpy(buf, eq);
    dt__rd_rule_fixup(buf, len);
    return DT_OK;
}

/* Every letter's global size: equal in every operand, or 1 (broadcast); output-only letters
 * from attrs. */
static dt_status letter_sizes(const dt_op_sig *sig, const char *eq, const dt__einsum_eq *e,
                              int64_t *size)
{
    for (int c = 0; c < 26; c++)
        size[c] = -1;
    for (int i = 0; i < e->nin; i++)
        for (int d = 0; d < e->rank[i]; d++) {
            int c = e->letters[i][d] - 'a';
            int64_t s = sig->in[i].dim[d];
            if (size[c] < 0 || size[c] == 1)
                size[c] = s;
            else if (s != size[c] && s != 1)
                return dt__error(DT_ERR_SHAPE,
                                 "einsum '%s': letter '%c' is %lld in operand %d, %lld before", eq,
                                 c + 'a', (long long)s, i, (long long)size[c]);
        }
    for (int d = 0; d < e->rank[e->nin]; d++) {
        int c = e->letters[e->nin][d] - 'a';
        if (size[c] < 0 || (size[c] == 1 && sig->attrs->i[c] > 1)) {
            if (sig->attrs->i[c] <= 0)
                return dt__error(DT_ERR_INVALID_ARGUMENT,
                                 "einsum '%s': output letter '%c' is in no operand", eq, c + 'a');
            size[c] = sig->attrs->i[c];
        }
    }
    return DT_OK;
}

static dt_status einsum_infer(const dt_op_sig *sig, dt_op_shape *out)
{
    dt__einsum_eq e;
    char mm[32], s[96], t[96];
    const char *eq;
    dt_status st = parse_sig(sig, &eq, mm, &e);
    if (st != DT_OK)
        return st;
    dt_dtype dt = sig->in[0].dtype;
    if (!dt__rd_float(dt) || (sig->nin > 1 && sig->in[1].dtype != dt))
        return dt__error(DT_ERR_SHAPE,
                         "einsum '%s': operands %s (%s) and %s (%s): f32 or f64, "
                         "alike",
                         eq, dt__rd_shape_str(&sig->in[0], s, sizeof(s)), dt_dtype_name(dt),
                         sig->nin > 1 ? dt__rd_shape_str(&sig->in[1], t, sizeof(t)) : "-",
                         sig->nin > 1 ? dt_dtype_name(sig->in[1].dtype) : "-");
    int64_t size[26];
    st = letter_sizes(sig, eq, &e, size);
    if (st != DT_OK)
        return st;
    out->dtype = dt;
    out->rank = e.rank[e.nin];
    for (int d = 0; d < out->rank; d++)
        out->dim[d] = size[e.letters[e.nin][d] - 'a'];
    return DT_OK;
}

/* d(operand i) = einsum(dy and the other operand -> operand i's letters): a letter the
 * operand broadcast (size 1 against more) becomes a new size-1 output letter (so the
 * original one is summed), a letter only in operand i a new output letter of its size
 * (attrs i[] carry every output letter's size). */
static dt_status grad_of(const dt_op_grad *g, const dt_tensor *dy, const char *eq,
                         const dt__einsum_eq *e, const int64_t *size, int i, dt_tensor **dx)
{
    dt_op_attrs at = DT_OP_ATTRS_INIT;
    at.f[0] = g->attrs->f[0];
    unsigned used = 0;
    for (int j = 0; j <= e->nin; j++)
        for (int d = 0; d < e->rank[j]; d++)
            used |= 1u << (e->letters[j][d] - 'a');
    int other = 1 - i;
    char out[DT_MAX_RANK + 1];
    const int64_t *xs = dt_tensor_shape(g->in[i]);
    for (int d = 0; d < e->rank[i]; d++) {
        int c = e->letters[i][d] - 'a';
        if (xs[d] != size[c]) { /* broadcast: a fresh letter of size 1 */
            int f = 0;
            while (f < 26 && (used >> f & 1))
                f++;
            if (f == 26)
                return dt__error(DT_ERR_UNSUPPORTED,
                                 "einsum '%s': no letter left for the "
                                 "gradient",
                                 eq);
            used |= 1u << f;
            c = f;
        }
        /* the size of every output letter: those in no operand, or only at size 1 there */
        at.i[c] = xs[d];
        out[d] = (char)('a' + c);
    }
    out[e->rank[i]] = 0;
    char geq[DT_OP_MAX_SATTR];
    const char *o = e->letters[e->nin];
    int n;
    if (e->nin == 1)
        n = snprintf(geq, sizeof(geq), "%.*s->%s", e->rank[1], o, out);
    else if (i == 0)
        n = snprintf(geq, sizeof(geq), "%.*s,%.*s->%s", e->rank[2], o, e->rank[1], e->letters[1],
                     out);
    else
        n = snprintf(geq, sizeof(geq), "%.*s,%.*s->%s", e->rank[0], e->letters[0], e->rank[2], o,
                     out);
    if (n < 0 || (size_t)n >= sizeof(at.s))
        return dt__error(DT_ERR_UNSUPPORTED, "einsum '%s': gradient equation too long", eq);
    memcpy(at.s, geq, (size_t)n + 1);
    const dt_tensor *in[2];
    if (e->nin == 1) {
        in[0] = dy;
    } else {
        in[i == 0 ? 0 : 1] = dy;
        in[i == 0 ? 1 : 0] = g->in[other];
    }
    return dt__op_run(&dt__def_einsum, in, e->nin, &at, NULL, dx);
}

static dt_status einsum_backward(const dt_op_grad *g)
{
    dt_op_sig sig;
    memset(&sig, 0, sizeof(sig));
    sig.nin = g->nin;
    sig.attrs = g->attrs;
    for (int i = 0; i < g->nin; i++) {
        sig.in[i].dtype = dt_tensor_dtype(g->in[i]);
        sig.in[i].rank = dt_tensor_rank(g->in[i]);
        memcpy(sig.in[i].dim, dt_tensor_shape(g->in[i]), sizeof(int64_t) * (size_t)sig.in[i].rank);
    }
    dt__einsum_eq e;
    char mm[32];
    const char *eq;
    int64_t size[26];
    dt_status st = parse_sig(&sig, &eq, mm, &e);
    if (st == DT_OK)
        st = letter_sizes(&sig, eq, &e, size);
    const dt_tensor *dy = NULL;
    dt_tensor *owned = NULL;
    if (st == DT_OK)
        st = dt__rd_dy(g, sig.in[0].dtype, &dy, &owned);
    for (int i = 0; st == DT_OK && i < g->nin; i++)
        if (g->needs[i])
            st = grad_of(g, dy, eq, &e, size, i, &g->dx[i]);
    dt_tensor_destroy(owned);
    return st;
}

static const char *const sample_eqs[] = {"ij,jk->ik",   "bij,bjk->bik", "ij->ji", "ijk->ki",
                                         "bij,jk->bik", "ij,kj->ik",    "i,i->",  "ij,j->i"};

static dt_status einsum_sample(uint64_t seed, int max_dim, dt_op_sig *sig, dt_op_attrs *attrs)
{
    uint64_t s = seed;
    const char *eq = sample_eqs[dt__rd_rand(&s) % (sizeof(sample_eqs) / sizeof(*sample_eqs))];
    int64_t size[26];
    for (int c = 0; c < 26; c++)
        size[c] = dt__rd_randint(&s, 1, max_dim);
    strcpy(attrs->s, eq);
    sig->nin = 0;
    const char *p = eq;
    for (;;) {
        dt_op_shape *x = &sig->in[sig->nin++];
        x->dtype = DT_DTYPE_F64;
        x->rank = 0;
        while (*p >= 'a' && *p <= 'z')
            x->dim[x->rank++] = size[*p++ - 'a'];
        if (*p != ',')
            break;
        p++;
    }
    return DT_OK;
}

static dt_status matmul_sample(uint64_t seed, int max_dim, dt_op_sig *sig, dt_op_attrs *attrs)
{
    (void)attrs;
    uint64_t s = seed;
    int ra = (int)dt__rd_randint(&s, 1, 4), rb = (int)dt__rd_randint(&s, 1, 4);
    int64_t m = dt__rd_randint(&s, 1, max_dim), k = dt__rd_randint(&s, 1, max_dim),
            n = dt__rd_randint(&s, 1, max_dim);
    sig->nin = 2;
    dt_op_shape *a = &sig->in[0], *b = &sig->in[1];
    a->dtype = b->dtype = DT_DTYPE_F64;
    a->rank = ra;
    b->rank = rb;
    /* batch dims right-aligned: equal or 1 */
    for (int d = 0; d < ra - 2; d++)
        a->dim[d] = dt__rd_randint(&s, 1, max_dim);
    for (int d = 0; d < rb - 2; d++) {
        int da = ra - 2 - (rb - 2) + d;
        b->dim[d] = da >= 0 && dt__rd_randint(&s, 0, 1) ? a->dim[da] : 1;
        if (da >= 0 && b->dim[d] != 1 && a->dim[da] != b->dim[d])
            b->dim[d] = 1;
    }
    if (ra == 1) {
        a->dim[0] = k;
    } else {
        a->dim[ra - 2] = m;
        a->dim[ra - 1] = k;
    }
    if (rb == 1) {
        b->dim[0] = k;
    } else {
        b->dim[rb - 2] = k;
        b->dim[rb - 1] = n;
    }
    return DT_OK;
}

const dt_op_def dt__def_einsum = {
    .name = "einsum",
    .nin = 1,
    .nin_max = 2,
    .rule_fn = einsum_rule,
    .infer = einsum_infer,
    .cpu = dt__k_einsum,
    .backward = einsum_backward,
    .linearity = DT_OP_LINEAR_MULTI,
    .linear_in = 3u,
    .reduce = DT_REDUCE_SUM,
    .doc = "einsum of one or two operands; the equation is the rule (a sharded contracted "
           "letter: partial sum)",
    .family = "linear",
    .sample = einsum_sample,
};

const dt_op_def dt__def_matmul_broadcast = {
    .name = "matmul_broadcast",
    .nin = 2,
    .rule_fn = einsum_rule,
    .infer = einsum_infer,
    .cpu = dt__k_einsum,
    .backward = einsum_backward,
    .linearity = DT_OP_LINEAR_MULTI,
    .linear_in = 3u,
    .reduce = DT_REDUCE_SUM,
    .doc = "torch.matmul: ranks >= 1, broadcast batch dims (einsum '...mk,...kn->...mn')",
    .family = "linear",
    .sample = matmul_sample,
};

dt_status dt_einsum(const char *equation, const dt_tensor *const *xs, int n, dt_tensor **out)
{
    if (!equation || !xs || !out || n < 1 || n > 2)
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "einsum: NULL equation, tensors or out, or %d operands (1 or 2)", n);
    for (int i = 0; i < n; i++)
        if (!xs[i])
            return dt__error(DT_ERR_INVALID_ARGUMENT, "einsum: operand %d is NULL", i);
    dt_op_attrs at = DT_OP_ATTRS_INIT;
    size_t len = strlen(equation);
    if (len == 0 || len >= sizeof(at.s))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "einsum: equation of %zu characters (1..%zu)",
                         len, sizeof(at.s) - 1);
    memcpy(at.s, equation, len + 1);
    return dt__op_run(&dt__def_einsum, xs, n, &at, NULL, out);
}

dt_status dt_matmul_broadcast(const dt_tensor *a, const dt_tensor *b, dt_tensor **out)
{
    if (!a || !b || !out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "matmul_broadcast: NULL argument");
    return dt__op_run2(&dt__def_matmul_broadcast, a, b, NULL, out);
}
