/* TensorFlow DTensor's mesh string: dt_mesh_parse and dt_mesh_format.
 *   [name]|d1=s1,...|global ids|local ids|local devices[|global devices][|use_xla_spmd]
 * the short test form "[name]|x=2,y=2|*CPU", and "empty_mesh". Errors carry the 1-based
 * column. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mesh/mesh_impl.h"
#include "runtime/error.h"

#define XLA_SPMD "use_xla_spmd"
#define EMPTY_MESH "empty_mesh"

/* The pieces of a split mesh string, with the column of each. */
typedef struct parsed {
    char *copy; /* the text with separators overwritten by NULs */
    int nparts;
    char *part[7];
    int part_col[7];
    int rank;
    const char *dim_names[DT_MESH_MAX_DIMS + 1];
    int64_t dim_sizes[DT_MESH_MAX_DIMS + 1];
    int dim_name_col[DT_MESH_MAX_DIMS + 1];
    int dim_size_col[DT_MESH_MAX_DIMS + 1];
    /* lists: 0 global ids, 1 local ids, 2 local devices, 3 global devices */
    int64_t count[4];
    char **items[4];
    int *cols[4];
    int64_t *ids[2];
} parsed;

enum { L_GLOBAL_IDS, L_LOCAL_IDS, L_LOCAL_DEVS, L_GLOBAL_DEVS };

static int col_of(const parsed *p, const char *s)
{
    return (int)(s - p->copy) + 1;
}

static void where(const void *ctx, dt__mesh_part part, int64_t index, char *buf, size_t len)
{
    const parsed *p = ctx;
    int col = 1;
    switch (part) {
    case DT__MESH_AT_MESH:
    case DT__MESH_AT_NAME:
        col = 1;
        break;
    case DT__MESH_AT_DIMS:
        col = p->part_col[1];
        break;
    case DT__MESH_AT_DIM_NAME:
        col = p->dim_name_col[index];
        break;
    case DT__MESH_AT_DIM_SIZE:
        col = p->dim_size_col[index];
        break;
    case DT__MESH_AT_GLOBAL_IDS:
        col = p->part_col[2];
        break;
    case DT__MESH_AT_LOCAL_IDS:
        col = p->part_col[3];
        break;
    case DT__MESH_AT_LOCAL_DEVICES:
        col = p->part_col[4];
        break;
    case DT__MESH_AT_GLOBAL_DEVICES:
        col = p->part_col[5];
        break;
    case DT__MESH_AT_GLOBAL_ID:
        col = p->cols[L_GLOBAL_IDS][index];
        break;
    case DT__MESH_AT_LOCAL_ID:
        col = p->cols[L_LOCAL_IDS][index];
        break;
    case DT__MESH_AT_LOCAL_DEVICE:
        col = p->cols[L_LOCAL_DEVS][index];
        break;
    case DT__MESH_AT_GLOBAL_DEVICE:
        col = p->cols[L_GLOBAL_DEVS][index];
        break;
    }
    snprintf(buf, len, "mesh string column %d: ", col);
}

static dt_status perr(const parsed *p, const char *at, dt_status st, const char *what)
{
    return dt__error(st, "mesh string column %d: %s", col_of(p, at), what);
}

/* Splits a ','-separated list in place; an empty string is an empty list. */
static dt_status split_list(parsed *p, char *s, int which)
{
    int64_t n = 0;
    if (s[0]) {
        n = 1;
        for (const char *c = s; *c; c++)
            n += *c == ',';
    }
    size_t cap = (size_t)(n ? n : 1);
    p->items[which] = malloc(cap * sizeof(char *));
    p->cols[which] = malloc(cap * sizeof(int));
    if (!p->items[which] || !p->cols[which])
        return dt__error(DT_ERR_NO_MEMORY, "out of memory parsing a mesh string");
    p->count[which] = n;
    for (int64_t i = 0; i < n; i++) {
        char *e = strchr(s, ',');
        if (e)
            *e = '\0';
        p->items[which][i] = s;
        p->cols[which][i] = col_of(p, s);
        s = e ? e + 1 : s + strlen(s);
    }
    return DT_OK;
}

static dt_status parse_ids(parsed *p, int which, const char *what)
{
    int64_t n = p->count[which];
    p->ids[which] = malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    if (!p->ids[which])
        return dt__error(DT_ERR_NO_MEMORY, "out of memory parsing a mesh string");
    for (int64_t i = 0; i < n; i++) {
        const char *s = p->items[which][i];
        if (dt__mesh_parse_int(s, strlen(s), 0, &p->ids[which][i]) != 0)
            return dt__error(DT_ERR_PARSE,
                             "mesh string column %d: expected a %s (a non-negative integer "
                             "without leading zeros), found '%s'",
                             p->cols[which][i], what, s);
    }
    return DT_OK;
}

