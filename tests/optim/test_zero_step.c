/* dt_zero_step against a host reference: stages 0, 1, 2 on 1-D and 2-D meshes with tiny and
 * default all-gather chunks; overflow skips on every rank; clipping by a hand-worked norm; the
 * loss scaler's sequences; learning-rate changes between steps. Gradients are small integers
 * times a power of two, so every reduction is exact and results compare bit for bit. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"
#include "optim/optim_impl.h"
#include "optim_grad_util.h"

#define MAXP 8

typedef struct pdesc {
    const char *name;
    int rank;
    int64_t shape[2];
    const char *s0, *s1; /* model-dim specs on the 2-D mesh */
} pdesc;

static int64_t pnumel(const pdesc *d)
{
    return d->rank == 1 ? d->shape[0] : d->shape[0] * d->shape[1];
}

static float init_value(int64_t idx, int salt)
{
    return (float)((idx * 13 + salt * 3) % 17 - 8) * 0.125f;
}

typedef struct gen {
    int salt;
    int64_t inj_idx;   /* element that gets inj_val on batch coordinate inj_dp, or -1 */
    int64_t inj_dp;
    float inj_val;
} gen;

static float grad_value(int64_t idx, int64_t dpc, int step, void *arg)
{
    const gen *g = arg;
    if (idx == g->inj_idx && dpc == g->inj_dp)
        return g->inj_val;
    return (float)((idx * 7 + dpc * 3 + step * 5 + g->salt) % 11 - 5);
}

/* Host model of one parameter under the inner optimizer. */
typedef struct ref_param {
    int64_t n;
    float *master, *s1, *s2, *grad;
} ref_param;

static void ref_init(ref_param *r, const pdesc *d, int salt, dt_dtype dtype)
{
    r->n = pnumel(d);
    r->master = calloc((size_t)r->n, sizeof(float));
    r->s1 = calloc((size_t)r->n, sizeof(float));
    r->s2 = calloc((size_t)r->n, sizeof(float));
    r->grad = calloc((size_t)r->n, sizeof(float));
    for (int64_t i = 0; i < r->n; i++)
        r->master[i] = init_value(i, salt);
    dt_test_round(r->master, r->n, dtype);
}

static void ref_free(ref_param *r)
{
    free(r->master);
    free(r->s1);
    free(r->s2);
    free(r->grad);
}

static void ref_step(ref_param *r, const dt_optim_hparams *hp, int64_t t, int64_t ndp, gen *g,
                     int step, float scale, dt_dtype pdtype, float grad_scale)
{
    og_grad_ref(r->n, ndp, grad_value, step, scale, g, r->grad);
    dt_test_round(r->grad, r->n, pdtype);
    if (hp->kind == DT_OPTIM_SGD) {
        dt_sgd_opts so = {hp->lr, hp->momentum, hp->dampening, hp->weight_decay, hp->nesterov,
                          grad_scale};
        DT_ASSERT_OK(dt_kernel_sgd(r->n, &so, r->master, r->grad, r->s1));
    } else {
        dt_adam_opts ao = {hp->lr, hp->beta1, hp->beta2, hp->eps, hp->weight_decay,
                           hp->kind == DT_OPTIM_ADAMW, grad_scale};
        DT_ASSERT_OK(dt_kernel_adam(r->n, &ao, t, r->master, r->grad, r->s1, r->s2));
    }
}

/* Checks that parameter t holds the reference master rounded to its dtype. */
static void check_param(const char *what, const dt_tensor *t, const ref_param *r)
{
    float *got = malloc((size_t)r->n * sizeof *got), *want = malloc((size_t)r->n * sizeof *want);
    og_fetch(t, got);
    memcpy(want, r->master, (size_t)r->n * sizeof *want);
    dt_test_round(want, r->n, dt_tensor_dtype(t));
    CU_ASSERT_EQUAL(og_diff(what, got, want, r->n), 0);
    free(got);
    free(want);
}

static dt_tensor *make_param(const dt_mesh *m, const pdesc *d, int model, dt_dtype dtype,
                             int salt)
{
    int64_t n = pnumel(d);
    float *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; i < n; i++)
        x[i] = init_value(i, salt);
    dt_layout *l = dt_test_layout(m, d->rank, model ? d->s0 : NULL, model ? d->s1 : NULL, NULL);
    dt_tensor *t = og_tensor(l, dtype, d->shape, x);
    dt_layout_destroy(l);
    free(x);
    return t;
}

/* Two groups: AdamW on bf16 parameters (f32 gradients) and SGD with momentum on f32
 * parameters (bf16 gradients); uneven model sharding with empty shards on 4 model ranks. */
static const pdesc group_a[3] = {
    {"w1", 2, {5, 3}, NULL, NULL},
    {"w2", 2, {6, 4}, "model", NULL},
    {"b2", 1, {7, 0}, "model", NULL},
};
static const pdesc group_b[2] = {
    {"w3", 2, {3, 3}, NULL, "model"},
    {"b3", 1, {2, 0}, NULL, NULL},
};

/* early: the gradients go in through dt_zero_grad_ready, last parameter first (as a backward
 * pass makes them), then dt_zero_step(z, NULL); bucket: reduce_bucket_size in bytes (0: the
 * default). */
