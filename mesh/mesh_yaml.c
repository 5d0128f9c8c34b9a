/* Meshes from YAML (libyaml's document loader): one `mesh:` mapping or a `meshes:` sequence per
 * document, selected by name. Every error names file:line:column of the offending node. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "mesh/mesh_impl.h"
#include "runtime/error.h"
#include "runtime/util.h"

#define STRING_FILE "<string>"

/* The meshes of one file, in order, with the position of each name for repeat messages. */
typedef struct mesh_list {
    dt_mesh **mesh;
    yaml_mark_t *name_mark;
    int n, cap;
} mesh_list;

/* Where each piece of one mesh mapping is, for dt__mesh_build's messages. */
typedef struct ymesh {
    const char *file;
    yaml_mark_t mesh, name, dims, ids;
    yaml_mark_t dim_key[DT_MESH_MAX_DIMS + 1], dim_val[DT_MESH_MAX_DIMS + 1];
    yaml_mark_t *id_marks;
} ymesh;

static dt_status at(dt_status st, const char *file, yaml_mark_t m, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

static dt_status at(dt_status st, const char *file, yaml_mark_t m, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return dt__error(st, "%s:%zu:%zu: %s", file, m.line + 1, m.column + 1, msg);
}

static void where(const void *ctx, dt__mesh_part part, int64_t index, char *buf, size_t len)
{
    const ymesh *y = ctx;
    yaml_mark_t m = y->mesh;
    switch (part) {
    case DT__MESH_AT_NAME:
        m = y->name;
        break;
    case DT__MESH_AT_DIMS:
        m = y->dims;
        break;
    case DT__MESH_AT_DIM_NAME:
        m = y->dim_key[index];
        break;
    case DT__MESH_AT_DIM_SIZE:
        m = y->dim_val[index];
        break;
    case DT__MESH_AT_GLOBAL_IDS:
        m = y->ids;
        break;
    case DT__MESH_AT_GLOBAL_ID:
        m = y->id_marks ? y->id_marks[index] : y->ids;
        break;
    default:
        break;
    }
    snprintf(buf, len, "%s:%zu:%zu: ", y->file, m.line + 1, m.column + 1);
}

static const char *scalar(const yaml_node_t *n)
{
    return (const char *)n->data.scalar.value;
}

static int is_scalar(const yaml_node_t *n)
{
    return n && n->type == YAML_SCALAR_NODE;
}

static dt_status need_int(const char *file, const yaml_node_t *n, const char *what,
                          int64_t *out)
{
    if (!is_scalar(n) ||
        dt__mesh_parse_int(scalar(n), n->data.scalar.length, 1, out) != 0)
        return at(DT_ERR_PARSE, file, n->start_mark, "%s must be an integer%s%s%s", what,
                  is_scalar(n) ? ", not '" : "", is_scalar(n) ? scalar(n) : "",
                  is_scalar(n) ? "'" : "");
    return DT_OK;
}

/* One `name: size` pair of dims. */
static dt_status read_dim(const char *file, yaml_document_t *doc, yaml_node_pair_t *pr,
                          ymesh *y, const char **names, int64_t *sizes, int *rank)
{
    yaml_node_t *k = yaml_document_get_node(doc, pr->key);
    yaml_node_t *v = yaml_document_get_node(doc, pr->value);
    if (!is_scalar(k))
        return at(DT_ERR_PARSE, file, k->start_mark, "a dimension name must be a plain string");
    if (*rank > DT_MESH_MAX_DIMS)
        return DT_OK; /* already one too many: the builder reports it */
    int i = (*rank)++;
    names[i] = scalar(k);
    y->dim_key[i] = k->start_mark;
    y->dim_val[i] = v->start_mark;
    char what[DT_NAME_MAX + 32];
    snprintf(what, sizeof what, "the size of dimension '%.*s'", DT_NAME_MAX, scalar(k));
    return need_int(file, v, what, &sizes[i]);
}

static dt_status read_dims(const char *file, yaml_document_t *doc, yaml_node_t *node, ymesh *y,
                           const char **names, int64_t *sizes, int *rank)
{
    dt_status st;
    y->dims = node->start_mark;
    if (node->type == YAML_MAPPING_NODE) {
        for (yaml_node_pair_t *pr = node->data.mapping.pairs.start;
             pr < node->data.mapping.pairs.top; pr++)
            if ((st = read_dim(file, doc, pr, y, names, sizes, rank)) != DT_OK)
                return st;
        return DT_OK;
    }
    if (node->type == YAML_SEQUENCE_NODE) {
        for (yaml_node_item_t *it = node->data.sequence.items.start;
             it < node->data.sequence.items.top; it++) {
            yaml_node_t *e = yaml_document_get_node(doc, *it);
            if (e->type != YAML_MAPPING_NODE ||
                e->data.mapping.pairs.top - e->data.mapping.pairs.start != 1)
                return at(DT_ERR_PARSE, file, e->start_mark,
                          "each entry of a dims sequence must be one {name: size}");
            if ((st = read_dim(file, doc, e->data.mapping.pairs.start, y, names, sizes, rank)) !=
                DT_OK)
                return st;
        }
        return DT_OK;
    }
    return at(DT_ERR_PARSE, file, node->start_mark,
              "dims must be a mapping {name: size, ...} or a sequence of {name: size}");
}

static dt_status read_ids(const char *file, yaml_document_t *doc, yaml_node_t *node, ymesh *y,
                          int64_t **ids_out, int64_t *n_out)
{
    y->ids = node->start_mark;
    if (node->type != YAML_SEQUENCE_NODE)
        return at(DT_ERR_PARSE, file, node->start_mark,
                  "device_ids must be a sequence of integers like [0, 1, 2, 3]");
    int64_t n = node->data.sequence.items.top - node->data.sequence.items.start;
    int64_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
    y->id_marks = malloc((size_t)(n ? n : 1) * sizeof *y->id_marks);
    if (!ids || !y->id_marks) {
        free(ids);
        return dt__error(DT_ERR_NO_MEMORY, "out of memory reading %s", file);
    }
    for (int64_t i = 0; i < n; i++) {
        yaml_node_t *e = yaml_document_get_node(doc, node->data.sequence.items.start[i]);
        y->id_marks[i] = e->start_mark;
        dt_status st = need_int(file, e, "a device id", &ids[i]);
        if (st != DT_OK) {
            free(ids);
            return st;
        }
    }
    *ids_out = ids;
    *n_out = n;
    return DT_OK;
}

static dt_status list_add(mesh_list *l, dt_mesh *m, yaml_mark_t name_mark)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 4;
        dt_mesh **nm = realloc(l->mesh, (size_t)cap * sizeof *nm);
        if (!nm)
            return dt__error(DT_ERR_NO_MEMORY, "out of memory reading meshes");
        l->mesh = nm;
        yaml_mark_t *mk = realloc(l->name_mark, (size_t)cap * sizeof *mk);
        if (!mk)
            return dt__error(DT_ERR_NO_MEMORY, "out of memory reading meshes");
        l->name_mark = mk;
        l->cap = cap;
    }
    l->mesh[l->n] = m;
    l->name_mark[l->n] = name_mark;
    l->n++;
    return DT_OK;
}

