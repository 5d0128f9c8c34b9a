/* autograd/record: what the ops' record hook does on a tape: finds or adds the values of a
 * call's tensors, decides whether the call needs recording and keeps what its backward needs. */
#include <stdlib.h>
#include <string.h>

#include "autograd/tape_impl.h"
#include "runtime/error.h"

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= UINT64_C(0xff51afd7ed558ccd);
    x ^= x >> 33;
    return x;
}

int64_t dt__ag_find(const dt_tape *tape, const dt_tensor *t)
{
    uint64_t s = dt__tensor_serial(t);
    if (!s || !tape->map_cap)
        return -1;
    for (uint64_t h = mix(s) & (uint64_t)(tape->map_cap - 1);;
         h = (h + 1) & (uint64_t)(tape->map_cap - 1)) {
        int64_t v = tape->map[h];
        if (v < 0)
            return -1;
        if (tape->values[v].serial == s)
            return v;
    }
}

static void map_put(int64_t *map, int64_t cap, const ag_value *values, int64_t v)
{
    uint64_t h = mix(values[v].serial) & (uint64_t)(cap - 1);
    while (map[h] >= 0 && values[map[h]].serial != values[v].serial)
        h = (h + 1) & (uint64_t)(cap - 1);
    map[h] = v;
}

/* Maps serial -> v (the map is rebuilt when 1/2 full); under the registry lock, since other
 * threads read this map for the "another tape" check. */
dt_status dt__ag_map_insert(dt_tape *tape, int64_t v)
{
    dt_status st = DT_OK;
    dt__ag_map_lock();
    if ((tape->map_used + 1) * 2 > tape->map_cap) {
        int64_t cap = tape->map_cap ? tape->map_cap * 2 : 256;
        int64_t *m = malloc((size_t)cap * sizeof *m);
        if (!m) {
            st = dt__error(DT_ERR_NO_MEMORY, "autograd: cannot grow the value map");
            goto out;
        }
        for (int64_t i = 0; i < cap; i++)
            m[i] = -1;
        tape->map_used = 0;
        for (int64_t i = 0; i < tape->map_cap; i++)
            if (tape->map[i] >= 0 && tape->values[tape->map[i]].serial) {
                map_put(m, cap, tape->values, tape->map[i]);
                tape->map_used++;
            }
        free(tape->map);
        tape->map = m;
        tape->map_cap = cap;
    }
    map_put(tape->map, tape->map_cap, tape->values, v);
    tape->map_used++;
out:
    dt__ag_map_unlock();
    return st;
}

dt_status dt__ag_value_add(dt_tape *tape, const dt_tensor *t, int64_t *id_out)
{
    if (tape->nvalues == tape->values_cap) {
        int64_t cap = tape->values_cap ? tape->values_cap * 2 : 64;
        ag_value *nv = realloc(tape->values, (size_t)cap * sizeof *nv);
        if (!nv)
            return dt__error(DT_ERR_NO_MEMORY, "autograd: cannot grow the values");
        tape->values = nv;
        tape->values_cap = cap;
    }
    int64_t v = tape->nvalues;
    ag_value *val = &tape->values[v];
    memset(val, 0, sizeof *val);
    val->serial = dt__tensor_serial(t);
    val->t = t;
    val->watch = -1;
    val->producer = -1;
    val->first_use = -1;
    tape->nvalues++;
    dt_status st = dt__ag_map_insert(tape, v);
    if (st != DT_OK) {
        tape->nvalues--;
        return st;
    }
    *id_out = v;
    return DT_OK;
}

uint64_t dt__ag_local_bytes(const dt_tensor *t)
{
    uint64_t bytes = 0;
    int n = dt_tensor_num_local(t);
    for (int i = 0; i < n; i++) {
        const DLTensor *d = dt_tensor_local(t, i);
        uint64_t e = 1;
        for (int k = 0; k < d->ndim; k++)
            e *= (uint64_t)d->shape[k];
        bytes += e * dt_dtype_size(dt_tensor_dtype(t));
    }
    return bytes;
}

void dt__ag_hold(dt_tape *tape, int64_t v, const dt_tensor *t)
{
    ag_value *val = &tape->values[v];
    if (val->held++ == 0) {
        val->held_bytes = dt__ag_local_bytes(t);
        tape->saved_bytes += val->held_bytes;
        tape->saved_tensors++;
        if (tape->saved_bytes > tape->peak_saved_bytes)
            tape->peak_saved_bytes = tape->saved_bytes;
    }
}