static void run_reference_case(int model, int stage, int64_t allgather, int early,
                               int64_t bucket)
{
    dt_mesh *m = model ? og_mesh_2d() : og_mesh_1d();
    int64_t ndp = dt_mesh_dim_size(m, dt_mesh_dim_index(m, "batch"));
    dt_zero_opts o = DT_ZERO_OPTS_INIT;
    o.stage = stage;
    o.allgather_size = allgather;
    if (bucket > 0)
        o.reduce_bucket_size = bucket;
    o.scaler.mode = DT_LOSS_SCALE_STATIC;
    o.scaler.init_scale = 8.0;
    dt_zero *z = NULL;
    DT_ASSERT_OK(dt_zero_create(m, &o, &z));
    dt_optim_hparams ha = DT_OPTIM_ADAMW_INIT, hb = DT_OPTIM_SGD_INIT;
    ha.lr = 0.01f;
    hb.lr = 0.05f;
    hb.momentum = 0.9f;
    hb.weight_decay = 0.1f;
    dt_tensor *params[5];
    const char *names[5];
    ref_param refs[5];
    gen gens[5];
    for (int j = 0; j < 5; j++) {
        const pdesc *d = j < 3 ? &group_a[j] : &group_b[j - 3];
        dt_dtype dt = j < 3 ? DT_DTYPE_BF16 : DT_DTYPE_F32;
        params[j] = make_param(m, d, model, dt, j);
        names[j] = d->name;
        ref_init(&refs[j], d, j, dt);
        gens[j] = (gen){j, -1, 0, 0.0f};
    }
    int ga = -1, gb = -1;
    DT_ASSERT_OK(dt_zero_add_group(z, 3, names, params, &ha, &ga));
    DT_ASSERT_OK(dt_zero_add_group(z, 2, names + 3, params + 3, &hb, &gb));
    CU_ASSERT_EQUAL(ga, 0);
    CU_ASSERT_EQUAL(gb, 1);
    CU_ASSERT_EQUAL(dt_zero_num_params(z), 5);
    double copied = 0.0;
    for (int step = 0; step < 3; step++) {
        dt_tensor *grads[5];
        for (int j = 0; j < 5; j++)
            grads[j] = og_grad(params[j], j < 3 ? DT_DTYPE_F32 : DT_DTYPE_BF16, grad_value,
                               step, 8.0f, &gens[j]);
        dt_zero_step_info info;
        if (early) {
            for (int j = 4; j >= 0; j--) {
                DT_ASSERT_OK(dt_zero_grad_ready(z, j, grads[j]));
                /* The optimizer holds its own copy from here on. */
                dt_tensor_destroy(grads[j]);
                grads[j] = NULL;
            }
            DT_ASSERT_OK(dt_zero_step(z, NULL, &info));
        } else {
            DT_ASSERT_OK(dt_zero_step(z, grads, &info));
        }
        /* The reduction's copies and sums: none without dt_zero_grad_ready or a dp dim to
         * reduce over. */
        CU_ASSERT(info.reduce_copy_s >= 0.0 && info.reduce_sum_s >= 0.0);
        if (!early || ndp < 2) {
            CU_ASSERT_EQUAL(info.reduce_copy_s, 0.0);
            CU_ASSERT_EQUAL(info.reduce_sum_s, 0.0);
        }
        copied += info.reduce_copy_s;
        CU_ASSERT_EQUAL(info.skipped, 0);
        CU_ASSERT_EQUAL(info.step, step + 1);
        CU_ASSERT_EQUAL(info.iteration, step);
        CU_ASSERT_EQUAL(info.loss_scale, 8.0);
        CU_ASSERT_EQUAL(info.clip_coef, 1.0);
        double sq = 0.0;
        for (int j = 0; j < 5; j++) {
            ref_step(&refs[j], j < 3 ? &ha : &hb, step + 1, ndp, &gens[j], step, 8.0f,
                     j < 3 ? DT_DTYPE_BF16 : DT_DTYPE_F32, 1.0f / 8.0f);
            for (int64_t i = 0; i < refs[j].n; i++)
                sq += (double)refs[j].grad[i] * refs[j].grad[i];
            dt_tensor_destroy(grads[j]);
        }
        CU_ASSERT(fabs(info.grad_norm - sqrt(sq) / 8.0) <= 1e-12 * info.grad_norm);
        char what[96];
        for (int j = 0; j < 5; j++) {
            snprintf(what, sizeof what, "%s stage %d model %d allgather %lld bucket %lld step %d",
                     names[j], stage, model, (long long)allgather, (long long)bucket, step);
            check_param(what, params[j], &refs[j]);
        }
    }
    if (early && ndp > 1)
        CU_ASSERT(copied > 0.0); /* 15 gradients went into the flat buffer */
    dt_zero_destroy(z);
    for (int j = 0; j < 5; j++) {
        dt_tensor_destroy(params[j]);
        ref_free(&refs[j]);
    }
    dt_mesh_destroy(m);
}

/* 1 if every local element of t is zero. */
static int all_zero(const dt_tensor *t)
{
    int zero = 1;
    for (int i = 0; i < dt_tensor_num_local(t); i++) {
        size_t n = dt_test_local_bytes(t, i);
        unsigned char *x = dt_test_local_get(t, i);
        for (size_t k = 0; k < n; k++)
            zero &= x[k] == 0;
        free(x);
    }
    return zero;
}

/* One data-parallel rank (batch=1, the model dim over every device): nothing to reduce, so
 * the step reads the gradients where they lie; the flat gradient buffers are never written
 * (they would hold the gradients if the copy came back) and the parameters match the host
 * reference bit for bit, in stages 0-2, f32 and bf16 (widened) gradients. */
