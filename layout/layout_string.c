/* Layout text: TensorFlow's "sharding_specs:x,unsharded, mesh:<mesh>" (with its placeholders
 * "any" and "match", and "empty_layout") and our partial extension
 * "sharding_specs:x, partial:y=sum;z=max, mesh:<mesh>" (docs/layout.md). */
#include <stdio.h>
#include <string.h>

#include "layout/layout_impl.h"
#include "runtime/error.h"
#include "runtime/util.h"

#define SPECS_PREFIX "sharding_specs:"
#define PARTIAL_PREFIX "partial:"
#define MESH_PREFIX "mesh:"
#define EMPTY_LAYOUT "empty_layout"

/* ---- format ------------------------------------------------------------------------------ */

typedef struct writer {
    char *buf;
    size_t len;
    size_t pos; /* length of the full text so far, even past len */
} writer;

static void put(writer *w, const char *s)
{
    size_t n = strlen(s);
    if (w->pos < w->len) {
        size_t room = w->len - 1 - w->pos;
        memcpy(w->buf + w->pos, s, n < room ? n : room);
    }
    w->pos += n;
}

/* Everything before "mesh:": the specs, each followed by ",", then " ", then the partial
 * dims and ", " when there are any. */
static void put_specs(writer *w, const dt_layout *layout)
{
    put(w, SPECS_PREFIX);
    for (int i = 0; i < layout->rank; i++) {
        put(w, dt_layout_spec(layout, i));
        put(w, ",");
    }
    put(w, " ");
    if (layout->npartial > 0) {
        put(w, PARTIAL_PREFIX);
        for (int i = 0; i < layout->npartial; i++) {
            if (i)
                put(w, ";");
            put(w, dt_mesh_dim_name(layout->mesh, layout->partial_dim[i]));
            put(w, "=");
            put(w, dt_reduce_op_name(layout->partial_op[i]));
        }
        put(w, ", ");
    }
}

size_t dt_layout_format(const dt_layout *layout, char *buf, size_t len)
{
    writer w = {buf, buf ? len : 0, 0};
    if (!layout) {
        if (w.len)
            buf[0] = '\0';
        return 0;
    }
    if (dt_mesh_is_empty(layout->mesh)) {
        put(&w, EMPTY_LAYOUT);
        if (w.len)
            buf[w.pos < w.len ? w.pos : w.len - 1] = '\0';
        return w.pos;
    }
    put_specs(&w, layout);
    put(&w, MESH_PREFIX);
    /* The mesh writes itself straight into the rest of the buffer. */
    char dummy[1];
    size_t room = w.pos < w.len ? w.len - w.pos : 0;
    size_t n = room ? dt_mesh_format(layout->mesh, buf + w.pos, room)
                    : dt_mesh_format(layout->mesh, dummy, sizeof dummy);
    w.pos += n;
    if (w.len)
        buf[w.pos < w.len ? w.pos : w.len - 1] = '\0';
    return w.pos;
}

void dt__layout_format_specs(const dt_layout *layout, char *buf, size_t len)
{
    writer w = {buf, len, 0};
    if (!len)
        return;
    if (!layout || dt_mesh_is_empty(layout->mesh)) {
        put(&w, layout ? EMPTY_LAYOUT : "");
    } else {
        put_specs(&w, layout);
        /* Without the separator before the mesh: the trailing ", " (or " " at rank 0). */
        w.pos -= w.pos >= 2 && w.pos <= w.len - 1 && buf[w.pos - 2] == ',' ? 2 : 1;
    }
    buf[w.pos < w.len ? w.pos : w.len - 1] = '\0';
}

/* ---- parse ------------------------------------------------------------------------------- */

typedef struct token {
    const char *s;
    size_t n;
    int col; /* 1-based column in the layout string */
} token;

static size_t ident_len(const char *p)
{
    size_t n = 0;
    while ((p[n] >= 'a' && p[n] <= 'z') || (p[n] >= 'A' && p[n] <= 'Z') ||
           (p[n] >= '0' && p[n] <= '9') || p[n] == '_')
        n++;
    return n;
}

