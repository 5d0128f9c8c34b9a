/* Fault injection in the stand-ins of the host build (-Dcuda=host; tests only, never
 * installed): a site's Nth call from now fails the way the real library fails there, so that
 * tests can check each failure surfaces as a dt_status with a message and leaks nothing.
 * Sites (docs/cuda_host.md, "Fault injection"):
 *   malloc      cudaMalloc: cudaErrorMemoryAllocation
 *   mallochost  cudaMallocHost / cudaHostAlloc: cudaErrorMemoryAllocation
 *   memcpy      cudaMemcpy / cudaMemcpyAsync: cudaErrorLaunchFailure at the call
 *   memset      cudaMemset / cudaMemsetAsync: cudaErrorLaunchFailure at the call
 *   setdevice   cudaSetDevice: cudaErrorDevicesUnavailable
 *   getdevice   cudaGetDevice: cudaErrorDevicesUnavailable
 *   kernel      a kernel launch: the launch succeeds, the kernel does not run and the device's
 *               sticky cudaErrorLaunchFailure surfaces at the next synchronisation
 *   cublascreate  cublasCreate: CUBLAS_STATUS_ALLOC_FAILED
 *   cublas      cublasSgemm: CUBLAS_STATUS_EXECUTION_FAILED
 *   nccl        ncclSend/ncclRecv/the collectives: ncclUnhandledCudaError at the call
 *   ncclasync   the same calls: accepted, the communicator's asynchronous error becomes
 *               ncclSystemError and the operation never completes (ncclCommGetAsyncError)
 *   ncclinit    ncclCommInitRank: ncclSystemError
 *   pcibusid    cudaDeviceGetPCIBusId: cudaErrorDevicesUnavailable
 * The environment arms sites at start: DT_CUDA_HOST_FAIL=site:N[,site:N...]; site:N@R arms it
 * only in the process of MPI world rank R (OMPI_COMM_WORLD_RANK or PMI_RANK). */
#ifndef DTENSOR_CUDA_HOST_FAULT_H
#define DTENSOR_CUDA_HOST_FAULT_H

#ifdef __cplusplus
extern "C" {
#endif

/* Arms `site`: its nth call from now fails (1: the next one); nth 0 disarms. Returns 0, or -1
 * for an unknown site. Per process, any thread. */
int dt__cuh_fail(const char *site, long nth);
/* As dt__cuh_fail, and the `times` - 1 calls after the nth fail too (a retry that fails
 * again: the staging pool's second try after emptying itself). */
int dt__cuh_fail_times(const char *site, long nth, long times);
/* 1 when `site` was armed and its fault has fired since. */
int dt__cuh_fail_fired(const char *site);
/* Clears the sticky error of every device (what a test needs after a `kernel` fault, where a
 * real process would have to start again). */
void dt__cuh_fail_reset_sticky(void);

#ifdef __cplusplus
}
/* The stand-ins' side: true when this call of `site` is the armed one. */
bool dt__cuh_fault_now(const char *site);
#endif

#endif
