// The distillation calls for bf16 inputs (one dtype per translation unit: they compile in parallel).
#include "dtype_calls.hpp"

namespace tlse::capi {
TLSE_CAPI_DISTILLATION(tlse::bfloat16);
}