static int token_is(const token *t, const char *word)
{
    return t->n == strlen(word) && memcmp(t->s, word, t->n) == 0;
}

/* A printable description of the character at p, for "found ..." in messages. */
static const char *found(const char *p, char *buf, size_t len)
{
    if (*p == '\0')
        snprintf(buf, len, "end of text");
    else if (*p == ' ')
        snprintf(buf, len, "' '");
    else
        snprintf(buf, len, "'%c'", *p);
    return buf;
}

/* Mesh dim index named by a token, or -1. */
static int token_mesh_dim(const dt_mesh *mesh, const token *t)
{
    char name[DT_NAME_MAX];
    if (t->n >= sizeof name)
        return -1;
    memcpy(name, t->s, t->n);
    name[t->n] = '\0';
    return dt_mesh_dim_index(mesh, name);
}

/* Reads "sharding_specs:a,b," up to (not including) the space; *pp advances. */
static dt_status parse_specs(const char *text, const char **pp, token *spec, int *nspec_out)
{
    const char *p = *pp;
    char f[16];
    int nspec = 0;
    while (*p != ' ') {
        int col = (int)(p - text) + 1;
        size_t n = ident_len(p);
        if (n == 0 && *p == '\0')
            return dt__error(DT_ERR_PARSE,
                             "layout string column %d: unexpected end of text, expected a "
                             "sharding spec or ' " MESH_PREFIX "'",
                             col);
        if (n == 0)
            return dt__error(DT_ERR_PARSE,
                             "layout string column %d: expected a sharding spec (a mesh "
                             "dimension name or '" DT_UNSHARDED "'), found %s",
                             col, found(p, f, sizeof f));
        if (p[n] == ':')
            return dt__error(DT_ERR_PARSE,
                             "layout string column %d: expected ' ' before '%.*s:'", col,
                             (int)n, p);
        if (p[n] == '\0') /* "sharding_specs:x,unsharded": the whole mesh part left out */
            return dt__error(DT_ERR_PARSE,
                             "layout string column %d: the mesh is missing: expected ', "
                             MESH_PREFIX "MESH' after sharding spec '%.*s' (as in "
                             "'sharding_specs:x,unsharded, mesh:|x=2|*CPU'), found end of text",
                             col + (int)n, (int)n, p);
        if (p[n] != ',')
            return dt__error(DT_ERR_PARSE,
                             "layout string column %d: expected ',' after sharding spec '%.*s', "
                             "found %s",
                             col + (int)n, (int)n, p, found(p + n, f, sizeof f));
        if (nspec == DT_MAX_RANK)
            return dt__error(DT_ERR_PARSE,
                             "layout string column %d: more than %d sharding specs "
                             "(DT_MAX_RANK)",
                             col, DT_MAX_RANK);
        spec[nspec].s = p;
        spec[nspec].n = n;
        spec[nspec].col = col;
        nspec++;
        p += n + 1;
    }
    *pp = p + 1;
    *nspec_out = nspec;
    return DT_OK;
}