static void test_one_dp_rank_steps_from_the_gradients_without_copying_them(void)
{
    const char *mnames[2] = {"batch", "model"};
    int64_t nd = dt_test_num_devices();
    int64_t sizes[2] = {1, nd};
    const pdesc descs[4] = {
        {"w1", 2, {3, 2 * nd}, NULL, "model"},
        {"b1", 1, {5, 0}, NULL, NULL},
        {"w2", 2, {nd, 3}, "model", NULL},
        {"b2", 1, {4, 0}, NULL, NULL},
    };
    for (int stage = 0; stage < 3; stage++) {
        dt_mesh *m = NULL;
        DT_ASSERT_OK(dt_mesh_create("one_dp", 2, mnames, sizes, dt_test_device_type(), &m));
        dt_zero_opts o = DT_ZERO_OPTS_INIT;
        o.stage = stage;
        o.allgather_size = 7; /* chunks cut through parameters */
        o.scaler.mode = DT_LOSS_SCALE_STATIC;
        o.scaler.init_scale = 4.0;
        dt_zero *z = NULL;
        DT_ASSERT_OK(dt_zero_create(m, &o, &z));
        dt_optim_hparams ha = DT_OPTIM_ADAMW_INIT, hb = DT_OPTIM_SGD_INIT;
        ha.lr = 0.01f;
        hb.lr = 0.05f;
        hb.momentum = 0.9f;
        dt_tensor *params[4];
        const char *names[4];
        ref_param refs[4];
        gen gens[4];
        for (int j = 0; j < 4; j++) {
            dt_dtype dt = j < 2 ? DT_DTYPE_F32 : DT_DTYPE_BF16;
            params[j] = make_param(m, &descs[j], 1, dt, j);
            names[j] = descs[j].name;
            ref_init(&refs[j], &descs[j], j, dt);
            gens[j] = (gen){j, -1, 0, 0.0f};
        }
        int ga = -1, gb = -1;
        DT_ASSERT_OK(dt_zero_add_group(z, 2, names, params, &ha, &ga));
        DT_ASSERT_OK(dt_zero_add_group(z, 2, names + 2, params + 2, &hb, &gb));
        for (int step = 0; step < 3; step++) {
            dt_tensor *grads[4];
            for (int j = 0; j < 4; j++)
                grads[j] = og_grad(params[j], dt_tensor_dtype(params[j]), grad_value, step,
                                   4.0f, &gens[j]);
            dt_zero_step_info info;
            DT_ASSERT_OK(dt_zero_step(z, grads, &info));
            CU_ASSERT_EQUAL(info.skipped, 0);
            for (int j = 0; j < 4; j++) {
                ref_step(&refs[j], j < 2 ? &ha : &hb, step + 1, 1, &gens[j], step, 4.0f,
                         dt_tensor_dtype(params[j]), 1.0f / 4.0f);
                dt_tensor_destroy(grads[j]);
            }
            char what[64];
            for (int j = 0; j < 4; j++) {
                snprintf(what, sizeof what, "%s stage %d step %d", names[j], stage, step);
                check_param(what, params[j], &refs[j]);
            }
        }
        /* (Stage 2 casts bf16 masters back through the spent gradient partition.) */
        for (int g = 0; g < z->ngroups; g++)
            for (int c = 0; c < z->groups[g].nchunks; c++) {
                const dt__zchunk *ch = &z->groups[g].chunks[c];
                if (stage < 2 || z->groups[g].dtype == DT_DTYPE_F32)
                    CU_ASSERT_TRUE(all_zero(stage == 2 ? ch->gpart : ch->flat));
            }
        dt_zero_destroy(z);
        for (int j = 0; j < 4; j++) {
            dt_tensor_destroy(params[j]);
            ref_free(&refs[j]);
        }
        dt_mesh_destroy(m);
    }
}

/* Parameters large enough that the step's passes on a CPU device are split among threads
 * (optim/par.c: the norm's pieces, the update, the update's copy into the parameters, on a
 * process with 2 or more cores to itself): the parameters bit for bit the host's one-thread
 * reference, the norm the f64 sum of the reference gradients. */
static void test_large_parameters_split_among_threads_give_the_reference_bits(void)
{
    const char *mnames[2] = {"batch", "model"};
    int64_t nd = dt_test_num_devices();
    int64_t sizes[2] = {1, nd};
    const pdesc descs[2] = {
        {"big1", 2, {1100, 1000}, NULL, NULL},
        {"big2", 1, {1200000, 0}, NULL, NULL},
    };
    for (int stage = 1; stage < 3; stage++) {
        dt_mesh *m = NULL;
        DT_ASSERT_OK(dt_mesh_create("one_dp", 2, mnames, sizes, dt_test_device_type(), &m));
        dt_zero_opts o = DT_ZERO_OPTS_INIT;
        o.stage = stage;
        o.scaler.mode = DT_LOSS_SCALE_STATIC;
        o.scaler.init_scale = 4.0;
        dt_zero *z = NULL;
        DT_ASSERT_OK(dt_zero_create(m, &o, &z));
        dt_optim_hparams ha = DT_OPTIM_ADAMW_INIT;
        ha.lr = 0.01f;
        ha.weight_decay = 0.1f;
        dt_tensor *params[2];
        const char *names[2];
        ref_param refs[2];
        gen gens[2];
        for (int j = 0; j < 2; j++) {
            params[j] = make_param(m, &descs[j], 1, DT_DTYPE_F32, j);
            names[j] = descs[j].name;
            ref_init(&refs[j], &descs[j], j, DT_DTYPE_F32);
            gens[j] = (gen){j, -1, 0, 0.0f};
        }
        int ga = -1;
        DT_ASSERT_OK(dt_zero_add_group(z, 2, names, params, &ha, &ga));
        for (int step = 0; step < 2; step++) {
            dt_tensor *grads[2];
            for (int j = 0; j < 2; j++)
                grads[j] = og_grad(params[j], DT_DTYPE_F32, grad_value, step, 4.0f, &gens[j]);
            dt_zero_step_info info;
            DT_ASSERT_OK(dt_zero_step(z, grads, &info));
            CU_ASSERT_EQUAL(info.skipped, 0);
            double sq = 0.0;
            for (int j = 0; j < 2; j++) {
                ref_step(&refs[j], &ha, step + 1, 1, &gens[j], step, 4.0f, DT_DTYPE_F32,
                         1.0f / 4.0f);
                for (int64_t i = 0; i < refs[j].n; i++)
                    sq += (double)refs[j].grad[i] * refs[j].grad[i];
                dt_tensor_destroy(grads[j]);
            }
            double want = sqrt(sq) / 4.0;
            CU_ASSERT_TRUE(fabs(info.grad_norm - want) <= 1e-9 * want);
            char what[64];
            for (int j = 0; j < 2; j++) {
                snprintf(what, sizeof what, "%s stage %d step %d", names[j], stage, step);
                check_param(what, params[j], &refs[j]);
            }
        }
        dt_zero_destroy(z);
        for (int j = 0; j < 2; j++) {
            dt_tensor_destroy(params[j]);
            ref_free(&refs[j]);
        }
        dt_mesh_destroy(m);
    }
}

