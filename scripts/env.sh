# Environment for running libdtensor's programs on this machine (sourced by run.sh, bench/run).
# Open MPI refuses to run as root and with more ranks than cores unless told; these let the
# test harness and examples run anywhere. MPICH ignores them: its launcher (Hydra) runs as root
# and oversubscribes as it is, but its ranks busy-poll (docs/mpi.md).
export OMPI_ALLOW_RUN_AS_ROOT=1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
