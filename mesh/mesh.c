/* Mesh core: the validating constructor shared by all front ends, dt_mesh_create, reference
 * counting, queries, coordinates <-> positions, per-dimension groups, the host mesh and the
 * check against the devices the runtime has. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "mesh/mesh_impl.h"
#include "runtime/comm.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/util.h"

/* ---- small helpers -------------------------------------------------------------------- */

int dt__mesh_parse_int(const char *s, size_t n, int allow_neg, int64_t *out)
{
    int neg = 0;
    uint64_t v = 0;
    if (n > 0 && s[0] == '-' && allow_neg) {
        neg = 1;
        s++;
        n--;
    }
    if (n == 0 || (s[0] == '0' && n > 1))
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (uint64_t)(s[i] - '0');
        if (v > (uint64_t)INT64_MAX)
            return -1;
    }
    *out = neg ? -(int64_t)v : (int64_t)v;
    return 0;
}

static void where(const dt__mesh_desc *d, dt__mesh_part part, int64_t index, char *buf,
                  size_t len)
{
    buf[0] = '\0';
    if (d->where)
        d->where(d->where_ctx, part, index, buf, len);
}

/* [A-Za-z_], and [0-9] when digits are allowed. */
static int ident_char(char ch, int digits)
{
    return (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || ch == '_' ||
           (digits && ch >= '0' && ch <= '9');
}

/* Checks one device name and returns its type name in type_out (DT_NAME_MAX bytes). Local
 * device names must say which host (job and task) and which type they are, as TensorFlow
 * requires of them; global ones need only parse. */
static dt_status check_device_name(const dt__mesh_desc *d, dt__mesh_part part, int64_t index,
                                   const char *name, char *type_out)
{
    char at[256];
    dt__device_name dn;
    if (dt__device_name_parse(name, &dn) != 0) {
        where(d, part, index, at, sizeof at);
        return dt__error(d->code,
                         "%sdevice name '%s' is not a TensorFlow device name "
                         "(like /job:localhost/replica:0/task:0/device:CPU:0)",
                         at, name);
    }
    int local = part == DT__MESH_AT_LOCAL_DEVICE;
    if (!dn.has_type || (local && (!dn.has_job || !dn.has_task))) {
        where(d, part, index, at, sizeof at);
        return dt__error(d->code,
                         "%s%s device name '%s' does not name its %s (TensorFlow: \"Failed to "
                         "either identify host or device type\"); write "
                         "/job:<name>/task:<n>/device:<TYPE>:<id>",
                         at, local ? "local" : "global", name,
                         !dn.has_type ? "device type" : !dn.has_job ? "job" : "task");
    }
    if (dt__device_name_type(name, &dn, type_out, DT_NAME_MAX) >= DT_NAME_MAX) {
        where(d, part, index, at, sizeof at);
        return dt__error(d->code, "%sdevice name '%s' has a type longer than %d bytes", at, name,
                         DT_NAME_MAX - 1);
    }
    return DT_OK;
}

static int valid_dim_name(const char *s)
{
    if (!ident_char(s[0], 0))
        return 0;
    for (const char *p = s + 1; *p; p++)
        if (!ident_char(*p, 1))
            return 0;
    return 1;
}

/* Sorting helpers to find repeats in O(n log n); on ties the input order decides, so the
 * first repeated entry in reading order is the one reported. */
typedef struct key_ix {
    int64_t v;
    const char *s;
    int64_t ix;
} key_ix;

static int cmp_int_key(const void *a, const void *b)
{
    const key_ix *x = a, *y = b;
    if (x->v != y->v)
        return x->v < y->v ? -1 : 1;
    return (x->ix > y->ix) - (x->ix < y->ix);
}

static int cmp_str_key(const void *a, const void *b)
{
    const key_ix *x = a, *y = b;
    int c = strcmp(x->s, y->s);
    if (c)
        return c;
    return (x->ix > y->ix) - (x->ix < y->ix);
}

/* Index of the earliest entry equal to an earlier one, or -1. *mem_ok is 0 on no memory. */
static int64_t first_repeat(const int64_t *ints, const char *const *strs, int64_t n, int *mem_ok)
{
    *mem_ok = 1;
    if (n < 2)
        return -1;
    key_ix *k = malloc((size_t)n * sizeof *k);
    if (!k) {
        *mem_ok = 0;
        return -1;
    }
    for (int64_t i = 0; i < n; i++) {
        k[i].v = ints ? ints[i] : 0;
        k[i].s = strs ? strs[i] : NULL;
        k[i].ix = i;
    }
    qsort(k, (size_t)n, sizeof *k, strs ? cmp_str_key : cmp_int_key);
    int64_t best = -1;
    for (int64_t i = 1; i < n; i++) {
        int same = strs ? strcmp(k[i].s, k[i - 1].s) == 0 : k[i].v == k[i - 1].v;
        if (same && (best < 0 || k[i].ix < best))
            best = k[i].ix;
    }
    free(k);
    return best;
}

static int cmp_int64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int cmp_slot(const void *a, const void *b)
{
    const dt__mesh_slot *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

/* "x=2,y=4" into buf. */
static void dims_text(const dt__mesh_desc *d, char *buf, size_t len)
{
    size_t pos = 0;
    buf[0] = '\0';
    for (int i = 0; i < d->rank && i < DT_MESH_MAX_DIMS && pos < len; i++) {
        int w = snprintf(buf + pos, len - pos, "%s%s=%lld", i ? "," : "", d->dim_names[i],
                         (long long)d->dim_sizes[i]);
        if (w < 0)
            break;
        pos += (size_t)w;
    }
}

static char *dup_string(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p)
        memcpy(p, s, n);
    return p;
}

static void free_names(char **names, int64_t n)
{
    if (!names)
        return;
    for (int64_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

static void mesh_free(dt_mesh *m)
{
    if (!m)
        return;
    free_names(m->local_devices, m->num_local);
    free_names(m->global_devices, m->num_global_devices);
    free(m->local_ids);
    free(m->by_id);
    free(m->global_ids);
    free(m);
}

/* The runtime's name for device `id` of this mesh when the runtime decides the local devices:
 * task = this client, index = the device's local index (task 0, index = id without runtime).
 * TensorFlow's expansion of the short form writes no replica (tf_short). */
static dt_status runtime_device_name(dt_device_type type, const char *type_name, int tf_short,
                                     int id, int per_client, char **out)
{
    int task = 0, index = id;
    if (per_client) {
        task = dt_client_id();
        int n = dt_num_local_devices(type);
        for (int li = 0; li < n; li++)
            if (dt_local_device_id(type, li) == id)
                index = li;
    }
    char buf[128];
    snprintf(buf, sizeof buf, "/job:localhost%s/task:%d/device:%s:%d",
             tf_short ? "" : "/replica:0", task, type_name, index);
    *out = dup_string(buf);
    return *out ? DT_OK : dt__error(DT_ERR_NO_MEMORY, "out of memory for a mesh device name");
}

/* ---- the validating constructor ------------------------------------------------------- */

/* 1 if d describes TensorFlow's empty mesh: a string whose mesh has no devices. */
static int describes_empty_mesh(const dt__mesh_desc *d)
{
    if (!d->allow_empty)
        return 0;
    if (d->global_ids)
        return d->num_global == 0 && d->num_local == 0 && d->num_local_devices == 0 &&
               !d->global_devices;
    for (int i = 0; i < d->rank && i <= DT_MESH_MAX_DIMS; i++)
        if (d->dim_sizes[i] == 0)
            return 1;
    return d->rank == 0;
}

/* Name and dims. For an empty mesh (`empty`) no dimension is needed and sizes may be 0, but
 * the names given must still be valid, as TensorFlow checks them before it sees the devices. */
static dt_status check_shape(const dt__mesh_desc *d, int empty, int64_t *size_out)
{
    char at[256];
    if (d->name) {
        size_t n = strlen(d->name);
        if (n >= DT_NAME_MAX) {
            where(d, DT__MESH_AT_NAME, 0, at, sizeof at);
            return dt__error(d->code, "%smesh name '%.*s...' is longer than %d bytes", at, 32,
                             d->name, DT_NAME_MAX - 1);
        }
        for (size_t i = 0; i < n; i++) {
            unsigned char ch = (unsigned char)d->name[i];
            if (ch <= ' ' || ch >= 127 || ch == '|') {
                where(d, DT__MESH_AT_NAME, 0, at, sizeof at);
                return dt__error(d->code,
                                 "%smesh name '%s' has a bad character at byte %zu "
                                 "(printable ASCII except space and '|')",
                                 at, d->name, i);
            }
        }
    }
    if (d->rank < 1 && !empty) {
        where(d, DT__MESH_AT_DIMS, 0, at, sizeof at);
        return dt__error(d->code, "%sa mesh needs at least one dimension", at);
    }
    if (d->rank > DT_MESH_MAX_DIMS) {
        where(d, DT__MESH_AT_DIM_NAME, DT_MESH_MAX_DIMS, at, sizeof at);
        return dt__error(d->code, "%smore than %d mesh dimensions", at, DT_MESH_MAX_DIMS);
    }
    int64_t size = 1;
    for (int i = 0; i < d->rank; i++) {
        const char *nm = d->dim_names[i];
        if (!nm || !nm[0]) {
            where(d, DT__MESH_AT_DIM_NAME, i, at, sizeof at);
            return dt__error(d->code, "%sdimension %d has an empty name", at, i);
        }
        if (strlen(nm) >= DT_NAME_MAX) {
            where(d, DT__MESH_AT_DIM_NAME, i, at, sizeof at);
            return dt__error(d->code, "%sdimension name '%.32s...' is longer than %d bytes", at,
                             nm, DT_NAME_MAX - 1);
        }
        if (!valid_dim_name(nm)) {
            where(d, DT__MESH_AT_DIM_NAME, i, at, sizeof at);
            return dt__error(d->code,
                             "%sdimension name '%s' is not an identifier ([A-Za-z_][A-Za-z0-9_]*)",
                             at, nm);
        }
        /* Reserved by TensorFlow's layouts (Layout::kUnshardedDim, kAny, kMatch). */
        if (!strcmp(nm, "unsharded") || !strcmp(nm, "any") || !strcmp(nm, "match")) {
            where(d, DT__MESH_AT_DIM_NAME, i, at, sizeof at);
            return dt__error(d->code,
                             "%sdimension name '%s' is reserved for layouts (TensorFlow: "
                             "\"mesh dimension name %s is reserved\")",
                             at, nm, nm);
        }
        for (int j = 0; j < i; j++) {
            if (!strcmp(d->dim_names[j], nm)) {
                where(d, DT__MESH_AT_DIM_NAME, i, at, sizeof at);
                return dt__error(d->code,
                                 "%sdimension '%s' repeated (TensorFlow: \"repeated mesh "
                                 "dimension\")",
                                 at, nm);
            }
        }
        if (d->dim_sizes[i] < (empty ? 0 : 1)) {
            where(d, DT__MESH_AT_DIM_SIZE, i, at, sizeof at);
            return dt__error(d->code, "%sdimension '%s' has size %lld; sizes must be >= 1", at,
                             nm, (long long)d->dim_sizes[i]);
        }
        if (size > 0 && d->dim_sizes[i] > INT_MAX / size) {
            where(d, DT__MESH_AT_DIM_SIZE, i, at, sizeof at);
            return dt__error(d->code, "%smesh has more than %d devices (dimension '%s' of %lld)",
                             at, INT_MAX, nm, (long long)d->dim_sizes[i]);
        }
        size *= d->dim_sizes[i];
    }
    *size_out = size;
    return DT_OK;
}

static dt_status check_ids(const dt__mesh_desc *d, int64_t size)
{
    char at[256], dims[256];
    int mem_ok;
    if (d->global_ids) {
        if (d->num_global != size) {
            dims_text(d, dims, sizeof dims);
            where(d, DT__MESH_AT_GLOBAL_IDS, 0, at, sizeof at);
            return dt__error(d->code,
                             "%s%lld device ids for a mesh of %lld devices (%s) (TensorFlow: "
                             "\"mesh size doesn't match number of devices\")",
                             at,
                             (long long)d->num_global, (long long)size, dims);
        }
        for (int64_t i = 0; i < size; i++) {
            if (d->global_ids[i] < 0 || d->global_ids[i] > INT_MAX) {
                where(d, DT__MESH_AT_GLOBAL_ID, i, at, sizeof at);
                return dt__error(d->code, "%sdevice id %lld is out of range 0..%d", at,
                                 (long long)d->global_ids[i], INT_MAX);
            }
        }
        int64_t r = first_repeat(d->global_ids, NULL, size, &mem_ok);
        if (!mem_ok)
            return dt__error(DT_ERR_NO_MEMORY, "out of memory checking mesh device ids");
        if (r >= 0) {
            where(d, DT__MESH_AT_GLOBAL_ID, r, at, sizeof at);
            return dt__error(d->code, "%sdevice id %lld repeated", at,
                             (long long)d->global_ids[r]);
        }
    }
    if (!d->local_ids)
        return DT_OK;
    int64_t *sorted = NULL;
    if (d->global_ids) {
        if (!(sorted = malloc((size_t)size * sizeof *sorted)))
            return dt__error(DT_ERR_NO_MEMORY, "out of memory checking mesh device ids");
        memcpy(sorted, d->global_ids, (size_t)size * sizeof *sorted);
        qsort(sorted, (size_t)size, sizeof *sorted, cmp_int64);
    }
    for (int64_t i = 0; i < d->num_local; i++) {
        int64_t id = d->local_ids[i];
        int in = sorted ? bsearch(&id, sorted, (size_t)size, sizeof *sorted, cmp_int64) != NULL
                        : id >= 0 && id < size;
        if (!in) {
            free(sorted);
            where(d, DT__MESH_AT_LOCAL_ID, i, at, sizeof at);
            return dt__error(d->code, "%slocal device id %lld is not one of the mesh's device ids",
                             at, (long long)id);
        }
    }
    free(sorted);
    int64_t r = first_repeat(d->local_ids, NULL, d->num_local, &mem_ok);
    if (!mem_ok)
        return dt__error(DT_ERR_NO_MEMORY, "out of memory checking mesh device ids");
    if (r >= 0) {
        where(d, DT__MESH_AT_LOCAL_ID, r, at, sizeof at);
        return dt__error(d->code, "%slocal device id %lld repeated", at,
                         (long long)d->local_ids[r]);
    }
    if (d->num_local_devices != d->num_local) {
        where(d, DT__MESH_AT_LOCAL_DEVICES, 0, at, sizeof at);
        return dt__error(d->code,
                         "%s%lld local device names for %lld local device ids (TensorFlow: "
                         "\"not meeting requirements\")",
                         at,
                         (long long)d->num_local_devices, (long long)d->num_local);
    }
    /* TensorFlow's meshes give every client the same number of devices. */
    if (d->num_local > 0 && size % d->num_local != 0) {
        where(d, DT__MESH_AT_LOCAL_IDS, 0, at, sizeof at);
        return dt__error(d->code,
                         "%s%lld local devices do not divide the mesh's %lld devices evenly "
                         "(TensorFlow: \"Uneven local clusters with global_ids %lld and "
                         "local_devices ids %lld\")",
                         at, (long long)d->num_local, (long long)size, (long long)size,
                         (long long)d->num_local);
    }
    return DT_OK;
}

/* Checks a list of device names: well formed, one device type (agreeing with type_io if
 * *have_type; type_io holds DT_NAME_MAX bytes), no repeats. */
static dt_status check_names(const dt__mesh_desc *d, dt__mesh_part item,
                             const char *const *names, int64_t n, char *type_io, int *have_type)
{
    char at[256], t[DT_NAME_MAX];
    int mem_ok;
    for (int64_t i = 0; i < n; i++) {
        dt_status st = check_device_name(d, item, i, names[i], t);
        if (st != DT_OK)
            return st;
        if (*have_type && strcmp(t, type_io) != 0) {
            where(d, item, i, at, sizeof at);
            return dt__error(d->code,
                             "%sdevice '%s' is %s but the mesh's other devices are %s "
                             "(TensorFlow: \"More than one device type per mesh not "
                             "supported\")",
                             at, names[i], t, type_io);
        }
        memcpy(type_io, t, sizeof t);
        *have_type = 1;
    }
    int64_t r = first_repeat(NULL, names, n, &mem_ok);
    if (!mem_ok)
        return dt__error(DT_ERR_NO_MEMORY, "out of memory checking mesh device names");
    if (r >= 0) {
        where(d, item, r, at, sizeof at);
        return dt__error(d->code, "%sdevice '%s' repeated", at, names[r]);
    }
    return DT_OK;
}

/* Local devices decided by the runtime (see dt__mesh_desc.local_rule). */
static dt_status runtime_locals(const dt__mesh_desc *d, dt_mesh *m)
{
    int per_client = dt_is_initialized() && (d->local_rule == 0 || dt_num_clients() > 1);
    int me = dt_client_id(), n = 0;
    for (int64_t p = 0; p < m->size; p++)
        if (!per_client || dt_device_client(m->type, m->global_ids[p]) == me)
            n++;
    m->local_ids = malloc((size_t)(n ? n : 1) * sizeof *m->local_ids);
    m->local_devices = calloc((size_t)(n ? n : 1), sizeof *m->local_devices);
    if (!m->local_ids || !m->local_devices)
        return dt__error(DT_ERR_NO_MEMORY, "out of memory for a mesh of %lld devices",
                         (long long)m->size);
    /* Local devices are listed in the runtime's order (by global id), like TensorFlow. */
    for (int64_t s = 0, k = 0; s < m->size; s++) {
        int id = m->by_id[s].id;
        if (per_client && dt_device_client(m->type, id) != me)
            continue;
        m->local_ids[k] = id;
        dt_status st = runtime_device_name(m->type, m->type_name, d->local_rule == 1, id,
                                           per_client, &m->local_devices[k]);
        k++;
        m->num_local = (int)k;
        if (st != DT_OK)
            return st;
    }
    return DT_OK;
}

dt_status dt__mesh_build(const dt__mesh_desc *d, dt_mesh **mesh_out)
{
    int64_t size = 0;
    int empty = describes_empty_mesh(d);
    dt_status st = check_shape(d, empty, &size);
    if (st != DT_OK)
        return st;
    if (empty)
        return dt__mesh_empty(mesh_out);
    st = check_ids(d, size);
    if (st != DT_OK)
        return st;

    char type_name[DT_NAME_MAX];
    dt__strlcpy(type_name, d->type_name ? d->type_name : dt_device_type_name(d->type),
                sizeof type_name);
    int have_type = 0;
    if (d->global_devices) {
        st = check_names(d, DT__MESH_AT_GLOBAL_DEVICE, d->global_devices,
                         d->num_global_devices, type_name, &have_type);
        if (st != DT_OK)
            return st;
    }
    if (d->local_ids) {
        st = check_names(d, DT__MESH_AT_LOCAL_DEVICE, d->local_devices, d->num_local, type_name,
                         &have_type);
        if (st != DT_OK)
            return st;
    }

    dt_mesh *m = calloc(1, sizeof *m);
    if (!m)
        return dt__error(DT_ERR_NO_MEMORY, "out of memory for a mesh");
    atomic_init(&m->refs, 1);
    if (d->name)
        dt__strlcpy(m->name, d->name, sizeof m->name);
    m->type = have_type ? dt__device_type_of(type_name) : d->type;
    memcpy(m->type_name, type_name, sizeof type_name);
    m->rank = d->rank;
    m->size = size;
    m->use_xla_spmd = d->use_xla_spmd;
    for (int i = 0; i < d->rank; i++) {
        dt__strlcpy(m->dim_names[i], d->dim_names[i], DT_NAME_MAX);
        m->dim_sizes[i] = d->dim_sizes[i];
    }
    int64_t stride = 1;
    for (int i = d->rank - 1; i >= 0; i--) {
        m->strides[i] = stride;
        stride *= m->dim_sizes[i];
    }
    m->global_ids = malloc((size_t)size * sizeof *m->global_ids);
    m->by_id = malloc((size_t)size * sizeof *m->by_id);
    if (!m->global_ids || !m->by_id) {
        st = dt__error(DT_ERR_NO_MEMORY, "out of memory for a mesh of %lld devices",
                       (long long)size);
        goto err_free_mesh;
    }
    for (int64_t p = 0; p < size; p++) {
        m->global_ids[p] = d->global_ids ? (int)d->global_ids[p] : (int)p;
        m->by_id[p].id = m->global_ids[p];
        m->by_id[p].position = p;
    }
    qsort(m->by_id, (size_t)size, sizeof *m->by_id, cmp_slot);

    if (d->global_devices) {
        m->global_devices = calloc((size_t)d->num_global_devices, sizeof *m->global_devices);
        if (!m->global_devices) {
            st = dt__error(DT_ERR_NO_MEMORY, "out of memory for mesh device names");
            goto err_free_mesh;
        }
        for (int64_t p = 0; p < d->num_global_devices; p++) {
            m->num_global_devices = p + 1;
            if (!(m->global_devices[p] = dup_string(d->global_devices[p]))) {
                st = dt__error(DT_ERR_NO_MEMORY, "out of memory for mesh device names");
                goto err_free_mesh;
            }
        }
    }
    if (d->local_ids) {
        size_t n = (size_t)(d->num_local ? d->num_local : 1);
        m->local_ids = malloc(n * sizeof *m->local_ids);
        m->local_devices = calloc(n, sizeof *m->local_devices);
        if (!m->local_ids || !m->local_devices) {
            st = dt__error(DT_ERR_NO_MEMORY, "out of memory for mesh device names");
            goto err_free_mesh;
        }
        for (int64_t i = 0; i < d->num_local; i++) {
            m->local_ids[i] = (int)d->local_ids[i];
            m->num_local = (int)i + 1;
            if (!(m->local_devices[i] = dup_string(d->local_devices[i]))) {
                st = dt__error(DT_ERR_NO_MEMORY, "out of memory for mesh device names");
                goto err_free_mesh;
            }
        }
    } else {
        st = runtime_locals(d, m);
        if (st != DT_OK)
            goto err_free_mesh;
    }
    *mesh_out = m;
    return DT_OK;

err_free_mesh:
    mesh_free(m);
    return st;
}

dt_status dt__mesh_empty(dt_mesh **mesh_out)
{
    dt_mesh *m = calloc(1, sizeof *m);
    if (!m)
        return dt__error(DT_ERR_NO_MEMORY, "out of memory for a mesh");
    atomic_init(&m->refs, 1);
    m->type = DT_DEVICE_CPU;
    *mesh_out = m;
    return DT_OK;
}

/* ---- public constructors and ownership ----------------------------------------------- */

dt_status dt_mesh_create(const char *name, int ndims, const char *const *dim_names,
                         const int64_t *dim_sizes, dt_device_type type, dt_mesh **mesh_out)
{
    if (!mesh_out || (ndims > 0 && (!dim_names || !dim_sizes)))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_mesh_create: NULL argument");
    if (type != DT_DEVICE_CPU && type != DT_DEVICE_GPU && type != DT_DEVICE_TPU)
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "dt_mesh_create: device type %d is not CPU, GPU or TPU", (int)type);
    if (ndims > DT_MESH_MAX_DIMS)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_mesh_create: %d dimensions; at most %d",
                         ndims, DT_MESH_MAX_DIMS);
    dt__mesh_desc d = {0};
    d.name = name;
    d.rank = ndims;
    d.dim_names = dim_names;
    d.dim_sizes = dim_sizes;
    d.type = type;
    d.code = DT_ERR_INVALID_ARGUMENT;
    return dt__mesh_build(&d, mesh_out);
}

dt_mesh *dt_mesh_retain(const dt_mesh *mesh)
{
    dt_mesh *m = (dt_mesh *)mesh;
    if (m)
        atomic_fetch_add_explicit(&m->refs, 1, memory_order_relaxed);
    return m;
}

void dt_mesh_destroy(dt_mesh *mesh)
{
    if (!mesh)
        return;
    if (atomic_fetch_sub_explicit(&mesh->refs, 1, memory_order_acq_rel) == 1)
        mesh_free(mesh);
}

/* ---- queries -------------------------------------------------------------------------- */

const char *dt_mesh_name(const dt_mesh *mesh)
{
    return mesh->name;
}

dt_device_type dt_mesh_device_type(const dt_mesh *mesh)
{
    return mesh->type;
}

const char *dt_mesh_device_type_name(const dt_mesh *mesh)
{
    return mesh->type_name;
}

int dt_mesh_is_empty(const dt_mesh *mesh)
{
    return mesh->size == 0;
}

int dt_mesh_rank(const dt_mesh *mesh)
{
    return mesh->rank;
}

int64_t dt_mesh_size(const dt_mesh *mesh)
{
    return mesh->size;
}

const char *dt_mesh_dim_name(const dt_mesh *mesh, int dim)
{
    return dim >= 0 && dim < mesh->rank ? mesh->dim_names[dim] : NULL;
}

int64_t dt_mesh_dim_size(const dt_mesh *mesh, int dim)
{
    return dim >= 0 && dim < mesh->rank ? mesh->dim_sizes[dim] : 0;
}

int dt_mesh_dim_index(const dt_mesh *mesh, const char *dim_name)
{
    if (!dim_name)
        return -1;
    for (int i = 0; i < mesh->rank; i++)
        if (!strcmp(mesh->dim_names[i], dim_name))
            return i;
    return -1;
}

int dt_mesh_device_id(const dt_mesh *mesh, int64_t position)
{
    return position >= 0 && position < mesh->size ? mesh->global_ids[position] : -1;
}

int64_t dt_mesh_position(const dt_mesh *mesh, int device_id)
{
    dt__mesh_slot key = {device_id, 0};
    if (mesh->size == 0)
        return -1;
    const dt__mesh_slot *s =
        bsearch(&key, mesh->by_id, (size_t)mesh->size, sizeof *mesh->by_id, cmp_slot);
    return s ? s->position : -1;
}

int dt_mesh_num_local_devices(const dt_mesh *mesh)
{
    return mesh->num_local;
}

int dt_mesh_local_device_id(const dt_mesh *mesh, int local_index)
{
    return local_index >= 0 && local_index < mesh->num_local ? mesh->local_ids[local_index] : -1;
}

int dt_mesh_equal(const dt_mesh *a, const dt_mesh *b)
{
    if (a == b)
        return 1;
    if (!a || !b || a->rank != b->rank || strcmp(a->type_name, b->type_name) != 0 ||
        a->size != b->size)
        return 0;
    for (int i = 0; i < a->rank; i++)
        if (a->dim_sizes[i] != b->dim_sizes[i] || strcmp(a->dim_names[i], b->dim_names[i]))
            return 0;
    /* The empty mesh has no id arrays at all. */
    return a->size == 0 ||
           memcmp(a->global_ids, b->global_ids, (size_t)a->size * sizeof *a->global_ids) == 0;
}

/* ---- coordinates and groups ----------------------------------------------------------- */

dt_status dt_mesh_coords(const dt_mesh *mesh, int64_t position, int64_t *coords_out)
{
    if (!mesh || !coords_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_mesh_coords: NULL argument");
    if (position < 0 || position >= mesh->size)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "mesh position %lld is out of range 0..%lld",
                         (long long)position, (long long)mesh->size - 1);
    for (int i = 0; i < mesh->rank; i++)
        coords_out[i] = position / mesh->strides[i] % mesh->dim_sizes[i];
    return DT_OK;
}

dt_status dt_mesh_position_of(const dt_mesh *mesh, const int64_t *coords, int64_t *position_out)
{
    if (!mesh || !coords || !position_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_mesh_position_of: NULL argument");
    int64_t p = 0;
    for (int i = 0; i < mesh->rank; i++) {
        if (coords[i] < 0 || coords[i] >= mesh->dim_sizes[i])
            return dt__error(DT_ERR_INVALID_ARGUMENT,
                             "coordinate %lld on mesh dimension '%s' is out of range 0..%lld",
                             (long long)coords[i], mesh->dim_names[i],
                             (long long)mesh->dim_sizes[i] - 1);
        p += coords[i] * mesh->strides[i];
    }
    *position_out = p;
    return DT_OK;
}

dt_status dt_mesh_dim_group(const dt_mesh *mesh, int dim, int64_t position, int64_t *positions_out)
{
    if (!mesh || !positions_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_mesh_dim_group: NULL argument");
    if (dim < 0 || dim >= mesh->rank)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "mesh dimension %d is out of range 0..%d", dim,
                         mesh->rank - 1);
    if (position < 0 || position >= mesh->size)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "mesh position %lld is out of range 0..%lld",
                         (long long)position, (long long)mesh->size - 1);
    int64_t stride = mesh->strides[dim];
    int64_t base = position - (position / stride % mesh->dim_sizes[dim]) * stride;
    for (int64_t k = 0; k < mesh->dim_sizes[dim]; k++)
        positions_out[k] = base + k * stride;
    return DT_OK;
}

/* ---- host mesh ------------------------------------------------------------------------ */

/* The CPU device beside GPU device `id` (same client and local index; dt_init gives every
 * client at least as many CPU devices as GPU devices), so the map keeps id order. Before
 * dt_init, or for an id no client holds, the id itself. */
static int host_id(int id)
{
    int cpu = dt_is_initialized() ? dt__device_id_map(DT_DEVICE_GPU, id, DT_DEVICE_CPU) : -1;
    return cpu >= 0 ? cpu : id;
}

dt_status dt_mesh_host_mesh(const dt_mesh *mesh, dt_mesh **host_out)
{
    if (!mesh || !host_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_mesh_host_mesh: NULL argument");
    if (mesh->type == DT_DEVICE_CPU) {
        *host_out = dt_mesh_retain(mesh);
        return DT_OK;
    }
    dt_status st = DT_ERR_NO_MEMORY;
    dt_mesh *h = calloc(1, sizeof *h);
    if (!h)
        goto err_nomem;
    atomic_init(&h->refs, 1);
    memcpy(h->name, mesh->name, sizeof h->name);
    h->type = DT_DEVICE_CPU;
    dt__strlcpy(h->type_name, dt_device_type_name(DT_DEVICE_CPU), sizeof h->type_name);
    h->rank = mesh->rank;
    memcpy(h->dim_names, mesh->dim_names, sizeof h->dim_names);
    memcpy(h->dim_sizes, mesh->dim_sizes, sizeof h->dim_sizes);
    memcpy(h->strides, mesh->strides, sizeof h->strides);
    h->size = mesh->size;
    /* XLA SPMD is a TPU/GPU compilation mode; TensorFlow's ToDeviceType drops it too. */
    h->use_xla_spmd = 0;
    h->global_ids = malloc((size_t)h->size * sizeof *h->global_ids);
    h->by_id = malloc((size_t)h->size * sizeof *h->by_id);
    h->local_ids = malloc((size_t)(mesh->num_local ? mesh->num_local : 1) * sizeof *h->local_ids);
    h->local_devices = calloc((size_t)(mesh->num_local ? mesh->num_local : 1), sizeof(char *));
    if (!h->global_ids || !h->by_id || !h->local_ids || !h->local_devices)
        goto err_nomem;
    memcpy(h->global_ids, mesh->global_ids, (size_t)h->size * sizeof *h->global_ids);
    memcpy(h->by_id, mesh->by_id, (size_t)h->size * sizeof *h->by_id);
    for (int64_t p = 0; p < h->size; p++) {
        h->global_ids[p] = host_id(mesh->global_ids[p]);
        h->by_id[p].id = host_id(mesh->by_id[p].id);
    }
    for (int i = 0; i < mesh->num_local; i++) {
        h->local_ids[i] = host_id(mesh->local_ids[i]);
        h->num_local = i + 1;
        if (!(h->local_devices[i] = dt__device_name_with_type(mesh->local_devices[i], "CPU")))
            goto err_nomem;
    }
    if (mesh->global_devices) {
        h->global_devices = calloc((size_t)mesh->num_global_devices, sizeof(char *));
        if (!h->global_devices)
            goto err_nomem;
        for (int64_t p = 0; p < mesh->num_global_devices; p++) {
            h->num_global_devices = p + 1;
            h->global_devices[p] = dt__device_name_with_type(mesh->global_devices[p], "CPU");
            if (!h->global_devices[p])
                goto err_nomem;
        }
    }
    *host_out = h;
    return DT_OK;

err_nomem:
    mesh_free(h);
    return dt__error(st, "out of memory for the host mesh of a %lld-device mesh",
                     (long long)mesh->size);
}

/* ---- against the runtime -------------------------------------------------------------- */

/* "mesh 'train'" or "unnamed mesh (x=2,y=4)" */
void dt__mesh_label(const dt_mesh *m, char *buf, size_t len)
{
    if (m->name[0]) {
        snprintf(buf, len, "mesh '%s'", m->name);
        return;
    }
    size_t pos = (size_t)snprintf(buf, len, "unnamed mesh (");
    for (int i = 0; i < m->rank && pos < len; i++)
        pos += (size_t)snprintf(buf + pos, len - pos, "%s%s=%lld", i ? "," : "", m->dim_names[i],
                                (long long)m->dim_sizes[i]);
    if (pos < len)
        snprintf(buf + pos, len - pos, ")");
}

/* "0,1,2,3" (cut short with "..." if long). */
static void ids_text(const int *ids, int n, char *buf, size_t len)
{
    size_t pos = 0;
    buf[0] = '\0';
    for (int i = 0; i < n; i++) {
        if (pos + 24 >= len) {
            snprintf(buf + pos, len - pos, ",...");
            return;
        }
        pos += (size_t)snprintf(buf + pos, len - pos, "%s%d", i ? "," : "", ids[i]);
    }
    if (n == 0)
        snprintf(buf, len, "none");
}

static dt_status check_locals(const dt_mesh *mesh, const char *label)
{
    const char *tn = dt_device_type_name(mesh->type);
    int me = dt_client_id(), n = 0;
    int *want = malloc((size_t)mesh->size * sizeof *want);
    if (!want)
        return dt__error(DT_ERR_NO_MEMORY, "out of memory checking %s", label);
    /* The mesh's own devices this client owns (a mesh may use any subset of the devices). */
    for (int64_t p = 0; p < mesh->size; p++)
        if (dt_device_client(mesh->type, mesh->global_ids[p]) == me)
            want[n++] = mesh->global_ids[p];
    int ok = n == mesh->num_local;
    for (int i = 0; ok && i < mesh->num_local; i++) {
        int id = mesh->local_ids[i], found = 0;
        for (int j = 0; j < n && !found; j++)
            found = want[j] == id;
        ok = found;
    }
    dt_status st = DT_OK;
    if (!ok) {
        char has[256], own[256];
        ids_text(mesh->local_ids, mesh->num_local, has, sizeof has);
        ids_text(want, n, own, sizeof own);
        st = dt__error(DT_ERR_DEVICE_MISMATCH,
                       "%s lists local %s devices %s but this client (%d of %d) owns %s", label,
                       tn, has, me, dt_num_clients(), own);
    }
    free(want);
    return st;
}

dt_status dt_mesh_check_devices(const dt_mesh *mesh)
{
    char label[192];
    if (!mesh)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_mesh_check_devices: NULL mesh");
    /* What the mesh itself rules out comes first: no runtime could hold these. */
    if (mesh->size == 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "the empty mesh (TensorFlow's 'empty_mesh') holds no devices, so it "
                         "cannot hold a tensor");
    dt__mesh_label(mesh, label, sizeof label);
    if (mesh->type != DT_DEVICE_CPU && mesh->type != DT_DEVICE_GPU)
        return dt__error(DT_ERR_UNSUPPORTED,
                         "%s is a %s mesh: libdtensor places tensors on CPU and GPU devices "
                         "only, so a %s mesh can be parsed and printed but cannot hold a tensor",
                         label, mesh->type_name, mesh->type_name);
    if (!dt_is_initialized())
        return dt__error(DT_ERR_STATE, "%s: the runtime is not initialised (call dt_init first)",
                         label);
    const char *tn = dt_device_type_name(mesh->type);
    int present = dt_num_global_devices(mesh->type);
    int clients = dt_num_clients();
    if (mesh->type == DT_DEVICE_GPU && present == 0)
        return dt__error(DT_ERR_DEVICE_MISMATCH,
                         "%s is a GPU mesh but no client has GPU devices: %s (DT_GPU=%s); "
                         "DT_GPU=sim runs GPU meshes on the simulated accelerator, and "
                         "DT_GPU_DEVICES sets the GPU devices per process", label,
                         dt__gpu_absence(), getenv("DT_GPU") ? getenv("DT_GPU") : "auto");
    /* A mesh may use a subset of the devices (copy_to_mesh onto fewer devices), never more. */
    if (mesh->size > present) {
        const int *counts = dt__client_device_counts(mesh->type);
        int same = 1;
        for (int c = 1; counts && c < clients; c++)
            same = same && counts[c] == counts[0];
        if (counts && same)
            return dt__error(DT_ERR_DEVICE_MISMATCH,
                             "%s has %lld %s devices but %d client%s x %d = %d %s present",
                             label, (long long)mesh->size, tn, clients, clients == 1 ? "" : "s",
                             counts[0], present, present == 1 ? "is" : "are");
        return dt__error(DT_ERR_DEVICE_MISMATCH,
                         "%s has %lld %s devices but the %d client%s hold %d in all", label,
                         (long long)mesh->size, tn, clients, clients == 1 ? "" : "s", present);
    }
    for (int64_t p = 0; p < mesh->size; p++) {
        if (mesh->global_ids[p] >= present)
            return dt__error(DT_ERR_DEVICE_MISMATCH,
                             "%s holds %s device %d but the devices present are 0..%d", label, tn,
                             mesh->global_ids[p], present - 1);
    }
    return check_locals(mesh, label);
}
