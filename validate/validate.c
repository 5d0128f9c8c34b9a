/* validate/validate: the op validator (dt_op_validate): random cases of a definition on
 * meshes of 1, 2, 2x2 and 2x2x2 devices with random input layouts, against the unsharded call
 * and, for the gradient, against central finite differences in f64 (docs/ops.md). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/dtensor.h"
#include "runtime/error.h"

#define TOL_F64 1e-10
#define TOL_F32 2e-5
#define FD_STEP 1e-5
#define FD_TOL 1e-6

typedef struct vc {
    const dt_op *op;
    const dt_op_def *def;
    const dt_validate_opts *o;
    dt_validate_result *r;
    uint64_t seed;
    dt_op_sig sig;
    dt_op_attrs attrs;
    void *host[DT_OP_MAX_IN];
    int flt[DT_OP_MAX_IN];
    char what[512]; /* the case's description for messages */
} vc;

static uint64_t mix(uint64_t *s)
{
    uint64_t z = (*s += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

static double unit(uint64_t *s)
{
    return (double)(mix(s) >> 11) * (1.0 / 9007199254740992.0);
}

static int is_float(dt_dtype t)
{
    return t == DT_DTYPE_F32 || t == DT_DTYPE_F64 || t == DT_DTYPE_F16 || t == DT_DTYPE_BF16;
}

static int64_t numel(const dt_op_shape *s)
{
    int64_t n = 1;
    for (int d = 0; d < s->rank; d++)
        n *= s->dim[d];
    return n;
}

static double get(dt_dtype t, const void *p, int64_t i)
{
    switch (t) {
    case DT_DTYPE_F32: return ((const float *)p)[i];
    case DT_DTYPE_F64: return ((const double *)p)[i];
    case DT_DTYPE_I32: return ((const int32_t *)p)[i];
    case DT_DTYPE_I64: return (double)((const int64_t *)p)[i];
    case DT_DTYPE_U8: return ((const uint8_t *)p)[i];
    default: return NAN;
    }
}

static void set(dt_dtype t, void *p, int64_t i, double v)
{
    switch (t) {
    case DT_DTYPE_F32: ((float *)p)[i] = (float)v; break;
    case DT_DTYPE_F64: ((double *)p)[i] = v; break;
    case DT_DTYPE_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case DT_DTYPE_I64: ((int64_t *)p)[i] = (int64_t)v; break;
    case DT_DTYPE_U8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    default: break;
    }
}

static void fail(vc *c, const char *fmt, ...)
{
    c->r->failures++;
    if (!c->o->report)
        return;
    char msg[768], line[1400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(line, sizeof line, "%s: %s: %s", c->def->name, c->what, msg);
    c->o->report(c->o->report_arg, line);
}

/* Copies the box at `off` of extent `len` (rank dims) out of the row-major `full` of `shape`
 * into the compact `box` (esz-byte elements). */
static void box_copy(int rank, const int64_t *shape, const int64_t *off, const int64_t *len,
                     size_t esz, const char *full, char *box)
{
    int64_t n = 1;
    for (int d = 0; d < rank; d++)
        n *= len[d];
    int64_t idx[DT_MAX_RANK] = {0};
    for (int64_t k = 0; k < n; k++) {
        int64_t g = 0;
        for (int d = 0; d < rank; d++)
            g = g * shape[d] + off[d] + idx[d];
        memcpy(box + (size_t)k * esz, full + (size_t)g * esz, esz);
        for (int d = rank - 1; d >= 0; d--) {
            if (++idx[d] < len[d])
                break;
            idx[d] = 0;
        }
    }
}

/* A tensor of the whole host array in `layout`; with a partial mesh dim, the members at
 * coordinate 0 along it hold the values and the others zeros (so the sum is the value). */
static dt_status make(const dt_layout *layout, int pdim, const dt_op_shape *s, const void *host,
                      dt_tensor **out)
{
    dt_tensor *t = NULL;
    dt_status st = dt_tensor_zeros(layout, s->dtype, s->dim, &t);
    if (st != DT_OK)
        return st;
    const dt_mesh *mesh = dt_layout_mesh(layout);
    size_t esz = dt_dtype_size(s->dtype);
    for (int i = 0; i < dt_tensor_num_local(t) && st == DT_OK; i++) {
        const DLTensor *dl = dt_tensor_local(t, i);
        int64_t len[DT_MAX_RANK], n = 1;
        for (int d = 0; d < s->rank; d++)
            n *= (len[d] = dl->shape[d]);
        if (pdim >= 0) {
            int64_t coords[DT_MESH_MAX_DIMS] = {0};
            dt_mesh_coords(mesh, dt_tensor_local_position(t, i), coords);
            if (coords[pdim] != 0)
                continue;
        }
        if (n == 0)
            continue;
        char *box = malloc((size_t)n * esz);
        if (!box) {
            st = dt__error(DT_ERR_NO_MEMORY, "dt_op_validate: no memory");
            break;
        }
        box_copy(s->rank, s->dim, dt_tensor_local_offset(t, i), len, esz, host, box);
        st = dt_tensor_local_write(t, i, box, (size_t)n * esz);
        free(box);
    }
    if (st != DT_OK) {
        dt_tensor_destroy(t);
        return st;
    }
    *out = t;
    return DT_OK;
}

/* The whole value of t (partial dims reduced) into a new host array; *has 0 on a client
 * holding none of the mesh. */
static dt_status fetch(const dt_tensor *t, void **host_out, int *has)
{
    dt_layout *rep = NULL;
    dt_tensor *r = NULL;
    const dt_mesh *mesh = dt_layout_mesh(dt_tensor_layout(t));
    dt_status st = dt_layout_replicated(mesh, dt_tensor_rank(t), &rep);
    if (st == DT_OK)
        st = dt_relayout(t, rep, &r);
    dt_layout_destroy(rep);
    if (st != DT_OK)
        return st;
    size_t bytes = (size_t)dt_tensor_numel(t) * dt_dtype_size(dt_tensor_dtype(t));
    *has = dt_tensor_num_local(r) > 0;
    *host_out = NULL;
    if (*has) {
        void *h = malloc(bytes ? bytes : 1);
        if (!h)
            st = dt__error(DT_ERR_NO_MEMORY, "dt_op_validate: no memory");
        else if ((st = dt_tensor_local_read(r, 0, h, bytes)) != DT_OK)
            free(h);
        else
            *host_out = h;
    }
    dt_tensor_destroy(r);
    return st;
}

static void compare(vc *c, const char *what, dt_dtype t, const void *got, const void *ref,
                    int64_t n)
{
    double scale = 1.0, worst = 0.0;
    int64_t at = -1;
    for (int64_t i = 0; i < n; i++)
        if (fabs(get(t, ref, i)) > scale)
            scale = fabs(get(t, ref, i));
    double tol = t == DT_DTYPE_F64 ? TOL_F64 : is_float(t) ? TOL_F32 : 0.0;
    for (int64_t i = 0; i < n; i++) {
        double g = get(t, got, i), r = get(t, ref, i);
        double e = isnan(r) && isnan(g) ? 0.0 : fabs(g - r);
        if (!(e <= tol * scale) && (at < 0 || e > worst || isnan(e))) {
            worst = e;
            at = i;
        }
    }
    c->r->checks++;
    if (at >= 0)
        fail(c, "%s: element %lld is %.17g, the unsharded call gives %.17g (tolerance %.3g)",
             what, (long long)at, get(t, got, at), get(t, ref, at), tol * scale);
}

/* The call on `in` (borrowed), with (dy != NULL) the gradients of sum(out * dy) through a
 * tape into grads[i] (host arrays, NULL for inputs without one). */
static dt_status run(vc *c, dt_tensor *const *in, const dt_tensor *dy, dt_tensor **out,
                     void **grads, int *has)
{
    dt_tape *tape = NULL;
    dt_status st = DT_OK;
    if (dy) {
        st = dt_tape_create(NULL, &tape);
        for (int i = 0; i < c->sig.nin && st == DT_OK; i++)
            if (c->flt[i])
                st = dt_tape_watch(tape, in[i], i);
        if (st == DT_OK)
            st = dt_tape_begin(tape);
    }
    if (st == DT_OK)
        st = dt_op_call(c->op, (const dt_tensor *const *)in, c->sig.nin, &c->attrs, NULL, out);
    if (tape) {
        dt_status st2 = dt_tape_end(tape);
        if (st == DT_OK)
            st = st2;
        if (st == DT_OK)
            st = dt_tape_backward(tape, *out, dy, 1.0f, NULL);
        for (int i = 0; i < c->sig.nin && st == DT_OK; i++) {
            const dt_tensor *g = NULL;
            grads[i] = NULL;
            if (!c->flt[i] || dt_tape_grad(tape, i, &g) != DT_OK || !g) {
                if (c->flt[i]) { /* no gradient reached it: zeros */
                    size_t b = (size_t)numel(&c->sig.in[i]) * dt_dtype_size(c->sig.in[i].dtype);
                    grads[i] = calloc(1, b ? b : 1);
                }
                continue;
            }
            st = fetch(g, &grads[i], has);
        }
        dt_tape_destroy(tape);
    }
    return st;
}

static const char *const mdims[3] = {"va", "vb", "vc"};

static void layout_text(const dt_layout *l, char *buf, size_t len)
{
    dt_layout_format(l, buf, len);
    char *m = strstr(buf, ", mesh:");
    if (m)
        *m = 0;
}

/* Random layouts of the inputs on a mesh of mrank dims of 2 (mrank 0: one device), each
 * against the reference output (and gradients: gref, with dy the output's host gradient). */
static dt_status on_mesh(vc *c, int mrank, uint64_t *rng, const dt_op_shape *oshape,
                         const void *ref, const void *dyh, void *const *gref)
{
    int64_t sizes[3] = {2, 2, 2};
    if (mrank == 0)
        sizes[0] = 1;
    dt_mesh *mesh = NULL;
    dt_status st = dt_mesh_create("validate", mrank ? mrank : 1, mdims, sizes,
                                  c->o->device_type, &mesh);
    if (st != DT_OK)
        return st;
    for (int l = 0; l < c->o->layouts && st == DT_OK; l++) {
        dt_tensor *in[DT_OP_MAX_IN] = {0}, *out = NULL, *out2 = NULL, *dy = NULL;
        dt_layout *ls[DT_OP_MAX_IN] = {0};
        void *grads[DT_OP_MAX_IN] = {0};
        char keep[sizeof c->what];
        snprintf(keep, sizeof keep, "%s", c->what);
        size_t n = strlen(c->what);
        n += (size_t)snprintf(c->what + n, sizeof c->what - n, ", mesh %s",
                              mrank == 0 ? "1" : mrank == 1 ? "2" : mrank == 2 ? "2x2" : "2x2x2");
        for (int i = 0; i < c->sig.nin && st == DT_OK; i++) {
            const char *specs[DT_MAX_RANK];
            unsigned used = 0;
            for (int d = 0; d < c->sig.in[i].rank; d++) {
                specs[d] = DT_UNSHARDED;
                int m = mrank ? (int)(mix(rng) % (uint64_t)mrank) : -1;
                if (m >= 0 && !(used >> m & 1) && mix(rng) % 3) {
                    specs[d] = mdims[m];
                    used |= 1u << m;
                }
            }
            int pdim = -1;
            if (c->flt[i] && mrank > 0 && mix(rng) % 4 == 0) {
                int m = (int)(mix(rng) % (uint64_t)mrank);
                if (!(used >> m & 1))
                    pdim = m;
            }
            const char *pd[1] = {pdim >= 0 ? mdims[pdim] : NULL};
            dt_reduce_op pop[1] = {DT_REDUCE_SUM};
            st = dt_layout_create_partial(mesh, c->sig.in[i].rank, specs, pdim >= 0, pd, pop,
                                          &ls[i]);
            if (st == DT_OK)
                st = make(ls[i], pdim, &c->sig.in[i], c->host[i], &in[i]);
            if (st == DT_OK && n < sizeof c->what) {
                char lt[256];
                layout_text(ls[i], lt, sizeof lt);
                n += (size_t)snprintf(c->what + n, sizeof c->what - n, ", input %d %s", i, lt);
            }
        }
        if (st == DT_OK && dyh) {
            dt_layout *rep = NULL;
            st = dt_layout_replicated(mesh, oshape->rank, &rep);
            if (st == DT_OK)
                st = make(rep, -1, oshape, dyh, &dy);
            dt_layout_destroy(rep);
        }
        int has = 0;
        if (st == DT_OK && run(c, in, NULL, &out, grads, &has) != DT_OK) {
            fail(c, "the call failed: %s", dt_last_error());
        } else if (st == DT_OK) {
            void *got = NULL;
            st = fetch(out, &got, &has);
            if (st == DT_OK && has)
                compare(c, "output", oshape->dtype, got, ref, numel(oshape));
            free(got);
            if (st == DT_OK && dy) {
                if (run(c, in, dy, &out2, grads, &has) != DT_OK)
                    fail(c, "the backward failed: %s", dt_last_error());
                else
                    for (int i = 0; i < c->sig.nin; i++)
                        if (grads[i] && gref[i] && has)
                            compare(c, "gradient", c->sig.in[i].dtype, grads[i], gref[i],
                                    numel(&c->sig.in[i]));
            }
        }
        for (int i = 0; i < DT_OP_MAX_IN; i++)
            free(grads[i]);
        dt_tensor_destroy(out);
        dt_tensor_destroy(out2);
        dt_tensor_destroy(dy);
        for (int i = 0; i < c->sig.nin; i++) {
            dt_tensor_destroy(in[i]);
            dt_layout_destroy(ls[i]);
        }
        snprintf(c->what, sizeof c->what, "%s", keep);
    }
    dt_mesh_destroy(mesh);
    return st;
}

/* sum(out * dy) of the call on host inputs, on the replicated reference mesh. */
static dt_status objective(vc *c, const dt_layout *const *rl, const dt_op_shape *oshape,
                           const void *dyh, double *f_out)
{
    dt_tensor *in[DT_OP_MAX_IN] = {0}, *out = NULL;
    dt_status st = DT_OK;
    for (int i = 0; i < c->sig.nin && st == DT_OK; i++)
        st = make(rl[i], -1, &c->sig.in[i], c->host[i], &in[i]);
    if (st == DT_OK)
        st = dt_op_call(c->op, (const dt_tensor *const *)in, c->sig.nin, &c->attrs, NULL, &out);
    void *h = NULL;
    int has = 0;
    if (st == DT_OK)
        st = fetch(out, &h, &has);
    if (st == DT_OK && has) {
        double f = 0.0;
        for (int64_t k = 0; k < numel(oshape); k++)
            f += get(oshape->dtype, h, k) * get(oshape->dtype, dyh, k);
        *f_out = f;
    }
    free(h);
    dt_tensor_destroy(out);
    for (int i = 0; i < c->sig.nin; i++)
        dt_tensor_destroy(in[i]);
    return st;
}

/* One case: the reference on a replicated mesh over every device, finite differences, then
 * every test mesh. */
static dt_status one_case(vc *c, uint64_t seed)
{
    const dt_op_def *def = c->def;
    memset(&c->sig, 0, sizeof c->sig);
    memset(&c->attrs, 0, sizeof c->attrs);
    dt_status st = def->sample(seed, c->o->max_dim, &c->sig, &c->attrs);
    if (st == DT_ERR_UNSUPPORTED) {
        c->r->skipped++;
        return DT_OK;
    }
    if (st != DT_OK) {
        fail(c, "sample failed: %s", dt_last_error());
        return DT_OK;
    }
    c->sig.op = c->op;
    c->sig.attrs = &c->attrs;
    c->sig.user = def->user;
    /* f64 where the op takes it (its infer accepts it), for the finite differences. */
    dt_op_sig s64 = c->sig;
    int any = 0;
    for (int i = 0; i < s64.nin; i++)
        if (s64.in[i].dtype == DT_DTYPE_F32) {
            s64.in[i].dtype = DT_DTYPE_F64;
            any = 1;
        }
    dt_op_shape probe;
    if (any && def->infer && def->infer(&s64, &probe) == DT_OK)
        c->sig = s64;
    uint64_t rng = seed ^ UINT64_C(0x5851f42d4c957f2d);
    size_t n = (size_t)snprintf(c->what, sizeof c->what, "case %llu: shapes",
                                (unsigned long long)seed);
    for (int i = 0; i < c->sig.nin; i++) {
        c->flt[i] = is_float(c->sig.in[i].dtype);
        int64_t ne = numel(&c->sig.in[i]);
        size_t esz = dt_dtype_size(c->sig.in[i].dtype);
        c->host[i] = calloc((size_t)(ne ? ne : 1), esz);
        if (!c->host[i])
            return dt__error(DT_ERR_NO_MEMORY, "dt_op_validate: no memory");
        /* fill sees the (possibly widened) signature and writes in its dtypes. */
        int filled = def->fill && def->fill(&c->sig, i, seed + (uint64_t)i, c->host[i], ne) == DT_OK;
        if (!filled)
            for (int64_t k = 0; k < ne; k++)
                set(c->sig.in[i].dtype, c->host[i], k, 2.0 * unit(&rng) - 1.0);
        n += (size_t)snprintf(c->what + n, sizeof c->what - n, "%s[", i ? " " : " ");
        for (int d = 0; d < c->sig.in[i].rank && n < sizeof c->what; d++)
            n += (size_t)snprintf(c->what + n, sizeof c->what - n, "%s%lld", d ? "," : "",
                                  (long long)c->sig.in[i].dim[d]);
        n += (size_t)snprintf(c->what + n, sizeof c->what - n, "] %s",
                              dt_dtype_name(c->sig.in[i].dtype));
    }
    c->r->cases++;

    /* The reference: every input replicated on a 1-D mesh of every device. */
    int ndev = dt_num_global_devices(c->o->device_type);
    dt_mesh *rm = NULL;
    int64_t rsize = ndev;
    dt_layout *rl[DT_OP_MAX_IN] = {0};
    dt_tensor *rin[DT_OP_MAX_IN] = {0}, *rout = NULL, *rdy = NULL;
    void *ref = NULL, *dyh = NULL, *gref[DT_OP_MAX_IN] = {0};
    dt_op_shape os;
    memset(&os, 0, sizeof os);
    st = dt_mesh_create("vref", 1, mdims, &rsize, c->o->device_type, &rm);
    for (int i = 0; i < c->sig.nin && st == DT_OK; i++) {
        st = dt_layout_replicated(rm, c->sig.in[i].rank, &rl[i]);
        if (st == DT_OK)
            st = make(rl[i], -1, &c->sig.in[i], c->host[i], &rin[i]);
    }
    if (st != DT_OK)
        goto out;
    int has = 0;
    if (run(c, rin, NULL, &rout, gref, &has) != DT_OK) {
        fail(c, "the unsharded call failed: %s", dt_last_error());
        goto out;
    }
    os.dtype = dt_tensor_dtype(rout);
    os.rank = dt_tensor_rank(rout);
    memcpy(os.dim, dt_tensor_shape(rout), sizeof(int64_t) * (size_t)os.rank);
    if ((st = fetch(rout, &ref, &has)) != DT_OK)
        goto out;
    int grad = def->backward && is_float(os.dtype);
    if (grad) {
        int64_t no = numel(&os);
        dyh = calloc((size_t)(no ? no : 1), dt_dtype_size(os.dtype));
        if (!dyh) {
            st = dt__error(DT_ERR_NO_MEMORY, "dt_op_validate: no memory");
            goto out;
        }
        for (int64_t k = 0; k < no; k++)
            set(os.dtype, dyh, k, 2.0 * unit(&rng) - 1.0);
        dt_layout *rep = NULL;
        if ((st = dt_layout_replicated(rm, os.rank, &rep)) == DT_OK)
            st = make(rep, -1, &os, dyh, &rdy);
        dt_layout_destroy(rep);
        dt_tensor *o2 = NULL;
        if (st == DT_OK && run(c, rin, rdy, &o2, gref, &has) != DT_OK) {
            fail(c, "the unsharded backward failed: %s", dt_last_error());
            grad = 0;
        }
        dt_tensor_destroy(o2);
    }
    /* Central finite differences of sum(out * dy) in f64. */
    int f64 = os.dtype == DT_DTYPE_F64;
    for (int i = 0; i < c->sig.nin && grad && f64 && st == DT_OK; i++) {
        if (c->sig.in[i].dtype != DT_DTYPE_F64 || !gref[i])
            continue;
        int64_t ne = numel(&c->sig.in[i]);
        for (int k = 0; k < c->o->fd_elems && k < ne && st == DT_OK; k++) {
            int64_t j = ne <= c->o->fd_elems ? k : (int64_t)(mix(&rng) % (uint64_t)ne);
            double *x = c->host[i], x0 = x[j], fp = 0.0, fm = 0.0;
            x[j] = x0 + FD_STEP;
            st = objective(c, (const dt_layout *const *)rl, &os, dyh, &fp);
            x[j] = x0 - FD_STEP;
            if (st == DT_OK)
                st = objective(c, (const dt_layout *const *)rl, &os, dyh, &fm);
            x[j] = x0;
            double fd = (fp - fm) / (2 * FD_STEP), g = ((double *)gref[i])[j];
            c->r->checks++;
            if (st == DT_OK && !(fabs(fd - g) <= FD_TOL * (1.0 + fabs(g))))
                fail(c, "input %d element %lld: gradient %.12g, finite differences %.12g", i,
                     (long long)j, g, fd);
        }
    }
    /* Every test mesh the devices allow. */
    for (int mrank = 0; mrank <= 3 && st == DT_OK; mrank++) {
        if ((1 << mrank) > ndev)
            break;
        st = on_mesh(c, mrank, &rng, &os, ref, grad ? dyh : NULL, gref);
    }
out:
    for (int i = 0; i < DT_OP_MAX_IN; i++) {
        dt_tensor_destroy(rin[i]);
        dt_layout_destroy(rl[i]);
        free(gref[i]);
        free(c->host[i]);
        c->host[i] = NULL;
    }
    dt_tensor_destroy(rout);
    dt_tensor_destroy(rdy);
    free(ref);
    free(dyh);
    dt_mesh_destroy(rm);
    return st;
}

dt_status dt_op_validate(const dt_op *op, const dt_validate_opts *opts,
                         dt_validate_result *result_out)
{
    if (!op || !result_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_op_validate: op or result_out is NULL");
    dt_validate_opts o = DT_VALIDATE_OPTS_INIT;
    if (opts)
        o = *opts;
    dt_validate_result r = {0, 0, 0, 0};
    vc c;
    memset(&c, 0, sizeof c);
    c.op = op;
    c.def = dt_op_definition(op);
    c.o = &o;
    c.r = &r;
    dt_status st = DT_OK;
    if (!c.def->sample) {
        r.skipped++;
    } else {
        uint64_t h = o.seed;
        for (const char *p = c.def->name; *p; p++)
            h = h * 131 + (unsigned char)*p;
        for (int k = 0; k < o.cases && st == DT_OK; k++)
            st = one_case(&c, h + (uint64_t)k * 7919);
    }
    *result_out = r;
    return st;
}