static void test_step_matches_host_reference_in_every_stage(void)
{
    for (int model = 0; model < 2; model++)
        for (int stage = 0; stage < 3; stage++)
            run_reference_case(model, stage, 0, 0, 0);
}

static void test_gradients_handed_over_early_give_the_reference_result_in_every_stage(void)
{
    for (int model = 0; model < 2; model++)
        for (int stage = 0; stage < 3; stage++) {
            run_reference_case(model, stage, 7, 1, 0);
            run_reference_case(model, stage, 0, 1, 0);
        }
}

/* Buckets smaller than a parameter and than a dp rank's part (6 bytes: 3 bf16 or 1 f32
 * elements, and 20 bytes), cutting the chunks of allgather_size 7 and the whole buffer: the
 * background reduction still sums in dp order, so the result is the reference's to the bit. */
static void test_gradients_reduced_in_small_buckets_in_the_background_give_the_reference_result(
    void)
{
    for (int model = 0; model < 2; model++)
        for (int stage = 0; stage < 3; stage++) {
            run_reference_case(model, stage, 7, 1, 6);
            run_reference_case(model, stage, 0, 1, 20);
        }
}

/* A ZeRO optimizer on m (o, NULL: the defaults) holding group_b's parameters 'a' and 'b' (into
 * params) in one SGD group; their step-0 f32 gradients into grads when not NULL. */
static dt_zero *zero_of_group_b(const dt_mesh *m, const dt_zero_opts *o, dt_tensor *params[2],
                                dt_tensor *grads[2])
{
    dt_zero *z = NULL;
    DT_ASSERT_OK(dt_zero_create(m, o, &z));
    const char *names[2] = {"a", "b"};
    for (int j = 0; j < 2; j++)
        params[j] = make_param(m, &group_b[j], 0, DT_DTYPE_F32, j);
    dt_optim_hparams hp = DT_OPTIM_SGD_INIT;
    DT_ASSERT_OK(dt_zero_add_group(z, 2, names, params, &hp, NULL));
    gen gens[2] = {{0, -1, 0, 0.0f}, {1, -1, 0, 0.0f}};
    for (int j = 0; grads && j < 2; j++)
        grads[j] = og_grad(params[j], DT_DTYPE_F32, grad_value, 0, 1.0f, &gens[j]);
    return z;
}

/* dt_zero_grad_ready's misuse: a bad index, a parameter given twice, a step with some
 * parameters missing (named) or with grads after early ones; then a plain step works. */
static void test_early_gradients_refuse_misuse_clearly(void)
{
    dt_mesh *m = og_mesh_1d();
    dt_tensor *params[2], *grads[2];
    dt_zero *z = zero_of_group_b(m, NULL, params, grads);
    DT_ASSERT_FAILS(dt_zero_grad_ready(z, 2, grads[0]), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("parameter 2");
    DT_ASSERT_FAILS(dt_zero_grad_ready(z, 0, grads[1]), DT_ERR_SHAPE);
    DT_ASSERT_OK(dt_zero_grad_ready(z, 1, grads[1]));
    DT_ASSERT_FAILS(dt_zero_grad_ready(z, 1, grads[1]), DT_ERR_STATE);
    DT_ASSERT_ERROR_MENTIONS("already");
    /* Refused input loses nothing: 'b' is still in; the step's refusal drops it. */
    DT_ASSERT_FAILS(dt_zero_step(z, NULL, NULL), DT_ERR_STATE);
    DT_ASSERT_ERROR_MENTIONS("'a'");
    DT_ASSERT_OK(dt_zero_grad_ready(z, 0, grads[0]));
    DT_ASSERT_FAILS(dt_zero_step(z, grads, NULL), DT_ERR_STATE);
    DT_ASSERT_ERROR_MENTIONS("pass NULL");
    dt_zero_step_info info;
    DT_ASSERT_OK(dt_zero_step(z, grads, &info));
    CU_ASSERT_EQUAL(info.step, 1);
    for (int j = 0; j < 2; j++) {
        dt_tensor_destroy(grads[j]);
        dt_tensor_destroy(params[j]);
    }
    dt_zero_destroy(z);
    dt_mesh_destroy(m);
}

/* Checks that z's stepped parameters equal those of a fresh optimizer of the same options
 * stepped synchronously on the same gradients, to the bit; then frees z, its parameters and
 * the gradients. */
static void expect_synchronous_result(dt_mesh *m, const dt_zero_opts *o, dt_zero *z,
                                      dt_tensor **params, dt_tensor **grads)
{
    dt_tensor *ps[2];
    dt_zero *zs = zero_of_group_b(m, o, ps, NULL);
    DT_ASSERT_OK(dt_zero_step(zs, grads, NULL));
    for (int j = 0; j < 2; j++) {
        int64_t n = pnumel(&group_b[j]);
        float *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b);
        og_fetch(params[j], a);
        og_fetch(ps[j], b);
        CU_ASSERT_EQUAL(memcmp(a, b, (size_t)n * sizeof *a), 0);
        free(a);
        free(b);
        dt_tensor_destroy(grads[j]);
        dt_tensor_destroy(params[j]);
        dt_tensor_destroy(ps[j]);
    }
    dt_zero_destroy(z);
    dt_zero_destroy(zs);
}

