/* tests/reference/ops_dump: every op definition with a validator sample run on random cases
 * (the definition's own sample and fill, the validator's seeds) on a 1-device CPU mesh, with
 * the gradient of sum(out * dy) through a tape, one JSON object per case on stdout: what
 * test_ops_torch.py recomputes in PyTorch. Public headers only.
 * Usage: ops_dump [--op NAME] [--cases N] [--seed S] [--max-dim M] [--grid] [--raw]
 *        [--spec FILE]
 * --spec FILE: instead of the samples, the cases of FILE, one a line (parse_spec: the op, its
 * attributes and its inputs' dtypes and shapes; values by the definition's fill, else uniform),
 * each run --cases times with other values: attribute variants the samples never draw.
 * --grid: the inputs a definition's fill leaves to uniform reals are drawn from {-1, -0.5, 0,
 * 0.5, 1} instead (ties, zeros and kinks: max / min / maximum ties, abs and sign at 0, argmax's
 * first index, the sorts' stability). --raw: float inputs too (without it, the definition's
 * fill keeps them in the op's domain and off its kinks). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/dtensor.h"

typedef struct dcase {
    const dt_op *op;
    const dt_op_def *def;
    dt_op_sig sig;
    dt_op_attrs attrs;
    void *host[DT_OP_MAX_IN];
    int flt[DT_OP_MAX_IN];
} dcase;

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

static int grid; /* --grid */
static int raw;  /* --raw */

static int is_float(dt_dtype t)
{
    return t == DT_DTYPE_F32 || t == DT_DTYPE_F64;
}

static int64_t numel(const dt_op_shape *s)
{
    int64_t n = 1;
    for (int d = 0; d < s->rank; d++)
        n *= s->dim[d];
    return n;
}

static void set(dt_dtype t, void *p, int64_t i, double v)
{
    switch (t) {
    case DT_DTYPE_F32:
        ((float *)p)[i] = (float)v;
        break;
    case DT_DTYPE_F64:
        ((double *)p)[i] = v;
        break;
    case DT_DTYPE_I32:
        ((int32_t *)p)[i] = (int32_t)v;
        break;
    case DT_DTYPE_I64:
        ((int64_t *)p)[i] = (int64_t)v;
        break;
    case DT_DTYPE_U8:
        ((uint8_t *)p)[i] = (uint8_t)v;
        break;
    default:
        break;
    }
}

static void put_real(double v)
{
    if (isnan(v))
        fputs("\"nan\"", stdout);
    else if (isinf(v))
        fputs(v > 0 ? "\"inf\"" : "\"-inf\"", stdout);
    else
        printf("%.17g", v);
}

static void put_values(dt_dtype t, const void *p, int64_t n)
{
    putchar('[');
    for (int64_t i = 0; i < n; i++) {
        if (i)
            putchar(',');
        switch (t) {
        case DT_DTYPE_F32:
            put_real(((const float *)p)[i]);
            break;
        case DT_DTYPE_F64:
            put_real(((const double *)p)[i]);
            break;
        case DT_DTYPE_I32:
            printf("%" PRId32, ((const int32_t *)p)[i]);
            break;
        case DT_DTYPE_I64:
            printf("%" PRId64, ((const int64_t *)p)[i]);
            break;
        case DT_DTYPE_U8:
            printf("%u", (unsigned)((const uint8_t *)p)[i]);
            break;
        default:
            fputs("null", stdout);
            break;
        }
    }
    putchar(']');
}

static void put_string(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            printf("\\u%04x", (unsigned)(unsigned char)*s);
        else
            putchar(*s);
    }
    putchar('"');
}

/* {"dtype": .., "shape": [..], "values": [..]} */
static void put_tensor(const dt_op_shape *s, const void *p)
{
    printf("{\"dtype\":\"%s\",\"shape\":[", dt_dtype_name(s->dtype));
    for (int d = 0; d < s->rank; d++)
        printf("%s%" PRId64, d ? "," : "", s->dim[d]);
    fputs("],\"values\":", stdout);
    put_values(s->dtype, p, numel(s));
    putchar('}');
}

static void put_attrs(const dt_op_attrs *a)
{
    int ni = 0, nf = 0;
    for (int k = 0; k < DT_OP_MAX_IATTR; k++)
        if (a->i[k])
            ni = k + 1;
    for (int k = 0; k < DT_OP_MAX_FATTR; k++)
        if (a->f[k] != 0.0)
            nf = k + 1;
    fputs("{\"i\":[", stdout);
    for (int k = 0; k < ni; k++)
        printf("%s%" PRId64, k ? "," : "", a->i[k]);
    fputs("],\"f\":[", stdout);
    for (int k = 0; k < nf; k++) {
        if (k)
            putchar(',');
        put_real(a->f[k]);
    }
    fputs("],\"s\":", stdout);
    put_string(a->s);
    putchar('}');
}

