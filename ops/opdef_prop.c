/* ops/opdef_prop: the propagator: from the inputs' layouts and an op's factor rule, the
 * candidate assignments of mesh dims to factors, their cost (latency + bandwidth of the
 * relayouts they need, plus the local compute), the cheapest one as the inputs' and the
 * output's layouts; and the cache of those decisions (docs/ops.md, "Propagation"). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ops/opdef_impl.h"
#include "runtime/error.h"

/* ---- cost model --------------------------------------------------------------------------- */

static pthread_mutex_t model_lock = PTHREAD_MUTEX_INITIALIZER;
static dt_op_cost_model model = {10.0, 10.0, 2.0};

void dt_op_cost_model_set(const dt_op_cost_model *m, dt_op_cost_model *old_out)
{
    pthread_mutex_lock(&model_lock);
    if (old_out)
        *old_out = model;
    if (m) {
        if (m->latency_us > 0)
            model.latency_us = m->latency_us;
        if (m->gbps > 0)
            model.gbps = m->gbps;
        if (m->compute_gelem_s > 0)
            model.compute_gelem_s = m->compute_gelem_s;
    }
    pthread_mutex_unlock(&model_lock);
    dt_op_cache_clear();
}

void dt__cost_model_get(dt_op_cost_model *out)
{
    pthread_mutex_lock(&model_lock);
    *out = model;
    pthread_mutex_unlock(&model_lock);
}

/* ---- candidates --------------------------------------------------------------------------- */

/* An assignment: fmesh[f] = the mesh dim sharding factor f (-1: none); pmask = mesh dims
 * whose sum-partial inputs pass through to the output. */
typedef struct cand {
    int8_t fmesh[DT__F_MAX];
    unsigned pmask;
    const char *origin;
} cand;

/* The factor a mesh dim sharding dim d of operand i stands for: the first factor of size > 1
 * of the dim when every factor before it has size 1 and the blocks of the dim are blocks of
 * that factor (its size divisible by the mesh dim's, or it is the only factor above 1); -1
 * otherwise (the dim must be gathered). */
static int dim_factor(const dt__bound *b, int i, int d, int64_t msize)
{
    const dt__rdim *rd = &b->dim[i][d];
    if (b->bcast[i][d])
        return -1;
    int k = 0;
    while (k < rd->nf - 1 && b->fsize[rd->f[k]] == 1)
        k++;
    int rest_one = 1;
    for (int j = k + 1; j < rd->nf; j++)
        if (b->fsize[rd->f[j]] != 1)
            rest_one = 0;
    if (!rest_one && b->fsize[rd->f[k]] % msize != 0)
        return -1;
    return rd->f[k];
}

/* The spec of dim d of operand i under assignment c: the mesh dim, -1 (unsharded), or -2
 * (the assignment shards a factor this dim cannot carry: the candidate is invalid). */
static int dim_spec(const dt__bound *b, const dt_mesh *mesh, int i, int d, const cand *c)
{
    const dt__rdim *rd = &b->dim[i][d];
    if (b->bcast[i][d])
        return -1;
    int m = -1, at = -1;
    for (int k = 0; k < rd->nf; k++)
        if (c->fmesh[rd->f[k]] >= 0) {
            if (m >= 0)
                return -2; /* two sharded factors in one dim */
            m = c->fmesh[rd->f[k]];
            at = k;
        }
    if (m < 0)
        return -1;
    return dim_factor(b, i, d, dt_mesh_dim_size(mesh, m)) == rd->f[at] ? m : -2;
}

/* Whether input i may keep a sum-partial over mesh dim m (in pmask) under the op's
 * linearity, given which inputs are partial there. */
static int keeps_partial(const dt_op_def *def, const dt__prop_call *call, int i, int m)
{
    if (!(def->linear_in >> i & 1))
        return 0;
    return call->in[i].partial[m] == 1 + DT_REDUCE_SUM;
}

