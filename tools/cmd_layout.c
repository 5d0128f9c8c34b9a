/* `dtensor layout show`: the canonical layout string; with --shape, the picture and the shard
 * of every device. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void print_shards(const dt_layout *layout, const int64_t *shape)
{
    const dt_mesh *mesh = dt_layout_mesh(layout);
    int rank = dt_layout_rank(layout);
    int64_t off[DT_MAX_RANK], loc[DT_MAX_RANK];
    printf("%8s %8s  %-24s %s\n", "device", "block", "offset", "shape");
    for (int64_t p = 0; p < dt_mesh_size(mesh); p++) {
        if (dt_layout_shard(layout, shape, p, off, loc) != DT_OK)
            continue;
        char o[256] = "[", s[256] = "[";
        for (int d = 0; d < rank; d++) {
            size_t on = strlen(o), sn = strlen(s);
            snprintf(o + on, sizeof o - on, "%s%lld", d ? "," : "", (long long)off[d]);
            snprintf(s + sn, sizeof s - sn, "%s%lld", d ? "," : "", (long long)loc[d]);
        }
        strcat(o, "]");
        strcat(s, "]");
        printf("%8d %8lld  %-24s %s\n", dt_mesh_device_id(mesh, p),
               (long long)dt_layout_block_index(layout, p), o, s);
    }
}

int cli_layout(int argc, char **argv)
{
    const char *text = NULL, *shape_text = NULL;
    if (argc < 3 || strcmp(argv[1], "show") != 0)
        return cli_usage();
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--shape") == 0 && i + 1 < argc)
            shape_text = argv[++i];
        else if (!text)
            text = argv[i];
        else
            return cli_usage();
    }
    if (!text)
        return cli_usage();

    dt_layout *layout = NULL;
    dt_status st = dt_layout_parse(text, &layout);
    if (st != DT_OK)
        return cli_fail("layout", st);
    int64_t shape[DT_MAX_RANK];
    if (shape_text && (st = dt_layout_check_concrete(layout)) != DT_OK) {
        /* A placeholder or the empty layout has no shards to draw. */
        dt_layout_destroy(layout);
        return cli_fail("layout --shape", st);
    }
    if (shape_text) {
        char why[256];
        int r = cli_parse_shape(shape_text, shape, DT_MAX_RANK, why, sizeof why);
        if (r < 0) {
            fprintf(stderr, "dtensor: --shape '%s': %s\n", shape_text, why);
            dt_layout_destroy(layout);
            return CLI_BAD_INPUT;
        }
        if (r != dt_layout_rank(layout)) {
            fprintf(stderr, "dtensor: --shape '%s': expected %d non-negative sizes separated by "
                    "commas (the layout's rank)\n", shape_text, dt_layout_rank(layout));
            dt_layout_destroy(layout);
            return CLI_BAD_INPUT;
        }
    }
    char *canon = cli_layout_string(layout);
    if (!canon) {
        dt_layout_destroy(layout);
        return cli_fail("layout", DT_ERR_NO_MEMORY);
    }
    printf("%s\n", canon);
    free(canon);
    if (shape_text) {
        size_t n = dt_layout_picture(layout, shape, NULL, 0);
        char *pic = malloc(n + 1);
        if (!pic) {
            dt_layout_destroy(layout);
            return cli_fail("layout picture", DT_ERR_NO_MEMORY);
        }
        dt_layout_picture(layout, shape, pic, n + 1);
        fputs(pic, stdout);
        free(pic);
        print_shards(layout, shape);
    }
    dt_layout_destroy(layout);
    return CLI_OK;
}