/* Reads "y=sum;z=max," after "partial:" up to (not including) the space. */
static dt_status parse_partials(const char *text, const char **pp, token *pname,
                                dt_reduce_op *pop, int *npart_out)
{
    const char *p = *pp;
    char f[16];
    int npart = 0;
    for (;;) {
        int col = (int)(p - text) + 1;
        size_t n = ident_len(p);
        if (n == 0)
            return dt__error(DT_ERR_PARSE,
                             "layout string column %d: expected a partial mesh dimension "
                             "name, found %s",
                             col, found(p, f, sizeof f));
        if (p[n] != '=')
            return dt__error(DT_ERR_PARSE,
                             "layout string column %d: expected '=' and a reduction (sum, max, "
                             "min, avg) after partial dimension '%.*s', found %s",
                             col + (int)n, (int)n, p, found(p + n, f, sizeof f));
        if (npart == DT_MESH_MAX_DIMS)
            return dt__error(DT_ERR_PARSE,
                             "layout string column %d: more than %d partial dimensions", col,
                             DT_MESH_MAX_DIMS);
        pname[npart].s = p;
        pname[npart].n = n;
        pname[npart].col = col;
        const char *op = p + n + 1;
        size_t m = ident_len(op);
        char opname[8] = "";
        int op_ok = m > 0 && m < sizeof opname;
        if (op_ok) {
            memcpy(opname, op, m);
            opname[m] = '\0';
            op_ok = dt_reduce_op_parse(opname, &pop[npart]) == DT_OK;
        }
        if (!op_ok)
            return dt__error(DT_ERR_PARSE,
                             "layout string column %d: reduction '%.*s' of partial dimension "
                             "'%.*s' is not one of sum, max, min, avg",
                             (int)(op - text) + 1, (int)m, op, (int)n, p);
        npart++;
        p = op + m;
        if (*p == ';') {
            p++;
            continue;
        }
        if (*p == ',')
            break;
        return dt__error(DT_ERR_PARSE,
                         "layout string column %d: expected ';' or ',' after partial "
                         "dimension '%.*s=%s', found %s",
                         (int)(p - text) + 1, (int)n, pname[npart - 1].s, opname,
                         found(p, f, sizeof f));
    }
    p++;
    if (*p != ' ') {
        char f2[16];
        return dt__error(DT_ERR_PARSE,
                         "layout string column %d: expected ' " MESH_PREFIX "' after the "
                         "partial dimensions, found %s",
                         (int)(p - text) + 1, found(p, f2, sizeof f2));
    }
    *pp = p + 1;
    *npart_out = npart;
    return DT_OK;
}

/* Maps spec and partial tokens to mesh dims, with column-exact errors. */
static dt_status resolve(const dt_mesh *mesh, const token *spec, int nspec, const token *pname,
                         int npart, int *rank_out, int *spec_dim, int *pdim)
{
    char dims[DT__MESH_DIMS_TEXT];
    int user_col[DT_MESH_MAX_DIMS] = {0}; /* column of the token that used a mesh dim */
    int match_col = 0;
    int rank = nspec;

    for (int i = 0; i < nspec; i++) {
        const token *t = &spec[i];
        int d = token_mesh_dim(mesh, t);
        if (d < 0 && token_is(t, DT_UNSHARDED)) {
            spec_dim[i] = DT__SPEC_UNSHARDED;
            continue;
        }
        if (d < 0 && token_is(t, "scalar")) {
            /* TensorFlow writes a rank-0 layout as "sharding_specs:scalar," too. */
            if (nspec != 1)
                return dt__error(DT_ERR_PARSE,
                                 "layout string column %d: 'scalar' must be the only "
                                 "sharding spec (TensorFlow: \"A scalar sharding_spec can only "
                                 "be used as a single sharding_spec\")",
                                 t->col);
            rank = 0;
            break;
        }
        if (d < 0 && token_is(t, DT_ANY)) {
            spec_dim[i] = DT__SPEC_ANY;
            continue;
        }
        if (d < 0 && token_is(t, DT_MATCH)) {
            /* TensorFlow lets 'any' repeat but counts 'match' as a dimension used once. */
            if (match_col)
                return dt__error(DT_ERR_PARSE,
                                 "layout string column %d: '" DT_MATCH "' already appears at "
                                 "column %d (TensorFlow: \"Attempted to shard two or more tensor "
                                 "dimensions over mesh dimension match\")",
                                 t->col, match_col);
            match_col = t->col;
            spec_dim[i] = DT__SPEC_MATCH;
            continue;
        }
        if (d < 0)
            return dt__error(DT_ERR_PARSE,
                             "layout string column %d: sharding spec '%.*s' is neither '"
                             DT_UNSHARDED "' nor a mesh dimension (mesh dims: %s) (TensorFlow: "
                             "\"refers to mesh dimension not contained in mesh\")",
                             t->col, (int)t->n, t->s,
                             dt__layout_mesh_dims(mesh, dims, sizeof dims));
        if (user_col[d])
            return dt__error(DT_ERR_PARSE,
                             "layout string column %d: mesh dimension '%.*s' already shards "
                             "the tensor dim at column %d; each mesh dimension may be used "
                             "at most once (TensorFlow: \"Attempted to shard two or more tensor "
                             "dimensions over mesh dimension\")",
                             t->col, (int)t->n, t->s, user_col[d]);
        user_col[d] = t->col;
        spec_dim[i] = d;
    }
    for (int i = 0; i < npart; i++) {
        const token *t = &pname[i];
        int d = token_mesh_dim(mesh, t);
        if (d < 0)
            return dt__error(DT_ERR_PARSE,
                             "layout string column %d: partial dimension '%.*s' is not a mesh "
                             "dimension (mesh dims: %s)",
                             t->col, (int)t->n, t->s,
                             dt__layout_mesh_dims(mesh, dims, sizeof dims));
        if (user_col[d])
            return dt__error(DT_ERR_PARSE,
                             "layout string column %d: mesh dimension '%.*s' cannot be partial: "
                             "it is already used at column %d",
                             t->col, (int)t->n, t->s, user_col[d]);
        user_col[d] = t->col;
        pdim[i] = d;
    }
    *rank_out = rank;
    return DT_OK;
}