/* Fills ls for operand i (an input, or the output at nin) under c; 0 if c is invalid. */
static int operand_spec(const dt__prop_call *call, const dt__bound *b, int i, const cand *c,
                        dt__lspec *ls)
{
    memset(ls, 0, sizeof *ls);
    ls->rank = b->rank[i];
    for (int d = 0; d < b->rank[i]; d++) {
        int s = dim_spec(b, call->mesh, i, d, c);
        if (s == -2)
            return 0;
        ls->spec[d] = s;
    }
    int nin = call->sig->nin;
    for (int m = 0; m < dt_mesh_rank(call->mesh); m++) {
        if (!(c->pmask >> m & 1))
            continue;
        if (i == nin)
            ls->partial[m] = 1 + DT_REDUCE_SUM;
        else if (keeps_partial(call->def, call, i, m))
            ls->partial[m] = 1 + DT_REDUCE_SUM;
    }
    if (i == nin)
        for (int f = 0; f < DT__F_MAX; f++)
            if (c->fmesh[f] >= 0 && !(b->in_output >> f & 1))
                ls->partial[c->fmesh[f]] = 1 + (int)call->def->reduce;
    return 1;
}

/* Whether a candidate is valid: each mesh dim used once, no whole or output-only factor
 * sharded, partial mesh dims passed through only as the op's linearity allows. */
static int cand_valid(const dt__prop_call *call, const dt__bound *b, const cand *c)
{
    unsigned used = c->pmask;
    int contracting = 0;
    for (int f = 0; f < DT__F_MAX; f++) {
        int m = c->fmesh[f];
        if (m < 0)
            continue;
        if (used >> m & 1)
            return 0;
        used |= 1u << m;
        if (f >= 26 && f < DT__F_ELL)
            return 0; /* uppercase: whole */
        if (!(b->in_inputs >> f & 1) && call->sig->nin > 0)
            return 0; /* output-only factor (constructors, without inputs, shard theirs) */
        if (!(b->in_output >> f & 1))
            contracting = 1;
    }
    if (contracting && c->pmask && call->def->reduce != DT_REDUCE_SUM)
        return 0;
    /* Partial pass-through per mesh dim. */
    const dt_op_def *def = call->def;
    for (int m = 0; m < dt_mesh_rank(call->mesh); m++) {
        if (!(c->pmask >> m & 1))
            continue;
        int npart = 0, nlin = 0;
        for (int i = 0; i < call->sig->nin; i++) {
            if (!(def->linear_in >> i & 1))
                continue;
            nlin++;
            if (keeps_partial(def, call, i, m))
                npart++;
        }
        if (def->linearity == DT_OP_LINEAR_MULTI && npart != 1)
            return 0;
        if (def->linearity == DT_OP_LINEAR_ADDITIVE && npart != nlin)
            return 0;
        if (def->linearity == DT_OP_LINEAR_NONE)
            return 0;
    }
    return 1;
}

/* Latency + bandwidth of relaying a tensor out from `from` to `to`, microseconds. */
static double relayout_us(const dt_mesh *mesh, const dt_op_shape *s, const dt__lspec *from,
                          const dt__lspec *to, const dt_op_cost_model *cm)
{
    if (memcmp(from, to, sizeof *from) == 0)
        return 0.0;
    int dims = 0;
    for (int m = 0; m < dt_mesh_rank(mesh); m++) {
        int fu = from->partial[m] != 0, tu = to->partial[m] != 0;
        for (int d = 0; d < from->rank; d++) {
            fu |= (from->spec[d] == m) << 1;
            tu |= (to->spec[d] == m) << 1;
        }
        if (fu != tu || (fu & 2)) {
            int moved = fu != tu;
            for (int d = 0; d < from->rank && !moved; d++)
                moved = (from->spec[d] == m) != (to->spec[d] == m);
            dims += moved;
        }
    }
    double elems = dt__relayout_cost(mesh, s->dim, from, to);
    double per_dev = elems / (double)dt_mesh_size(mesh) * (double)dt_dtype_size(s->dtype);
    return cm->latency_us * (dims ? dims : 1) + per_dev / (cm->gbps * 1e3);
}