static const char *const mesh_keys = "name, device_type, dims, device_ids";

/* One mesh mapping -> a mesh appended to l. */
static dt_status read_mesh(const char *file, yaml_document_t *doc, yaml_node_t *node,
                           mesh_list *l)
{
    if (node->type != YAML_MAPPING_NODE)
        return at(DT_ERR_PARSE, file, node->start_mark, "a mesh must be a mapping with keys %s",
                  mesh_keys);
    ymesh y = {0};
    y.file = file;
    y.mesh = y.name = y.ids = node->start_mark;
    const char *name = NULL;
    const char *dim_names[DT_MESH_MAX_DIMS + 1] = {0};
    int64_t dim_sizes[DT_MESH_MAX_DIMS + 1] = {0};
    int rank = 0;
    int64_t *ids = NULL, nids = 0;
    dt_device_type type = DT_DEVICE_CPU;
    yaml_node_t *seen[4] = {0};
    static const char *const keys[4] = {"name", "device_type", "dims", "device_ids"};
    dt_status st = DT_OK;

    for (yaml_node_pair_t *pr = node->data.mapping.pairs.start;
         pr < node->data.mapping.pairs.top; pr++) {
        yaml_node_t *k = yaml_document_get_node(doc, pr->key);
        yaml_node_t *v = yaml_document_get_node(doc, pr->value);
        int key = -1;
        for (int i = 0; i < 4 && is_scalar(k); i++)
            if (!strcmp(scalar(k), keys[i]))
                key = i;
        if (key < 0) {
            st = at(DT_ERR_PARSE, file, k->start_mark, "unknown key '%s' in a mesh (keys: %s)",
                    is_scalar(k) ? scalar(k) : "?", mesh_keys);
            goto done;
        }
        if (seen[key]) {
            st = at(DT_ERR_PARSE, file, k->start_mark, "key '%s' repeated (first at line %zu)",
                    keys[key], seen[key]->start_mark.line + 1);
            goto done;
        }
        seen[key] = k;
        switch (key) {
        case 0:
            if (!is_scalar(v)) {
                st = at(DT_ERR_PARSE, file, v->start_mark, "the mesh name must be a string");
                goto done;
            }
            name = scalar(v);
            y.name = v->start_mark;
            break;
        case 1:
            if (!is_scalar(v) || dt_device_type_parse(scalar(v), &type) != DT_OK) {
                st = at(DT_ERR_PARSE, file, v->start_mark,
                        "device_type must be CPU, GPU or TPU, not '%s'",
                        is_scalar(v) ? scalar(v) : "?");
                goto done;
            }
            break;
        case 2:
            st = read_dims(file, doc, v, &y, dim_names, dim_sizes, &rank);
            break;
        case 3:
            st = read_ids(file, doc, v, &y, &ids, &nids);
            break;
        }
        if (st != DT_OK)
            goto done;
    }
    if (!seen[2]) {
        st = at(DT_ERR_PARSE, file, node->start_mark, "mesh has no 'dims'");
        goto done;
    }
    if (name && name[0]) {
        for (int i = 0; i < l->n; i++) {
            if (!strcmp(dt_mesh_name(l->mesh[i]), name)) {
                st = at(DT_ERR_PARSE, file, y.name, "mesh name '%s' repeated (first at line %zu)",
                        name, l->name_mark[i].line + 1);
                goto done;
            }
        }
    }

    dt__mesh_desc d = {0};
    d.name = name;
    d.rank = rank;
    d.dim_names = dim_names;
    d.dim_sizes = dim_sizes;
    d.type = type;
    d.global_ids = ids;
    d.num_global = nids;
    d.code = DT_ERR_PARSE;
    d.where = where;
    d.where_ctx = &y;
    dt_mesh *m = NULL;
    if ((st = dt__mesh_build(&d, &m)) != DT_OK)
        goto done;
    if ((st = list_add(l, m, y.name)) != DT_OK)
        dt_mesh_destroy(m);

done:
    free(ids);
    free(y.id_marks);
    return st;
}