void dt__ag_unhold(dt_tape *tape, int64_t v)
{
    ag_value *val = &tape->values[v];
    if (val->held > 0 && --val->held == 0) {
        tape->saved_bytes -= val->held_bytes;
        tape->saved_tensors--;
    }
}

static dt_status seg_add_input(dt_tape *tape, ag_segment *seg, int64_t v)
{
    for (int i = 0; i < seg->ninputs; i++)
        if (seg->inputs[i] == v)
            return DT_OK;
    if (seg->ninputs == seg->cap) {
        int cap = seg->cap ? seg->cap * 2 : 8;
        int64_t *ni = realloc(seg->inputs, (size_t)cap * sizeof *ni);
        if (!ni)
            return dt__error(DT_ERR_NO_MEMORY, "autograd: cannot grow a segment's inputs");
        seg->inputs = ni;
        dt_tensor **nt = realloc(seg->input_t, (size_t)cap * sizeof *nt);
        if (!nt)
            return dt__error(DT_ERR_NO_MEMORY, "autograd: cannot grow a segment's inputs");
        seg->input_t = nt;
        seg->cap = cap;
    }
    const ag_value *val = &tape->values[v];
    int borrow = seg->opts.borrow_watched && val->watch >= 0;
    seg->inputs[seg->ninputs] = v;
    seg->input_t[seg->ninputs] = borrow ? NULL : dt_tensor_retain(val->t);
    if (!borrow)
        dt__ag_hold(tape, v, val->t);
    seg->ninputs++;
    return DT_OK;
}

dt_status dt__ag_record(dt__recorder *self, const dt__op_record *rec)
{
    dt_tape *tape = (dt_tape *)self;
    int64_t ids[DT__REC_MAX_IN];
    int any = 0;
    const dt__ag_rule *rule = rec->rule ? rec->rule : dt__ag_rule_of(rec->kind);
    const char *name = rule ? rule->name : dt_op_kind_name(rec->kind);
    for (int i = 0; i < rec->nin; i++) {
        ids[i] = dt__ag_find(tape, rec->in[i]);
        if (ids[i] >= 0 && tape->values[ids[i]].requires_grad)
            any = 1;
        if (ids[i] < 0 && dt__ag_other_tape_has(tape, rec->in[i]))
            return dt__error(DT_ERR_INVALID_ARGUMENT,
                             "%s: input %d was recorded on another tape than the one recording "
                             "on this thread",
                             name, i);
    }
    /* No gradient flows through integer values (indices, masks): such outputs are not
     * recorded, so what is computed from them alone needs no gradient either. */
    dt_dtype ot = dt_tensor_dtype(rec->out);
    if (!any || !(ot == DT_DTYPE_F32 || ot == DT_DTYPE_F64 || ot == DT_DTYPE_F16 ||
                  ot == DT_DTYPE_BF16))
        return DT_OK;
    for (int i = 0; i < rec->nin; i++)
        if (ids[i] < 0) {
            dt_status st = dt__ag_value_add(tape, rec->in[i], &ids[i]);
            if (st != DT_OK)
                return st;
        }
    if (tape->nnodes == tape->nodes_cap) {
        int64_t cap = tape->nodes_cap ? tape->nodes_cap * 2 : 64;
        ag_node *nn = realloc(tape->nodes, (size_t)cap * sizeof *nn);
        if (!nn)
            return dt__error(DT_ERR_NO_MEMORY, "autograd: cannot grow the records");
        tape->nodes = nn;
        tape->nodes_cap = cap;
    }
    dt_op_attrs *attrs = NULL;
    if (rec->attrs) {
        attrs = malloc(sizeof *attrs);
        if (!attrs)
            return dt__error(DT_ERR_NO_MEMORY, "autograd: cannot keep %s's attributes", name);
        *attrs = *rec->attrs;
    }
    int64_t out;
    /* A tensor seen before under the same serial cannot be an op's new output; the ops make
     * new tensors, so this only guards the map. */
    dt_status st = dt__ag_value_add(tape, rec->out, &out);
    if (st != DT_OK) {
        free(attrs);
        return st;
    }
    int64_t n = tape->nnodes;
    ag_node *node = &tape->nodes[n];
    memset(node, 0, sizeof *node);
    node->kind = rec->kind;
    node->rule = rule;
    node->nin = rec->nin;
    node->out = out;
    node->layout = rec->layout ? dt_layout_retain(rec->layout) : NULL;
    node->in0_layout = dt_layout_retain(dt_tensor_layout(rec->in[0]));
    for (int d = 0; d < dt_tensor_rank(rec->in[0]); d++)
        node->in0_shape[d] = dt_tensor_shape(rec->in[0])[d];
    node->in0_dtype = dt_tensor_dtype(rec->in[0]);
    memcpy(node->iattr, rec->iattr, sizeof node->iattr);
    memcpy(node->fattr, rec->fattr, sizeof node->fattr);
    node->def = rec->def;
    node->attrs = attrs;
    node->segment = tape->open_seg;
    ag_segment *seg = tape->open_seg >= 0 ? &tape->segs[tape->open_seg] : NULL;
    tape->nnodes++;
    ag_value *ov = &tape->values[out];
    ov->requires_grad = 1;
    ov->producer = n;
    for (int i = 0; i < rec->nin; i++) {
        ag_value *val = &tape->values[ids[i]];
        node->in[i] = ids[i];
        node->use[i] = val->nuses++;
        if (val->first_use < 0)
            val->first_use = n;
        int saves = rule && (rule->save_in >> i & 1);
        int inside = seg && val->producer >= seg->first;
        if (seg && seg->opts.recompute) {
            /* Only the segment's inputs are kept: the rest is recomputed at backward. */
            if (!inside && (st = seg_add_input(tape, seg, ids[i])) != DT_OK)
                return st;
        } else if (saves && !(seg && seg->opts.borrow_watched && val->watch >= 0)) {
            node->saved[i] = dt_tensor_retain(val->t);
            dt__ag_hold(tape, ids[i], val->t);
        }
    }
    int keep_out = rule && rule->save_out;
    if (seg && seg->opts.recompute)
        keep_out = (seg->opts.keep_ops >> rec->kind & 1) != 0;
    if (keep_out) {
        node->saved_out = dt_tensor_retain(rec->out);
        dt__ag_hold(tape, out, rec->out);
    }
    if (seg)
        seg->last = n;
    return DT_OK;
}