/* The cost of candidate c, with the layouts it asks for in d. */
static double cost_of(const dt__prop_call *call, const dt__bound *b, const cand *c,
                      const dt_op_cost_model *cm, dt__decision *d)
{
    const dt_op_sig *sig = call->sig;
    double us = 0.0;
    for (int i = 0; i < sig->nin; i++)
        us += relayout_us(call->mesh, &sig->in[i], &call->in[i], &d->in[i], cm);
    /* Local work: the product of every factor's size over the devices sharing it. */
    double work = 1.0;
    for (int f = 0; f < DT__F_MAX; f++)
        if ((b->in_inputs | b->in_output) >> f & 1)
            work *= (double)b->fsize[f] /
                    (double)(c->fmesh[f] >= 0 ? dt_mesh_dim_size(call->mesh, c->fmesh[f]) : 1);
    us += work / (cm->compute_gelem_s * 1e3);
    if (call->forced)
        us += relayout_us(call->mesh, &d->out_shape, &d->out, call->forced, cm);
    return us;
}

/* Adds the (factor -> mesh dim) pairs of input i's layout to c where they fit. */
static void add_from_input(const dt__prop_call *call, const dt__bound *b, int i, cand *c)
{
    const dt__lspec *ls = &call->in[i];
    for (int d = 0; d < ls->rank; d++) {
        int m = ls->spec[d];
        if (m < 0 || (c->pmask >> m & 1))
            continue;
        int f = dim_factor(b, i, d, dt_mesh_dim_size(call->mesh, m));
        if (f < 0 || (f >= 26 && f < DT__F_ELL) || c->fmesh[f] >= 0)
            continue;
        int taken = 0;
        for (int g = 0; g < DT__F_MAX; g++)
            taken |= c->fmesh[g] == m;
        if (!taken)
            c->fmesh[f] = (int8_t)m;
    }
}

static void cand_init(cand *c, unsigned pmask, const char *origin)
{
    memset(c->fmesh, -1, sizeof c->fmesh);
    c->pmask = pmask;
    c->origin = origin;
}

static void explain_cand(const dt__prop_call *call, const cand *c, const dt__decision *d,
                         double us, const char *verdict)
{
    char text[1024];
    size_t n = 0;
    for (int i = 0; i < call->sig->nin && n < sizeof text; i++) {
        char ls[160];
        dt__lspec_text(call->mesh, &d->in[i], ls, sizeof ls);
        n += (size_t)snprintf(text + n, sizeof text - n, "%s%s", i ? ", " : "", ls);
    }
    char ol[160];
    dt__lspec_text(call->mesh, &d->out, ol, sizeof ol);
    dt__explain("  candidate (%s): %s -> %s  cost %.2f us%s", c->origin, text, ol, us, verdict);
}