static dt_status read_document(const char *file, yaml_document_t *doc, mesh_list *l)
{
    yaml_node_t *root = yaml_document_get_root_node(doc);
    dt_status st;
    if (is_scalar(root) && root->data.scalar.length == 0)
        return DT_OK; /* an empty document */
    if (root->type != YAML_MAPPING_NODE)
        return at(DT_ERR_PARSE, file, root->start_mark,
                  "expected a mapping with 'mesh:' or 'meshes:'");
    for (yaml_node_pair_t *pr = root->data.mapping.pairs.start;
         pr < root->data.mapping.pairs.top; pr++) {
        yaml_node_t *k = yaml_document_get_node(doc, pr->key);
        yaml_node_t *v = yaml_document_get_node(doc, pr->value);
        if (is_scalar(k) && !strcmp(scalar(k), "mesh")) {
            if ((st = read_mesh(file, doc, v, l)) != DT_OK)
                return st;
        } else if (is_scalar(k) && !strcmp(scalar(k), "meshes")) {
            if (v->type != YAML_SEQUENCE_NODE)
                return at(DT_ERR_PARSE, file, v->start_mark,
                          "'meshes' must be a sequence of meshes");
            for (yaml_node_item_t *it = v->data.sequence.items.start;
                 it < v->data.sequence.items.top; it++)
                if ((st = read_mesh(file, doc, yaml_document_get_node(doc, *it), l)) != DT_OK)
                    return st;
        } else {
            return at(DT_ERR_PARSE, file, k->start_mark,
                      "unknown key '%s' (expected 'mesh' or 'meshes')",
                      is_scalar(k) ? scalar(k) : "?");
        }
    }
    return DT_OK;
}

static dt_status syntax_error(const char *file, const yaml_parser_t *p)
{
    if (p->error == YAML_MEMORY_ERROR)
        return dt__error(DT_ERR_NO_MEMORY, "%s: out of memory parsing YAML", file);
    if (p->error == YAML_READER_ERROR)
        return dt__error(DT_ERR_PARSE, "%s: byte %zu: %s", file, p->problem_offset,
                         p->problem ? p->problem : "unreadable input");
    char ctx[256] = "";
    if (p->context)
        snprintf(ctx, sizeof ctx, " (%s at line %zu column %zu)", p->context,
                 p->context_mark.line + 1, p->context_mark.column + 1);
    return at(DT_ERR_PARSE, file, p->problem_mark, "%s%s",
              p->problem ? p->problem : "malformed YAML", ctx);
}

