/* dt_alltoallv: the ragged all-to-all over one mesh dim (docs/collective.md): the counts are
 * gathered (a relayout to replicated), every client checks and plans every line alike, and
 * the rows move in one exchange of the plan's transport plus copies between local devices.
 * Recorded on a tape as the op definition "alltoallv" (backward: the reverse exchange). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/collective.h"
#include "dtensor/layout.h"
#include "dtensor/mesh.h"
#include "dtensor/opdef.h"
#include "dtensor/relayout.h"
#include "layout/tensor_dev.h"
#include "mesh/mesh_group.h"
#include "ops/opdef_impl.h"
#include "runtime/comm.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/record.h"
#include "runtime/trace.h"
#include "runtime/transport.h"
#include "runtime/util.h"

/* attrs of the definition: s = mesh dim name, i[0] = out global rows (0: out_rows i[2]),
 * i[1] = 1 when send_counts are taken transposed within lines (the backward), i[2] = the
 * caller's out_rows. */
enum { A_GLOBAL = 0, A_TRANSPOSE = 1, A_OUT_ROWS = 2 };

/* Everything every client knows alike about one call. */
typedef struct a2a_plan {
    const dt_mesh *mesh;
    int dim;          /* mesh dim index */
    int64_t P, L;     /* line length, number of lines */
    int64_t *counts;  /* [P*L][P]: row m*L + l = what member m of line l sends to each member */
    int64_t *pos_of;  /* [P*L]: mesh position of member m of line l */
    int64_t *in_rows, *out_rows; /* [P*L]: local rows of x's and y's shard */
    int64_t out_global;
    size_t elem;
} a2a_plan;

static void plan_free(a2a_plan *p)
{
    free(p->counts);
    free(p->pos_of);
    free(p->in_rows);
    free(p->out_rows);
}

static int64_t cnt(const a2a_plan *p, int64_t m, int64_t l, int64_t j)
{
    return p->counts[(m * p->L + l) * p->P + j];
}

/* Positions of every (member, line): lines numbered row-major over the other mesh dims. */
static dt_status plan_positions(a2a_plan *p)
{
    int nd = dt_mesh_rank(p->mesh);
    int64_t n = dt_mesh_size(p->mesh);
    p->pos_of = malloc((size_t)n * sizeof *p->pos_of);
    if (!p->pos_of)
        return dt__error(DT_ERR_NO_MEMORY, "alltoallv: no memory");
    for (int64_t pos = 0; pos < n; pos++) {
        int64_t c[DT_MAX_RANK];
        dt_status st = dt_mesh_coords(p->mesh, pos, c);
        if (st != DT_OK)
            return st;
        int64_t l = 0;
        for (int d = 0; d < nd; d++)
            if (d != p->dim)
                l = l * dt_mesh_dim_size(p->mesh, d) + c[d];
        p->pos_of[c[p->dim] * p->L + l] = pos;
    }
    return DT_OK;
}

/* send_counts' entries [rows, P] on every client: each writes those its local components
 * hold (INT64_MIN elsewhere), then one all-reduce (max) over the mesh's clients; without
 * partial layouts every entry is held by some device. A partial layout takes a relayout to
 * replicated instead (it sums). */