static void free_all(dt_tensor **t, int n)
{
    for (int i = 0; i < n; i++) {
        dt_tensor_destroy(t[i]);
        t[i] = NULL;
    }
}

/* The inputs as tensors of the replicated layout on `mesh`. */
static dt_status make_inputs(const dcase *c, const dt_mesh *mesh, dt_tensor **in)
{
    dt_status st = DT_OK;
    for (int i = 0; i < c->sig.nin && st == DT_OK; i++) {
        dt_layout *l = NULL;
        st = dt_layout_replicated(mesh, c->sig.in[i].rank, &l);
        if (st == DT_OK)
            st = dt_tensor_from_host(l, c->sig.in[i].dtype, c->sig.in[i].dim, c->host[i], &in[i]);
        dt_layout_destroy(l);
    }
    return st;
}

static dt_status to_host(const dt_tensor *t, void **out)
{
    size_t bytes = (size_t)dt_tensor_numel(t) * dt_dtype_size(dt_tensor_dtype(t));
    void *h = calloc(1, bytes ? bytes : 1);
    if (!h)
        return DT_ERR_NO_MEMORY;
    dt_status st = dt_tensor_to_host(t, -1, h, bytes);
    if (st != DT_OK) {
        free(h);
        return st;
    }
    *out = h;
    return DT_OK;
}

static void shape_of(const dt_tensor *t, dt_op_shape *s)
{
    memset(s, 0, sizeof *s);
    s->dtype = dt_tensor_dtype(t);
    s->rank = dt_tensor_rank(t);
    memcpy(s->dim, dt_tensor_shape(t), sizeof(int64_t) * (size_t)s->rank);
}

/* One case: one JSON line (or an "error" line naming the failed step). given: c->sig's
 * inputs and c->attrs are set (a --spec case), else the definition's sample draws them. */