dt_status dt__prop_decide(const dt__prop_call *call, const dt__rule *rule, dt__decision *out)
{
    const dt_op_sig *sig = call->sig;
    const char *name = dt__op_name(call->op);
    dt__bound b;
    dt_op_shape oshape;
    memset(&oshape, 0, sizeof oshape);
    dt_status st;
    if (call->def->infer) {
        st = call->def->infer(sig, &oshape);
        if (st != DT_OK)
            return st;
        if (oshape.rank < 0 || oshape.rank > DT_MAX_RANK)
            return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: infer gave rank %d", name,
                             oshape.rank);
        st = dt__rule_bind(name, rule, sig, &oshape, &b, NULL);
    } else {
        st = dt__rule_bind(name, rule, sig, NULL, &b, &oshape);
    }
    if (st != DT_OK)
        return st;
    dt_op_cost_model cm;
    dt__cost_model_get(&cm);

    /* Partial mesh dims that could pass through: sum-partial in some linear input. */
    unsigned pall = 0;
    for (int m = 0; m < dt_mesh_rank(call->mesh); m++)
        for (int i = 0; i < sig->nin; i++)
            if (keeps_partial(call->def, call, i, m))
                pall |= 1u << m;

    cand cands[2 * (DT_OP_MAX_IN + 3)];
    int nc = 0;
    unsigned pmasks[2] = {pall, 0};
    for (int p = 0; p < (pall ? 2 : 1); p++) {
        /* Each input alone, inputs by decreasing size merged, the forced output, none. */
        int order[DT_OP_MAX_IN];
        for (int i = 0; i < sig->nin; i++)
            order[i] = i;
        for (int i = 0; i < sig->nin; i++)
            for (int j = i + 1; j < sig->nin; j++) {
                int64_t ni = 1, nj = 1;
                for (int d = 0; d < sig->in[order[i]].rank; d++)
                    ni *= sig->in[order[i]].dim[d];
                for (int d = 0; d < sig->in[order[j]].rank; d++)
                    nj *= sig->in[order[j]].dim[d];
                if (nj > ni) {
                    int t = order[i];
                    order[i] = order[j];
                    order[j] = t;
                }
            }
        cand_init(&cands[nc], pmasks[p], "merged");
        for (int i = 0; i < sig->nin; i++)
            add_from_input(call, &b, order[i], &cands[nc]);
        nc++;
        for (int i = 0; i < sig->nin && sig->nin > 1; i++) {
            cand_init(&cands[nc], pmasks[p], "input");
            add_from_input(call, &b, order[i], &cands[nc]);
            nc++;
        }
        if (call->forced) {
            cand_init(&cands[nc], pmasks[p], "requested output");
            for (int d = 0; d < call->forced->rank; d++) {
                int m = call->forced->spec[d];
                if (m < 0 || (pmasks[p] >> m & 1))
                    continue;
                int f = dim_factor(&b, sig->nin, d, dt_mesh_dim_size(call->mesh, m));
                if (f >= 0 && cands[nc].fmesh[f] < 0)
                    cands[nc].fmesh[f] = (int8_t)m;
            }
            nc++;
        }
        cand_init(&cands[nc++], pmasks[p], "replicated");
    }

    int explain = dt__explain_on();
    int best = -1;
    dt__decision bestd;
    for (int k = 0; k < nc; k++) {
        const cand *c = &cands[k];
        int dup = 0;
        for (int j = 0; j < k && !dup; j++)
            dup = memcmp(cands[j].fmesh, c->fmesh, sizeof c->fmesh) == 0 &&
                  cands[j].pmask == c->pmask;
        if (dup || !cand_valid(call, &b, c))
            continue;
        dt__decision d;
        memset(&d, 0, sizeof d);
        d.out_shape = oshape;
        int ok = 1;
        for (int i = 0; i <= sig->nin && ok; i++)
            ok = operand_spec(call, &b, i, c, i < sig->nin ? &d.in[i] : &d.out);
        if (!ok)
            continue;
        for (int f = 0; f < DT__F_MAX; f++)
            if (c->fmesh[f] >= 0 && !(b.in_output >> f & 1))
                d.partial_kernel = 1;
        d.cost = cost_of(call, &b, c, &cm, &d);
        int better = best < 0 || d.cost < bestd.cost - 1e-9;
        if (explain)
            explain_cand(call, c, &d, d.cost, "");
        if (better) {
            best = k;
            bestd = d;
        }
    }
    if (best < 0)
        return dt__error(DT_ERR_UNSUPPORTED, "%s: the propagator found no valid layout", name);
    if (explain) {
        char ol[160];
        dt__lspec_text(call->mesh, &bestd.out, ol, sizeof ol);
        dt__explain("  taken: %s (%s), cost %.2f us", ol, cands[best].origin, bestd.cost);
    }
    *out = bestd;
    return DT_OK;
}

/* ---- the decision cache ------------------------------------------------------------------- */

typedef struct key {
    const dt_op *op;
    dt_op_attrs attrs;
    int nin;
    int mesh_rank;
    int64_t mesh_dims[DT_MESH_MAX_DIMS];
    dt_op_shape in[DT_OP_MAX_IN];
    dt__lspec ls[DT_OP_MAX_IN];
    int forced;
    dt__lspec fls;
} key;

typedef struct entry {
    uint64_t hash;
    key k;
    dt__decision d;
    int used;
} entry;

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static entry *table;
static int64_t cap, count;
#define CACHE_LIMIT 16384