static dt_status read_counts(const dt_tensor *sc, int64_t *raw, int64_t P)
{
    const dt_layout *sl = dt_tensor_layout(sc);
    const dt_mesh *mesh = dt_layout_mesh(sl);
    int64_t rows = dt_tensor_shape(sc)[0], n = rows * P;
    size_t bytes = (size_t)n * sizeof(int64_t);
    dt_status st = DT_OK;
    if (dt_layout_num_partial(sl) > 0) {
        dt_layout *rep = NULL;
        dt_tensor *full = NULL;
        st = dt_layout_replicated(mesh, 2, &rep);
        if (st == DT_OK)
            st = dt_relayout(sc, rep, &full);
        if (st == DT_OK && dt_tensor_num_local(full) > 0)
            st = dt_tensor_local_read(full, 0, raw, bytes);
        dt_tensor_destroy(full);
        dt_layout_destroy(rep);
        return st;
    }
    int64_t *tmp = malloc(bytes);
    if (!tmp)
        return dt__error(DT_ERR_NO_MEMORY, "alltoallv: no memory for the counts");
    for (int64_t i = 0; i < n; i++)
        raw[i] = INT64_MIN;
    for (int i = 0; st == DT_OK && i < dt_tensor_num_local(sc); i++) {
        const DLTensor *dl = dt_tensor_local(sc, i);
        const int64_t *off = dt_tensor_local_offset(sc, i);
        st = dt_tensor_local_read(sc, i, tmp,
                                  (size_t)(dl->shape[0] * dl->shape[1]) * sizeof(int64_t));
        for (int64_t r = 0; st == DT_OK && r < dl->shape[0]; r++)
            memcpy(&raw[(off[0] + r) * P + off[1]], &tmp[r * dl->shape[1]],
                   (size_t)dl->shape[1] * sizeof(int64_t));
    }
    free(tmp);
    const dt__group *g = NULL;
    if (st == DT_OK && dt_mesh_num_clients(mesh) > 1)
        st = dt__mesh_group(mesh, &g);
    if (st == DT_OK && g && g->comm != MPI_COMM_NULL) {
        MPI_Request req = MPI_REQUEST_NULL;
        int rc = MPI_Iallreduce(MPI_IN_PLACE, raw, (int)n, MPI_INT64_T, MPI_MAX, g->comm, &req);
        if (rc != MPI_SUCCESS)
            return dt__mpi_error(rc, "alltoallv: MPI_Iallreduce of the counts");
        /* A short busy spin first (at most 1 ms): the watched wait yields the core after a
         * few idle tests, a time slice each on a busy host, for a reduction that usually
         * completes in microseconds. */
        double end = dt__now_seconds() + 1e-3;
        for (unsigned k = 1; req != MPI_REQUEST_NULL; k++) {
            int flag = 0;
            rc = MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
            if (rc != MPI_SUCCESS)
                return dt__mpi_error(rc, "alltoallv: MPI_Iallreduce of the counts");
            if (flag || (k % 64 == 0 && dt__now_seconds() > end))
                break;
        }
        if (req != MPI_REQUEST_NULL)
            st = dt__wait_watched_group(&req, g->clients, g->size, 0,
                                        "alltoallv: the counts' all-reduce");
    }
    return st;
}

/* The full counts on the host: send_counts gathered, expanded to one row per device, and
 * transposed within lines when asked. */
static dt_status gather_counts(a2a_plan *p, const dt_tensor *sc, int transpose)
{
    int64_t rows = dt_tensor_shape(sc)[0], P = p->P, L = p->L;
    size_t bytes = (size_t)(rows * P) * sizeof(int64_t);
    int64_t *raw = malloc(bytes ? bytes : 1);
    p->counts = malloc((size_t)(P * L * P) * sizeof *p->counts);
    if (!raw || !p->counts) {
        free(raw);
        return dt__error(DT_ERR_NO_MEMORY, "alltoallv: no memory for the counts");
    }
    dt_status st = read_counts(sc, raw, P);
    if (st != DT_OK) {
        free(raw);
        return st;
    }
    for (int64_t m = 0; m < P; m++)
        for (int64_t l = 0; l < L; l++)
            for (int64_t j = 0; j < P; j++) {
                /* transposed: what member m of line l receives from member j */
                int64_t sm = transpose ? j : m, sj = transpose ? m : j;
                int64_t r = rows == P ? sm : sm * L + l;
                p->counts[(m * L + l) * P + j] = raw[r * P + sj];
            }
    free(raw);
    return DT_OK;
}

/* A position's coordinates as text, for messages. */
static void pos_text(const a2a_plan *p, int64_t pos, char *buf, size_t len)
{
    int64_t c[DT_MAX_RANK];
    size_t n = (size_t)snprintf(buf, len, "device %d (coords ",
                                dt_mesh_device_id(p->mesh, pos));
    dt_mesh_coords(p->mesh, pos, c);
    for (int d = 0; d < dt_mesh_rank(p->mesh) && n < len; d++)
        n += (size_t)snprintf(buf + n, len - n, "%s%s=%lld", d ? "," : "",
                              dt_mesh_dim_name(p->mesh, d), (long long)c[d]);
    if (n < len)
        snprintf(buf + n, len - n, ")");
}

static void counts_text(const a2a_plan *p, int64_t m, int64_t l, char *buf, size_t len)
{
    size_t n = (size_t)snprintf(buf, len, "[");
    for (int64_t j = 0; j < p->P && n < len; j++)
        n += (size_t)snprintf(buf + n, len - n, "%s%lld", j ? "," : "",
                              (long long)cnt(p, m, l, j));
    if (n < len)
        snprintf(buf + n, len - n, "]");
}

/* Checks the counts against the shards and picks the output's rows; the same verdict on
 * every client (it reads only what all know). */