static dt_status parse_dims(parsed *p)
{
    char *s = p->part[1];
    p->rank = 0;
    if (!s[0])
        return DT_OK; /* no dims: reported by the builder */
    while (p->rank <= DT_MESH_MAX_DIMS) {
        char *e = strchr(s, ',');
        if (e)
            *e = '\0';
        char *eq = strchr(s, '=');
        if (!eq)
            return dt__error(DT_ERR_PARSE,
                             "mesh string column %d: expected name=size, found '%s'",
                             col_of(p, s), s);
        *eq = '\0';
        int i = p->rank++;
        p->dim_names[i] = s;
        p->dim_name_col[i] = col_of(p, s);
        p->dim_size_col[i] = col_of(p, eq + 1);
        if (dt__mesh_parse_int(eq + 1, strlen(eq + 1), 1, &p->dim_sizes[i]) != 0)
            return dt__error(DT_ERR_PARSE,
                             "mesh string column %d: dimension '%s' has size '%s'; expected an "
                             "integer",
                             col_of(p, eq + 1), s, eq + 1);
        if (!e)
            break;
        s = e + 1;
    }
    return DT_OK;
}

static void parsed_free(parsed *p)
{
    for (int i = 0; i < 4; i++) {
        free(p->items[i]);
        free(p->cols[i]);
    }
    free(p->ids[0]);
    free(p->ids[1]);
    free(p->copy);
}

