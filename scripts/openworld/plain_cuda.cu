// A plain CUDA program with no annotations: kernels, memcpy both ways, memset, a cuBLAS GEMM.
// Captured under nsys for cptrace's open-world reader tests (no NVTX, no framework).
#include <cstdio>
#include <cuda_runtime.h>
#include <cublas_v2.h>

__global__ void saxpy(int n, float a, const float* x, float* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
__global__ void scale(int n, float a, float* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] *= a;
}

int main() {
  const int n = 1 << 22, m = 1024;
  float *hx, *hy, *x, *y, *A, *B, *C;
  cudaMallocHost(&hx, n * sizeof(float));
  cudaMallocHost(&hy, n * sizeof(float));
  for (int i = 0; i < n; ++i) { hx[i] = 1.0f; hy[i] = 2.0f; }
  cudaMalloc(&x, n * sizeof(float));
  cudaMalloc(&y, n * sizeof(float));
  cudaMalloc(&A, m * m * sizeof(float));
  cudaMalloc(&B, m * m * sizeof(float));
  cudaMalloc(&C, m * m * sizeof(float));
  cudaMemset(A, 0, m * m * sizeof(float));
  cudaMemset(B, 0, m * m * sizeof(float));
  cublasHandle_t h;
  cublasCreate(&h);
  cudaStream_t s2;
  cudaStreamCreate(&s2);
  const float one = 1.0f, zero = 0.0f;
  for (int it = 0; it < 10; ++it) {
    cudaMemcpy(x, hx, n * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemcpyAsync(y, hy, n * sizeof(float), cudaMemcpyHostToDevice, s2);
    cudaStreamSynchronize(s2);
    saxpy<<<(n + 255) / 256, 256>>>(n, 2.0f, x, y);
    scale<<<(n + 255) / 256, 256>>>(n, 0.5f, y);
    cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, m, m, &one, A, m, B, m, &zero, C, m);
    cudaMemsetAsync(C, 0, m * m * sizeof(float));
    cudaMemcpy(hy, y, n * sizeof(float), cudaMemcpyDeviceToHost);
  }
  cudaDeviceSynchronize();
  printf("y[0]=%f\n", hy[0]);
  cublasDestroy(h);
  return 0;
}
