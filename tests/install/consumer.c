/* A separate program built against the installed libdtensor with pkg-config only. It builds
 * a mesh and a layout from strings and checks the shard of one device against hand-worked
 * values. */
#include <dtensor/dtensor.h>
#include <stdio.h>
#include <string.h>

int main(void)
{
    dt_layout *l = NULL;
    const char *text = "sharding_specs:x,unsharded, mesh:|x=2,y=2|*CPU";
    if (dt_layout_parse(text, &l) != DT_OK) {
        fprintf(stderr, "consumer: %s\n", dt_last_error());
        return 1;
    }
    int64_t shape[2] = {5, 3}, off[2], loc[2];
    /* Position 2 has x=1: rows 3..4 of 5 (the first shard takes the extra row). */
    if (dt_layout_shard(l, shape, 2, off, loc) != DT_OK || off[0] != 3 || loc[0] != 2 ||
        off[1] != 0 || loc[1] != 3) {
        fprintf(stderr, "consumer: wrong shard\n");
        return 1;
    }
    char buf[512];
    dt_layout_format(l, buf, sizeof buf);
    printf("libdtensor %s: %s\n", DT_VERSION_STRING, buf);
    dt_layout_destroy(l);
    return strstr(buf, "sharding_specs:x,unsharded, mesh:|x=2,y=2|0,1,2,3|") ? 0 : 1;
}