static void make_key(const dt__prop_call *call, key *k)
{
    memset(k, 0, sizeof *k);
    k->op = call->op;
    if (call->sig->attrs)
        k->attrs = *call->sig->attrs;
    k->nin = call->sig->nin;
    k->mesh_rank = dt_mesh_rank(call->mesh);
    for (int m = 0; m < k->mesh_rank; m++)
        k->mesh_dims[m] = dt_mesh_dim_size(call->mesh, m);
    for (int i = 0; i < k->nin; i++) {
        k->in[i].dtype = call->sig->in[i].dtype;
        k->in[i].rank = call->sig->in[i].rank;
        memcpy(k->in[i].dim, call->sig->in[i].dim, sizeof(int64_t) * (size_t)k->in[i].rank);
        k->ls[i] = call->in[i];
    }
    if (call->forced) {
        k->forced = 1;
        k->fls = *call->forced;
    }
}

static uint64_t hash_key(const key *k)
{
    /* Word by word (the key is zeroed before it is filled, padding included). */
    uint64_t h = UINT64_C(1469598103934665603), w;
    const unsigned char *p = (const unsigned char *)k;
    size_t i = 0;
    for (; i + 8 <= sizeof *k; i += 8) {
        memcpy(&w, p + i, 8);
        h = (h ^ w) * UINT64_C(0x100000001b3);
        h ^= h >> 29;
    }
    for (; i < sizeof *k; i++)
        h = (h ^ p[i]) * UINT64_C(0x100000001b3);
    return h ? h : 1;
}

int dt__prop_cache_get(const dt__prop_call *call, dt__decision *out)
{
    key k;
    make_key(call, &k);
    uint64_t h = hash_key(&k);
    int found = 0;
    pthread_mutex_lock(&cache_lock);
    if (cap)
        for (int64_t s = (int64_t)(h & (uint64_t)(cap - 1));; s = (s + 1) & (cap - 1)) {
            entry *e = &table[s];
            if (!e->used)
                break;
            if (e->hash == h && memcmp(&e->k, &k, sizeof k) == 0) {
                *out = e->d;
                found = 1;
                break;
            }
        }
    pthread_mutex_unlock(&cache_lock);
    return found;
}

void dt__prop_cache_put(const dt__prop_call *call, const dt__decision *d)
{
    key k;
    make_key(call, &k);
    uint64_t h = hash_key(&k);
    pthread_mutex_lock(&cache_lock);
    if (count >= CACHE_LIMIT) { /* a bound, not an LRU: start over */
        memset(table, 0, sizeof *table * (size_t)cap);
        count = 0;
    }
    if ((count + 1) * 2 > cap) {
        int64_t ncap = cap ? cap * 2 : 256;
        entry *nt = calloc((size_t)ncap, sizeof *nt);
        if (!nt)
            goto out; /* no cache: decisions are remade */
        for (int64_t i = 0; i < cap; i++)
            if (table[i].used) {
                int64_t s = (int64_t)(table[i].hash & (uint64_t)(ncap - 1));
                while (nt[s].used)
                    s = (s + 1) & (ncap - 1);
                nt[s] = table[i];
            }
        free(table);
        table = nt;
        cap = ncap;
    }
    for (int64_t s = (int64_t)(h & (uint64_t)(cap - 1));; s = (s + 1) & (cap - 1)) {
        entry *e = &table[s];
        if (e->used && !(e->hash == h && memcmp(&e->k, &k, sizeof k) == 0))
            continue;
        if (!e->used)
            count++;
        e->used = 1;
        e->hash = h;
        e->k = k;
        e->d = *d;
        break;
    }
out:
    pthread_mutex_unlock(&cache_lock);
}

int64_t dt_op_cache_size(void)
{
    pthread_mutex_lock(&cache_lock);
    int64_t n = count;
    pthread_mutex_unlock(&cache_lock);
    return n;
}

void dt_op_cache_clear(void)
{
    pthread_mutex_lock(&cache_lock);
    if (table)
        memset(table, 0, sizeof *table * (size_t)cap);
    count = 0;
    pthread_mutex_unlock(&cache_lock);
}