static dt_status plan_check(a2a_plan *p, const dt_layout *xl, const int64_t *xshape,
                            int64_t out_rows, int64_t out_global, const char *who)
{
    int64_t P = p->P, L = p->L, maxr = 0;
    char dev[160], cs[256];
    p->in_rows = malloc((size_t)(P * L) * sizeof *p->in_rows);
    p->out_rows = malloc((size_t)(P * L) * sizeof *p->out_rows);
    if (!p->in_rows || !p->out_rows)
        return dt__error(DT_ERR_NO_MEMORY, "alltoallv: no memory");
    for (int64_t m = 0; m < P; m++)
        for (int64_t l = 0; l < L; l++) {
            int64_t off, len, sum = 0;
            dt_shard_range(xshape[0], P, m, &off, &len);
            p->in_rows[m * L + l] = len;
            for (int64_t j = 0; j < P; j++) {
                int64_t c = cnt(p, m, l, j);
                if (c < 0 || (sum += c) > len) {
                    pos_text(p, p->pos_of[m * L + l], dev, sizeof dev);
                    counts_text(p, m, l, cs, sizeof cs);
                    if (c < 0)
                        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: %s (member %lld of line "
                                         "%lld) has negative counts %s", who, dev, (long long)m,
                                         (long long)l, cs);
                    return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: %s (member %lld of line "
                                     "%lld) has send counts %s summing past the %lld rows of "
                                     "its shard", who, dev, (long long)m, (long long)l, cs,
                                     (long long)len);
                }
            }
            int64_t r = 0;
            for (int64_t j = 0; j < P; j++)
                r += cnt(p, j, l, m);
            if (r > maxr)
                maxr = r;
        }
    if (out_global <= 0)
        out_global = P * (out_rows > 0 ? out_rows : maxr > 0 ? maxr : 1);
    p->out_global = out_global;
    (void)xl;
    for (int64_t m = 0; m < P; m++)
        for (int64_t l = 0; l < L; l++) {
            int64_t off, len, r = 0;
            dt_shard_range(out_global, P, m, &off, &len);
            p->out_rows[m * L + l] = len;
            for (int64_t j = 0; j < P; j++)
                r += cnt(p, j, l, m);
            if (r > len) {
                pos_text(p, p->pos_of[m * L + l], dev, sizeof dev);
                return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: %s (member %lld of line %lld) "
                                 "receives %lld rows, more than out_rows %lld", who, dev,
                                 (long long)m, (long long)l, (long long)r, (long long)len);
            }
        }
    return DT_OK;
}

/* DT_CHECK_COLLECTIVES: lines that differ only in mesh dims over which x is replicated hold
 * the same rows, so they must send the same counts. */
static dt_status check_replicas(const a2a_plan *p, const dt_layout *xl)
{
    int nd = dt_mesh_rank(p->mesh);
    int used[DT_MAX_RANK] = {0};
    for (int d = 0; d < dt_layout_rank(xl); d++) {
        int md = dt_layout_spec_mesh_dim(xl, d);
        if (md >= 0)
            used[md] = 1;
    }
    for (int i = 0; i < dt_layout_num_partial(xl); i++) {
        int md;
        dt_reduce_op op;
        if (dt_layout_partial(xl, i, &md, &op) == DT_OK && md >= 0)
            used[md] = 1;
    }
    for (int64_t l = 0; l < p->L; l++) {
        /* the representative line: coordinates of replicated dims set to 0 */
        int64_t c[DT_MAX_RANK], pos0;
        dt_mesh_coords(p->mesh, p->pos_of[l], c);
        for (int d = 0; d < nd; d++)
            if (d != p->dim && !used[d])
                c[d] = 0;
        dt_mesh_position_of(p->mesh, c, &pos0);
        int64_t l0 = -1;
        for (int64_t k = 0; k < p->L; k++)
            if (p->pos_of[k] == pos0)
                l0 = k;
        if (l0 < 0 || l0 == l)
            continue;
        for (int64_t m = 0; m < p->P; m++)
            if (memcmp(&p->counts[(m * p->L + l) * p->P], &p->counts[(m * p->L + l0) * p->P],
                       (size_t)p->P * sizeof(int64_t)) != 0) {
                char a[160], b[160], ca[256], cb[256];
                pos_text(p, p->pos_of[m * p->L + l], a, sizeof a);
                pos_text(p, p->pos_of[m * p->L + l0], b, sizeof b);
                counts_text(p, m, l, ca, sizeof ca);
                counts_text(p, m, l0, cb, sizeof cb);
                return dt__error(DT_ERR_STATE, "alltoallv (DT_CHECK_COLLECTIVES): %s sends "
                                 "counts %s but %s, which holds the same rows of x (replicated), "
                                 "sends %s", a, ca, b, cb);
            }
    }
    return DT_OK;
}

/* ---- the exchange ---- */

static dt_status zero_tails(const a2a_plan *p, dt_tensor *y);

/* Zeroing the output's tails as local work of the exchange (while the peers copy or the
 * transfers progress): the rows past what a shard receives are touched by no transfer. */