/* The reduction runs in the background: client 0 hands over every gradient while the other
 * clients have not given any yet (they wait for client 0's word that its calls returned). A
 * reduction inside the call would keep client 0 in it until the others come; they give up
 * waiting after 60 s, make their calls (so nothing hangs) and the test fails. */
static void test_grad_ready_returns_before_the_other_clients_give_theirs(void)
{
    int nclients = dt_num_clients(), me = dt_client_id();
    if (nclients < 2)
        return;
    dt_mesh *m = og_mesh_1d();
    for (int stage = 0; stage < 3; stage++) {
        dt_zero_opts o = DT_ZERO_OPTS_INIT;
        o.stage = stage;
        o.reduce_bucket_size = 8;
        /* Unbounded: with the default bound (two buckets) the call completes the oldest
         * bucket before starting a third, which needs the other clients. */
        o.max_live_bucket_bytes = INT64_MAX;
        dt_tensor *params[2], *grads[2];
        dt_zero *z = zero_of_group_b(m, &o, params, grads);
        int word = 1, came = 1;
        if (me == 0) {
            for (int j = 1; j >= 0; j--)
                DT_ASSERT_OK(dt_zero_grad_ready(z, j, grads[j]));
            for (int c = 1; c < nclients; c++)
                MPI_Send(&word, 1, MPI_INT, c, 77, MPI_COMM_WORLD);
        } else {
            MPI_Request r;
            MPI_Irecv(&word, 1, MPI_INT, 0, 77, MPI_COMM_WORLD, &r);
            double until = MPI_Wtime() + 60.0;
            came = 0;
            while (!came && MPI_Wtime() < until)
                MPI_Test(&r, &came, MPI_STATUS_IGNORE);
            for (int j = 1; j >= 0; j--)
                DT_ASSERT_OK(dt_zero_grad_ready(z, j, grads[j]));
            if (!came)
                MPI_Wait(&r, MPI_STATUS_IGNORE);
        }
        CU_ASSERT(came);
        dt_zero_step_info info;
        DT_ASSERT_OK(dt_zero_step(z, NULL, &info));
        /* And the result is the reduction's: the same as the synchronous path's. */
        expect_synchronous_result(m, &o, z, params, grads);
    }
    dt_mesh_destroy(m);
}

/* Whether every bucket of z's step has been started and has completed its last phase (read
 * under the optimizer's lock while its progress thread runs). */
static int all_buckets_done(dt_zero *z)
{
    if (z->prog_on)
        pthread_mutex_lock(&z->lock);
    int done = z->nbuckets > 0 && z->nstarted == z->nbuckets;
    for (int k = 0; done && k < z->nstarted; k++)
        done = z->buckets[z->order[k]].phase == 3;
    if (z->prog_on)
        pthread_mutex_unlock(&z->lock);
    return done;
}

/* On CPU devices the progress thread completes the buckets' phases itself (the sums, the
 * copies into the flat buffer, stage 0's second messages) while the caller makes no call
 * into the optimizer (as during a backward pass): every bucket is done before dt_zero_step,
 * and the result is still the synchronous path's to the bit. */
static void test_progress_thread_completes_the_buckets_while_the_caller_computes(void)
{
    int provided = 0;
    MPI_Query_thread(&provided);
    if (dt_num_clients() < 2 || provided != MPI_THREAD_MULTIPLE ||
        dt_test_device_type() != DT_DEVICE_CPU)
        return;
    dt_mesh *m = og_mesh_1d();
    for (int stage = 0; stage < 3; stage++) {
        dt_zero_opts o = DT_ZERO_OPTS_INIT;
        o.stage = stage;
        o.reduce_bucket_size = 8;
        o.max_live_bucket_bytes = INT64_MAX;
        dt_tensor *params[2], *grads[2];
        dt_zero *z = zero_of_group_b(m, &o, params, grads);
        for (int j = 1; j >= 0; j--)
            DT_ASSERT_OK(dt_zero_grad_ready(z, j, grads[j]));
        double until = MPI_Wtime() + 30.0;
        int done = 0;
        while (!(done = all_buckets_done(z)) && MPI_Wtime() < until) {
            struct timespec ms = {0, 1000000};
            nanosleep(&ms, NULL);
        }
        CU_ASSERT(done);
        dt_zero_step_info info;
        DT_ASSERT_OK(dt_zero_step(z, NULL, &info));
        CU_ASSERT(info.reduce_sum_s > 0.0);
        expect_synchronous_result(m, &o, z, params, grads);
    }
    dt_mesh_destroy(m);
}

/* The converse with max_live_bucket_bytes of one bucket: client 0 cannot hand over every
 * gradient alone (a second bucket waits for the first, which needs the other clients), so its
 * word does not come while the others hold back (2 s); then they give theirs and all goes on. */
static void test_grad_ready_waits_at_the_bound_on_buckets_in_flight(void)
{
    int nclients = dt_num_clients(), me = dt_client_id();
    if (nclients < 2)
        return;
    dt_mesh *m = og_mesh_1d();
    dt_zero_opts o = DT_ZERO_OPTS_INIT;
    o.stage = 1;
    o.reduce_bucket_size = 8;
    o.max_live_bucket_bytes = 8;
    dt_tensor *params[2], *grads[2];
    dt_zero *z = zero_of_group_b(m, &o, params, grads);
    int word = 1, came = 0;
    if (me == 0) {
        for (int j = 1; j >= 0; j--)
            DT_ASSERT_OK(dt_zero_grad_ready(z, j, grads[j]));
        for (int c = 1; c < nclients; c++)
            MPI_Send(&word, 1, MPI_INT, c, 78, MPI_COMM_WORLD);
    } else {
        MPI_Request r;
        MPI_Irecv(&word, 1, MPI_INT, 0, 78, MPI_COMM_WORLD, &r);
        double until = MPI_Wtime() + 2.0;
        while (!came && MPI_Wtime() < until)
            MPI_Test(&r, &came, MPI_STATUS_IGNORE);
        CU_ASSERT(!came);
        for (int j = 1; j >= 0; j--)
            DT_ASSERT_OK(dt_zero_grad_ready(z, j, grads[j]));
        if (!came)
            MPI_Wait(&r, MPI_STATUS_IGNORE);
    }
    DT_ASSERT_OK(dt_zero_step(z, NULL, NULL));
    for (int j = 0; j < 2; j++) {
        dt_tensor_destroy(grads[j]);
        dt_tensor_destroy(params[j]);
    }
    dt_zero_destroy(z);
    dt_mesh_destroy(m);
}

