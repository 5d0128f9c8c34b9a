/* ops/opdef_rule: factor rules: parsing the einsum-like text (docs/ops.md, "Factor rules")
 * and binding a rule to one call's ranks and shapes. */
#include <string.h>

#include "ops/opdef_impl.h"
#include "runtime/error.h"

static int factor_id(char c)
{
    if (c >= 'a' && c <= 'z')
        return c - 'a';
    if (c >= 'A' && c <= 'Z')
        return 26 + (c - 'A');
    return -1;
}

static dt_status bad(const char *who, const char *text, const char *p, const char *what)
{
    return dt__error(DT_ERR_PARSE, "%s: factor rule \"%s\", column %d: %s", who, text,
                     (int)(p - text) + 1, what);
}

/* One operand up to ',' / '-' / NUL. */
static dt_status parse_operand(const char *who, const char *text, const char **pp,
                               dt__roperand *o)
{
    const char *p = *pp;
    memset(o, 0, sizeof *o);
    o->ell = -1;
    while (*p && *p != ',' && *p != '-') {
        if (*p == ' ') {
            p++;
            continue;
        }
        if (p[0] == '.' && p[1] == '.' && p[2] == '.') {
            if (o->ell >= 0)
                return bad(who, text, p, "'...' twice in one operand");
            o->ell = o->ndims;
            p += 3;
            continue;
        }
        if (o->ndims == DT_MAX_RANK)
            return bad(who, text, p, "more dims than DT_MAX_RANK");
        dt__rdim *d = &o->dim[o->ndims];
        if (*p == '(') {
            p++;
            while (*p && *p != ')') {
                int f = factor_id(*p);
                if (f < 0)
                    return bad(who, text, p, "expected a factor letter in '( )'");
                if (d->nf == DT_MAX_RANK)
                    return bad(who, text, p, "too many factors in one compound dim");
                d->f[d->nf++] = (uint8_t)f;
                p++;
            }
            if (*p != ')')
                return bad(who, text, p, "unclosed '('");
            if (d->nf == 0)
                return bad(who, text, p, "empty '()'");
            p++;
        } else {
            int f = factor_id(*p);
            if (f < 0)
                return bad(who, text, p, "expected a factor letter, '(', '...', ',' or '->'");
            d->f[d->nf++] = (uint8_t)f;
            p++;
        }
        o->ndims++;
    }
    *pp = p;
    return DT_OK;
}

dt_status dt__rule_parse(const char *who, const char *text, int nin, dt__rule *out)
{
    if (!text)
        return dt__error(DT_ERR_PARSE, "%s: no factor rule", who);
    dt__rule r;
    memset(&r, 0, sizeof r);
    const char *p = text;
    while (*p == ' ')
        p++;
    /* Operands are separated by ','; an empty one is a rank-0 input ("ab,->"). Text starting
     * with "->" has no inputs (constructors) unless the op takes one (a rank-0 input). */
    int more = !(p[0] == '-' && p[1] == '>') || nin == 1;
    while (more) {
        if (r.nin == DT_OP_MAX_IN)
            return bad(who, text, p, "more than DT_OP_MAX_IN inputs");
        dt_status st = parse_operand(who, text, &p, &r.op[r.nin]);
        if (st != DT_OK)
            return st;
        r.nin++;
        more = *p == ',';
        if (more)
            p++;
    }
    if (p[0] != '-' || p[1] != '>')
        return bad(who, text, p, "expected '->'");
    p += 2;
    dt_status st = parse_operand(who, text, &p, &r.op[r.nin]);
    if (st != DT_OK)
        return st;
    if (*p)
        return bad(who, text, p, "one output only");
    /* A factor appears at most once per operand. */
    for (int i = 0; i <= r.nin; i++) {
        uint64_t seen = 0;
        for (int d = 0; d < r.op[i].ndims; d++)
            for (int k = 0; k < r.op[i].dim[d].nf; k++) {
                uint64_t bit = UINT64_C(1) << r.op[i].dim[d].f[k];
                if (seen & bit)
                    return dt__error(DT_ERR_PARSE, "%s: factor rule \"%s\": a factor appears "
                                     "twice in operand %d", who, text, i);
                seen |= bit;
            }
    }
    *out = r;
    return DT_OK;
}

/* Expands operand o of rank `rank` (-1: the output, whose ellipsis is `ell_out` long) into b. */
static dt_status expand(const char *who, const dt__roperand *o, int idx, int rank, int ell_len,
                        dt__bound *b)
{
    int e = o->ell >= 0 ? ell_len : 0;
    if (o->ndims + e != rank)
        return dt__error(DT_ERR_SHAPE, "%s: operand %d has rank %d, its rule wants %s%d", who,
                         idx, rank, o->ell >= 0 ? "at least " : "", o->ndims);
    int k = 0;
    for (int d = 0; d <= o->ndims; d++) {
        if (d == o->ell)
            for (int j = 0; j < e; j++) {
                b->dim[idx][k].nf = 1;
                b->dim[idx][k].f[0] = (uint8_t)(DT__F_ELL + (e - 1 - j));
                k++;
            }
        if (d < o->ndims)
            b->dim[idx][k++] = o->dim[d];
    }
    b->rank[idx] = rank;
    return DT_OK;
}