typedef struct tail_work {
    const a2a_plan *p;
    dt_tensor *y;
    dt_status st;
} tail_work;

static void run_tails(void *arg)
{
    tail_work *t = arg;
    t->st = zero_tails(t->p, t->y);
}

typedef struct local_copy {
    const dt__device *dev; /* destination's */
    void *dst;
    const void *src;
    size_t bytes;
} local_copy;

typedef struct local_work_arg {
    local_copy *copies;
    size_t n;
    dt_status st;
    tail_work *tails; /* then the tails */
} local_work_arg;

static void run_local(void *arg)
{
    local_work_arg *a = arg;
    for (size_t i = 0; i < a->n && a->st == DT_OK; i++) {
        local_copy *c = &a->copies[i];
        dt__copy_dir dir = c->dev->kind->host_visible ? DT__COPY_H2D : DT__COPY_D2D;
        a->st = c->dev->kind->copy(c->dev, dir, c->dst, c->src, c->bytes);
    }
    if (a->st == DT_OK && a->tails) {
        run_tails(a->tails);
        a->st = a->tails->st;
    }
}

/* Local component index of mesh position pos in t, -1 when not here. */
static int local_of(const dt_tensor *t, int64_t pos)
{
    for (int i = 0; i < dt_tensor_num_local(t); i++)
        if (dt_tensor_local_position(t, i) == pos)
            return i;
    return -1;
}

/* Rows [row0, row0 + rows) of a local component as a region: one compact run of rows, so
 * a transport sees a contiguous array of row-sized elements (MPI: a contiguous datatype). */
static void fill_region(dt__region *r, const DLTensor *dl, const dt__device *dev, size_t elem,
                        int64_t row0, int64_t rows)
{
    size_t row = elem;
    for (int d = 1; d < dl->ndim; d++)
        row *= (size_t)dl->shape[d];
    memset(r, 0, sizeof *r);
    r->base = (char *)dl->data + (size_t)row0 * row;
    r->dev = dev;
    r->rank = 1;
    r->elem = row;
    r->shape[0] = rows;
    r->count[0] = rows;
}

/* The transport's ragged all-to-all, one per line holding a local device, when it has one
 * and every line's members lie on distinct clients (member j is then the line group's rank
 * j): the rows go straight from x's component to y's, with no per-pair messages to match.
 * *done_out = 0 when it does not apply (the exchange below runs instead). */
static dt_status run_collective(const a2a_plan *p, const dt_tensor *x, dt_tensor *y,
                                const dt__transport *t, tail_work *tails, int *done_out)
{
    int64_t P = p->P, L = p->L;
    dt_device_type type = dt_mesh_device_type(p->mesh);
    *done_out = 0;
    if (!t->collective || !(t->coll_kinds & DT__COLL_BIT(DT__COLL_ALLTOALLV)))
        return DT_OK;
    int *clients = malloc((size_t)(P * L) * sizeof *clients);
    if (!clients)
        return dt__error(DT_ERR_NO_MEMORY, "alltoallv: no memory");
    for (int64_t l = 0; l < L; l++)
        for (int64_t j = 0; j < P; j++) {
            int c = dt_device_client(type, dt_mesh_device_id(p->mesh, p->pos_of[j * L + l]));
            clients[l * P + j] = c;
            for (int64_t i = 0; i < j; i++)
                if (clients[l * P + i] == c) {
                    free(clients);
                    return DT_OK; /* two members of a line in one client */
                }
        }
    int nl = dt_tensor_num_local(y);
    dt__coll *colls = calloc((size_t)nl + 1, sizeof *colls);
    size_t *sizes = calloc((size_t)(4 * P * nl) + 1, sizeof *sizes);
    dt_status st = colls && sizes ? DT_OK : dt__error(DT_ERR_NO_MEMORY, "alltoallv: no memory");
    int n = 0;
    /* in line order: members of a line list its collectives alike */
    for (int64_t l = 0; st == DT_OK && l < L; l++)
        for (int64_t m = 0; m < P; m++) {
            int64_t pos = p->pos_of[m * L + l];
            int xi = local_of(x, pos), yi = local_of(y, pos);
            if (xi < 0 || yi < 0)
                continue;
            const DLTensor *xs = dt_tensor_local(x, xi), *ys = dt_tensor_local(y, yi);
            const dt__device *dev = dt__tensor_device(y, yi);
            size_t row = p->elem, so = 0, ro = 0;
            for (int d = 1; d < xs->ndim; d++)
                row *= (size_t)xs->shape[d];
            size_t *sb = &sizes[4 * P * n], *sd = sb + P, *rb = sb + 2 * P, *rd = sb + 3 * P;
            for (int64_t j = 0; j < P; j++) {
                sb[j] = (size_t)cnt(p, m, l, j) * row;
                sd[j] = so;
                so += sb[j];
                rb[j] = (size_t)cnt(p, j, l, m) * row;
                rd[j] = ro;
                ro += rb[j];
            }
            colls[n++] = (dt__coll){.kind = DT__COLL_ALLTOALLV, .nmembers = (int)P,
                                    .clients = &clients[l * P], .rank = (int)m,
                                    .send = xs->data, .recv = ys->data,
                                    .dtype = dt_tensor_dtype(x),
                                    .dev = dev->kind->host_visible ? NULL : dev,
                                    .send_bytes = sb, .send_displs = sd, .recv_bytes = rb,
                                    .recv_displs = rd};
        }
    if (st == DT_OK && n > 0) {
        /* the tails zeroed while the rows move, by a transport that runs local work;
         * before, by others */
        if (t->coll_kinds & DT__COLL_LOCAL_WORK) {
            colls[0].local_work = run_tails;
            colls[0].arg = tails;
        } else {
            run_tails(tails);
            st = tails->st;
        }
        if (st == DT_OK)
            st = t->collective(colls, (size_t)n);
        if (st == DT_OK)
            st = tails->st;
        *done_out = 1;
    } else if (st == DT_OK) {
        *done_out = 1; /* nothing here */
        run_tails(tails);
        st = tails->st;
    }
    free(sizes);
    free(colls);
    free(clients);
    return st;
}