dt_status dt_layout_parse(const char *text, dt_layout **layout_out)
{
    token spec[DT_MAX_RANK], pname[DT_MESH_MAX_DIMS];
    dt_reduce_op pop[DT_MESH_MAX_DIMS];
    int spec_dim[DT_MAX_RANK], pdim[DT_MESH_MAX_DIMS];
    int nspec = 0, npart = 0, rank = 0;
    dt_mesh *mesh = NULL;
    dt_status st;

    if (!text || !layout_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_layout_parse: NULL argument");
    if (strcmp(text, EMPTY_LAYOUT) == 0) {
        if ((st = dt_mesh_parse("empty_mesh", &mesh)) != DT_OK)
            return st;
        st = dt__layout_new(mesh, 0, spec_dim, 0, pdim, pop, layout_out);
        dt_mesh_destroy(mesh);
        return st;
    }
    if (strncmp(text, "maximal:", 8) == 0 || strncmp(text, "parted:", 7) == 0)
        return dt__error(DT_ERR_UNSUPPORTED,
                         "layout string column 1: TensorFlow's '%.*s' layouts are not "
                         "supported; expected '" SPECS_PREFIX "'",
                         (int)strcspn(text, ":"), text);
    if (strncmp(text, SPECS_PREFIX, strlen(SPECS_PREFIX)) != 0)
        return dt__error(DT_ERR_PARSE, "layout string column 1: expected '" SPECS_PREFIX "'");

    const char *p = text + strlen(SPECS_PREFIX);
    st = parse_specs(text, &p, spec, &nspec);
    if (st != DT_OK)
        return st;
    if (strncmp(p, PARTIAL_PREFIX, strlen(PARTIAL_PREFIX)) == 0) {
        p += strlen(PARTIAL_PREFIX);
        st = parse_partials(text, &p, pname, pop, &npart);
        if (st != DT_OK)
            return st;
    }
    if (strncmp(p, MESH_PREFIX, strlen(MESH_PREFIX)) != 0) {
        /* TensorFlow splits the text at spaces and wants two items: say so when that is
         * what went wrong. */
        int items = 1;
        for (const char *c = text; *c; c++)
            items += *c == ' ';
        char tf[64] = "";
        if (!npart && items != 2)
            snprintf(tf, sizeof tf, " (TensorFlow: \"Expected 2 items but found %d\")", items);
        return dt__error(DT_ERR_PARSE, "layout string column %d: expected '" MESH_PREFIX "'%s%s",
                         (int)(p - text) + 1, npart ? "" : " or '" PARTIAL_PREFIX "'", tf);
    }
    p += strlen(MESH_PREFIX);

    st = dt_mesh_parse(p, &mesh);
    if (st != DT_OK) {
        char msg[768];
        dt__strlcpy(msg, dt_last_error(), sizeof msg);
        return dt__error(st, "layout string column %d, in the mesh part: %s",
                         (int)(p - text) + 1, msg);
    }
    st = resolve(mesh, spec, nspec, pname, npart, &rank, spec_dim, pdim);
    if (st == DT_OK)
        st = dt__layout_new(mesh, rank, spec_dim, npart, pdim, pop, layout_out);
    dt_mesh_destroy(mesh);
    return st;
}
