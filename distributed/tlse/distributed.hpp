#pragma once
/// \file distributed.hpp
/// Umbrella header of the distributed layer (link TiledLSE::Distributed): the communicators
/// this build was configured with, the callback communicator (always), and the distributed losses.
#include <tlse/distributed/callback_communicator.hpp>
#if defined(TLSE_ENABLE_MPI)
#include <tlse/distributed/mpi_communicator.hpp>
#endif
#if defined(TLSE_ENABLE_NCCL)
#include <tlse/distributed/nccl_communicator.hpp>
#endif
#include <tlse/distributed/contrastive_loss.hpp>
#include <tlse/distributed/cross_entropy.hpp>
#include <tlse/distributed/distillation_loss.hpp>