static dt_status exchange(const a2a_plan *p, const dt_tensor *x, dt_tensor *y,
                          const char **path_out)
{
    int64_t P = p->P, L = p->L;
    dt_device_type type = dt_mesh_device_type(p->mesh);
    int me = dt_client_id();
    size_t cap = (size_t)(P * P * L), ns = 0, nr = 0;
    dt__xfer *sends = calloc(cap + 1, sizeof *sends), *recvs = calloc(cap + 1, sizeof *recvs);
    local_copy *copies = calloc(cap + 1, sizeof *copies);
    tail_work tails = {p, y, DT_OK};
    local_work_arg lw = {copies, 0, DT_OK, &tails};
    dt_status st = DT_OK;
    int crossing = 0;
    *path_out = NULL;
    if (!sends || !recvs || !copies) {
        st = dt__error(DT_ERR_NO_MEMORY, "alltoallv: no memory for %zu transfers", cap);
        goto out;
    }
    /* In (line, source, destination) order on every client, so that each pair of clients
     * lists its transfers alike. */
    for (int64_t l = 0; l < L; l++)
        for (int64_t i = 0; i < P; i++) {
            int64_t spos = p->pos_of[i * L + l], soff = 0;
            int sc = dt_device_client(type, dt_mesh_device_id(p->mesh, spos));
            int sl = sc == me ? local_of(x, spos) : -1;
            for (int64_t j = 0; j < P; j++) {
                int64_t c = cnt(p, i, l, j), doff = 0;
                if (c == 0)
                    continue;
                for (int64_t k = 0; k < i; k++)
                    doff += cnt(p, k, l, j);
                int64_t dpos = p->pos_of[j * L + l];
                int dc = dt_device_client(type, dt_mesh_device_id(p->mesh, dpos));
                int dl = dc == me ? local_of(y, dpos) : -1;
                if (sc != dc)
                    crossing = 1;
                if (sl >= 0 && dl >= 0) {
                    dt__region from, to;
                    fill_region(&from, dt_tensor_local(x, sl), NULL, p->elem, soff, c);
                    fill_region(&to, dt_tensor_local(y, dl), NULL, p->elem, doff, c);
                    copies[lw.n++] = (local_copy){dt__tensor_device(y, dl), to.base, from.base,
                                                  dt__region_bytes(&to)};
                } else if (sl >= 0) {
                    dt__xfer *xf = &sends[ns++];
                    xf->peer = dc;
                    fill_region(&xf->region, dt_tensor_local(x, sl), dt__tensor_device(x, sl),
                                p->elem, soff, c);
                } else if (dl >= 0) {
                    dt__xfer *xf = &recvs[nr++];
                    xf->peer = sc;
                    fill_region(&xf->region, dt_tensor_local(y, dl), dt__tensor_device(y, dl),
                                p->elem, doff, c);
                }
                soff += c;
            }
        }
    const dt__transport *t = NULL;
    if (dt_tensor_num_local(x) > 0) {
        const dt__group *g = NULL;
        st = dt__mesh_group(p->mesh, &g);
        const dt__device_kind *kind = dt__tensor_device(x, 0)->kind;
        if (st == DT_OK)
            st = dt__transport_select(&kind, 1, g->clients, g->size, crossing, &t);
    }
    if (st != DT_OK)
        goto out;
    int done = 0;
    if (t && crossing)
        st = run_collective(p, x, y, t, &tails, &done);
    if (st != DT_OK)
        goto out;
    if (done) {
        *path_out = t->name;
    } else if (t && (ns || nr)) {
        *path_out = t->name;
        st = t->exchange(sends, ns, recvs, nr, run_local, &lw);
    } else {
        run_local(&lw);
    }
    if (st == DT_OK)
        st = lw.st;
    for (int i = 0; st == DT_OK && i < dt_tensor_num_local(y); i++) {
        const dt__device *dev = dt__tensor_device(y, i);
        if (!dev->kind->host_visible)
            st = dev->kind->sync(dev);
    }
out:
    free(sends);
    free(recvs);
    free(copies);
    return st;
}