static void drop_node(dt_tape *tape, ag_node *node)
{
    for (int i = 0; i < node->nin; i++)
        if (node->saved[i]) {
            dt__ag_unhold(tape, node->in[i]);
            dt_tensor_destroy(node->saved[i]);
            node->saved[i] = NULL;
        }
    if (node->saved_out) {
        dt__ag_unhold(tape, node->out);
        dt_tensor_destroy(node->saved_out);
        node->saved_out = NULL;
    }
}

void dt__ag_drop_recording(dt_tape *tape)
{
    for (int64_t n = 0; n < tape->nnodes; n++) {
        drop_node(tape, &tape->nodes[n]);
        dt_layout_destroy(tape->nodes[n].layout);
        dt_layout_destroy(tape->nodes[n].in0_layout);
        free(tape->nodes[n].attrs);
    }
    for (int s = 0; s < tape->nsegs; s++) {
        ag_segment *seg = &tape->segs[s];
        for (int i = 0; i < seg->ninputs; i++)
            dt_tensor_destroy(seg->input_t[i]);
        free(seg->inputs);
        free(seg->input_t);
    }
    for (int64_t v = 0; v < tape->nvalues; v++) {
        ag_value *val = &tape->values[v];
        if (val->contrib) {
            for (int k = 0; k < val->ncontrib_cap; k++)
                dt_tensor_destroy(val->contrib[k]);
            free(val->contrib);
        }
        dt_tensor_destroy(val->grad);
        dt_tensor_destroy(val->recomp);
    }
    dt__ag_map_lock();
    tape->nvalues = 0;
    tape->map_used = 0;
    for (int64_t i = 0; i < tape->map_cap; i++)
        tape->map[i] = -1;
    dt__ag_map_unlock();
    tape->nnodes = 0;
    tape->nsegs = 0;
    tape->open_seg = -1;
    tape->saved_bytes = 0;
    tape->saved_tensors = 0;
    tape->peak_saved_bytes = 0;
    tape->has_recording = 0;
    tape->consumed = 0;
    for (int i = 0; i < tape->nwatch; i++)
        tape->watch[i].value = -1;
}