static dt_status one_case(dcase *c, const dt_mesh *mesh, uint64_t seed, int index, int max_dim,
                          int given)
{
    const dt_op_def *def = c->def;
    dt_status st = DT_OK;
    if (!given) {
        memset(&c->sig, 0, sizeof c->sig);
        memset(&c->attrs, 0, sizeof c->attrs);
        st = def->sample(seed, max_dim, &c->sig, &c->attrs);
    }
    if (st == DT_ERR_UNSUPPORTED)
        return DT_OK;
    printf("{\"op\":\"%s\",\"case\":%d,\"seed\":%" PRIu64 ",\"attrs\":", def->name, index, seed);
    put_attrs(&c->attrs);
    if (st != DT_OK) {
        fputs(",\"error\":", stdout);
        put_string(dt_last_error());
        fputs("}\n", stdout);
        return DT_OK;
    }
    c->sig.op = c->op;
    c->sig.attrs = &c->attrs;
    c->sig.user = def->user;
    /* f64 where the op takes it (its infer accepts it), as the validator does. */
    dt_op_sig s64 = c->sig;
    int any = 0;
    for (int i = 0; i < s64.nin && !given; i++)
        if (s64.in[i].dtype == DT_DTYPE_F32) {
            s64.in[i].dtype = DT_DTYPE_F64;
            any = 1;
        }
    dt_op_shape probe;
    if (any && def->infer && def->infer(&s64, &probe) == DT_OK)
        c->sig = s64;
    uint64_t rng = seed ^ UINT64_C(0x5851f42d4c957f2d);
    for (int i = 0; i < c->sig.nin; i++) {
        c->flt[i] = is_float(c->sig.in[i].dtype);
        int64_t ne = numel(&c->sig.in[i]);
        c->host[i] = calloc((size_t)(ne ? ne : 1), dt_dtype_size(c->sig.in[i].dtype));
        if (!c->host[i])
            return DT_ERR_NO_MEMORY;
        int filled = !(raw && c->flt[i]) && def->fill &&
                     def->fill(&c->sig, i, seed + (uint64_t)i, c->host[i], ne) == DT_OK;
        if (!filled)
            for (int64_t k = 0; k < ne; k++)
                set(c->sig.in[i].dtype, c->host[i], k,
                    grid ? 0.5 * (double)(mix(&rng) % 5) - 1.0 : 2.0 * unit(&rng) - 1.0);
    }
    fputs(",\"inputs\":[", stdout);
    for (int i = 0; i < c->sig.nin; i++) {
        if (i)
            putchar(',');
        put_tensor(&c->sig.in[i], c->host[i]);
    }
    putchar(']');

    dt_tensor *in[DT_OP_MAX_IN] = {0}, *out = NULL, *out2 = NULL, *dy = NULL;
    void *outh = NULL, *dyh = NULL;
    dt_tape *tape = NULL;
    dt_op_shape os;
    st = make_inputs(c, mesh, in);
    if (st == DT_OK)
        st = dt_op_call(c->op, (const dt_tensor *const *)in, c->sig.nin, &c->attrs, NULL, &out);
    if (st == DT_OK)
        st = to_host(out, &outh);
    if (st != DT_OK) {
        fputs(",\"error\":", stdout);
        put_string(dt_last_error());
        fputs("}\n", stdout);
        st = DT_OK;
        goto done;
    }
    shape_of(out, &os);
    fputs(",\"output\":", stdout);
    put_tensor(&os, outh);
    if (!def->backward || !is_float(os.dtype))
        goto end;
    /* The gradient of sum(out * dy) for a random dy, through a tape. */
    int64_t no = numel(&os);
    dyh = calloc((size_t)(no ? no : 1), dt_dtype_size(os.dtype));
    if (!dyh) {
        st = DT_ERR_NO_MEMORY;
        goto done;
    }
    for (int64_t k = 0; k < no; k++)
        set(os.dtype, dyh, k, 2.0 * unit(&rng) - 1.0);
    fputs(",\"dy\":", stdout);
    put_tensor(&os, dyh);
    dt_layout *rep = NULL;
    st = dt_layout_replicated(mesh, os.rank, &rep);
    if (st == DT_OK)
        st = dt_tensor_from_host(rep, os.dtype, os.dim, dyh, &dy);
    dt_layout_destroy(rep);
    if (st == DT_OK)
        st = dt_tape_create(NULL, &tape);
    for (int i = 0; i < c->sig.nin && st == DT_OK; i++)
        if (c->flt[i])
            st = dt_tape_watch(tape, in[i], i);
    if (st == DT_OK)
        st = dt_tape_begin(tape);
    if (st == DT_OK) {
        st = dt_op_call(c->op, (const dt_tensor *const *)in, c->sig.nin, &c->attrs, NULL, &out2);
        dt_status st2 = dt_tape_end(tape);
        if (st == DT_OK)
            st = st2;
    }
    if (st == DT_OK)
        st = dt_tape_backward(tape, out2, dy, 1.0f, NULL);
    if (st != DT_OK) {
        fputs(",\"grad_error\":", stdout);
        put_string(dt_last_error());
        st = DT_OK;
        goto end;
    }
    fputs(",\"grads\":[", stdout);
    for (int i = 0; i < c->sig.nin; i++) {
        if (i)
            putchar(',');
        const dt_tensor *g = NULL;
        if (!c->flt[i] || dt_tape_grad(tape, i, &g) != DT_OK || !g) {
            fputs("null", stdout);
            continue;
        }
        void *gh = NULL;
        dt_op_shape gs;
        shape_of(g, &gs);
        if ((st = to_host(g, &gh)) != DT_OK)
            break;
        put_tensor(&gs, gh);
        free(gh);
    }
    putchar(']');
end:
    fputs("}\n", stdout);
done:
    dt_tape_destroy(tape);
    dt_tensor_destroy(out);
    dt_tensor_destroy(out2);
    dt_tensor_destroy(dy);
    free_all(in, DT_OP_MAX_IN);
    free(outh);
    free(dyh);
    for (int i = 0; i < DT_OP_MAX_IN; i++) {
        free(c->host[i]);
        c->host[i] = NULL;
    }
    return st;
}

/* One --spec line: "op;i=1,-1;f=0.5;s=ij->ji;in=f64[2,3] i64[4]" (fields after the op in
 * any order, each optional but in=; rank 0: "f64[]"). 0 on success. */
static int parse_spec(char *line, dcase *c)
{
    memset(&c->sig, 0, sizeof c->sig);
    memset(&c->attrs, 0, sizeof c->attrs);
    char *save = NULL, *field = strtok_r(line, ";\n", &save);
    if (!field || !(c->op = dt_op_find(field)))
        return -1;
    c->def = dt_op_definition(c->op);
    while ((field = strtok_r(NULL, ";\n", &save))) {
        char *v = field + 2, *end = NULL;
        if (strncmp(field, "s=", 2) == 0) {
            snprintf(c->attrs.s, sizeof c->attrs.s, "%s", v);
        } else if (strncmp(field, "i=", 2) == 0) {
            for (int k = 0; k < DT_OP_MAX_IATTR && *v; k++, v = *end ? end + 1 : end)
                c->attrs.i[k] = strtoll(v, &end, 10);
        } else if (strncmp(field, "f=", 2) == 0) {
            for (int k = 0; k < DT_OP_MAX_FATTR && *v; k++, v = *end ? end + 1 : end)
                c->attrs.f[k] = strtod(v, &end);
        } else if (strncmp(field, "in=", 3) == 0) {
            char *s2 = NULL;
            for (char *t = strtok_r(field + 3, " ", &s2); t; t = strtok_r(NULL, " ", &s2)) {
                dt_op_shape *sh = &c->sig.in[c->sig.nin];
                char *br = strchr(t, '[');
                if (!br || c->sig.nin >= DT_OP_MAX_IN)
                    return -1;
                *br = 0;
                if (dt_dtype_parse(t, &sh->dtype) != DT_OK)
                    return -1;
                for (char *q = br + 1; *q && *q != ']'; q = *end == ',' ? end + 1 : end) {
                    sh->dim[sh->rank++] = strtoll(q, &end, 10);
                    if (end == q || sh->rank > DT_MAX_RANK)
                        return -1;
                }
                c->sig.nin++;
            }
        } else {
            return -1;
        }
    }
    return c->sig.nin ? 0 : -1;
}

