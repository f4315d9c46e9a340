#pragma once
/// \file tlse.hpp
/// Umbrella header: everything a TiledLSE user calls.
#include <tlse/contrastive_loss.hpp>
#include <tlse/cross_entropy.hpp>
#include <tlse/cross_entropy_options.hpp>
#include <tlse/distillation_loss.hpp>
#include <tlse/distillation_options.hpp>
#include <tlse/linear_lse.hpp>
#include <tlse/options.hpp>
#include <tlse/scalar_types.hpp>
