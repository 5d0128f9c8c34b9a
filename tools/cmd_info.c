/* `dtensor info`: clients, local devices and the hwloc topology this process sees. */
#include <stdio.h>

#include "cli.h"

int cli_info(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    dt_status st = dt_init(NULL, NULL, NULL);
    if (st != DT_OK)
        return cli_fail("init", st);
    dt_topology_info topo;
    st = dt_topology(&topo);
    if (st != DT_OK) {
        dt_finalize();
        return cli_fail("topology", st);
    }
    printf("libdtensor %s, CUDA %s\n", DT_VERSION_STRING, DT_HAVE_CUDA ? "built" : "not built");
    printf("client %d of %d on %s (%d of %d on this host)\n", dt_client_id(), dt_num_clients(),
           topo.hostname, topo.host_rank, topo.host_clients);
    for (int t = DT_DEVICE_CPU; t <= DT_DEVICE_GPU; t++) {
        int n = dt_num_local_devices((dt_device_type)t);
        printf("%s devices: %d local, %d global", dt_device_type_name((dt_device_type)t), n,
               dt_num_global_devices((dt_device_type)t));
        if (n > 0)
            printf(", ids %d..%d, run by '%s'", dt_local_device_id((dt_device_type)t, 0),
                   dt_local_device_id((dt_device_type)t, n - 1),
                   dt_device_kind_name((dt_device_type)t));
        printf("\n");
    }
    printf("topology: %d packages, %d NUMA nodes, %d cores, %d hardware threads, %d GPUs\n",
           topo.packages, topo.numa_nodes, topo.cores, topo.pus, topo.gpus);
    printf("binding: %s\n", topo.bound ? topo.cpuset : "off");
    dt_finalize();
    return CLI_OK;
}
