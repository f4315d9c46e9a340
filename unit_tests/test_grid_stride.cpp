// The elementwise kernels' launch (grid_stride.hpp): grid_for caps the blocks at 65535, so a
// count past 65535 x 256 items is covered only because each thread walks the grid's stride. A
// CUDA-build test (run on the GPU by scripts/run_gpu.sh): every item visited exactly once.
#include <gtest/gtest.h>

#include <tlse/backends/cuda/grid_stride.hpp>

#include <vector>

namespace {

using tlse::impl::index_t;
using tlse::impl::cuda::for_each_index;
using tlse::impl::cuda::grid_for;

__global__ void count_visits_kernel(index_t n, unsigned char* visits) {
  for_each_index(n, [&](index_t i) { ++visits[i]; });
}

TEST(GridStride, GridForCapsTheBlocks) {
  EXPECT_EQ(grid_for(0), 1u);
  EXPECT_EQ(grid_for(256), 1u);
  EXPECT_EQ(grid_for(257), 2u);
  EXPECT_EQ(grid_for(100, 32), 4u);
  EXPECT_EQ(grid_for(index_t(65535) * 256), 65535u);
  EXPECT_EQ(grid_for(index_t(1) << 40), 65535u);
}

TEST(GridStride, EveryItemOnceAtCountsPastTheCappedGrid) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) GTEST_SKIP() << "no CUDA device";
  // 65535 x 256 = 16776960 threads: the first count fits one pass, the others need a second.
  for (const index_t n : {index_t(1000), index_t(65535) * 256, index_t(65535) * 256 + 4097, index_t(40000001)}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    unsigned char* visits = nullptr;
    ASSERT_EQ(cudaMalloc(&visits, std::size_t(n)), cudaSuccess);
    ASSERT_EQ(cudaMemset(visits, 0, std::size_t(n)), cudaSuccess);
    count_visits_kernel<<<grid_for(n), 256>>>(n, visits);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<unsigned char> host(std::size_t(n), 0);
    ASSERT_EQ(cudaMemcpy(host.data(), visits, std::size_t(n), cudaMemcpyDeviceToHost), cudaSuccess);
    cudaFree(visits);
    index_t wrong = 0, first_wrong = -1;
    for (index_t i = 0; i < n; ++i)
      if (host[std::size_t(i)] != 1 && wrong++ == 0) first_wrong = i;
    EXPECT_EQ(wrong, 0) << "first at " << first_wrong << ", visited " << int(host[std::size_t(first_wrong)])
                        << " times";
  }
}

}  // namespace