/* Zeroes the rows of each local output shard past what it receives. */
static dt_status zero_tails(const a2a_plan *p, dt_tensor *y)
{
    for (int i = 0; i < dt_tensor_num_local(y); i++) {
        int64_t pos = dt_tensor_local_position(y, i), c[DT_MAX_RANK], l = 0;
        dt_mesh_coords(p->mesh, pos, c);
        for (int d = 0; d < dt_mesh_rank(p->mesh); d++)
            if (d != p->dim)
                l = l * dt_mesh_dim_size(p->mesh, d) + c[d];
        int64_t m = c[p->dim], r = 0;
        for (int64_t j = 0; j < p->P; j++)
            r += cnt(p, j, l, m);
        const DLTensor *dl = dt_tensor_local(y, i);
        size_t row = p->elem;
        for (int d = 1; d < dl->ndim; d++)
            row *= (size_t)dl->shape[d];
        size_t bytes = (size_t)(dl->shape[0] - r) * row;
        if (bytes == 0)
            continue;
        const dt__device *dev = dt__tensor_device(y, i);
        dt_status st = dev->kind->memset0(dev, (char *)dl->data + (size_t)r * row, bytes);
        if (st != DT_OK)
            return st;
    }
    return DT_OK;
}

/* The received counts in send_counts' shape and layout. */
static dt_status make_recv_counts(const a2a_plan *p, const dt_tensor *sc, dt_tensor **out)
{
    int64_t rows = dt_tensor_shape(sc)[0], P = p->P, L = p->L;
    size_t bytes = (size_t)(rows * P) * sizeof(int64_t);
    int64_t *host = malloc(bytes);
    if (!host)
        return dt__error(DT_ERR_NO_MEMORY, "alltoallv: no memory");
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < P; j++) {
            int64_t m = rows == P ? r : r / L, l = rows == P ? 0 : r % L;
            host[r * P + j] = cnt(p, j, l, m);
        }
    dt_layout *rep = NULL;
    dt_tensor *full = NULL;
    dt_status st = dt_layout_replicated(dt_layout_mesh(dt_tensor_layout(sc)), 2, &rep);
    if (st == DT_OK)
        st = dt__tensor_empty(rep, DT_DTYPE_I64, dt_tensor_shape(sc), &full);
    for (int i = 0; st == DT_OK && i < dt_tensor_num_local(full); i++)
        st = dt_tensor_local_write(full, i, host, bytes);
    if (st == DT_OK)
        st = dt_relayout(full, dt_tensor_layout(sc), out);
    dt_tensor_destroy(full);
    dt_layout_destroy(rep);
    free(host);
    return st;
}

/* Text of the call for the flight recorder and the collective check. */
static void call_detail(const a2a_plan *p, const dt_tensor *x, char *buf, size_t len)
{
    uint64_t h = 1469598103934665603ull;
    for (int64_t i = 0; i < p->P * p->L * p->P; i++)
        h = (h ^ (uint64_t)p->counts[i]) * 1099511628211ull;
    size_t n = (size_t)snprintf(buf, len, "dim %s, %s [", dt_mesh_dim_name(p->mesh, p->dim),
                                dt_dtype_name(dt_tensor_dtype(x)));
    for (int d = 0; d < dt_tensor_rank(x) && n < len; d++)
        n += (size_t)snprintf(buf + n, len - n, "%s%lld", d ? "," : "",
                              (long long)dt_tensor_shape(x)[d]);
    if (n < len)
        snprintf(buf + n, len - n, "] -> %lld rows, counts %016llx", (long long)p->out_global,
                 (unsigned long long)h);
}