static void test_tiny_allgather_chunks_give_the_same_result(void)
{
    /* 7 elements per chunk: chunks cut through parameters and partitions. */
    for (int model = 0; model < 2; model++)
        for (int stage = 0; stage < 3; stage++)
            run_reference_case(model, stage, 7, 0, 0);
    run_reference_case(1, 2, 1, 0, 0);
}

typedef struct overflow_log {
    int calls;
    dt_zero_step_info last;
} overflow_log;

static void on_overflow(void *arg, const dt_zero_step_info *info)
{
    overflow_log *log = arg;
    log->calls++;
    log->last = *info;
}

static void snapshot(const dt_tensor *t, unsigned char **buf, size_t *bytes)
{
    size_t total = 0;
    for (int i = 0; i < dt_tensor_num_local(t); i++)
        total += dt_test_local_bytes(t, i);
    *buf = malloc(total ? total : 1);
    size_t at = 0;
    for (int i = 0; i < dt_tensor_num_local(t); i++) {
        size_t b = dt_test_local_bytes(t, i);
        void *d = dt_test_local_get(t, i);
        memcpy(*buf + at, d, b);
        free(d);
        at += b;
    }
    *bytes = total;
}

static void test_overflow_on_one_rank_skips_the_step_everywhere(void)
{
    dt_mesh *m = og_mesh_2d();
    int64_t ndp = dt_mesh_dim_size(m, 0);
    overflow_log log = {0};
    dt_zero_opts o = DT_ZERO_OPTS_INIT;
    o.stage = 2;
    o.scaler.mode = DT_LOSS_SCALE_DYNAMIC;
    o.scaler.init_scale = 1024.0;
    o.scaler.hysteresis = 1;
    o.on_overflow = on_overflow;
    o.on_overflow_arg = &log;
    dt_zero *z = NULL;
    DT_ASSERT_OK(dt_zero_create(m, &o, &z));
    const pdesc *descs[2] = {&group_a[1], &group_b[1]}; /* w2 [6,4] over model, b3 [2] */
    dt_tensor *params[2];
    const char *names[2] = {"w2", "b3"};
    ref_param refs[2];
    gen gens[2];
    for (int j = 0; j < 2; j++) {
        params[j] = make_param(m, descs[j], 1, DT_DTYPE_BF16, j);
        ref_init(&refs[j], descs[j], j, DT_DTYPE_BF16);
        gens[j] = (gen){j, -1, 0, 0.0f};
    }
    dt_optim_hparams hp = DT_OPTIM_ADAM_INIT;
    hp.lr = 0.01f;
    DT_ASSERT_OK(dt_zero_add_group(z, 2, names, params, &hp, NULL));
    CU_ASSERT_EQUAL(dt_zero_loss_scale(z), 1024.0);

    /* Step 0 clean; step 1: +inf in w2 element 17 on the last batch rank only (one model
     * shard holds it: one device, one client); step 2: NaN in b3 on batch rank 0; step 3
     * clean at the lowered scale. */
    double scales[4] = {1024.0, 1024.0, 512.0, 256.0};
    int64_t t = 0;
    for (int step = 0; step < 4; step++) {
        gens[0].inj_idx = step == 1 ? 17 : -1;
        gens[0].inj_dp = ndp - 1;
        gens[0].inj_val = INFINITY;
        gens[1].inj_idx = step == 2 ? 1 : -1;
        gens[1].inj_dp = 0;
        gens[1].inj_val = NAN;
        dt_tensor *grads[2];
        for (int j = 0; j < 2; j++)
            grads[j] = og_grad(params[j], DT_DTYPE_BF16, grad_value, step, (float)scales[step],
                               &gens[j]);
        unsigned char *before[2];
        size_t bytes[2];
        for (int j = 0; j < 2; j++)
            snapshot(params[j], &before[j], &bytes[j]);
        dt_zero_step_info info;
        DT_ASSERT_OK(dt_zero_step(z, grads, &info));
        int skip = step == 1 || step == 2;
        CU_ASSERT_EQUAL(info.skipped, skip);
        CU_ASSERT_EQUAL(info.iteration, step);
        CU_ASSERT_EQUAL(info.loss_scale, scales[step]);
        CU_ASSERT_EQUAL(info.next_loss_scale, step == 3 ? 256.0 : scales[step + 1]);
        CU_ASSERT_EQUAL(dt_zero_loss_scale(z), info.next_loss_scale);
        CU_ASSERT_EQUAL(log.calls, step == 0 ? 0 : step == 3 ? 2 : step);
        if (skip) {
            CU_ASSERT(!isfinite(info.grad_norm));
            CU_ASSERT_EQUAL(log.last.iteration, step);
            CU_ASSERT_EQUAL(log.last.skipped, 1);
            CU_ASSERT_EQUAL(log.last.loss_scale, scales[step]);
            CU_ASSERT_EQUAL(log.last.next_loss_scale, scales[step] / 2);
            CU_ASSERT_EQUAL(info.step, 1);
        } else {
            t++;
            CU_ASSERT_EQUAL(info.step, t);
            for (int j = 0; j < 2; j++)
                ref_step(&refs[j], &hp, t, ndp, &gens[j], step, (float)scales[step],
                         DT_DTYPE_BF16, (float)(1.0 / scales[step]));
        }
        for (int j = 0; j < 2; j++) {
            unsigned char *after;
            size_t nb;
            snapshot(params[j], &after, &nb);
            if (skip)
                CU_ASSERT(nb == bytes[j] && memcmp(after, before[j], nb) == 0);
            free(after);
            free(before[j]);
            check_param(names[j], params[j], &refs[j]);
            dt_tensor_destroy(grads[j]);
        }
    }
    dt_zero_destroy(z);
    for (int j = 0; j < 2; j++) {
        dt_tensor_destroy(params[j]);
        ref_free(&refs[j]);
    }
    dt_mesh_destroy(m);
}