int main(int argc, char **argv)
{
    const char *only = NULL, *spec = NULL;
    int cases = 3, max_dim = 5;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--op") == 0 && i + 1 < argc)
            only = argv[++i];
        else if (strcmp(argv[i], "--cases") == 0 && i + 1 < argc)
            cases = atoi(argv[++i]);
        else if (strcmp(argv[i], "--max-dim") == 0 && i + 1 < argc)
            max_dim = atoi(argv[++i]);
        else if (strcmp(argv[i], "--spec") == 0 && i + 1 < argc)
            spec = argv[++i];
        else if (strcmp(argv[i], "--grid") == 0)
            grid = 1;
        else if (strcmp(argv[i], "--raw") == 0)
            raw = 1;
        else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "usage: ops_dump [--op NAME] [--cases N] [--seed S] [--max-dim M] "
                            "[--grid] [--raw]\n");
            return 2;
        }
    }
    if (cases < 1 || max_dim < 1) {
        fprintf(stderr, "ops_dump: --cases and --max-dim must be >= 1\n");
        return 2;
    }
    dt_status st = dt_init(NULL, NULL, NULL);
    if (st != DT_OK) {
        fprintf(stderr, "ops_dump: dt_init: %s\n", dt_last_error());
        return 1;
    }
    const char *dims[1] = {"d"};
    int64_t sizes[1] = {1};
    dt_mesh *mesh = NULL;
    st = dt_mesh_create("ops_dump", 1, dims, sizes, DT_DEVICE_CPU, &mesh);
    int found = 0;
    FILE *sf = NULL;
    if (st == DT_OK && spec && !(sf = fopen(spec, "r"))) {
        fprintf(stderr, "ops_dump: cannot open %s\n", spec);
        st = DT_ERR_IO;
    }
    char line[1024];
    for (int n = 0; sf && st == DT_OK && fgets(line, sizeof line, sf); n++) {
        dcase c;
        memset(&c, 0, sizeof c);
        char copy[sizeof line];
        snprintf(copy, sizeof copy, "%s", line);
        if (parse_spec(line, &c) != 0) {
            fprintf(stderr, "ops_dump: %s:%d: bad case: %s", spec, n + 1, copy);
            st = DT_ERR_PARSE;
            break;
        }
        found = 1;
        for (int k = 0; k < cases && st == DT_OK; k++)
            st = one_case(&c, mesh, seed * 1000003u + (uint64_t)n * 7919 + (uint64_t)k, n, max_dim,
                          1);
    }
    if (sf)
        fclose(sf);
    for (int i = 0; i < dt_op_count() && st == DT_OK && !spec; i++) {
        dcase c;
        memset(&c, 0, sizeof c);
        c.op = dt_op_at(i);
        c.def = dt_op_definition(c.op);
        if (only && strcmp(only, c.def->name) != 0)
            continue;
        found = 1;
        if (!c.def->sample) {
            printf("{\"op\":\"%s\",\"no_sample\":true}\n", c.def->name);
            continue;
        }
        uint64_t h = seed;
        for (const char *p = c.def->name; *p; p++)
            h = h * 131 + (unsigned char)*p;
        for (int k = 0; k < cases && st == DT_OK; k++)
            st = one_case(&c, mesh, h + (uint64_t)k * 7919, k, max_dim, 0);
    }
    if (st != DT_OK)
        fprintf(stderr, "ops_dump: %s: %s\n", dt_status_name(st), dt_last_error());
    else if (only && !found) {
        fprintf(stderr, "ops_dump: no op named %s\n", only);
        st = DT_ERR_INVALID_ARGUMENT;
    }
    dt_mesh_destroy(mesh);
    dt_finalize();
    return st == DT_OK ? 0 : 1;
}