static dt_status impl(const dt_tensor *x, const dt_tensor *sc, const char *mesh_dim,
                      int64_t out_rows, int64_t out_global, int transpose, dt_tensor **y_out,
                      dt_tensor **recv_out)
{
    const char *who = "dt_alltoallv";
    if (!x || !sc || !mesh_dim || !y_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: x, send_counts, mesh_dim and y_out must "
                         "not be NULL", who);
    const dt_layout *xl = dt_tensor_layout(x);
    a2a_plan p;
    memset(&p, 0, sizeof p);
    p.mesh = dt_layout_mesh(xl);
    p.dim = dt_mesh_dim_index(p.mesh, mesh_dim);
    if (p.dim < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: the mesh has no dim '%s'", who, mesh_dim);
    p.P = dt_mesh_dim_size(p.mesh, p.dim);
    p.L = dt_mesh_size(p.mesh) / p.P;
    p.elem = dt_dtype_size(dt_tensor_dtype(x));
    int rank = dt_tensor_rank(x);
    if (rank < 1 || dt_layout_spec_mesh_dim(xl, 0) != p.dim)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: x (rank %d) must have its dim 0 sharded "
                         "over '%s'", who, rank, mesh_dim);
    for (int i = 0; i < dt_layout_num_partial(xl); i++) {
        int md;
        dt_reduce_op op;
        if (dt_layout_partial(xl, i, &md, &op) == DT_OK && md == p.dim)
            return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: x is partial over '%s', the dim it "
                             "exchanges over", who, mesh_dim);
    }
    const dt_layout *sl = dt_tensor_layout(sc);
    const int64_t *ss = dt_tensor_shape(sc);
    if (dt_tensor_dtype(sc) != DT_DTYPE_I64 || dt_tensor_rank(sc) != 2 || ss[1] != p.P ||
        (ss[0] != p.P && ss[0] != p.P * p.L) || !dt_mesh_equal(dt_layout_mesh(sl), p.mesh))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: send_counts must be int64 [%lld, %lld] or "
                         "[%lld, %lld] on x's mesh (got %s rank %d [%lld, %lld])", who,
                         (long long)(p.P * p.L), (long long)p.P, (long long)p.P,
                         (long long)p.P, dt_dtype_name(dt_tensor_dtype(sc)),
                         dt_tensor_rank(sc), (long long)ss[0],
                         (long long)(dt_tensor_rank(sc) > 1 ? ss[1] : 0));
    if (out_rows < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: out_rows %lld is negative", who,
                         (long long)out_rows);
    if (dt_tensor_num_local(x) == 0) {
        /* a client outside the mesh: no component, nothing to agree on */
        int64_t shape[DT_MAX_RANK];
        memcpy(shape, dt_tensor_shape(x), (size_t)rank * sizeof *shape);
        shape[0] = out_global > 0 ? out_global : p.P * (out_rows > 0 ? out_rows : 1);
        dt_tensor *y = NULL, *rc = NULL;
        dt_status st = dt_tensor_zeros(xl, dt_tensor_dtype(x), shape, &y);
        if (st == DT_OK && recv_out)
            st = dt_tensor_zeros(sl, DT_DTYPE_I64, ss, &rc);
        if (st != DT_OK) {
            dt_tensor_destroy(y);
            return st;
        }
        *y_out = y;
        if (recv_out)
            *recv_out = rc;
        return DT_OK;
    }
    dt_status st = plan_positions(&p);
    if (st == DT_OK)
        st = gather_counts(&p, sc, transpose);
    if (st == DT_OK)
        st = plan_check(&p, xl, dt_tensor_shape(x), out_rows, out_global, who);
    if (st == DT_OK && dt__check_on())
        st = check_replicas(&p, xl);
    if (st != DT_OK) {
        plan_free(&p);
        return st;
    }
    long token = -1;
    const dt__group *g = NULL;
    char detail[DT__TRACE_DETAIL];
    if (dt_tensor_num_local(x) > 0 && (dt__trace_on() || dt__check_on())) {
        call_detail(&p, x, detail, sizeof detail);
        st = dt__mesh_group(p.mesh, &g);
        if (st == DT_OK)
            st = dt__coll_begin(g->clients, g->size, "alltoallv", detail, &token);
    }
    int64_t yshape[DT_MAX_RANK];
    memcpy(yshape, dt_tensor_shape(x), (size_t)rank * sizeof *yshape);
    yshape[0] = p.out_global;
    dt_tensor *y = NULL, *rc = NULL;
    const char *path = NULL;
    if (st == DT_OK)
        st = dt__tensor_empty(xl, dt_tensor_dtype(x), yshape, &y);
    if (st == DT_OK)
        st = exchange(&p, x, y, &path); /* zeroes the tails too */
    if (token >= 0)
        dt__coll_end(token, path, st);
    if (st == DT_OK && recv_out)
        st = make_recv_counts(&p, sc, &rc);
    plan_free(&p);
    if (st != DT_OK) {
        dt_tensor_destroy(y);
        return st;
    }
    *y_out = y;
    if (recv_out)
        *recv_out = rc;
    return DT_OK;
}

