# Spack recipe of TiledLSE. From a checkout: `spack repo add spack && spack install tiled-lse`
# (docs/spack.md). It builds this checkout's git repository; a release tarball URL goes here
# once there is one.
import os
import re

from spack.package import *


class TiledLse(CMakePackage, CudaPackage):
    """Log-sum-exp losses over implicit matrices on Kokkos: the CLIP contrastive loss and cut
    cross-entropy, forward and backward, without materializing the logit matrix. Header-only C++
    API, a C API (libtiledlse_c, usable from Fortran) and the PyTorch package tiledlse."""

    git = "file://" + os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))

    version("main", branch="main")

    variant("openmp", default=True, description="Kokkos' OpenMP backend on the host")
    variant("mpi", default=False, description="MPI communicator of the distributed layer")
    variant("nccl", default=False, description="NCCL communicator of the distributed layer (needs +cuda)")
    variant("python", default=False, description="Install the PyTorch package tiledlse")
    # Off by default: the tool's float64 reference and materialized baseline need Kokkos Kernels,
    # which the library does not.
    variant("apps", default=False,
            description="Install the command-line tool tlse (apps/tlse), which checks the losses "
                        "against a float64 reference on this machine's GPU or CPU (tlse ... --check)")

    depends_on("cmake@3.16:", type="build")
    depends_on("kokkos@3.4:")
    depends_on("kokkos+openmp", when="+openmp")
    # TiledLSE runs on the devices Kokkos was built for: a CUDA build needs a Kokkos built for
    # the same GPU architecture, with device lambdas (as ArborX and Kokkos Kernels require).
    depends_on("kokkos+cuda_lambda", when="+cuda")
    # TiledLSE's CUDA code is compiled by nvcc through Kokkos' wrapper (Spack's Kokkos refuses
    # +cuda ~wrapper with gcc anyway: "Kokkos requires +wrapper when using +cuda without clang").
    depends_on("kokkos+wrapper", when="+cuda")
    for arch in CudaPackage.cuda_arch_values:
        depends_on("kokkos+cuda cuda_arch={0}".format(arch), when="+cuda cuda_arch={0}".format(arch))
    conflicts("+cuda", when="cuda_arch=none", msg="give the GPU architecture, e.g. cuda_arch=90")

    # The Hopper kernels (backends/cuda/hopper, cmake/hopper.cmake): their own library, compiled
    # for sm_90a by the spec's nvcc with the CuTe/CUTLASS 3 headers, called by the Kokkos::Cuda
    # specializations on H100/H200. Spack builds one CUDA per spec, so Kokkos and these kernels
    # share it, and it has to be a CUDA that compiles CuTe's wgmma and TMA code (12.4 on).
    variant("hopper", default=True, when="+cuda cuda_arch=90",
            description="Hopper (sm_90a) kernels, built with CUTLASS/CuTe (needs CUDA 12.4 or newer)")
    # cuda_arch is multi-valued: asked for +hopper with another architecture, the concretizer
    # would add 90 and then fail on Kokkos' single architecture, with no word of the reason.
    for arch in CudaPackage.cuda_arch_values:
        if arch != "90":
            conflicts("+hopper", when="cuda_arch={0}".format(arch),
                      msg="the Hopper kernels are sm_90a code: +hopper needs cuda_arch=90 alone; "
                          "use ~hopper for other GPUs")
    depends_on("cuda@12.4:", when="+hopper")
    conflicts("^cuda@:12.3", when="+hopper",
              msg="the Hopper kernels need CUDA 12.4 or newer: use a newer cuda, or ~hopper to build "
                  "only the generic CUDA kernels with this one")
    # Headers only (the folder of cute/tensor.hpp; cmake/hopper.cmake asks for CUTLASS 3.5 on),
    # compiled into libtiledlse_hopper: nothing of CUTLASS is linked or installed. Spack's cutlass
    # refuses cuda_arch=none, hence the arch.
    depends_on("cutlass@3.5: +cuda cuda_arch=90", when="+hopper", type="build")
    # Branch versions rank above every release in a range, so where Spack's cutlass recipe has no
    # release from 3.5 on (Spack 0.22 stops at 3.4.1) the range would pick a checkout of CUTLASS's
    # main branch, whatever it holds that day: a release is asked for instead.
    for branch in ("main", "master"):
        conflicts("^cutlass@" + branch, when="+hopper",
                  msg="the Hopper kernels want a CUTLASS release, 3.5 or newer: declare one as an external "
                      "(docs/spack.md) where Spack's cutlass recipe has none")

    # Built against the Kokkos of the spec (kokkos-kernels@X depends on kokkos@X).
    depends_on("kokkos-kernels@3.4:", when="+apps")
    depends_on("mpi", when="+mpi")
    # Spack's NCCL refuses cuda_arch=none: it is built for the GPUs TiledLSE is built for.
    for arch in CudaPackage.cuda_arch_values:
        depends_on("nccl cuda_arch={0}".format(arch), when="+nccl cuda_arch={0}".format(arch))
    conflicts("+nccl", when="~cuda", msg="NCCL needs +cuda")

    extends("python", when="+python")
    depends_on("python@3.9:", when="+python", type=("build", "run"))
    depends_on("py-torch", when="+python", type=("run", "test"))
    depends_on("py-pytest", when="+python", type="test")
    depends_on("googletest", type="test")

    def cmake_args(self):
        spec = self.spec
        args = [
            self.define("Kokkos_ROOT", spec["kokkos"].prefix),
            self.define("TiledLSE_ENABLE_C_API", True),
            self.define("TiledLSE_ENABLE_TESTS", self.run_tests),
            self.define_from_variant("TiledLSE_ENABLE_CUDA", "cuda"),
            self.define_from_variant("TiledLSE_ENABLE_MPI", "mpi"),
            self.define_from_variant("TiledLSE_ENABLE_NCCL", "nccl"),
            # Not define_from_variant, which gives nothing where the variant does not exist (all
            # but +cuda cuda_arch=90): OFF there too, rather than whatever a cache held.
            self.define("TiledLSE_ENABLE_HOPPER", spec.satisfies("+hopper")),
            self.define_from_variant("TiledLSE_ENABLE_PYTHON", "python"),
            self.define_from_variant("TiledLSE_ENABLE_APPS", "apps"),
        ]
        if spec.satisfies("+cuda"):
            # Kokkos' compiler wrapper (nvcc_wrapper) compiles the kernels, as for every Kokkos CUDA build.
            args.append(self.define("CMAKE_CXX_COMPILER", self.kokkos_cxx()))
        if spec.satisfies("+hopper"):
            # cmake/hopper.cmake builds the kernels as a project of their own with these: the spec's
            # nvcc (not Kokkos' wrapper), the compiler of the spec as its host compiler, and the
            # CUTLASS headers.
            args.extend([
                self.define("TiledLSE_HOPPER_CUDA_COMPILER", spec["cuda"].prefix.bin.nvcc),
                self.define("TiledLSE_HOPPER_HOST_COMPILER", self.compiler.cxx),
                self.define("CUTLASS_INCLUDE_DIR", spec["cutlass"].prefix.include),
            ])
        if spec.satisfies("+python"):
            args.append(self.define("Python3_EXECUTABLE", spec["python"].command.path))
            # Where Spack puts extensions of this Python (python_platlib, set by python-venv) and
            # adds them to PYTHONPATH on `spack load`: not the platlib of the Python itself,
            # which for Debian's is local/lib/python3.X/dist-packages.
            args.append(self.define("TiledLSE_PYTHON_INSTALL_DIR", os.path.relpath(python_platlib, self.prefix)))
        return args

    def kokkos_cxx(self):
        """The C++ compiler of a CUDA build: the one Kokkos was built with."""
        kokkos = self.spec["kokkos"]
        if not kokkos.external:
            return kokkos.kokkos_cxx
        # An external Kokkos has no kokkos-nvcc-wrapper node, and Spack's kokkos package then
        # gives the spec's plain C++ compiler, which cannot compile CUDA. The installation records
        # its compiler (nvcc_wrapper, or a site's wrapper around it) in its CMake config, and
        # Kokkos' own config redirects to it: so does this recipe, explicitly.
        for config in find(kokkos.prefix, "KokkosConfigCommon.cmake"):
            with open(config) as f:
                recorded = re.search(r'SET\(Kokkos_CXX_COMPILER "([^"]+)"\)', f.read())
            if recorded:
                return recorded.group(1)
        raise InstallError("no Kokkos_CXX_COMPILER in KokkosConfigCommon.cmake under the external "
                           "Kokkos prefix {0}: is it a Kokkos 3.4+ CMake installation?".format(kokkos.prefix))

    def setup_run_environment(self, env):
        """The installed Python package finds the library through TILEDLSE_LIBRARY."""
        libs = find_libraries("libtiledlse_c", self.prefix, recursive=True)
        if self.spec.satisfies("+python") and libs:
            env.set("TILEDLSE_LIBRARY", libs[0])

    examples_src_dir = "examples"
    # The stand-alone test compiles examples/: Spack sets up the compilers (CC, CXX, FC) for it.
    test_requires_compiler = True

    @run_after("install")
    def cache_examples(self):
        """Keeps examples/ for `spack test run tiled-lse`."""
        cache_extra_test_sources(self, [self.examples_src_dir])

    def test_examples(self):
        """builds examples/ (C++, C, Fortran if available) against the installed package, then runs them (test_run_examples)"""
        source = join_path(self.test_suite.current_test_cache_dir, self.examples_src_dir)
        cmake = which(self.spec["cmake"].prefix.bin.cmake)
        ctest = which(self.spec["cmake"].prefix.bin.ctest)
        # The compiler TiledLSE was built with: Kokkos' wrapper for CUDA, else the spec's C++ compiler.
        cxx = self.kokkos_cxx() if self.spec.satisfies("+cuda") else self.compiler.cxx
        with working_dir("build-examples", create=True):
            cmake(source, self.define("CMAKE_PREFIX_PATH", self.prefix),
                  self.define("Kokkos_ROOT", self.spec["kokkos"].prefix),
                  self.define("CMAKE_CXX_COMPILER", cxx))
            cmake("--build", ".")
            build_dir = os.getcwd()
        # A +cuda build's examples initialize Kokkos::Cuda and abort without a GPU: there, building
        # them is the whole test, and the run is reported as skipped, not as passed. (Not named
        # test_examples_*: Spack would give the build part the run's status.)
        with test_part(self, "test_run_examples", purpose="runs the examples built above",
                       work_dir=build_dir):
            if self.spec.satisfies("+cuda") and not self.gpu_visible():
                raise SkipTest("a +cuda build's examples need a GPU and `nvidia-smi -L` lists none here; "
                               "they are built in {0}: run ctest there on a GPU machine".format(build_dir))
            ctest("--output-on-failure")

    @staticmethod
    def gpu_visible():
        """Whether `nvidia-smi -L` lists an NVIDIA GPU (no nvidia-smi: none)."""
        nvidia_smi = which("nvidia-smi")
        if not nvidia_smi:
            return False
        listing = nvidia_smi("-L", output=str, error=str, fail_on_error=False)
        return nvidia_smi.returncode == 0 and "GPU " in listing