static void list_free(mesh_list *l)
{
    for (int i = 0; i < l->n; i++)
        dt_mesh_destroy(l->mesh[i]);
    free(l->mesh);
    free(l->name_mark);
    *l = (mesh_list){0};
}

/* Reads every document of the stream into l. */
static dt_status load(yaml_parser_t *p, const char *file, mesh_list *l)
{
    for (;;) {
        yaml_document_t doc;
        if (!yaml_parser_load(p, &doc)) {
            dt_status st = syntax_error(file, p);
            list_free(l);
            return st;
        }
        if (!yaml_document_get_root_node(&doc)) {
            yaml_document_delete(&doc);
            return DT_OK; /* end of the stream */
        }
        dt_status st = read_document(file, &doc, l);
        yaml_document_delete(&doc);
        if (st != DT_OK) {
            list_free(l);
            return st;
        }
    }
}

static dt_status load_file(const char *path, mesh_list *l)
{
    yaml_parser_t p;
    FILE *f = fopen(path, "rb");
    if (!f)
        return dt__error(DT_ERR_IO, "cannot open mesh file '%s': %s", path, strerror(errno));
    if (!yaml_parser_initialize(&p)) {
        fclose(f);
        return dt__error(DT_ERR_NO_MEMORY, "out of memory for a YAML parser");
    }
    yaml_parser_set_input_file(&p, f);
    dt_status st = load(&p, path, l);
    if (st == DT_OK && ferror(f)) {
        list_free(l);
        st = dt__error(DT_ERR_IO, "error reading mesh file '%s'", path);
    }
    yaml_parser_delete(&p);
    fclose(f);
    return st;
}

/* Takes the selected mesh out of l (l is freed either way). */
static dt_status pick(mesh_list *l, const char *file, const char *select, dt_mesh **mesh_out)
{
    dt_status st = DT_OK;
    int found = -1;
    for (int i = 0; i < l->n && found < 0; i++)
        if (!select || !strcmp(dt_mesh_name(l->mesh[i]), select))
            found = i;
    if (l->n == 0) {
        st = dt__error(DT_ERR_NOT_FOUND, "%s: defines no mesh", file);
    } else if (found < 0) {
        char names[512];
        size_t pos = 0;
        names[0] = '\0';
        for (int i = 0; i < l->n && pos < sizeof names; i++) {
            const char *nm = dt_mesh_name(l->mesh[i]);
            int w = snprintf(names + pos, sizeof names - pos, "%s'%s'", i ? ", " : "", nm);
            pos += w > 0 ? (size_t)w : 0;
        }
        st = dt__error(DT_ERR_NOT_FOUND, "%s: no mesh named '%s' (meshes: %s)", file, select,
                       names);
    } else {
        *mesh_out = l->mesh[found];
        l->mesh[found] = NULL;
    }
    list_free(l);
    return st;
}

dt_status dt_mesh_from_yaml_file(const char *path, const char *select, dt_mesh **mesh_out)
{
    if (!path || !mesh_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_mesh_from_yaml_file: NULL argument");
    mesh_list l = {0};
    dt_status st = load_file(path, &l);
    if (st != DT_OK)
        return st;
    return pick(&l, path, select, mesh_out);
}

dt_status dt_mesh_from_yaml_string(const char *text, const char *select, dt_mesh **mesh_out)
{
    if (!text || !mesh_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_mesh_from_yaml_string: NULL argument");
    yaml_parser_t p;
    if (!yaml_parser_initialize(&p))
        return dt__error(DT_ERR_NO_MEMORY, "out of memory for a YAML parser");
    yaml_parser_set_input_string(&p, (const unsigned char *)text, strlen(text));
    mesh_list l = {0};
    dt_status st = load(&p, STRING_FILE, &l);
    yaml_parser_delete(&p);
    if (st != DT_OK)
        return st;
    return pick(&l, STRING_FILE, select, mesh_out);
}

dt_status dt_mesh_yaml_names(const char *path, int cap, char (*names_out)[DT_NAME_MAX],
                             int *count_out)
{
    if (!path || !count_out || cap < 0 || (cap > 0 && !names_out))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_mesh_yaml_names: bad argument");
    mesh_list l = {0};
    dt_status st = load_file(path, &l);
    if (st != DT_OK)
        return st;
    for (int i = 0; i < l.n && i < cap; i++)
        dt__strlcpy(names_out[i], dt_mesh_name(l.mesh[i]), DT_NAME_MAX);
    *count_out = l.n;
    list_free(&l);
    return DT_OK;
}