/* ---- the op definition: how the tape records, differentiates and replays the call ---- */

static dt_status def_spmd(const dt_tensor *const *in, int nin, const dt_op_attrs *attrs,
                          const dt_layout *layout, dt_tensor **out);

static dt_status def_backward(const dt_op_grad *g)
{
    if (!g->needs[0])
        return DT_OK;
    /* The reverse exchange: dy's rows go back to where they came from, into x's rows (dy
     * first in the forward output's layout, x's, if it came in another). */
    const dt_layout *xl = dt_tensor_layout(g->in[0]);
    dt_tensor *dy = NULL;
    dt_status st = DT_OK;
    if (!dt_layout_equal(dt_tensor_layout(g->dy), xl))
        st = dt_relayout(g->dy, xl, &dy);
    if (st == DT_OK)
        st = impl(dy ? dy : g->dy, g->in[1], g->attrs->s, 0, dt_tensor_shape(g->in[0])[0],
                  !g->attrs->i[A_TRANSPOSE], &g->dx[0], NULL);
    dt_tensor_destroy(dy);
    return st;
}

static const dt_op_def a2a_def = {
    .name = "alltoallv",
    .nin = 2,
    .rule = "...,ab->...",
    .spmd = def_spmd,
    .backward = def_backward,
    .reduce = DT_REDUCE_SUM,
    .family = "collective",
    .doc = "ragged all-to-all of dim 0's rows over one mesh dim (dt_alltoallv)",
};

static const dt_op *a2a_op;
static dt_status a2a_reg_st = DT_OK;
static char a2a_reg_msg[256];
static pthread_once_t a2a_once = PTHREAD_ONCE_INIT;

static void a2a_register(void)
{
    a2a_reg_st = dt_op_register(&a2a_def, &a2a_op);
    if (a2a_reg_st != DT_OK)
        snprintf(a2a_reg_msg, sizeof a2a_reg_msg, "%s", dt_last_error());
}

/* Runs the call and records it (kind DT_OP_DEFINED, the definition's rule) on a recording
 * tape; the resolved global rows go into the attributes so that a replay makes the same
 * shape. */
static dt_status run_recorded(const dt_tensor *x, const dt_tensor *sc, const dt_op_attrs *a,
                              dt_tensor **y_out, dt_tensor **recv_out)
{
    pthread_once(&a2a_once, a2a_register);
    if (a2a_reg_st != DT_OK)
        return dt__error(a2a_reg_st, "%s", a2a_reg_msg);
    dt__recorder *r = dt__rec_suspend();
    dt_tensor *y = NULL, *rc = NULL;
    dt_status st = impl(x, sc, a->s, a->i[A_OUT_ROWS], a->i[A_GLOBAL], (int)a->i[A_TRANSPOSE],
                        &y, recv_out ? &rc : NULL);
    dt_op_attrs attrs = *a;
    dt__op_record rec;
    memset(&rec, 0, sizeof rec);
    if (r && st == DT_OK) {
        attrs.i[A_GLOBAL] = dt_tensor_shape(y)[0];
        rec.kind = DT_OP_DEFINED;
        rec.nin = 2;
        rec.in[0] = x;
        rec.in[1] = sc;
        rec.rule = dt__op_tape_rule(a2a_op);
        rec.def = a2a_op;
        rec.attrs = &attrs;
    }
    st = dt__rec_finish(r, st, &rec, y, y_out);
    if (st != DT_OK) {
        dt_tensor_destroy(rc);
        return st;
    }
    if (recv_out)
        *recv_out = rc;
    return DT_OK;
}

static dt_status def_spmd(const dt_tensor *const *in, int nin, const dt_op_attrs *attrs,
                          const dt_layout *layout, dt_tensor **out)
{
    (void)layout;
    if (nin != 2)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "alltoallv: takes 2 inputs, %d given", nin);
    return run_recorded(in[0], in[1], attrs, out, NULL);
}

dt_status dt_alltoallv(const dt_tensor *x, const dt_tensor *send_counts, const char *mesh_dim,
                       int64_t out_rows, dt_tensor **y_out, dt_tensor **recv_counts_out)
{
    if (!mesh_dim || strlen(mesh_dim) >= DT_OP_MAX_SATTR)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_alltoallv: mesh_dim is NULL or too long");
    if (!y_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_alltoallv: y_out is NULL");
    dt_op_attrs a = DT_OP_ATTRS_INIT;
    dt__strlcpy(a.s, mesh_dim, sizeof a.s);
    a.i[A_OUT_ROWS] = out_rows;
    return run_recorded(x, send_counts, &a, y_out, recv_counts_out);
}