/* w1 [2] replicated over model, w2 [2,2] row-sharded over model (shards of 1, 1, 0, 0 rows on
 * 4 model ranks); batch rank 0 holds 4 * G, the others 0, with loss scale 4:
 * G1 = [1, 2], G2 = [[2, 0], [0, 4]], |G|^2 = 1 + 4 + 4 + 16 = 25, norm 5. */
static float clip_grad(int64_t idx, int64_t dpc, int step, void *arg)
{
    const float *g = arg;
    (void)step;
    return dpc == 0 ? g[idx] : 0.0f;
}

static void test_clipping_uses_the_hand_worked_global_norm(void)
{
    static const float g1[2] = {1, 2}, g2[4] = {2, 0, 0, 4};
    const float *gv[2] = {g1, g2};
    for (int stage = 0; stage < 3; stage++)
        for (int clip = 0; clip < 2; clip++) {
            dt_mesh *m = og_mesh_2d();
            dt_zero_opts o = DT_ZERO_OPTS_INIT;
            o.stage = stage;
            o.scaler.mode = DT_LOSS_SCALE_STATIC;
            o.scaler.init_scale = 4.0;
            o.clip_norm = clip ? 1.0 : 10.0;
            dt_zero *z = NULL;
            DT_ASSERT_OK(dt_zero_create(m, &o, &z));
            const pdesc d1 = {"w1", 1, {2, 0}, NULL, NULL}, d2 = {"w2", 2, {2, 2}, "model", NULL};
            float zeros[4] = {0};
            dt_layout *l1 = dt_test_layout(m, 1, NULL, NULL, NULL);
            dt_layout *l2 = dt_test_layout(m, 2, "model", NULL, NULL);
            dt_tensor *params[2] = {og_tensor(l1, DT_DTYPE_F32, d1.shape, zeros),
                                    og_tensor(l2, DT_DTYPE_F32, d2.shape, zeros)};
            const char *names[2] = {"w1", "w2"};
            dt_optim_hparams hp = DT_OPTIM_SGD_INIT;
            hp.lr = 1.0f;
            DT_ASSERT_OK(dt_zero_add_group(z, 2, names, params, &hp, NULL));
            dt_tensor *grads[2];
            for (int j = 0; j < 2; j++)
                grads[j] = og_grad(params[j], DT_DTYPE_F32, clip_grad, 0, 4.0f, (void *)gv[j]);
            dt_zero_step_info info;
            DT_ASSERT_OK(dt_zero_step(z, grads, &info));
            CU_ASSERT_EQUAL(info.grad_norm, 5.0);
            double coef = clip ? 1.0 / (5.0 + 1e-6) : 1.0;
            CU_ASSERT_EQUAL(info.clip_coef, coef);
            float gs = (float)(coef / 4.0);
            for (int j = 0; j < 2; j++) {
                float got[4], want[4];
                int64_t n = j == 0 ? 2 : 4;
                for (int64_t i = 0; i < n; i++)
                    want[i] = 0.0f - 1.0f * (gs * (4.0f * gv[j][i]) + 0.0f * 0.0f);
                og_fetch(params[j], got);
                CU_ASSERT_EQUAL(og_diff(names[j], got, want, n), 0);
                dt_tensor_destroy(grads[j]);
                dt_tensor_destroy(params[j]);
            }
            dt_zero_destroy(z);
            dt_layout_destroy(l1);
            dt_layout_destroy(l2);
            dt_mesh_destroy(m);
        }
}

/* Scaler: init 16, window 3, hysteresis 2, min 2, factor 2; overflow on the calls marked 1. */
static const int pattern[16] = {0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 0, 1, 1, 1, 1, 0};
static const double next_plain[16] = {16, 16, 32, 32, 16, 8, 8, 8, 16, 16, 16, 8, 4, 2, 2, 2};
static const double next_consecutive[16] = {16, 16, 32, 32, 16, 8, 8, 8,
                                            16, 16, 16, 16, 8, 4, 2, 2};

