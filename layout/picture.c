/* dt_layout_picture: a text grid of a layout's blocks over a global shape, each block labelled
 * with the ids of the devices that hold it (in the spirit of JAX's visualize_array_sharding). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layout/layout_impl.h"
#include "runtime/error.h"
#include "runtime/util.h"

/* A growable string; `failed` sticks once an allocation fails. */
typedef struct sbuf {
    char *p;
    size_t n, cap;
    int failed;
} sbuf;

static void sb_putn(sbuf *b, const char *s, size_t n)
{
    if (b->failed)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->failed = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void sb_puts(sbuf *b, const char *s)
{
    sb_putn(b, s, strlen(s));
}

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void sb_printf(sbuf *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0)
        sb_putn(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

static void sb_repeat(sbuf *b, char c, size_t n)
{
    for (size_t i = 0; i < n; i++)
        sb_putn(b, &c, 1);
}

/* Moves the line in `line` to `out` without trailing spaces, adding a newline. */
static void sb_flush_line(sbuf *out, sbuf *line)
{
    size_t n = line->n;
    while (n > 0 && line->p[n - 1] == ' ')
        n--;
    if (n)
        sb_putn(out, line->p, n);
    sb_puts(out, "\n");
    line->n = 0;
    if (line->p)
        line->p[0] = '\0';
}

/* Writes `s` centred in a field of width w. */
static void sb_center(sbuf *b, const char *s, size_t w)
{
    if (!s)
        s = "";
    size_t n = strlen(s);
    size_t left = n < w ? (w - n) / 2 : 0;
    size_t right = n < w ? w - n - left : 0;
    sb_repeat(b, ' ', left);
    sb_putn(b, s, n);
    sb_repeat(b, ' ', right);
}

typedef struct holder {
    int64_t block;
    int device;
} holder;

static int holder_cmp(const void *a, const void *b)
{
    const holder *x = a, *y = b;
    if (x->block != y->block)
        return x->block < y->block ? -1 : 1;
    return (x->device > y->device) - (x->device < y->device);
}

/* "0-3,8,9": ascending ids, runs of three or more written as first-last. */
static void device_label(sbuf *b, const holder *h, int64_t count)
{
    b->n = 0;
    sb_puts(b, "");
    for (int64_t i = 0; i < count;) {
        int64_t j = i;
        while (j + 1 < count && h[j + 1].device == h[j].device + 1)
            j++;
        if (i > 0)
            sb_puts(b, ",");
        if (j - i >= 2) {
            sb_printf(b, "%d-%d", h[i].device, h[j].device);
            i = j + 1;
        } else {
            sb_printf(b, "%d", h[i].device);
            i++;
        }
    }
}

/* Index range "a:b" of shard j of tensor dim `dim`. */
static void range_label(char *buf, size_t len, const dt_layout *l, const int64_t *shape, int dim,
                        int64_t j)
{
    int64_t off, size;
    dt_shard_range(shape[dim], dt_layout_num_shards(l, dim), j, &off, &size);
    snprintf(buf, len, "%lld:%lld", (long long)off, (long long)(off + size));
}

typedef struct grid_ctx {
    const dt_layout *l;
    const int64_t *shape;
    const holder *holders; /* sorted by block, then device */
    int64_t per_block;     /* devices holding each block */
    int64_t coord[DT_MAX_RANK];
    sbuf *out, *line, *label;
} grid_ctx;

static int64_t coord_block(const dt_layout *l, const int64_t *coord)
{
    int64_t block = 0;
    for (int i = 0; i < l->rank; i++)
        block = block * dt_layout_num_shards(l, i) + coord[i];
    return block;
}

/* Label of cell (i, j) of the current grid into ctx->label. */
static void cell_label(grid_ctx *g, int rdim, int cdim, int64_t i, int64_t j)
{
    if (rdim >= 0)
        g->coord[rdim] = i;
    if (cdim >= 0)
        g->coord[cdim] = j;
    int64_t block = coord_block(g->l, g->coord);
    device_label(g->label, g->holders + block * g->per_block, g->per_block);
}

/* Draws one grid: rows are the shards of tensor dim 0, columns those of dim 1 (rank >= 2),
 * or one row of dim 0's shards (rank 1), or one cell (rank 0). */
static void draw_grid(grid_ctx *g)
{
    const dt_layout *l = g->l;
    int rdim = l->rank >= 2 ? 0 : -1;
    int cdim = l->rank >= 2 ? 1 : (l->rank == 1 ? 0 : -1);
    int64_t rows = rdim >= 0 ? dt_layout_num_shards(l, rdim) : 1;
    int64_t cols = cdim >= 0 ? dt_layout_num_shards(l, cdim) : 1;
    size_t *width = calloc((size_t)cols, sizeof *width);
    char rl[48];
    size_t gutter = 0;

    if (!width) {
        g->out->failed = 1;
        return;
    }
    for (int64_t j = 0; j < cols; j++) {
        if (cdim >= 0) {
            range_label(rl, sizeof rl, l, g->shape, cdim, j);
            width[j] = strlen(rl);
        }
        for (int64_t i = 0; i < rows; i++) {
            cell_label(g, rdim, cdim, i, j);
            if (g->label->n > width[j])
                width[j] = g->label->n;
        }
        width[j] += 2;
    }
    for (int64_t i = 0; rdim >= 0 && i < rows; i++) {
        range_label(rl, sizeof rl, l, g->shape, rdim, i);
        if (strlen(rl) + 1 > gutter)
            gutter = strlen(rl) + 1;
    }

    if (cdim >= 0) {
        sb_repeat(g->line, ' ', gutter);
        for (int64_t j = 0; j < cols; j++) {
            range_label(rl, sizeof rl, l, g->shape, cdim, j);
            sb_puts(g->line, " ");
            sb_center(g->line, rl, width[j]);
        }
        sb_flush_line(g->out, g->line);
    }
    for (int64_t i = 0; i <= rows; i++) {
        sb_repeat(g->line, ' ', gutter);
        for (int64_t j = 0; j < cols; j++) {
            sb_puts(g->line, "+");
            sb_repeat(g->line, '-', width[j]);
        }
        sb_puts(g->line, "+");
        sb_flush_line(g->out, g->line);
        if (i == rows)
            break;
        if (rdim >= 0) {
            range_label(rl, sizeof rl, l, g->shape, rdim, i);
            sb_repeat(g->line, ' ', gutter - 1 - strlen(rl));
            sb_printf(g->line, "%s ", rl);
        }
        for (int64_t j = 0; j < cols; j++) {
            cell_label(g, rdim, cdim, i, j);
            sb_puts(g->line, "|");
            sb_center(g->line, g->label->p, width[j]);
        }
        sb_puts(g->line, "|");
        sb_flush_line(g->out, g->line);
    }
    free(width);
}

static void draw_header(sbuf *out, const dt_layout *l, const int64_t *shape)
{
    sb_puts(out, "shape [");
    for (int i = 0; i < l->rank; i++)
        sb_printf(out, "%s%lld", i ? ", " : "", (long long)shape[i]);
    sb_puts(out, "], sharding_specs [");
    for (int i = 0; i < l->rank; i++)
        sb_printf(out, "%s%s", i ? ", " : "", dt_layout_spec(l, i));
    sb_puts(out, "], mesh ");
    for (int d = 0; d < l->mesh_rank; d++)
        sb_printf(out, "%s%s=%lld", d ? "," : "", dt_mesh_dim_name(l->mesh, d),
                  (long long)l->mesh_dim_size[d]);
    sb_puts(out, "\n");
    if (l->npartial > 0) {
        sb_puts(out, "partial: ");
        for (int i = 0; i < l->npartial; i++)
            sb_printf(out, "%s%s=%s", i ? ";" : "",
                      dt_mesh_dim_name(l->mesh, l->partial_dim[i]),
                      dt_reduce_op_name(l->partial_op[i]));
        sb_puts(out, " (the devices of a block hold values pending this reduction)\n");
    }
}

/* Builds the whole picture into out; returns a status (NO_MEMORY when out failed). */
static dt_status build(sbuf *out, const dt_layout *l, const int64_t *shape)
{
    sbuf line = {0}, label = {0};
    holder *h = malloc((size_t)l->mesh_size * sizeof *h);
    dt_status st = DT_OK;
    if (!h)
        return dt__error(DT_ERR_NO_MEMORY, "dt_layout_picture: out of memory");

    for (int64_t p = 0; p < l->mesh_size; p++) {
        h[p].block = dt_layout_block_index(l, p);
        h[p].device = dt_mesh_device_id(l->mesh, p);
    }
    qsort(h, (size_t)l->mesh_size, sizeof *h, holder_cmp);
    int64_t nblocks = 1;
    for (int i = 0; i < l->rank; i++)
        nblocks *= dt_layout_num_shards(l, i);

    grid_ctx g = {l, shape, h, l->mesh_size / nblocks, {0}, out, &line, &label};
    draw_header(out, l, shape);
    /* One grid per combination of the shards of dims 2.., walked like an odometer. */
    for (;;) {
        if (l->rank >= 3) {
            char rl[48];
            sb_puts(out, "[:, :");
            for (int i = 2; i < l->rank; i++) {
                range_label(rl, sizeof rl, l, shape, i, g.coord[i]);
                sb_printf(out, ", %s", rl);
            }
            sb_puts(out, "]\n");
        }
        draw_grid(&g);
        int i = l->rank - 1;
        for (; i >= 2; i--) {
            if (++g.coord[i] < dt_layout_num_shards(l, i))
                break;
            g.coord[i] = 0;
        }
        if (i < 2)
            break;
    }
    if (out->failed || line.failed || label.failed)
        st = dt__error(DT_ERR_NO_MEMORY, "dt_layout_picture: out of memory");
    free(line.p);
    free(label.p);
    free(h);
    return st;
}

size_t dt_layout_picture(const dt_layout *layout, const int64_t *shape, char *buf, size_t len)
{
    sbuf out = {0};
    size_t n = 0;

    if (buf && len)
        buf[0] = '\0';
    if (!layout || (layout->rank > 0 && !shape)) {
        dt__error(DT_ERR_INVALID_ARGUMENT, "dt_layout_picture: NULL layout or shape");
        return 0;
    }
    for (int i = 0; i < layout->rank; i++) {
        if (shape[i] < 0) {
            dt__error(DT_ERR_INVALID_ARGUMENT, "dt_layout_picture: shape[%d] = %lld is negative",
                      i, (long long)shape[i]);
            return 0;
        }
    }
    if (build(&out, layout, shape) == DT_OK) {
        n = out.n;
        if (buf && len)
            dt__strlcpy(buf, out.p, len);
    }
    free(out.p);
    return n;
}