dt_status dt_mesh_parse(const char *text, dt_mesh **mesh_out)
{
    if (!text || !mesh_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_mesh_parse: NULL argument");
    if (!strcmp(text, EMPTY_MESH))
        return dt__mesh_empty(mesh_out);
    parsed p = {0};
    dt_status st;
    size_t n = strlen(text);
    if (!(p.copy = malloc(n + 1)))
        return dt__error(DT_ERR_NO_MEMORY, "out of memory parsing a mesh string");
    memcpy(p.copy, text, n + 1);

    /* Fields separated by '|'. */
    char *s = p.copy;
    for (;;) {
        char *e = strchr(s, '|');
        if (p.nparts == 7) {
            st = perr(&p, s, DT_ERR_PARSE, "too many '|'-separated fields (at most 7)");
            goto done;
        }
        p.part[p.nparts] = s;
        p.part_col[p.nparts] = col_of(&p, s);
        p.nparts++;
        if (!e)
            break;
        *e = '\0';
        s = e + 1;
    }
    if (p.nparts != 3 && (p.nparts < 5 || p.nparts > 7)) {
        st = dt__error(DT_ERR_PARSE,
                       "mesh string column 1: expected 5 to 7 '|'-separated fields "
                       "(name|dims|global ids|local ids|local devices[|global devices][|" XLA_SPMD
                       "]) or 3 (name|dims|*CPU), found %d (TensorFlow: \"Expected either 5, 6, "
                       "7 or 3 mesh parts\")",
                       p.nparts);
        goto done;
    }
    if ((st = parse_dims(&p)) != DT_OK)
        goto done;

    dt__mesh_desc d = {0};
    d.name = p.part[0];
    d.rank = p.rank;
    d.dim_names = p.dim_names;
    d.dim_sizes = p.dim_sizes;
    d.code = DT_ERR_PARSE;
    d.where = where;
    d.where_ctx = &p;

    d.allow_empty = 1;

    if (p.nparts == 3) {
        /* TensorFlow reads what follows the one '*' as the device type, ignoring what precedes
         * it; the type must be one a device name can spell. */
        const char *g = p.part[2], *star = strchr(g, '*');
        if (!star || strchr(star + 1, '*')) {
            st = perr(&p, g, DT_ERR_PARSE,
                      "expected '*' and a device type in the short form name|dims|*TYPE, as in "
                      "|x=2|*CPU (TensorFlow: \"Expected a * in mesh_gen_instructions\")");
            goto done;
        }
        const char *t = star + 1;
        if (!dt__device_type_name_ok(t)) {
            st = perr(&p, t, DT_ERR_PARSE,
                      "expected a device type after '*' (a letter, then letters, digits or '_'; "
                      "CPU, GPU, TPU, ...) (TensorFlow: \"Failed to parse local_devices\")");
            goto done;
        }
        d.type = dt__device_type_of(t);
        d.type_name = t;
        d.local_rule = 1;
        st = dt__mesh_build(&d, mesh_out);
        goto done;
    }

    /* An empty sixth or seventh field is read as absent, as TensorFlow does. */
    if (p.nparts == 7 && !p.part[6][0])
        p.nparts = 6;
    if (p.nparts == 7) {
        if (strcmp(p.part[6], XLA_SPMD) != 0) {
            st = perr(&p, p.part[6], DT_ERR_PARSE,
                      "expected '" XLA_SPMD "' as the last field (TensorFlow: \"Expected string "
                      XLA_SPMD " as the 7th argument\")");
            goto done;
        }
        d.use_xla_spmd = 1;
    }
    if (p.nparts == 6 && !strcmp(p.part[5], XLA_SPMD))
        d.use_xla_spmd = 1;
    int have_global_devs = p.nparts >= 6 && p.part[5][0] && !(p.nparts == 6 && d.use_xla_spmd);

    if ((st = split_list(&p, p.part[2], L_GLOBAL_IDS)) != DT_OK ||
        (st = split_list(&p, p.part[3], L_LOCAL_IDS)) != DT_OK ||
        (st = split_list(&p, p.part[4], L_LOCAL_DEVS)) != DT_OK ||
        (have_global_devs && (st = split_list(&p, p.part[5], L_GLOBAL_DEVS)) != DT_OK))
        goto done;
    if ((st = parse_ids(&p, L_GLOBAL_IDS, "device id")) != DT_OK ||
        (st = parse_ids(&p, L_LOCAL_IDS, "local device id")) != DT_OK)
        goto done;
    for (int w = L_LOCAL_DEVS; w <= L_GLOBAL_DEVS; w++) {
        for (int64_t i = 0; i < p.count[w]; i++) {
            if (!p.items[w][i][0]) {
                st = dt__error(DT_ERR_PARSE, "mesh string column %d: empty device name",
                               p.cols[w][i]);
                goto done;
            }
        }
    }
    d.global_ids = p.ids[L_GLOBAL_IDS];
    d.num_global = p.count[L_GLOBAL_IDS];
    d.local_ids = p.ids[L_LOCAL_IDS];
    d.num_local = p.count[L_LOCAL_IDS];
    d.local_devices = (const char *const *)p.items[L_LOCAL_DEVS];
    d.num_local_devices = p.count[L_LOCAL_DEVS];
    if (have_global_devs) {
        d.global_devices = (const char *const *)p.items[L_GLOBAL_DEVS];
        d.num_global_devices = p.count[L_GLOBAL_DEVS];
    }
    st = dt__mesh_build(&d, mesh_out);

done:
    parsed_free(&p);
    return st;
}

/* ---- formatting ----------------------------------------------------------------------- */

typedef struct out {
    char *buf;
    size_t len, pos;
} out;

static void put(out *o, const char *s)
{
    size_t n = strlen(s);
    if (o->pos < o->len) {
        size_t room = o->len - o->pos - 1;
        memcpy(o->buf + o->pos, s, n < room ? n : room);
        o->buf[o->pos + (n < room ? n : room)] = '\0';
    }
    o->pos += n;
}

/* Decimal digits by hand: a mesh of thousands of devices formats thousands of ids, and the
 * checkpoint index writes this string per tensor (issue 22). */
static void put_int(out *o, long long v)
{
    char t[32];
    int n = (int)sizeof t - 1;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    t[n] = '\0';
    do
        t[--n] = (char)('0' + u % 10);
    while ((u /= 10) != 0);
    if (v < 0)
        t[--n] = '-';
    put(o, t + n);
}

size_t dt_mesh_format(const dt_mesh *mesh, char *buf, size_t len)
{
    out o = {buf, buf ? len : 0, 0};
    if (o.len)
        buf[0] = '\0';
    if (mesh->size == 0) {
        put(&o, EMPTY_MESH);
        return o.pos;
    }
    put(&o, mesh->name);
    put(&o, "|");
    for (int i = 0; i < mesh->rank; i++) {
        put(&o, i ? "," : "");
        put(&o, mesh->dim_names[i]);
        put(&o, "=");
        put_int(&o, mesh->dim_sizes[i]);
    }
    put(&o, "|");
    for (int64_t p = 0; p < mesh->size; p++) {
        put(&o, p ? "," : "");
        put_int(&o, mesh->global_ids[p]);
    }
    put(&o, "|");
    for (int i = 0; i < mesh->num_local; i++) {
        put(&o, i ? "," : "");
        put_int(&o, mesh->local_ids[i]);
    }
    put(&o, "|");
    for (int i = 0; i < mesh->num_local; i++) {
        put(&o, i ? "," : "");
        put(&o, mesh->local_devices[i]);
    }
    if (mesh->global_devices) {
        put(&o, "|");
        for (int64_t p = 0; p < mesh->num_global_devices; p++) {
            put(&o, p ? "," : "");
            put(&o, mesh->global_devices[p]);
        }
    }
    if (mesh->use_xla_spmd)
        put(&o, "|" XLA_SPMD);
    return o.pos;
}