static void run_scaler(dt_loss_scale_mode mode, int consecutive, const double *want_next)
{
    dt_mesh *m = og_mesh_1d();
    int64_t ndp = dt_mesh_dim_size(m, 0);
    overflow_log log = {0};
    dt_zero_opts o = DT_ZERO_OPTS_INIT;
    o.stage = 1;
    o.scaler.mode = mode;
    o.scaler.init_scale = 16.0;
    o.scaler.window = 3;
    o.scaler.hysteresis = 2;
    o.scaler.min_scale = 2.0;
    o.scaler.factor = 2.0;
    o.scaler.consecutive_hysteresis = consecutive;
    o.on_overflow = on_overflow;
    o.on_overflow_arg = &log;
    dt_zero *z = NULL;
    DT_ASSERT_OK(dt_zero_create(m, &o, &z));
    const pdesc d = {"w", 1, {9, 0}, NULL, NULL};
    dt_tensor *p = make_param(m, &d, 0, DT_DTYPE_F16, 0);
    ref_param ref;
    ref_init(&ref, &d, 0, DT_DTYPE_F16);
    const char *name = "w";
    dt_optim_hparams hp = DT_OPTIM_SGD_INIT;
    hp.lr = 0.125f;
    DT_ASSERT_OK(dt_zero_add_group(z, 1, &name, &p, &hp, NULL));
    double scale = mode == DT_LOSS_SCALE_NONE ? 1.0 : 16.0;
    int64_t applied = 0;
    gen g = {0, -1, 0, 0.0f};
    for (int it = 0; it < 16; it++) {
        g.inj_idx = pattern[it] ? it % 9 : -1;
        g.inj_dp = it % ndp;
        g.inj_val = it % 2 ? -INFINITY : NAN;
        dt_tensor *grad = og_grad(p, DT_DTYPE_F16, grad_value, it, (float)scale, &g);
        dt_zero_step_info info;
        DT_ASSERT_OK(dt_zero_step(z, &grad, &info));
        dt_tensor_destroy(grad);
        CU_ASSERT_EQUAL(info.iteration, it);
        CU_ASSERT_EQUAL(info.skipped, pattern[it]);
        CU_ASSERT_EQUAL(info.loss_scale, scale);
        double want = want_next ? want_next[it] : scale;
        if (info.next_loss_scale != want)
            fprintf(stderr, "call %d: next scale %g, want %g\n", it, info.next_loss_scale, want);
        CU_ASSERT_EQUAL(info.next_loss_scale, want);
        if (!pattern[it]) {
            applied++;
            ref_step(&ref, &hp, applied, ndp, &g, it, (float)scale, DT_DTYPE_F16,
                     (float)(1.0 / scale));
        }
        CU_ASSERT_EQUAL(info.step, applied);
        check_param("scaler run", p, &ref);
        scale = info.next_loss_scale;
    }
    CU_ASSERT_EQUAL(log.calls, 8);
    dt_zero_destroy(z);
    dt_tensor_destroy(p);
    ref_free(&ref);
    dt_mesh_destroy(m);
}

static void test_dynamic_scaler_follows_the_hand_worked_sequence(void)
{
    run_scaler(DT_LOSS_SCALE_DYNAMIC, 0, next_plain);
}

static void test_consecutive_hysteresis_resets_on_every_clean_step(void)
{
    run_scaler(DT_LOSS_SCALE_DYNAMIC, 1, next_consecutive);
}

static void test_static_and_no_scaling_keep_the_scale_and_still_skip(void)
{
    run_scaler(DT_LOSS_SCALE_STATIC, 0, NULL);
    run_scaler(DT_LOSS_SCALE_NONE, 0, NULL);
}

static void test_learning_rate_changes_between_steps(void)
{
    dt_mesh *m = og_mesh_2d();
    int64_t ndp = dt_mesh_dim_size(m, 0);
    dt_zero *z = NULL;
    dt_zero_opts o = DT_ZERO_OPTS_INIT;
    o.stage = 2;
    DT_ASSERT_OK(dt_zero_create(m, &o, &z));
    dt_tensor *p = make_param(m, &group_b[0], 1, DT_DTYPE_F32, 3);
    ref_param ref;
    ref_init(&ref, &group_b[0], 3, DT_DTYPE_F32);
    const char *name = "w3";
    dt_optim_hparams hp = DT_OPTIM_ADAM_INIT;
    hp.lr = 0.5f;
    int grp = -1;
    DT_ASSERT_OK(dt_zero_add_group(z, 1, &name, &p, &hp, &grp));
    gen g = {3, -1, 0, 0.0f};
    const float lrs[3] = {0.5f, 0.125f, 0.0f};
    for (int step = 0; step < 3; step++) {
        if (step > 0)
            DT_ASSERT_OK(dt_zero_set_lr(z, grp, lrs[step]));
        hp.lr = lrs[step];
        dt_tensor *grad = og_grad(p, DT_DTYPE_F32, grad_value, step, 1.0f, &g);
        DT_ASSERT_OK(dt_zero_step(z, &grad, NULL));
        dt_tensor_destroy(grad);
        ref_step(&ref, &hp, step + 1, ndp, &g, step, 1.0f, DT_DTYPE_F32, 1.0f);
        check_param("lr schedule", p, &ref);
    }
    DT_ASSERT_FAILS(dt_zero_set_lr(z, 1, 0.1f), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(dt_zero_set_lr(z, -1, 0.1f), DT_ERR_INVALID_ARGUMENT);
    dt_zero_destroy(z);
    dt_tensor_destroy(p);
    ref_free(&ref);
    dt_mesh_destroy(m);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_step_matches_host_reference_in_every_stage),
        DT_TEST(test_tiny_allgather_chunks_give_the_same_result),
        DT_TEST(test_one_dp_rank_steps_from_the_gradients_without_copying_them),
        DT_TEST(test_large_parameters_split_among_threads_give_the_reference_bits),
        DT_TEST(test_gradients_handed_over_early_give_the_reference_result_in_every_stage),
        DT_TEST(test_gradients_reduced_in_small_buckets_in_the_background_give_the_reference_result),
        DT_TEST(test_grad_ready_returns_before_the_other_clients_give_theirs),
        DT_TEST(test_grad_ready_waits_at_the_bound_on_buckets_in_flight),
        DT_TEST(test_progress_thread_completes_the_buckets_while_the_caller_computes),
        DT_TEST(test_early_gradients_refuse_misuse_clearly),
        DT_TEST(test_overflow_on_one_rank_skips_the_step_everywhere),
        DT_TEST(test_clipping_uses_the_hand_worked_global_norm),
        DT_TEST(test_dynamic_scaler_follows_the_hand_worked_sequence),
        DT_TEST(test_consecutive_hysteresis_resets_on_every_clean_step),
        DT_TEST(test_static_and_no_scaling_keep_the_scale_and_still_skip),
        DT_TEST(test_learning_rate_changes_between_steps),
        DT_TEST_END,
    };
    return dt_test_main_device(argc, argv, "optim_step", cases);
}