static void shape_text(const int64_t *s, int r, char *buf, size_t len)
{
    size_t n = 0;
    n += (size_t)snprintf(buf + n, len - n, "[");
    for (int i = 0; i < r && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%lld", i ? ", " : "", (long long)s[i]);
    if (n < len)
        snprintf(buf + n, len - n, "]");
}

static dt_status mismatch(const char *who, const dt_op_sig *sig, const dt_op_shape *out,
                          const char *why)
{
    char text[512];
    size_t n = 0;
    for (int i = 0; i < sig->nin && n < sizeof text; i++) {
        char s[128];
        shape_text(sig->in[i].dim, sig->in[i].rank, s, sizeof s);
        n += (size_t)snprintf(text + n, sizeof text - n, "%s%s", i ? ", " : "", s);
    }
    if (out && n < sizeof text) {
        char s[128];
        shape_text(out->dim, out->rank, s, sizeof s);
        snprintf(text + n, sizeof text - n, " -> %s", s);
    }
    return dt__error(DT_ERR_SHAPE, "%s: shapes %s do not fit: %s", who, text, why);
}

dt_status dt__rule_bind(const char *who, const dt__rule *rule, const dt_op_sig *sig,
                        const dt_op_shape *out, dt__bound *b, dt_op_shape *out_shape)
{
    if (rule->nin != sig->nin)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: the rule has %d inputs, the call %d",
                         who, rule->nin, sig->nin);
    memset(b, 0, sizeof *b);
    b->nops = sig->nin + 1;
    int ell_max = 0;
    for (int i = 0; i < sig->nin; i++) {
        const dt__roperand *o = &rule->op[i];
        int e = o->ell >= 0 ? sig->in[i].rank - o->ndims : 0;
        if (e < 0)
            return mismatch(who, sig, NULL, "an operand has fewer dims than its rule names");
        if (e > 8)
            return mismatch(who, sig, NULL, "'...' covers more than 8 dims");
        dt_status st = expand(who, o, i, sig->in[i].rank, e, b);
        if (st != DT_OK)
            return st;
        if (e > ell_max)
            ell_max = e;
    }
    const dt__roperand *oo = &rule->op[sig->nin];
    int out_rank = out ? out->rank : oo->ndims + (oo->ell >= 0 ? ell_max : 0);
    int oe = oo->ell >= 0 ? out_rank - oo->ndims : 0;
    if (oe < 0 || out_rank > DT_MAX_RANK)
        return mismatch(who, sig, out, "the output's rank does not fit its rule");
    dt_status st = expand(who, oo, sig->nin, out_rank, oe, b);
    if (st != DT_OK)
        return st;
    /* Sizes: every single-factor dim gives its factor's size (the largest; 1 broadcasts). */
    int64_t size[DT__F_MAX];
    for (int f = 0; f < DT__F_MAX; f++)
        size[f] = -1;
    for (int i = 0; i < b->nops; i++) {
        const int64_t *dims = i < sig->nin ? sig->in[i].dim : out ? out->dim : NULL;
        for (int d = 0; d < b->rank[i]; d++) {
            const dt__rdim *rd = &b->dim[i][d];
            for (int k = 0; k < rd->nf; k++)
                (i < sig->nin ? &b->in_inputs : &b->in_output)[0] |= UINT64_C(1) << rd->f[k];
            if (!dims || rd->nf != 1)
                continue;
            if (dims[d] > size[rd->f[0]])
                size[rd->f[0]] = dims[d];
        }
    }
    /* Compound dims with one unknown factor determine it. */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < b->nops; i++) {
            const int64_t *dims = i < sig->nin ? sig->in[i].dim : out ? out->dim : NULL;
            for (int d = 0; dims && d < b->rank[i]; d++) {
                const dt__rdim *rd = &b->dim[i][d];
                if (rd->nf < 2)
                    continue;
                int unknown = -1, nun = 0;
                int64_t prod = 1;
                for (int k = 0; k < rd->nf; k++) {
                    if (size[rd->f[k]] < 0) {
                        unknown = rd->f[k];
                        nun++;
                    } else {
                        prod *= size[rd->f[k]];
                    }
                }
                if (nun == 1 && prod > 0 && dims[d] % prod == 0)
                    size[unknown] = dims[d] / prod;
            }
        }
    for (int f = 0; f < DT__F_MAX; f++)
        if (((b->in_inputs | b->in_output) >> f & 1) && size[f] < 0)
            return mismatch(who, sig, out, "a factor's size cannot be told from the shapes");
    /* Check every dim against its factors; a single-factor dim of size 1 against a larger
     * factor broadcasts. */
    for (int i = 0; i < b->nops; i++) {
        const int64_t *dims = i < sig->nin ? sig->in[i].dim : out ? out->dim : NULL;
        for (int d = 0; d < b->rank[i]; d++) {
            const dt__rdim *rd = &b->dim[i][d];
            int64_t prod = 1;
            for (int k = 0; k < rd->nf; k++)
                prod *= size[rd->f[k]];
            if (!dims) {
                out_shape->dim[d] = prod;
                continue;
            }
            if (dims[d] == prod)
                continue;
            if (rd->nf == 1 && dims[d] == 1 && i < sig->nin) {
                b->bcast[i][d] = 1;
                continue;
            }
            return mismatch(who, sig, out, "a dim differs from its factors' size");
        }
    }
    if (!out) {
        out_shape->rank = out_rank;
        out_shape->dtype = sig->nin ? sig->in[0].dtype : DT_DTYPE_F32;
    }
    for (int f = 0; f < DT__F_MAX; f++)
        b->fsize[f] = size[f] < 0 ? 1 : size[f];
    return DT_OK;
}
